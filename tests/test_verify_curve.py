"""Tests for jetflow/results/verify_curve.py and the backend names of jetflow/engine/load.py, on tiny targets."""
import pytest
import torch

from fakes import CharTokenizer, tiny_model
from jetflow.engine import quant
from jetflow.engine.compiled import CompileConfig, compile_target
from jetflow.engine.load import backend_of, pick_backend
from jetflow.engine.target import Target
from jetflow.results import verify_curve


def _target(dtype=torch.float32, kind=None):
    model = tiny_model("llama", 256, layers=1).to(dtype)
    return Target(quant.quantize_model(model, kind) if kind else model, CharTokenizer(256), "tiny")


def test_backend_names():
    assert backend_of(_target()) == "fp32" and backend_of(_target(torch.bfloat16)) == "bf16"
    assert backend_of(_target(torch.bfloat16, "q4")) == "q4" and backend_of(_target(torch.bfloat16, "int8")) == "int8"
    assert backend_of(_target(torch.float32, "q4")) == "float32-q4"
    assert backend_of(compile_target(_target(), CompileConfig(cache_len=32, query_sizes=(1,)))) == "fp32-compiled"


def test_pick_backend_keeps_what_is_asked_and_defaults_to_the_fastest_lossless(monkeypatch):
    """Native bf16: the embedded target in q4x8 where its kernel is the VNNI one, else q4 (both lossless against
    their own AR by construction); a hub model or a GPU in fp32; no native bf16: fp32 everywhere."""
    from jetflow.engine import dot8
    from jetflow.util import hardware
    assert pick_backend(None, "float32") == ("float32", None, "asked for")
    monkeypatch.setattr(hardware, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    for vnni, quant in ((True, "q4x8"), (False, "q4")):
        monkeypatch.setattr(dot8, "vectorized", lambda vnni=vnni: vnni)
        assert pick_backend(None)[:2] == ("bfloat16", quant) and "--dtype float32" in pick_backend(None)[2]
        assert pick_backend("smollm2-135m")[:2] == ("bfloat16", quant)
        assert pick_backend(None, compile=True)[:2] == ("bfloat16", quant)  # compiled: the lean forward, row-exact
    assert pick_backend("some/hub-model")[:2] == ("float32", None) and "--dtype bfloat16" in pick_backend("x/y")[2]
    assert pick_backend(None, quant="int8")[:2] == ("bfloat16", "int8")
    monkeypatch.setattr(hardware, "cpu_bf16_flags", lambda: ())
    assert pick_backend(None)[:2] == ("float32", None) and pick_backend(None, quant="q4")[:2] == ("float32", "q4")


def test_curves_interleave_every_backend_and_render():
    targets = {"fp32": _target(), "q4": _target(torch.bfloat16, "q4")}
    seconds, first = verify_curve.curves(targets, (1, 2, 4), past_len=8, repeats=2)
    assert set(seconds) == set(first) == {"fp32", "q4"} and all(set(s) == {1, 2, 4} for s in seconds.values())
    rows = [{"kind": "setup", "hardware": "cpu", "bf16_native": True, "load_average_before": 1.0,
             "load_average_after": 1.5}]
    for key, s in seconds.items():
        rows.append({"kind": "curve", "backend": key, "seconds": {str(k): v for k, v in s.items()},
                     "ar_steps": {str(k): v / s[1] for k, v in s.items()}, "auto_budget": 4,
                     "tau": {"4": 2.5}, "predicted_tokens_per_s": 10.0})
    table = verify_curve.to_markdown(rows)
    assert "| fp32 |" in table and "| q4 |" in table and "4 (2.50)" in table and "load average 1.0" in table


def test_config_refuses_unknown_backends():
    with pytest.raises(ValueError, match="unknown backends"):
        verify_curve.VerifyCurveConfig(backends=("fp16",))
    with pytest.raises(ValueError, match="include 1"):
        verify_curve.VerifyCurveConfig(sizes=(2, 4))

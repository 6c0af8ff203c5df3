"""The backend comparison (``python -m jetflow speed --backends/--prompts-file/--json``) on tiny targets;
llama.cpp is left out (``llama_cpp=False``): its rows need the optional bench extra and the real file."""
import argparse
import json

import pytest

from jetflow.results import backends
from jetflow.results.backends_table import to_markdown
from jetflow.results.bandwidth import copy_bandwidth


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(["1 2 3 1 2 3", "abc abc"])))
    return path


@pytest.fixture
def fake_backends(monkeypatch, tiny_target):
    monkeypatch.setattr(backends, "load_backend", lambda name: tiny_target)
    monkeypatch.setattr(backends, "copy_bandwidth", lambda mib, threads: {"mib": mib, "threads": threads, "seconds": 1.0,
                                                                     "gb_per_s": 1.0})


def test_rows_per_configuration_with_identity_to_the_same_backends_ar(fake_backends, prompts_file):
    cfg = backends.BackendsConfig(backends=("fp32", "bf16"), methods=(), budget=4, prompts_file=str(prompts_file),
                                  max_new_tokens=6, threads=1, llama_cpp=False)
    rows = backends.measure(cfg)
    decode = [r for r in rows if r["kind"] == "decode"]
    assert [(r["backend"], r["method"]) for r in decode] == [("fp32", "ar"), ("fp32", "lookup"),
                                                              ("bf16", "ar"), ("bf16", "lookup")]
    for r in decode:
        assert r["n"] == 2 and r["identical_to_ar"] == 2 and r["tokens_per_s"] > 0  # greedy lookup is lossless
        assert r["vs_llama_cpp_ar"] is None and {"cpu", "bf16_native", "tau"} <= set(r)
    assert decode[0]["budget"] is None and decode[1]["budget"] == 4
    assert {r["kind"] for r in rows} == {"setup", "bandwidth", "backend", "decode"}
    table = to_markdown(rows)
    assert "Best lossless decode per backend" in table and "| fp32 | lookup | 4 |" in table


def test_json_prints_one_row_per_configuration(fake_backends, prompts_file, capsys, tmp_path):
    parser = argparse.ArgumentParser()
    backends.speed_arguments(parser)
    args = parser.parse_args(["--prompts-file", str(prompts_file), "--json", "--backends", "fp32", "--methods", "",
                              "--budget", "4", "--max-new-tokens", "4", "--repeats", "1", "--threads", "1",
                              "--no-llama-cpp", "--out", str(tmp_path / "out")])
    assert backends.wanted(args) and backends.speed_run(args) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["backend"], r["method"]) for r in lines] == [("fp32", "ar"), ("fp32", "lookup")]
    assert (tmp_path / "out" / "table.md").read_text().startswith("# Backends beside llama.cpp")


def test_llama_cpp_ratios_when_its_rows_are_there():
    run = lambda tokens, secs: ([1] * tokens, tokens - 1, secs, None)
    runs = {("fp32", "ar"): [[run(11, 1.0)]], ("llama.cpp", "ar"): [[run(11, 0.25)]],
            ("llama.cpp", "lookup"): [[run(11, 0.2)]]}
    rows = {(r["backend"], r["method"]): r for r in backends.decode_rows(runs, {}, backends.BackendsConfig(), {})}
    assert rows[("fp32", "ar")]["vs_llama_cpp_ar"] == pytest.approx(0.25)
    assert rows[("llama.cpp", "lookup")]["vs_own_ar"] == pytest.approx(1.25)
    assert rows[("llama.cpp", "lookup")]["budget"] is None and rows[("fp32", "ar")]["tau"] is None


def test_unknown_backend_and_missing_quant_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="unknown backends"):
        backends.BackendsConfig(backends=("fp16",))
    monkeypatch.setattr(backends, "load_target", lambda name=None, *, dtype="float32": None)
    with pytest.raises(ValueError, match="needs jetflow.engine.quant"):
        backends.load_backend("q4")


def test_copy_bandwidth_is_positive():
    row = copy_bandwidth(mib=4, repeats=2, threads=1)
    assert row["gb_per_s"] > 0 and row["threads"] == 1

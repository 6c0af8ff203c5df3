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
    monkeypatch.setattr(backends, "load_backend", lambda name, cache_len=None: tiny_target)
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
    assert {r["kind"] for r in rows} == {"setup", "bandwidth", "backend", "decode", "agreement"}
    agree = [r for r in rows if r["kind"] == "agreement"]
    assert [(r["backend"], r["same_as_fp32_ar"]) for r in agree] == [("fp32", 2), ("bf16", 2)]  # one tiny target
    table = to_markdown(rows)
    assert "Best lossless decode per backend" in table and "| fp32 | lookup | 4 |" in table
    assert "| bf16 | 2/2 |" in table


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
    agree = {r["backend"]: r for r in backends.agreement_rows(runs)}
    assert agree["fp32"]["same_as_llama_cpp_ar"] == 1 and agree["llama.cpp"]["common_prefix_fp32"] == 11


def test_unknown_backend_refused_and_names_load_through_the_engine(monkeypatch):
    with pytest.raises(ValueError, match="unknown backends"):
        backends.BackendsConfig(backends=("fp16",))
    calls = []
    monkeypatch.setattr(backends, "engine_load_backend", lambda name, **kw: calls.append((name, kw)))
    backends.load_backend("q4")
    backends.load_backend("bf16-compiled", cache_len=96)
    assert calls == [("q4", {"compile": False, "cache_len": None}), ("bf16", {"compile": True, "cache_len": 96})]
    assert {"q4", "q4-compiled", "fp32-compiled"} <= set(backends.backend_names())


def test_llama_cpp_route_bound_from_its_tree_curve():
    from jetflow.results.llamacpp_verify import route_rows
    curve = [{"kind": "llama-verify", "shape": shape, "size": k, "seconds": 0.01 * k, "ar_steps": k, "past_len": 8}
             for shape in ("chain", "tree") for k in (1, 9, 17)]
    decode = [{"backend": "llama.cpp", "method": "ar", "budget": None, "tau": None, "tokens_per_s": 100.0},
              {"backend": "bf16", "method": "ar", "budget": None, "tau": None, "tokens_per_s": 20.0},
              {"backend": "bf16", "method": "jetflow+lookup", "budget": 16, "tau": 3.4, "tokens_per_s": 30.0}]
    (row,) = route_rows(decode, curve)
    assert row["bound_tokens_per_s"] == pytest.approx(20.0) and row["vs_llama_cpp_ar"] == pytest.approx(0.2)
    from jetflow.results.backends_table import llama_verify_table
    text = "\n".join(llama_verify_table(curve, [], [row]))
    assert "| tree | 10.0 (1.00) |" in text and "| bf16 | jetflow+lookup | 16 | 3.40 | 170.0 | 20.0 | 0.20x | 30.0 |" in text


def test_tree_layout_gives_every_path_the_root():
    from jetflow.results.llamacpp_verify import chain_layout, tree_layout
    assert tree_layout(1, 4) == [(0, (0,))] and chain_layout(3) == [(0, (0,)), (1, (0,)), (2, (0,))]
    nodes = tree_layout(8, 3)
    assert nodes[0] == (0, (0, 1, 2)) and len(nodes) == 8
    assert sorted(d for d, s in nodes if s == (0,)) == [1, 2, 3] and max(d for d, _ in nodes) == 3


def test_llama_cpp_batched_verify_agrees_with_its_ar():
    """With the bench extra: llama.cpp's tree/chain verify runs and one batch predicts its own AR tokens."""
    pytest.importorskip("llama_cpp")
    from jetflow.results import llamacpp, llamacpp_verify
    llm = llamacpp.load(1, 256)
    rows = llamacpp_verify.verify_curve(llm, (1, 4), past_len=16, repeats=1)
    assert {(r["shape"], r["size"]) for r in rows} == {("chain", 1), ("chain", 4), ("tree", 1), ("tree", 4)}
    assert llamacpp_verify.ar_agreement(llm, llm.tokenize(b"1 2 3 4 5"), 6)["same_argmax"] == 6
    llm.close()


def test_copy_bandwidth_is_positive():
    row = copy_bandwidth(mib=4, repeats=2, threads=1)
    assert row["gb_per_s"] > 0 and row["threads"] == 1

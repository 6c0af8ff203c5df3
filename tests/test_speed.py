"""The speed run's pieces on tiny eager targets (no compiling here: test_compiled.py covers that)."""
import pytest
import torch

from jetflow.results.speed import SpeedConfig, agreement_rows, decode_rows, verify_rows
from jetflow.results.speed_table import to_markdown


def fake_runs():
    """(path, method) -> repeats -> per prompt (tokens, decode tokens, decode seconds, tau, draft seconds, rounds)."""
    run = lambda tokens, secs, tau=1.0: ([1] * tokens, tokens - 1, secs, tau, secs / 4, round((tokens - 1) / tau))
    return {("eager", "ar"): [[run(11, 1.0), run(21, 2.0)], [run(11, 2.0), run(21, 3.0)]],
            ("eager", "jetflow"): [[run(11, 0.5, 2.0), run(21, 1.0, 2.0)], [run(11, 0.5, 2.0), run(21, 2.0, 2.0)]],
            ("compiled", "ar"): [[run(11, 0.5), run(21, 1.0)], [run(11, 1.0), run(21, 1.5)]],
            ("llama.cpp", "ar"): [[run(11, 0.1), run(21, 0.2)], [run(11, 0.1), run(21, 0.2)]]}


def test_decode_rows_take_totals_over_prompts_then_medians_over_repeats():
    rows = {(r["path"], r["method"]): r for r in decode_rows(fake_runs(), SpeedConfig(limit=2))}
    assert rows[("eager", "ar")]["tokens_per_s"] == pytest.approx((30 / 3 + 30 / 5) / 2)
    # jetflow's repeats: 30/1.5 = 20 and 30/2.5 = 12 tokens/s against AR's 10 and 6 in the same repeat
    assert rows[("eager", "jetflow")]["speedup"] == pytest.approx(2.0)
    assert rows[("eager", "jetflow")]["tau"] == 2.0 and rows[("eager", "jetflow")]["budget"] == 16
    assert rows[("compiled", "ar")]["vs_eager_ar"] == pytest.approx(((30 / 1.5) / 10 + (30 / 2.5) / 6) / 2)
    assert rows[("llama.cpp", "ar")]["speedup"] == 1.0 and rows[("llama.cpp", "ar")]["identical_to_ar"] == 2
    # jetflow's repeats: 1.5 s and 2.5 s over 5 + 10 rounds, a quarter of it drafting
    assert rows[("eager", "jetflow")]["draft_ms"] == pytest.approx(1e3 * (1.5 + 2.5) / 4 / 2 / 15)
    assert rows[("eager", "jetflow")]["verify_ms"] == pytest.approx(3 * rows[("eager", "jetflow")]["draft_ms"])


@pytest.mark.parametrize("kwargs,message", [({"threads": 0}, "must be >= 1"), ({"verify_sizes": (9, 17)}, "include 1"),
                                            ({"methods": ("ar",)}, "AR is always measured"),
                                            ({"methods": ("nope",)}, "unknown")])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpeedConfig(**kwargs)


def test_verify_rows_are_relative_to_the_one_token_step(tiny_target):
    cfg = SpeedConfig(verify_sizes=(1, 5), verify_repeats=2, past_len=8)
    rows = verify_rows({"eager": tiny_target, "again": tiny_target}, cfg)
    assert {(r["path"], r["size"]) for r in rows} == {(p, k) for p in ("eager", "again") for k in (1, 5)}
    assert all(r["ar_steps"] == 1.0 for r in rows if r["size"] == 1)


def test_agreement_rows_find_the_first_difference_and_its_gap(tiny_target):
    ids = torch.tensor([1, 400, 401])
    rows = agreement_rows(tiny_target, [ids, ids, ids], [[5, 6, 7], [5, 6, 7], [5, 6]], [[5, 6, 7], [5, 9, 7], [5, 6, 7]],
                          ["a", "b", "c"])
    assert [r["first_difference"] for r in rows] == [None, 1, 2]
    assert rows[0]["top2_gap_there"] is None and rows[1]["top2_gap_there"] >= 0


def test_markdown_renders_every_part():
    cfg = SpeedConfig(limit=2)
    rows = [{"kind": "setup", "hardware": "a CPU", "torch": "t", "transformers": "x", "gguf": "g.gguf",
             "llama_cpp": "0.3", "inductor_cache_files_before": 0, "prompts": ["p0", "p1"],
             "config": {**cfg.__dict__}},
            {"kind": "compile", "graph": "target", "size": 1, "seconds": 12.0},
            {"kind": "compile", "graph": "draft:jetflow", "size": None, "seconds": 7.0},
            *[{"kind": "draft", "method": "jetflow", "path": p, "context": 256, "dtype": "bfloat16", "seconds": s,
               "max_abs_diff": 0.001, "argmax_differs": 0} for p, s in (("eager", 0.004), ("compiled", 0.002))],
            {"kind": "verify", "path": "eager", "size": 1, "seconds": 0.05, "ar_steps": 1.0},
            {"kind": "verify", "path": "eager", "size": 17, "seconds": 0.09, "ar_steps": 1.8},
            {"kind": "exactness", "method": "jetflow", "identical_to_compiled_ar": 2, "n_prompts": 2},
            {"kind": "ar-agreement", "prompt": "p0", "first_difference": None, "top2_gap_there": None},
            {"kind": "ar-agreement", "prompt": "p1", "first_difference": 40, "top2_gap_there": 0.01},
            *decode_rows(fake_runs(), cfg)]
    text = to_markdown(rows)
    assert "a CPU" in text and "| llama.cpp | ar |" in text and "90.0 (1.80)" in text
    assert "jetflow 2/2" in text and "first differs at token 40 (top-2 gap 0.01)" in text
    assert "1 tokens 12 s, draft:jetflow 7 s" in text and "| jetflow | bfloat16 | 4.00 | 2.00 | 0.001 | 0 |" in text


def test_profile_rows_split_a_forward_into_its_parts(tiny_target):
    from jetflow.results.speed_bounds import profile_rows
    rows = profile_rows({"eager": tiny_target}, (1, 5), past_len=8, calls=2)
    assert [(r["path"], r["size"]) for r in rows] == [("eager", 1), ("eager", 5)]
    for r in rows:  # the tiny target's lm_head has a vocabulary-sized operand, its layers linears and SDPA
        assert r["lm_head"] > 0 and r["linears"] > 0 and r["attention"] > 0
        assert r["other"] >= 0  # self times inside the profiled calls never exceed their wall time


def test_probe_names_are_checked():
    with pytest.raises(ValueError, match="unknown probes"):
        SpeedConfig(probes=("bf16", "nope"))


def test_markdown_renders_profile_and_probe_rows():
    cfg = SpeedConfig(limit=1)
    verify = [{"kind": "verify", "path": "eager", "size": k, "seconds": s, "ar_steps": s / 0.05}
              for k, s in ((1, 0.05), (17, 0.09))]
    rows = [{"kind": "setup", "hardware": "a CPU", "torch": "t", "transformers": "x", "gguf": "g.gguf", "llama_cpp": None,
             "inductor_cache_files_before": 0, "prompts": ["p0"], "config": {**cfg.__dict__}}, *verify,
            {"kind": "profile", "path": "compiled", "size": 17, "total_ms": 70.0, "lm_head": 20.0, "linears": 30.0,
             "attention": 5.0, "other": 15.0},
            *[{**r, "kind": "probe", "probe": "bf16", "path": "compiled", "dtype": "bfloat16", "cache_len": 512,
               "freezing": True} for r in verify[:1]]]
    text = to_markdown(rows)
    assert "| compiled | 17 | 70.0 | 20.0 | 30.0 | 5.0 | 15.0 |" in text
    assert "| bf16 | compiled | bfloat16 | 512 | True | 50.0 (1.00) | - |" in text and "llama.cpp not run" in text

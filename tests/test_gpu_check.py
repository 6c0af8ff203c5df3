"""Tests for jetflow/gpu_check.py: the whole command end to end on a CPU with tiny shapes, the projection
arithmetic, the published-tau table, the exit status, and the embedded-target check."""
import json

import pytest
import torch

from jetflow.drafting import methods as registry
from jetflow import gpu_check
from jetflow.cli import main
from jetflow.gpu_check import PUBLISHED, VERIFY_TOKENS, Check, Settings, projection

TINY = ["gpu-check", "--device", "cpu", "--shape", "tiny", "--reps", "1", "--samples", "200", "--context", "24",
        "--skip-embedded"]


def test_gpu_check_runs_end_to_end_on_cpu(tmp_path, capsys):
    out = tmp_path / "report" / "gpu-check.json"
    assert main(TINY + ["--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["hardware"]["device"] == "cpu" and report["settings"]["shape"] == "tiny"
    names = [c["name"] for c in report["checks"]]
    assert any("bf16 drafts" in n for n in names) and any("stub proposers" in n for n in names)
    assert "seeded sampling repeats" in names and "sampling distribution == target's" in names
    assert all(c["ok"] for c in report["checks"]), report["checks"]
    oracle = next(c for c in report["checks"] if "stub" in c["name"])["data"]["tau"]["oracle"]
    assert oracle > 5  # the oracle's long accepted paths really went through the tree verify
    t = report["timings_ms"]
    assert t["ar_step"] > 0 and sorted(map(int, t["verify"])) == list(VERIFY_TOKENS)
    assert set(t["draft"]) == {f"{m}@{n}" for m, n in PUBLISHED}
    rows = report["projection"]
    assert len(rows) == sum(len(v) for v in PUBLISHED.values())
    for r in rows:  # the JSON's own numbers reproduce every projected speedup
        round_ms = t["draft"][f"{r['method']}@{r['paper_budget']}"] + t["verify"][str(r["paper_budget"])]
        assert r["projected_speedup"] == pytest.approx(r["tau"] * t["ar_step"] / round_ms)
        assert r["budget"] == r["paper_budget"] - 1
    assert "projected" in printed and f"wrote {out}" in printed


def test_projection_arithmetic():
    t = {"ar_step": 10.0, "verify": {16: 20.0, 64: 30.0, 256: 60.0},
         "draft": {f"{m}@{n}": 5.0 for m, n in PUBLISHED}}
    rows = {(r["method"], r["paper_budget"], r["dataset"]): r for r in projection(t)}
    assert rows["jetflow", 16, "gsm8k"]["projected_speedup"] == pytest.approx(6.00 * 10 / 25)
    assert rows["jetflow", 256, "math500"]["projected_speedup"] == pytest.approx(10.76 * 10 / 65)
    assert rows["ddtree", 256, "mt_bench"]["paper_speedup"] == 4.26


def test_published_table_is_the_papers_grid():
    assert set(PUBLISHED) == {("dflash", 16), ("ddtree", 256), ("jetflow", 16), ("jetflow", 64), ("jetflow", 256)}
    for (method, n), by_dataset in PUBLISHED.items():
        assert n in VERIFY_TOKENS
        assert set(by_dataset) == {"gsm8k", "math500", "humaneval", "mbpp", "mt_bench"}
        assert all(1 < speedup < tau for speedup, tau in by_dataset.values())  # columns not swapped


def crash(s):
    raise RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'")


def test_failing_or_crashing_checks_set_exit_status_1_and_the_report_still_comes_out(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "greedy_checks", lambda s: [Check("planted failure", False, "for the test")])
    monkeypatch.setattr(gpu_check, "sampling_checks", crash)
    assert main(TINY + ["--out", str(tmp_path / "r.json")]) == 1
    printed = capsys.readouterr().out
    assert "FAIL planted failure" in printed
    assert "FAIL sampling checks: raised RuntimeError: Expected a 'cuda' device type" in printed
    report = json.loads((tmp_path / "r.json").read_text())
    assert [c["ok"] for c in report["checks"]] == [False, False] and report["timings_ms"]["ar_step"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_missing_cuda_is_a_clear_error(tmp_path, capsys):
    assert main(["gpu-check", "--out", str(tmp_path / "r.json")]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("change,message", [
    (dict(shape="huge"), "unknown shape 'huge'"), (dict(context=4), "need context > new_taps"),
    (dict(reps=0), "reps 0"), (dict(samples=0), "samples 0"),
])
def test_bad_settings_are_refused(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        gpu_check.run(Settings(**(dict(device="cpu", shape="tiny") | change)), tmp_path / "r.json")


def test_embedded_check_passes_on_cpu(smol):
    (check,) = gpu_check.embedded_checks(Settings(device="cpu", embedded_tokens=16))
    assert check.ok, check.detail
    plain = {m.name for m in registry.METHODS.values() if m.head is not None and not m.lookup_merged and not m.correction}
    assert {"jetflow", "dflash", "ddtree", "jetflow-bp"} <= plain
    assert set(check.data["tau"]) == plain

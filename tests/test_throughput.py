"""Tests for jetflow/results/throughput.py on a tiny random target: both taps sources run the same steps on the
same data, the rows add up, the table renders them, and bad settings are refused."""
import json

import pytest
import torch

from jetflow.cli import main
from jetflow.engine.target import Target
from jetflow.results.throughput import SOURCES, ThroughputConfig, measure, to_markdown
from jetflow.training.step import head_compute
from jetflow.training.config import TrainConfig
from fakes import CharTokenizer, tiny_model


@pytest.fixture
def target():
    return Target(tiny_model("llama", 211, seed=1).to(torch.bfloat16), CharTokenizer(211), "tiny-char")


def head_step_of(cfg) -> str:
    dtype, blockwise = head_compute(cfg, "cpu")
    return f"{str(dtype).removeprefix('torch.')} {'blockwise' if blockwise else 'packed'}"


def test_both_sources_run_the_same_steps_and_the_ratio_is_theirs(target, tmp_path, monkeypatch):
    monkeypatch.setenv("JETFLOW_CACHE", str(tmp_path / "cache"))
    cfg = ThroughputConfig(out=str(tmp_path / "out"), prompts=4, max_new_tokens=12, steps=4, rounds=2, anchors=(4, 2),
                           draft_vocab=0, max_len=600, data_dir="fixtures")
    rows = measure(cfg, target, progress=False)
    assert [(r["anchors"], r["taps"], r["reference"]) for r in rows] == \
        [(a, s, False) for a in (4, 2) for s in SOURCES] + [(4, "cached", True), (2, "cached", True)]
    online, cached, few, _, reference, _ = rows
    assert reference["head_step"] == "float32 packed" and cached["head_step"] == head_step_of(TrainConfig())
    assert reference["supervised_slots"] == cached["supervised_slots"]  # the same steps, another head step
    assert {r["steps"] for r in rows} == {4} and online["prompt_source"] == "fixtures"
    # the same data positions and anchors: the same supervised slots, whatever the speed
    assert online["supervised_slots"] == cached["supervised_slots"] > few["supervised_slots"] > 0
    for r in rows:
        assert r["slots_per_s"] == pytest.approx(r["supervised_slots"] / r["seconds"])
    assert cached["ratio_to_online"] == pytest.approx(cached["slots_per_s"] / online["slots_per_s"])
    assert online["ratio_to_online"] == few["ratio_to_online"] == 1.0 and "hardware" in online and json.dumps(rows)
    table = to_markdown(rows)
    assert table.count("\n| ") == 7 and online["hardware"] in table and f"{cached['ratio_to_online']:.2f}x" in table
    again = measure(cfg, target, progress=False)  # the data and taps are reused (no second regeneration)
    assert again[0]["supervised_slots"] == online["supervised_slots"]
    assert main(["throughput", "--out", str(tmp_path / "o"), "--anchors", "4,x"]) == 2
    assert main(["throughput", "--out", str(tmp_path / "o"), "--anchors", "4,0"]) == 2


def test_bad_settings_are_one_error_line(tmp_path, capsys):
    assert main(["throughput", "--out", str(tmp_path / "o"), "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="steps >= rounds"):
        measure(ThroughputConfig(out=str(tmp_path), steps=2, rounds=3), object())

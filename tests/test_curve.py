"""Tests for jetflow/results/curve.py end to end on a tiny random target over SmolLM2's vocabulary and the bundled
fixture prompts: every ready point trains with one recipe and is replayed, points whose parts are still
being regenerated are skipped, rerunning adds nothing twice, and the rows, table and plot say what ran."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from jetflow.results import curve
from jetflow.cli import main
from jetflow.results.curve import CurveConfig, ready, run, summary, to_markdown, train_config

SETTINGS = dict(anchors=4, seqs_per_step=2, passes=1.0, draft_vocab=64, max_len=64, datasets=("gsm8k", "mt_bench"),
                limit=2, max_new_tokens=6, budgets=(4, 8), data_dir="fixtures", holdout=2)


def write_part(folder, k, n, whole=True, seed=0):
    """A part of a chunked regeneration: n rows; ``whole`` writes the .meta.json regenerate leaves at its end."""
    g = torch.Generator().manual_seed(seed + k)
    path = folder / f"part-{k:02d}-of-03.jsonl"
    rows = [{"settings": {"chunk": k, "chunks": 3}}] + [
        {"id": f"gsm8k-train:{k}-{i}", "prompt_ids": torch.randint(3, 400, (4 + i % 3,), generator=g).tolist(),
         "response_ids": torch.randint(3, 400, (10 + i % 5,), generator=g).tolist()} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if whole:
        path.with_name(path.name + ".meta.json").write_text(json.dumps({"command": "python -m jetflow regenerate"}))


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "regen"
    root.mkdir()
    write_part(root, 0, 20)
    write_part(root, 1, 20)
    write_part(root, 2, 5, whole=False)  # still being regenerated
    return root


def test_a_part_is_ready_once_regenerate_has_finished_it(folder):
    assert ready(folder, 1) and ready(folder, 2) and not ready(folder, 3) and not ready(folder, 4)


def test_one_recipe_and_the_same_passes_for_every_point(folder, tmp_path):
    cfg = CurveConfig(out=str(tmp_path / "out"), data=str(folder), work=str(tmp_path / "work"), passes=3.0, **{
        k: v for k, v in SETTINGS.items() if k != "passes"})
    one, two = (train_config(cfg, k, "causal", tmp_path / "taps") for k in (1, 2))
    assert (one.parts, two.parts) == (1, 2) and one.steps == 3 * 4 // 2 and two.steps == 3 * 24 // 2
    assert {f: getattr(one, f) for f in ("lr", "anchors_per_seq", "loss", "taps", "causal", "gamma")} == \
        {f: getattr(two, f) for f in ("lr", "anchors_per_seq", "loss", "taps", "causal", "gamma")}
    bidir = train_config(cfg, 1, "bidirectional", tmp_path / "taps")
    assert not bidir.causal and bidir.gamma == 7.0 and bidir.steps == one.steps and bidir.out != one.out
    assert Path(one.out).name == "causal-k1-p3"  # other passes: another head, in a folder of its own
    assert Path(train_config(replace(cfg, passes=2.0), 1, "causal", tmp_path / "taps").out).name == "causal-k1"


@pytest.mark.parametrize("tiny_target", ["llama"], indirect=True)
def test_the_curve_end_to_end(tiny_target, folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JETFLOW_CACHE", str(tmp_path / "cache"))
    cfg = CurveConfig(out=str(tmp_path / "out"), data=str(folder), work=str(tmp_path / "work"), parts=(1, 2, 4),
                      **SETTINGS)
    rows = run(cfg, tiny_target, tiny_target, progress=False)
    assert "skipped k = [4]" in capsys.readouterr().out
    points = {(r["parts"], r["head"]) for r in rows}
    assert points == {(k, h) for k in (1, 2) for h in ("causal", "bidirectional")}
    assert {r["method"] for r in rows} == {"jetflow", "jetflow-bp", "ddtree", "dflash"}
    assert {r["dataset"] for r in rows} == {"gsm8k", "mt_bench"} and {r["budget"] for r in rows} == {4, 8}
    assert {r["n_prompts"] for r in rows} == {2} and all(r["tau"] >= 1 for r in rows)
    seen = {k: {r["response_tokens_seen"] for r in rows if r["parts"] == k and r["head"] == "causal"} for k in (1, 2)}
    assert len(seen[1]) == len(seen[2]) == 1 and seen[2].pop() > seen[1].pop() > 0  # one pass: more data, more seen
    assert {r["train_sequences"] for r in rows if r["parts"] == 2} == {24}
    out = tmp_path / "out"
    assert json.loads((out / "rows.json").read_text()) == json.loads(json.dumps(rows))
    table = (out / "table.md").read_text()
    assert table == to_markdown(rows) and table.count("| jetflow | gsm8k | ") == 3 and "1/3" in table and "2/3" in table
    assert "per doubling" in table and "| k 1 -> 2 |" in table  # two tau lines and one gain line per method, dataset
    assert "plotly" in (out / curve.PLOT).read_text()
    lines = summary(rows, 8)  # a line per head method and point, a tau per dataset
    assert len(lines) == 4 * 2 and all("gsm8k" in l and "mt_bench" in l for l in lines)
    first = next(r for r in rows if r["method"] == "jetflow" and r["parts"] == 1 and r["budget"] == 8)
    assert lines[0].startswith("jetflow    k = 1/3") and f"{first['dataset']} {first['tau']:.2f}" in lines[0]
    with pytest.raises(ValueError, match="no row at budget 5"):
        summary(rows, 5)
    # rerunning trains and replays only the points not done yet: here the one whose part has since finished
    import jetflow.evaluation.replay
    import jetflow.training.train
    trained, real_train = [], jetflow.training.train.train
    monkeypatch.setattr(jetflow.training.train, "train", lambda c, *a, **k: trained.append((c.parts, c.causal)) or real_train(c, *a, **k))
    assert json.loads(json.dumps(run(cfg, tiny_target, tiny_target, progress=False))) == json.loads(json.dumps(rows))
    assert trained == []
    write_part(folder, 2, 5)  # part 2 of 3 is whole now; --parts 4 still waits
    capsys.readouterr()
    done = run(replace(cfg, parts=(1, 2, 3, 4), done_only=True), tiny_target, tiny_target, progress=False)
    assert trained == [] and {r["parts"] for r in done} == {1, 2}  # k = 3 is ready but not trained: left out
    assert "skipped k = [3, 4]: not trained and replayed yet (--done-only)" in capsys.readouterr().out
    assert all("done_only" not in r["curve"] for r in done)  # how it ran is not a setting of the rows
    with pytest.raises(ValueError, match="--done-only: no point"):
        run(replace(cfg, parts=(3,), done_only=True), tiny_target, tiny_target, progress=False)
    assert trained == []
    more = run(replace(cfg, parts=(1, 2, 3, 4)), tiny_target, tiny_target, progress=False)
    assert trained == [(3, True), (3, False)] and {r["parts"] for r in more} == {1, 2, 3}
    # only the point that reaches the last part holds its 2 profile rows out: 45 rows - 16 evaluation - 2
    assert {r["train_sequences"] for r in more if r["parts"] == 3} == {27}
    assert {"--holdout 2" in r["train_command"] for r in more} == {True, False}
    replayed, real_replay = [], jetflow.evaluation.replay.replay
    monkeypatch.setattr(jetflow.evaluation.replay, "replay", lambda *a, **k: replayed.append(a[3]) or real_replay(*a, **k))
    state = tmp_path / "work" / "causal-k1-p1" / "checkpoint" / "train_state.json"  # passes 1: not the default 2
    before = state.stat().st_mtime_ns
    fewer = run(replace(cfg, parts=(1,), budgets=(8,)), tiny_target, tiny_target, progress=False)
    assert replayed == [(8,), (8,)] and state.stat().st_mtime_ns == before  # other budgets: replayed, not retrained
    assert {r["budget"] for r in fewer} == {8}
    drop = lambda rs: [{k: v for k, v in r.items() if k != "curve"} for r in json.loads(json.dumps(list(rs)))]
    assert drop(r for r in more if r["parts"] < 3) == drop(rows)  # the earlier points' rows as they were
    # --keep: a point run alone is added to the rows already in --out (the others need no head here)
    run(replace(cfg, parts=(1, 2)), tiny_target, tiny_target, progress=False)
    del trained[:]
    kept = run(replace(cfg, parts=(3,), keep=True), tiny_target, tiny_target, progress=False)
    assert drop(kept) == drop(more) and json.loads((out / "rows.json").read_text()) == json.loads(json.dumps(kept))
    assert {tuple(r["curve"]["parts"]) == (3,) for r in kept} == {True, False} and all("keep" not in r["curve"] for r in kept)
    assert (out / "table.md").read_text() == to_markdown(kept) and "| k 2 -> 3 |" in to_markdown(kept)
    with pytest.raises(ValueError, match="--keep: the kept row of causal k = 1"):  # kept at budgets 4 and 8
        run(replace(cfg, parts=(3,), budgets=(8,), keep=True), tiny_target, tiny_target, progress=False)
    assert trained == []  # k = 3 reused its replay.json; the refused run did nothing first


def test_bad_settings_are_clear_errors(folder, tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown head kind"):
        CurveConfig(out="x", heads=("sideways",))
    with pytest.raises(ValueError, match="passes > 0"):
        CurveConfig(out="x", passes=0)
    with pytest.raises(ValueError, match="no point is ready"):
        run(CurveConfig(out=str(tmp_path / "o"), data=str(folder), parts=(4,)), object(), object())
    assert main(["curve", "--out", str(tmp_path / "o"), "--data", str(folder), "--parts", "4",
                 "--data-dir", "fixtures"]) == 2
    assert "no point is ready" in capsys.readouterr().err


def test_gains_per_doubling_of_the_tokens_seen():
    """(tau_b - tau_a) / log2(seen_b / seen_a) between consecutive points, per method and dataset; the table
    puts each pair of points in a column."""
    from jetflow.results.curve import gains, gains_table
    rows = [{"method": m, "dataset": "gsm8k", "parts": k, "budget": 64, "tau": tau, "response_tokens_seen": seen}
            for m, pts in {"jetflow": [(1, 2.0, 1000), (2, 3.0, 4000), (4, 3.5, 8000)],
                           "ddtree": [(1, 2.0, 1000), (2, 2.5, 2000)]}.items() for k, tau, seen in pts]
    g = {(r["method"], r["from"], r["to"]): r["per_doubling"] for r in gains(rows, 64)}
    assert g == {("jetflow", 1, 2): pytest.approx(0.5), ("jetflow", 2, 4): pytest.approx(0.5),
                 ("ddtree", 1, 2): pytest.approx(0.5)}
    lines = gains_table(rows, 64).splitlines()
    assert lines[0] == "| method | dataset | k 1 -> 2 | k 2 -> 4 |"
    assert lines[2] == "| ddtree | gsm8k | +0.50 |  |" and lines[3] == "| jetflow | gsm8k | +0.50 | +0.50 |"
    with pytest.raises(ValueError, match="no row at budget 16"):
        gains(rows, 16)


@pytest.mark.parametrize("tiny_target", ["llama"], indirect=True)
def test_a_data_parallel_peer_trains_the_points_and_leaves_the_rest_to_the_main_process(tiny_target, folder, tmp_path,
                                                                                       monkeypatch):
    # under `accelerate launch` every process runs the command: all train each point together (the launch itself is
    # tests/test_distributed.py's), and only the main one loads the fp32 target, replays and writes the rows
    import jetflow.training.train
    monkeypatch.setenv("JETFLOW_CACHE", str(tmp_path / "cache"))
    cfg = CurveConfig(out=str(tmp_path / "out"), data=str(folder), work=str(tmp_path / "work"), parts=(1, 2), **SETTINGS)
    trained = []
    monkeypatch.setattr(jetflow.training.train, "train", lambda c, *a, **k: trained.append((c.parts, c.causal)))
    monkeypatch.setattr(curve, "_is_main", lambda: False)
    assert run(cfg, tiny_target, object(), progress=False) == []  # object(): the fp32 target is never touched
    assert trained == [(1, True), (1, False), (2, True), (2, False)] and not (tmp_path / "out" / "rows.json").exists()
    monkeypatch.setattr(curve, "_is_main", lambda: True)  # the main process finds the heads untrained: a clear error
    with pytest.raises(RuntimeError, match="the head of causal k = 1 is not trained yet"):
        run(cfg, tiny_target, tiny_target, progress=False)


def test_the_same_steps_spent_on_more_data_are_set_beside_the_nearest_point():
    def row(k, steps, passes, tau, budget=8, method="jetflow"):
        return {"head": "causal", "parts": k, "of_parts": 4, "steps": steps, "passes": passes, "method": method,
                "dataset": "gsm8k", "budget": budget, "tau": tau, "response_tokens_seen": 100 * steps,
                "heldout_acc1": 0.1 * k, "n_prompts": 2}
    rows = [row(1, 10, 2.0, 1.5), row(2, 20, 2.0, 2.0), row(2, 20, 2.0, 2.2, budget=16)]
    other = [row(4, 19, 1.0, 2.5), row(4, 19, 1.0, 2.2, budget=16)]
    table = curve.same_steps_table(rows, other)
    assert "| jetflow | gsm8k | 2.00 -> 2.50 (+25.0 %) | 2.20 -> 2.20 (+0.0 %) |" in table  # k = 2: 20 steps, nearest 19
    assert "k = 2/4 for 2 passes (20 steps, 2,000 response tokens seen" in table and "k = 4/4 for 1 pass (19 steps" in table
    with pytest.raises(ValueError, match="no causal point"):
        curve.same_steps_table([dict(r, head="bidirectional") for r in rows], other)

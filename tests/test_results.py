"""Tests for jetflow/results/manifest.py: every committed result folder has one manifest entry whose command and
renderer reproduce what is committed (its rows' settings and its table.md)."""
import json

import pytest

from jetflow.results import manifest as results
from jetflow.evaluation.bench import BenchConfig
from jetflow.cli import build_parser, main
from jetflow.util.flags import given
from jetflow.results.diagnose import DiagnoseConfig
from jetflow.evaluation.replay import ReplayConfig
from jetflow.results.report import RESULTS

FOLDERS = sorted(p.name for p in RESULTS.iterdir() if p.is_dir())


def test_every_committed_folder_has_one_entry():
    assert sorted(results.ENTRIES) == FOLDERS


def config_of(name):
    args = build_parser().parse_args(results.command(name))
    if args.command == "diagnose":
        return DiagnoseConfig(**given(args, DiagnoseConfig))
    cls = ReplayConfig if args.command == "replay" else BenchConfig
    return BenchConfig.from_name("cpu", **given(args, cls)) if cls is BenchConfig else ReplayConfig(**given(args, cls))


@pytest.mark.parametrize("name", FOLDERS)
def test_the_entry_reproduces_the_committed_folder(name):
    rows = json.loads((RESULTS / name / "rows.json").read_text())
    assert results.command(name)[-2:] == ["--out", str(RESULTS / name)]
    if results.entry(name).argv[0] == "correction-cost":  # timed rows of the path correction, per prompt and budget
        from jetflow.results.correction_cost import CostConfig
        args = build_parser().parse_args(results.command(name))
        cfg = CostConfig(**given(args, CostConfig))
        assert {r["budget"] for r in rows} == set(cfg.budgets) and len({r["prompt"] for r in rows}) == cfg.prompts
        assert (RESULTS / name / "table.md").read_text() == results.entry(name).renderer(rows)
        return
    if results.entry(name).argv[0] == "verify-curve":  # one setup row holds the run's settings
        from jetflow.results.verify_curve import VerifyCurveConfig
        cfg = VerifyCurveConfig(**given(build_parser().parse_args(results.command(name)), VerifyCurveConfig))
        got = rows[0]["config"]
        assert rows[0]["kind"] == "setup" and (got["repeats"], got["calibrate"], got["max_new_tokens"]) == \
            (cfg.repeats, cfg.calibrate, cfg.max_new_tokens)
        assert (RESULTS / name / "table.md").read_text() == results.entry(name).renderer(rows)
        return
    if results.entry(name).argv[0] == "speed":  # one setup row holds the run's settings
        from jetflow.results import speed
        args = build_parser().parse_args(results.command(name))
        assert rows[0]["kind"] == "setup" and rows[0]["config"]["limit"] == speed.config_of(args).limit
        assert (RESULTS / name / "table.md").read_text() == results.entry(name).renderer(rows)
        return
    if results.entry(name).argv[0] == "throughput":  # every row holds the run's settings
        from jetflow.results.throughput import SOURCES, ThroughputConfig
        args = build_parser().parse_args(results.command(name))
        cfg = ThroughputConfig(**given(args, ThroughputConfig))
        assert [(r["anchors"], r["taps"]) for r in rows if not r["reference"]] == \
            [(a, s) for a in cfg.anchors for s in SOURCES]
        assert [r["anchors"] for r in rows if r["reference"]] == (list(cfg.anchors) if cfg.reference else [])
        assert {r["steps"] for r in rows} == {cfg.steps} and {r["dtype"] for r in rows} == {cfg.dtype}
        assert (RESULTS / name / "table.md").read_text() == results.entry(name).renderer(rows)
        return
    if results.entry(name).argv[0] == "curve":  # the ready points of the curve, each head replayed at every budget
        from jetflow.results.curve import HEADS, CurveConfig
        args = build_parser().parse_args(results.command(name))
        cfg = CurveConfig(**given(args, CurveConfig))
        assert {r["parts"] for r in rows} <= set(cfg.parts) and {r["head"] for r in rows} == set(cfg.heads)
        for r in rows:
            assert r["method"] in HEADS[r["head"]][1] and r["passes"] == cfg.passes
        points = {(r["parts"], r["head"]) for r in rows}
        assert sorted((r["parts"], r["head"], r["method"], r["dataset"], r["budget"]) for r in rows) == sorted(
            (k, h, m, d, b) for k, h in points for m in HEADS[h][1] for d in cfg.datasets for b in cfg.budgets)
        assert {r["n_prompts"] for r in rows} == {cfg.limit} and {r["dtype"] for r in rows} == {"float32"}
        assert (RESULTS / name / "table.md").read_text() == results.entry(name).renderer(rows)
        return
    cfg = config_of(name)
    if isinstance(cfg, DiagnoseConfig):
        heldout = ["heldout"] if cfg.heldout else []
        assert list(dict.fromkeys(r["dataset"] for r in rows)) == list(cfg.datasets) + heldout
        assert {r["n_prompts"] for r in rows if r["dataset"] != "heldout"} == {cfg.limit}
        assert {r["n_prompts"] for r in rows if r["dataset"] == "heldout"} <= {cfg.heldout}
        assert {r["dtype"] for r in rows} == {"float32"}
        assert (RESULTS / name / "table.md").read_text() == results.entry(name).renderer(rows)
        return
    assert {r["method"] for r in rows} == set(cfg.methods) | ({"ar"} if isinstance(cfg, BenchConfig) else set())
    assert list(dict.fromkeys(r["dataset"] for r in rows)) == list(cfg.datasets)
    assert {r["budget"] for r in rows} - {None} == set(cfg.budgets)
    assert {r["n_prompts"] for r in rows} == {cfg.limit}
    assert {r["dtype"] for r in rows} == {getattr(cfg, "dtype", "float32")}
    if isinstance(cfg, ReplayConfig):  # widths only for the builders that take one
        from jetflow.drafting.methods import method
        from jetflow.drafting.builders import BUILDERS
        widths = set(cfg.widths) if any("width" in BUILDERS[method(m).builder].options for m in cfg.methods) else set()
        assert {r["width"] for r in rows} - {None} == widths
    assert (RESULTS / name / "table.md").read_text() == results.entry(name).renderer(rows)


def test_batches_run_side_by_side_in_order(capsys):
    assert results.batches("results")[:2] == [["cpu-replay-tau"], ["cpu-gsm8k-fp32-causal", "cpu-gsm8k-fp32-bidir"]]
    assert sorted(n for b in results.batches("table") for n in b) == [n for n in FOLDERS if "-table-" in n]
    assert main(["results", "--batches", "merged"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "cpu-replay-tau-merged"


def test_render_rewrites_table_md_from_rows(tmp_path):
    (tmp_path / "cpu-replay-tau").mkdir()
    (tmp_path / "cpu-replay-tau" / "rows.json").write_text((RESULTS / "cpu-replay-tau" / "rows.json").read_text())
    path = results.render("cpu-replay-tau", tmp_path)
    assert path.read_text() == (RESULTS / "cpu-replay-tau" / "table.md").read_text()


def test_unknown_names_are_clear_errors(capsys):
    assert main(["results", "cpu-nope"]) == 2 and "unknown result 'cpu-nope'" in capsys.readouterr().err
    assert main(["results", "--batches", "nope"]) == 2

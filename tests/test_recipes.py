"""Tests for jetflow/training/recipes.py and jetflow/views/viz_train.py: the full recipe is the shipped head's own
(command for command), provenance holds no machine-local path, the smoke recipe runs and resumes."""
import json
import re
from pathlib import Path

import pytest

from jetflow.data.regenerate import load_regenerated
from jetflow.training import recipes
from jetflow.views import viz_train
from jetflow.util.paths import shipped_head_dir
from jetflow.training.train import train
from jetflow.training.config import command_for

SHIPPED = {kind: json.loads((shipped_head_dir(kind) / "provenance.json").read_text()) for kind in ("jetflow", "dflash")}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JETFLOW_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def as_in_cache(command: str) -> str:
    """A shipped command as it reads when the cache folder is $JETFLOW_CACHE instead of the default."""
    return command.replace("~/.cache/jetflow/", "$JETFLOW_CACHE/")


def test_full_recipe_is_the_shipped_jetflow_head(cache):
    recipe = recipes.RECIPES["full"]
    root = recipes.recipe_dir(recipe)
    assert root == cache / "heads"
    first = recipes.stage_config(recipe, root, 0)
    (root / "jetflow").mkdir(parents=True)
    (root / "jetflow" / "config.json").write_text("{}")  # the second stage needs its init to exist
    second = recipes.stage_config(recipe, root, 1)
    shipped = SHIPPED["jetflow"]
    assert [command_for(first), command_for(second)] == [as_in_cache(c) for c in [*shipped["lineage"], shipped["command"]]]
    assert recipes.regenerate_command(recipe, root / recipe.data_file) == as_in_cache(shipped["data"]["command"])
    config = {k: v for k, v in shipped["config"].items() if k not in ("data", "out", "init")}
    assert {k: v for k, v in vars(second).items() if k in config} == config


def machine_local(text: str) -> list[str]:
    """Absolute paths in a text: tokens that start with / (a URL's // or a markdown table's | are not)."""
    return [t for t in re.split(r"[\s'\"`(),]+", text) if t.startswith("/") and not t.startswith("//")]


@pytest.mark.parametrize("kind", ["jetflow", "dflash"])
@pytest.mark.parametrize("name", ["provenance.json", "PROVENANCE.md"])
def test_shipped_provenance_holds_no_machine_local_path(kind, name):
    text = (shipped_head_dir(kind) / name).read_text()
    assert machine_local(text) == []
    assert "~/.cache/jetflow/heads/regen-3030.jsonl" in text


@pytest.mark.parametrize("name", ["quick", "smoke"])
def test_other_recipes_train_one_stage_from_the_target(name, tmp_path):
    recipe = recipes.RECIPES[name]
    cfg = recipes.stage_config(recipe, tmp_path, 0)
    assert len(recipe.stages) == 1 and cfg.init == "target" and cfg.causal
    assert cfg.data == str(tmp_path / recipe.data_file) and cfg.out == str(tmp_path / "jetflow")
    assert cfg.eval_seqs < recipe.regen.n and cfg.steps >= cfg.eval_every


@pytest.mark.parametrize("bad, match", [(dict(index=2), "has 1 stage"), (dict(index=-1), "has 1 stage")])
def test_stage_config_bad_index(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        recipes.stage_config(recipes.RECIPES["quick"], tmp_path, **bad)


def test_smoke_recipe_needs_a_folder():
    with pytest.raises(ValueError, match="no folder of its own"):
        recipes.recipe_dir(recipes.RECIPES["smoke"])


def test_smoke_recipe_runs_resumes_and_records_portable_provenance(tiny_target, cache):
    recipe, root = recipes.RECIPES["smoke"], cache / "smoke"
    regen = recipes.regenerate(recipe, root, tiny_target, progress=False)
    assert len(load_regenerated(regen)) == 3
    meta = json.loads(regen.with_name(regen.name + ".meta.json").read_text())
    assert meta["command"].startswith("python -m jetflow regenerate --n 3 --out $JETFLOW_CACHE/smoke/regen-3.jsonl")
    cfg = recipes.stage_config(recipe, root, 0)
    head, history = train(cfg, tiny_target, progress=False)
    again, history_again = train(cfg, tiny_target, progress=False)   # finished: resumes at the end
    assert history_again == history and [h["step"] for h in history if h["acc"] is not None] == [0, 2, 4]
    prov = json.loads((root / "jetflow" / "provenance.json").read_text())
    assert prov["data"]["command"] == meta["command"]
    assert prov["config"]["data"] == "$JETFLOW_CACHE/smoke/regen-3.jsonl"
    text = (root / "jetflow" / "provenance.json").read_text() + (root / "jetflow" / "PROVENANCE.md").read_text()
    assert str(cache) not in text and machine_local(text) == []
    with pytest.raises(ValueError, match="answers in bfloat16; got a torch.float32 target"):
        recipes.regenerate(recipes.RECIPES["quick"], root, tiny_target)


# ----------------------------------------------------------------------------- shipped curves, figure
def test_shipped_histories_are_the_committed_curves():
    hist = recipes.shipped_histories()
    for kind, rows in hist.items():
        points = viz_train.curve_points(rows)
        assert points[0][0] == 0 and points[-1][0] == SHIPPED[kind]["steps"]
        assert points[-1][1] == pytest.approx(SHIPPED[kind]["final"]["sim_tau"])
        assert points[-1][1] > points[0][1]  # the shipped second stage raised tau


def test_heads_curves_plots_every_evaluated_step():
    hist = {"a": [{"step": 0, "acc": [0.1, 0.0], "sim_tau": 1.1}, {"step": 1, "acc": None, "sim_tau": None},
                  {"step": 2, "acc": [0.3, 0.1], "sim_tau": 1.33}],
            "b": [{"step": 0, "acc": [0.2], "sim_tau": 1.2}]}
    fig = viz_train.heads_curves(hist).to_dict()
    traces = [(t["name"], t["xaxis"], list(t["x"]), list(t["y"])) for t in fig["data"]]
    assert traces == [("a", "x", [0, 2], [1.1, 1.33]), ("a", "x2", [0, 2], [0.1, 0.3]),
                      ("b", "x", [0], [1.2]), ("b", "x2", [0], [0.2])]


@pytest.mark.parametrize("hist, match", [({}, "at least one history"), ({"a": [{"step": 0, "acc": None}]}, "no evaluated")])
def test_heads_curves_bad_input(hist, match):
    with pytest.raises(ValueError, match=match):
        viz_train.heads_curves(hist)

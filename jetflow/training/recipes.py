"""Training recipes for a JetFlow head on the embedded target, as data, run into the cache folder.

    recipe = RECIPES["quick"]                          # "full": the shipped head's recipe; "smoke": seconds
    root = recipe_dir(recipe)                          # ~/.cache/jetflow/heads-quick (cache_dir())
    regen = regenerate(recipe, root, target)           # the target answers the recipe's prompts
    for i in range(len(recipe.stages)):                # each stage starts from the one before it
        cfg = stage_config(recipe, root, i)
        head, history = train(cfg, load_target(cfg.model, dtype=cfg.dtype))

Everything a recipe writes stays in its folder, so running it again resumes: ``regenerate`` skips the
answers already written and ``train`` continues each stage from its last checkpoint (or returns a
finished one at once). ``full`` is what ``make heads`` runs for the JetFlow head, in the same folder
(``~/.cache/jetflow/heads``): 3,030 answers, 2,200 steps from the target's own layers, then 2,000 more
from that head; ``tests/test_recipes.py`` checks that its commands are the shipped head's provenance.
``quick`` trains one short stage on 192 answers in ~15 minutes on a free core (13.4 measured end to end in
02): half the anchors (a step ~1 s), a peak lr of 6e-3 and depth 1 weighted most (gamma 0.5), so that the head
leaves the unigram plateau; held-out simulated tau 1.00 -> 1.20 in that run (02's closing note). ``smoke``
runs in seconds on the bundled fixture prompts in fp32.

``shipped_histories()`` reads the shipped heads' committed training curves (``history.jsonl``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jetflow.data import regenerate as regeneration
from jetflow.data.prompts import training_prompts
from jetflow.util import jsonl
from jetflow.util import paths
from .config import TrainConfig


@dataclass(frozen=True)
class Regen:
    """How the training answers are made (the options of ``python -m jetflow regenerate``)."""
    n: int                        # training prompts (training_prompts: 50% math, 25% code, 25% chat)
    seed: int = 0
    batch_size: int = 16
    max_new_tokens: int = 128     # answers are cut here
    max_prompt_tokens: int = 256  # longer prompts are skipped
    dtype: str = "bfloat16"       # the target's dtype while answering
    data_dir: str | None = None   # the prompts' source (paths.data_dir); None: $JETFLOW_DATA_DIR or the hub


@dataclass(frozen=True)
class Recipe:
    name: str
    folder: str                   # under cache_dir(); "" = the caller names the folder (smoke: a temp dir)
    regen: Regen
    stages: tuple[tuple[str, dict], ...]  # (output folder, TrainConfig.from_name(preset) overrides)
    preset: str = "cpu"
    minutes: int = 0              # rough wall time on 2 CPU cores, one torch thread

    @property
    def data_file(self) -> str:
        return f"regen-{self.regen.n}.jsonl"


SHIPPED = dict(loss="ce", seqs_per_step=2, anchors_per_seq=64, draft_vocab=8192)  # both shipped stages
RECIPES = {
    # the shipped JetFlow head (data/heads/smollm2-135m-jetflow): ~25 + ~75 + ~80 minutes
    "full": Recipe("full", "heads", Regen(3030), (
        ("jetflow", dict(SHIPPED, gamma=4.0, gamma_start=0.5, steps=2200)),
        ("jetflow-more", dict(SHIPPED, gamma=4.0, steps=2000, lr=5e-4, seed=1))), minutes=180),
    # one short stage, ~15 minutes on a free core: the shipped curriculum (gamma 4 reached early) or a peak lr of 1e-3
    # left 200-240 steps on the unigram plateau (simulated tau 1.09); 32 anchors make a step ~1 s, and a 6e-3 peak with
    # depth 1 weighted most (gamma 0.5) left it after ~150-200 steps (300 steps: 1.11; these 640: 1.20)
    "quick": Recipe("quick", "heads-quick", Regen(192, max_new_tokens=96), (
        ("jetflow", dict(SHIPPED, anchors_per_seq=32, lr=6e-3, gamma=0.5, steps=640, eval_every=80,
                         save_every=80)),), minutes=15),
    # seconds: three fixture answers, fp32 so that the run is the same on every machine
    "smoke": Recipe("smoke", "", Regen(3, batch_size=4, max_new_tokens=48, dtype="float32", data_dir="fixtures"),
                    (("jetflow", dict(dtype="float32", max_len=320)),), preset="smoke"),  # room for the prompts
}


def recipe_dir(recipe: Recipe) -> Path:
    """The recipe's folder under the cache folder (``paths.cache_dir()``)."""
    if not recipe.folder:
        raise ValueError(f"recipe {recipe.name!r} has no folder of its own; pass one to regenerate and stage_config")
    return paths.cache_dir() / recipe.folder


def regenerate_command(recipe: Recipe, out: Path) -> str:
    """The ``python -m jetflow regenerate`` line that makes the same file (paths portable)."""
    r = recipe.regen
    args = ["python", "-m", "jetflow", "regenerate", "--n", str(r.n), "--out", paths.portable_path(out),
            "--batch-size", str(r.batch_size), "--max-new-tokens", str(r.max_new_tokens),
            "--max-prompt-tokens", str(r.max_prompt_tokens), "--seed", str(r.seed)]
    args += ["--dtype", r.dtype] if r.dtype != "bfloat16" else []
    args += ["--data-dir", r.data_dir] if r.data_dir else []
    return paths.shell_join(args)


def regenerate(recipe: Recipe, root: str | Path, target, *, progress: bool = True) -> Path:
    """Let ``target`` answer the recipe's training prompts into ``root/regen-N.jsonl`` (resumable), with
    the ``.meta.json`` beside it that training provenance reads. -> the data file."""
    r, out = recipe.regen, Path(root) / recipe.data_file
    if str(target.dtype).removeprefix("torch.") != r.dtype:
        raise ValueError(f"recipe {recipe.name!r} answers in {r.dtype}; got a {target.dtype} target")
    prompts = training_prompts(r.n, seed=r.seed, data_dir=r.data_dir)
    regeneration.regenerate(target, prompts, out, batch_size=r.batch_size, max_new_tokens=r.max_new_tokens,
                            max_prompt_tokens=r.max_prompt_tokens, progress=progress)
    out.with_name(out.name + ".meta.json").write_text(json.dumps({"command": regenerate_command(recipe, out)}) + "\n")
    return out


def stage_config(recipe: Recipe, root: str | Path, index: int) -> TrainConfig:
    """The ``TrainConfig`` of stage ``index`` (0-based), writing to ``root/<stage>``; a later stage
    starts (``init``) from the head the stage before it wrote, so build it once that one has finished."""
    if not 0 <= index < len(recipe.stages):
        raise ValueError(f"recipe {recipe.name!r} has {len(recipe.stages)} stage(s), got index {index}")
    root = Path(root)
    name, overrides = recipe.stages[index]
    init = {"init": str(root / recipe.stages[index - 1][0])} if index else {}
    return TrainConfig.from_name(recipe.preset, data=str(root / recipe.data_file), out=str(root / name),
                                 **overrides, **init)


def shipped_histories(kinds: tuple[str, ...] = ("jetflow", "dflash")) -> dict[str, list[dict]]:
    """kind -> the committed training curve of the head shipped for the embedded target (its
    ``history.jsonl``: one entry per step, ``acc`` / ``sim_tau`` on evaluated steps)."""
    from jetflow.util.paths import shipped_head_dir
    out = {}
    for kind in kinds:
        path = shipped_head_dir(kind) / "history.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: the shipped {kind} head has no training curve")
        out[kind] = jsonl.read(path, repair=False)
    return out

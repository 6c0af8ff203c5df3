"""One training run's state: the run's objects (``TrainingRun``), its progress, its checkpoint (swapped in
whole), its history and its output folder.

Resume is exact: data order and anchors are pure functions of (seed, data position) (``jetflow.training.step``),
and the checkpoint holds the head, AdamW, scheduler and RNG states (``accelerate.save_state``) beside
``train_state.json``; a checkpoint of another config or other data is refused.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from torch import nn

from jetflow.drafting.head import DraftHead
from jetflow.util import jsonl
from .config import LEGACY, TrainConfig


@dataclass
class Progress:
    """What a checkpoint adds to the accelerate state; persisted as ``checkpoint/train_state.json``."""
    step: int = 0
    data_position: int = 0        # training sequences consumed so far (the next one is row_at(data_position))
    elapsed_s: float = 0.0        # wall time of all runs so far
    tokens: dict = field(default_factory=dict)  # context_tokens, response_tokens, supervised_slots


@dataclass
class TrainingRun:
    """One training run as it goes: the config, the frozen target, accelerate's prepared objects, the data."""
    cfg: TrainConfig
    target: object
    accelerator: object
    blocks: nn.Module             # BlockForward(head), prepared (DDP-wrapped under accelerate launch)
    optimizer: object
    scheduler: object
    train_seqs: list              # [(ids (S,), prompt_len)]
    eval_seqs: list
    out: Path
    train_rows: list = field(default_factory=list)  # the data row of each training sequence
    source: object = None         # the taps source: (row, ids, logits) -> (teacher logits | None, taps)
    data_sha256: str = ""         # the data files by content (resume refuses other data)
    holdout_ids: list = field(default_factory=list)  # the ids of the rows --holdout kept out of training

    @property
    def head(self) -> DraftHead:
        return self.accelerator.unwrap_model(self.blocks).head


# ----------------------------------------------------------------------------- the checkpoint
def save_checkpoint(run: TrainingRun, progress: Progress) -> None:
    """accelerate state (head, AdamW, scheduler, RNG) + train_state.json, swapped in by renames so a kill
    at any point leaves a whole checkpoint (``checkpoint``, or ``checkpoint.old`` between the renames)."""
    ckpt, tmp, old = run.out / "checkpoint", run.out / "checkpoint.tmp", run.out / "checkpoint.old"
    if run.accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # a save cut short: never the only copy
    run.accelerator.wait_for_everyone()
    run.accelerator.save_state(str(tmp))  # every process writes its RNG state; the main one the rest
    run.accelerator.wait_for_everyone()   # all of them in tmp before train_state.json marks it whole
    if run.accelerator.is_main_process:
        state = asdict(progress) | {"config": asdict(run.cfg), "data_sha256": run.data_sha256}
        (tmp / "train_state.json").write_text(json.dumps(state, indent=1) + "\n")  # written last: marks tmp whole
        swap_in(tmp, ckpt, old)
    run.accelerator.wait_for_everyone()


def swap_in(new: Path, ckpt: Path, old: Path) -> None:
    """Replace ``ckpt`` by the whole folder ``new``. ``old`` left by a kill is stale once ``ckpt``
    exists (removed first), and the only whole copy while it does not (kept until ``new`` is in)."""
    if old.exists() and ckpt.exists():
        shutil.rmtree(old)
    if ckpt.exists():
        ckpt.rename(old)
    new.rename(ckpt)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(run: TrainingRun) -> Progress:
    """Restore out/checkpoint when there is one (refusing another config's), else start at step 0."""
    ckpt = next((d for d in (run.out / "checkpoint", run.out / "checkpoint.old")
                 if (d / "train_state.json").is_file()), None)
    if ckpt is None:
        return Progress()
    state = json.loads((ckpt / "train_state.json").read_text())
    state["config"] = LEGACY | state["config"]
    free = ("eval_every", "save_every", "eval_stride", "taps_dir")  # may change without changing results
    if "data_sha256" in state:  # the data by content: a moved or renamed file resumes, an edited one does not
        free += ("data", "out")
        if state["data_sha256"] != run.data_sha256:
            raise ValueError(f"{run.out} holds a checkpoint trained on other data (the sha256 of {run.cfg.data} "
                             "differs); resume with the same data file or choose a new --out")
    changed = sorted(k for k, v in asdict(run.cfg).items() if state["config"].get(k) != v and k not in free)
    if changed:
        raise ValueError(f"{run.out} holds a checkpoint of another config (differs in {changed}); "
                         "rerun with the same settings or choose a new --out")
    run.accelerator.load_state(str(ckpt))
    return Progress(**{k: state[k] for k in ("step", "data_position", "elapsed_s", "tokens")})


# ----------------------------------------------------------------------------- the output folder and history
OWN_FILES = {".lock", "history.jsonl", "history.jsonl.tmp", "checkpoint.tmp"}  # what a run leaves before its first checkpoint


def check_out(out: str | Path) -> None:
    """Refuse an output folder that holds something other than a run of ours: without a checkpoint to
    resume from, training would overwrite its history and weights (a shipped head, another project)."""
    out = Path(out)
    if not out.is_dir():
        return
    if any((out / d / "train_state.json").is_file() for d in ("checkpoint", "checkpoint.old")):
        return
    foreign = sorted(p.name for p in out.iterdir() if p.name not in OWN_FILES)
    if foreign:
        raise ValueError(f"--out {str(out)!r} is not empty ({', '.join(foreign[:4])}"
                         f"{', ...' if len(foreign) > 4 else ''}) and holds no checkpoint to resume from; "
                         "training would overwrite it: choose a new or empty --out")


def read_history(run: TrainingRun, step: int) -> list[dict]:
    """out/history.jsonl up to ``step``; an interrupted run's later entries (and a torn last line) are
    dropped, from the file too (rewritten whole, then renamed over it)."""
    path = run.out / "history.jsonl"
    rows = [h for h in jsonl.read(path, repair=run.accelerator.is_main_process) if h["step"] <= step]
    if run.accelerator.is_main_process:
        tmp = path.with_name(path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        jsonl.append(tmp, rows)
        tmp.touch()
        tmp.replace(path)
    return rows

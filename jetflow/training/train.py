"""Train a draft head on the target's own answers (docs/method.md, Training): the setup, the loop and the
launch.

    cfg = TrainConfig.from_name("cpu", data="regen.jsonl", out="runs/jf")  # vary with dataclasses.replace
    head, history = train(cfg)  # out/: checkpoint/, history.jsonl, config.json + model.safetensors (bf16),
                                #       provenance.json, PROVENANCE.md; rerunning resumes exactly

The config and its presets are ``jetflow.training.config``; one step (anchors, the head over all blocks, the
loss, held-out accuracy) is ``jetflow.training.step``; one run's state (checkpoint, history, resume) is
``jetflow.training.run``.

Where a step's taps come from is ``taps``: ``online`` runs the frozen target over the sequence every step
(the KL loss needs this: its teacher is the target's whole distribution; GPU users with large targets,
whose taps would not fit on disk), ``cached`` reads them from the memory-mapped taps cache that
``python -m jetflow taps`` builds (``jetflow.training.taps``; loss ce only), so the step is the head's alone; with a
bf16 target both give the same loss and weights (tests/test_taps.py). ``data`` may be a chunked folder
(``regenerate --chunks K``) and ``parts`` its first K files; the held-out rows are always the first
file's last ``eval_seqs``, and evaluation runs the target online in either mode. The target runs under
no_grad and its embedding and lm_head enter the graph detached: only head parameters get gradients.

Across processes (``accelerate launch --multi_gpu``, docs/distributed.md) each process takes every N-th
sequence of a step and DDP averages the gradients: the weights do not depend on the number of
processes, up to float rounding (tests/test_distributed.py), and a run may resume on another number.
CPU note: beside another torch job on 2 cores, run with OMP_NUM_THREADS=1; oversubscribed threads
made one 180-token SmolLM2 forward take 7.6 s instead of 0.15 s.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from jetflow.data.regenerate import data_files, files_sha256, is_last_part, load_regenerated
from jetflow.drafting.checkpoint import init_from_target
from jetflow.drafting.head import DraftHead, HeadConfig
from jetflow.engine.load import load_target
from jetflow.util import jsonl
from jetflow.data.holdout import holdout_rows
from .config import TrainConfig
from .provenance import write_provenance
from .run import Progress, TrainingRun, check_out, load_checkpoint, read_history, save_checkpoint
from .step import BlockForward, as_sequences, evaluate, indexed_sequences, lr_factor, train_step
from .taps import CachedTaps, OnlineTaps, cache_for, default_dir


# ----------------------------------------------------------------------------- the head and the setup
def draft_vocabulary(rows: list[dict], k: int, always=()) -> torch.Tensor:
    """(k,) the k most frequent response token ids of ``rows`` (ties: lower id first), ids in
    ``always`` (e.g. EOS) included; padded with the lowest unused ids when the data has fewer."""
    counts = Counter(t for r in rows for t in r["response_ids"])
    ranked = list(dict.fromkeys([*always, *sorted(counts, key=lambda t: (-counts[t], t))]))[:k]
    used = set(ranked)
    spare = (i for i in itertools.count() if i not in used)
    ranked += [next(spare) for _ in range(k - len(ranked))]
    return torch.tensor(ranked, dtype=torch.long)


def build_head(cfg: TrainConfig, target, rows: list[dict] | None = None) -> DraftHead:
    """A fresh head for ``target`` as ``cfg`` says; ``rows`` (the training rows) pick its draft vocabulary."""
    torch.manual_seed(cfg.seed)
    vocab_size = target.config.vocab_size
    if cfg.draft_vocab > vocab_size:
        raise ValueError(f"draft_vocab ({cfg.draft_vocab}) exceeds the target's vocabulary ({vocab_size})")
    head = DraftHead(HeadConfig.for_target(target.config, num_layers=cfg.num_layers, causal=cfg.causal,
                                           block_size=cfg.block_size, draft_vocab_size=cfg.draft_vocab))
    if cfg.draft_vocab:
        head.draft_vocab.copy_(draft_vocabulary(rows or [], cfg.draft_vocab, sorted(target.eos_ids)))
    if cfg.init == "target":
        init_from_target(head, target.model)
    elif cfg.init != "random":
        warm_start(head, cfg.init)
    return head.float()  # fp32 params whatever the target's dtype


def warm_start(head: DraftHead, path: str) -> None:
    """Copy a trained head's weights (and draft vocabulary) into ``head``, which must have its layout."""
    parent = DraftHead.from_pretrained(path)
    if parent.config != head.config:
        diff = sorted(k for k, v in asdict(head.config).items() if asdict(parent.config).get(k) != v)
        raise ValueError(f"cannot warm-start from {path}: its head differs in {diff}")
    head.load_state_dict(parent.state_dict())


def setup(cfg: TrainConfig, target=None) -> tuple[TrainingRun, list[dict]]:
    """Check the inputs, split the data, build head/optimiser/scheduler under accelerate."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    if not cfg.out:
        raise ValueError("TrainConfig.out (--out) must name an output directory")
    files, rows, held, indexed, holdout = split_data(cfg)
    accelerator = Accelerator(step_scheduler_with_optimizer=False)  # one global step = one scheduler step
    check_launch(accelerator)
    if cfg.seqs_per_step % accelerator.num_processes:
        raise ValueError(f"seqs_per_step ({cfg.seqs_per_step}) must be a multiple of the number of "
                         f"processes ({accelerator.num_processes})")
    set_seed(cfg.seed)
    target = target or load_target(cfg.model, dtype=cfg.dtype, device=str(accelerator.device))
    training = [r for i, r in enumerate(rows) if i not in held and i not in holdout]  # the draft vocabulary's
    head = build_head(cfg, target, training)
    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg.steps, cfg.warmup))
    blocks, optimizer, scheduler = accelerator.prepare(BlockForward(head), optimizer, scheduler)
    run = TrainingRun(cfg, target, accelerator, blocks, optimizer, scheduler, [seq for _, seq in indexed],
                      as_sequences([rows[i] for i in held], cfg.max_len), Path(cfg.out),
                      train_rows=[i for i, _ in indexed], source=taps_source(cfg, target, files, head),
                      data_sha256=files_sha256(files), holdout_ids=[rows[i]["id"] for i in sorted(holdout)])
    run.out.mkdir(parents=True, exist_ok=True)
    return run, rows


class Split(NamedTuple):
    files: list[Path]       # the data files
    rows: list[dict]        # all their rows
    held: range             # the evaluation rows: the first file's last eval_seqs (the same for every --parts)
    indexed: list           # (row, (ids, prompt_len)) of the training sequences
    holdout: frozenset      # rows never trained on for the acceptance profile (``holdout_rows``)


def split_data(cfg: TrainConfig) -> Split:
    """The data, split: the evaluation rows are held out, the ``holdout`` rows of the data's last part too
    when the files reach it, the rest that keep an anchor are trained on."""
    files = data_files(cfg.data, cfg.parts)
    per_file = [load_regenerated(f) for f in files]
    rows = [r for part in per_file for r in part]
    n0 = len(per_file[0])
    if n0 <= cfg.eval_seqs:
        raise ValueError(f"{files[0]} has {n0} sequences; need more than eval_seqs={cfg.eval_seqs}")
    held = range(n0 - cfg.eval_seqs, n0)
    tail = frozenset()
    if cfg.holdout and is_last_part(files[-1]):
        first = len(rows) - len(per_file[-1])
        tail = frozenset(first + i for i in holdout_rows(per_file[-1], cfg.holdout, files[-1]))
        if any(i in held for i in tail):
            raise ValueError(f"{files[-1]} is too short to hold out {cfg.holdout} rows beside the "
                             f"{cfg.eval_seqs} evaluation rows")
    indexed = indexed_sequences(rows, [i for i in range(len(rows)) if i not in held and i not in tail], cfg.max_len)
    if not indexed:
        raise ValueError(f"no training sequence in {cfg.data} has a response token to anchor on")
    return Split(files, rows, held, indexed, tail)


def taps_source(cfg: TrainConfig, target, files: list[Path], head: DraftHead):
    """Where a step's taps come from: the target's forward (online) or the taps cache (cached)."""
    layers = head.config.target_layer_ids
    if cfg.taps == "online":
        return OnlineTaps(target, layers)
    root = Path(cfg.taps_dir) if cfg.taps_dir else default_dir(cfg.data, target.name, layers)
    caches = [cache_for(root, f, Path(cfg.data).is_dir()) for f in files]
    return CachedTaps.open(target, files, caches, layers=layers, max_len=cfg.max_len)


# ----------------------------------------------------------------------------- training a head
def train(cfg: TrainConfig, target=None, *, stop_at: int | None = None, progress: bool = True
          ) -> tuple[DraftHead, list[dict]]:
    """Train, or resume from ``cfg.out``, a head as ``cfg`` says. ``stop_at`` ends this call at that
    step with a checkpoint; the same call later continues it. -> (the fp32 head, history).
    The final head (bf16) and the provenance files are written once step ``cfg.steps`` is reached."""
    if not cfg.out:
        raise ValueError("TrainConfig.out (--out) must name an output directory")
    check_out(cfg.out)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)  # the lock lives inside it
    with jsonl.locked(cfg.out) if is_main_process() else contextlib.nullcontext():
        run, rows = setup(cfg, target)
        state = load_checkpoint(run)
        history = read_history(run, state.step)
        last = _loop(run, state, history, min(stop_at or cfg.steps, cfg.steps), progress)
        if state.step == cfg.steps and run.accelerator.is_main_process:
            run.head.save_pretrained(run.out, dtype=torch.bfloat16)
            write_provenance(run, state, last, rows)
    return run.head, history


# ----------------------------------------------------------------------------- the launch
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")  # torchrun, then mpirun's
WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")


def _launched(names: tuple[str, ...], default: str) -> str:
    """The first of the launcher's variables ``names`` that is set (read before accelerate starts)."""
    return next((os.environ[k] for k in names if k in os.environ), default)


def is_main_process() -> bool:
    """Whether this is the main process of an ``accelerate launch`` (only it takes out/'s lock and writes
    there); read from the launcher's environment, before the Accelerator exists."""
    return _launched(RANK_VARS, "0") == "0"


SHARDED = ("FSDP", "DEEPSPEED", "MEGATRON_LM")  # accelerate's DistributedType names this loop does not drive


def check_launch(accelerator) -> None:
    """Refuse a launch this loop cannot train correctly. (1) torchrun started N processes but accelerate
    joined fewer (``accelerate launch --multi_gpu`` without a GPU per process, unless ACCELERATE_USE_CPU=1):
    each would train the whole batch alone and all would write the same out/. (2) Sharded training:
    evaluation calls the head outside the prepared module, the main process alone saves the final head
    (it holds only its shard), and under DeepSpeed every backward would step the optimiser (see
    docs/distributed.md); only data parallelism (DDP, one whole head per process) is supported."""
    launched = int(_launched(WORLD_VARS, "1"))
    if launched != accelerator.num_processes:
        raise ValueError(f"launched as {launched} processes but accelerate joined {accelerator.num_processes}: "
                         "without a GPU per process, set ACCELERATE_USE_CPU=1 to train on CPU processes "
                         "(gloo); see docs/distributed.md")
    if accelerator.distributed_type in SHARDED:  # a str enum: equal to its name
        kind = getattr(accelerator.distributed_type, "value", accelerator.distributed_type)
        raise ValueError(f"training under {kind} is not supported (only data parallelism: accelerate launch "
                         "--multi_gpu); see docs/distributed.md")


# ----------------------------------------------------------------------------- the loop
def _loop(run: TrainingRun, state: Progress, history: list[dict], end: int, progress: bool) -> dict:
    """Steps state.step .. end-1 with logging, evaluation and checkpoints. -> the last evaluation."""
    cfg = run.cfg
    last = next((h for h in reversed(history) if h["acc"] is not None), None)
    if not history:
        lr0 = cfg.lr * lr_factor(0, cfg.steps, cfg.warmup)
        last = _log(run, history, {"step": 0, "loss": None, "lr": lr0}, state.elapsed_s, evaluate_now=True)
    bar = tqdm(total=cfg.steps, initial=state.step, desc="train",
               disable=not progress or not run.accelerator.is_main_process)
    start, elapsed0 = time.perf_counter(), state.elapsed_s
    while state.step < end:
        lr = run.scheduler.get_last_lr()[0]  # the lr this step uses
        loss, counts = train_step(run, state.data_position)
        state.step, state.data_position = state.step + 1, state.data_position + cfg.seqs_per_step
        state.tokens = dict(Counter(state.tokens) + counts)
        state.elapsed_s = elapsed0 + time.perf_counter() - start
        due = state.step % cfg.eval_every == 0 or state.step == cfg.steps
        last = _log(run, history, {"step": state.step, "loss": loss, "lr": lr}, state.elapsed_s, due) or last
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", acc1=f"{last['acc'][0]:.3f}", tau=f"{last['sim_tau']:.2f}")
        if state.step % cfg.save_every == 0 or state.step == end:
            save_checkpoint(run, state)
    bar.close()
    return last


def _log(run: TrainingRun, history: list[dict], entry: dict, elapsed_s: float, evaluate_now: bool) -> dict | None:
    """Append a history entry (evaluated on the held-out sequences when due) to out/history.jsonl."""
    ev = evaluate(run.head, run.target, run.eval_seqs, stride=run.cfg.eval_stride) if evaluate_now else {}
    history.append(entry | {"acc": ev.get("acc"), "sim_tau": ev.get("sim_tau"), "elapsed_s": elapsed_s})
    if run.accelerator.is_main_process:
        jsonl.append(run.out / "history.jsonl", [history[-1]])
    return history[-1] if evaluate_now else None

"""Train a draft head on the target's own answers (docs/method.md, Training).

    cfg = TrainConfig.from_name("cpu", data="regen.jsonl", out="runs/jf")  # vary with dataclasses.replace
    head, history = train(cfg)  # out/: checkpoint/, history.jsonl, config.json + model.safetensors (bf16),
                                #       provenance.json, PROVENANCE.md; rerunning resumes exactly

Per sequence ids (S,) = prompt + regenerated response: the frozen target gives the taps (S, L, H) and,
for the KL loss, the teacher logits (S, V); A random anchors inside the response each open a block
``[anchor, MASK x D]``; the head runs all blocks in one pass under ``training_mask``, and the
target's frozen lm_head turns slots 1..D (D = Q-1, Q the block size) into logits (A, D, V). Slot k of the block at
anchor a predicts token a+k (teacher: target logits at a+k-1); slots past the end are masked; depth k
weighs exp(-(k-1)/gamma) (gamma 0 = uniform).

Where a step's taps come from is ``taps``: ``online`` runs the frozen target over the sequence every step
(the KL loss needs this: its teacher is the target's whole distribution; GPU users with large targets,
whose taps would not fit on disk), ``cached`` reads them from the memory-mapped taps cache that
``python -m jetflow taps`` builds (``jetflow.training.taps``; loss ce only), so the step is the head's alone; with a
bf16 target both give the same loss and weights (tests/test_taps.py). ``data`` may be a chunked folder
(``regenerate --chunks K``) and ``parts`` its first K files; the held-out rows are always the first
file's last ``eval_seqs``, and evaluation runs the target online in either mode. The target runs under
no_grad and its embedding and lm_head enter the graph detached: only head parameters get gradients.
A step's head pass runs under ``precision`` (autocast: bf16 matmuls where the device computes bf16
natively, fp32 master weights, AdamW and loss) and ``attention`` (blockwise on CPU, ``jetflow.drafting.blockwise``);
with loss ce only the counted slots reach the lm_head (``objective.weighted_ce``). Evaluation runs fp32.

Resume is exact: data order and anchors are pure functions of (seed, data position), and the
checkpoint holds the head, AdamW, scheduler and RNG states (``accelerate.save_state``).
Across processes (``accelerate launch --multi_gpu``, docs/distributed.md) each process takes every N-th
sequence of a step and DDP averages the gradients: the weights do not depend on the number of
processes, up to float rounding (tests/test_distributed.py), and a run may resume on another number.
CPU note: beside another torch job on 2 cores, run with OMP_NUM_THREADS=1; oversubscribed threads
made one 180-token SmolLM2 forward take 7.6 s instead of 0.15 s.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import os
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from jetflow.util import jsonl
from jetflow.data.prompts import data_files, is_last_part, load_regenerated
from jetflow.data.holdout import holdout_rows
from jetflow.util.paths import portable_path, shell_join
from jetflow.util.flags import command_args, option
from jetflow.drafting.checkpoint import init_from_target
from jetflow.drafting.head import DraftHead, HeadConfig
from jetflow.engine.metrics import simulated_tau
from jetflow.util.hardware import fast_dtype
from .objective import (curriculum_weights, depth_accuracy, draft_columns, masked_mean, slot_losses, slot_targets,
                        weighted_ce)
from .provenance import write_provenance
from jetflow.engine.load import DTYPES, load_target
from .taps import CachedTaps, OnlineTaps, cache_for, default_dir, sequence_ids

BUILTIN_INITS = ("target", "random")  # any other ``init`` names a trained head's directory (warm start)
PRECISIONS, ATTENTIONS = ("auto", "float32", "bfloat16"), ("auto", "blocks", "packed")
LEGACY = {"precision": "float32", "attention": "packed", "holdout": 0}  # what checkpoints before these fields used


def _init_path(text: str) -> str:
    """``--init``: a built-in init as given, a head directory made absolute (the command must work anywhere)."""
    return text if text in BUILTIN_INITS else str(Path(text).resolve())


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Each field's help and flag (``--name``, or ``--set name=value`` for fields
    without one) are its metadata: the ``train`` subcommand and ``command_for`` are generated from it."""
    data: str = option("", "regenerated JSONL, or a chunked folder of them (python -m jetflow regenerate)",
                       required=True)
    parts: int = option(0, "with a chunked --data folder: train on its first K parts (0: all); the "
                        "held-out rows are part 0's last, whatever K")
    holdout: int = option(0, "never train on N evenly spaced rows of the chunked --data folder's last part (or "
                          "of a single --data file), when the data reaches it: a head trained on the whole pool "
                          "keeps prompts for its acceptance profile (python -m jetflow profile --data)")
    taps: str = option("online", "online: the target runs over each sequence every step; cached: read "
                       "the taps cache (python -m jetflow taps), the step is the head's alone (loss ce)",
                       choices=("online", "cached"))
    taps_dir: str | None = option(None, "the taps cache folder (default: the one `jetflow taps` writes for "
                                  "--data)", parse=lambda text: str(Path(text).resolve()))
    out: str = option("", "output dir (checkpoint, history, head, provenance); rerunning resumes from its "
                      "checkpoint", required=True)
    model: str | None = option(None, "target hub id or local dir (default: the embedded SmolLM2-135M-Instruct)")
    dtype: str = option("bfloat16", "the frozen target forward's dtype; head params and AdamW stay fp32", flag=None)
    precision: str = option("auto", "the head's compute dtype in a training step (autocast; fp32 weights, AdamW "
                            "and loss). auto: bfloat16 where the device has it natively (CUDA, a CPU with AVX-512 "
                            "BF16 or AMX), else float32", choices=PRECISIONS)
    attention: str = option("auto", "blocks: each block attends the context and its own slots (no masked "
                            "block-to-block scores: CPUs); packed: all blocks as one masked row (one fused kernel, "
                            "memory linear in the anchors: GPUs, long sequences). auto: blocks on CPU, else packed",
                            choices=ATTENTIONS)
    causal: bool = option(True, "JetFlow's causal block (the default)", negate=("--bidirectional", "DFlash's bidirectional block"))
    num_layers: int = option(2, "draft decoder layers (= taps)", flag=None)
    block_size: int = option(16, "Q: the anchor + Q-1 draftable depths", flag=None)
    gamma: float = option(0.0, "depth weights exp(-(k-1)/gamma); 0 = uniform (JetFlow), DFlash uses 7")
    gamma_start: float | None = option(None, "depth curriculum: start from this gamma's weights (e.g. 0.5: "
                                       "depth 1 dominates) and move to --gamma's")
    curriculum: float = option(0.5, "fraction of the steps the curriculum takes (with --gamma-start only)")
    loss: str = option("kl", "kl: forward KL to the target's distribution; ce: the regenerated tokens",
                       choices=("kl", "ce"))
    anchors_per_seq: int = option(512, "random anchors inside each response (paper: up to 512)", flag="--anchors")
    seqs_per_step: int = option(16, "sequences per optimiser step (accumulated, split across processes)")
    steps: int = option(300_000, "optimiser steps (the paper: ~800K examples x 6 epochs / 16)")
    lr: float = option(3e-4, "peak AdamW lr, weight decay 0")
    warmup: float = option(0.04, "warmup fraction of the steps, then cosine to 0", flag=None)
    grad_clip: float = option(1.0, "gradient norm clip", flag=None)
    max_len: int = option(3072, "truncate prompt + response to this many tokens", flag=None)
    init: str = option("target", "target (init_from_target) | random (stalls) | a trained head's directory "
                       "to continue training from", parse=_init_path)
    draft_vocab: int = option(0, "draft only the K most frequent response tokens of the data, plus EOS "
                              "(0 = whole vocabulary): a K-row lm_head, cheaper to train and to draft with")
    seed: int = option(0, "seed of the data order, the anchors and the head's init")
    eval_every: int = option(1000, "steps between evaluations (step 0 and the last step always)")
    eval_seqs: int = option(64, "held out: the last eval_seqs rows of the file, never trained on", flag=None)
    eval_stride: int = option(1, "evaluation anchors at every eval_stride-th response position", flag=None)
    save_every: int = option(1000, "steps between checkpoints (the last step always)")
    preset: str = "paper"         # the preset this config started from (for the reproducing command)

    def __post_init__(self):
        ints = ("num_layers", "anchors_per_seq", "seqs_per_step", "steps", "eval_every", "eval_seqs",
                "eval_stride", "save_every")
        problems = [f"{k} must be >= 1, got {getattr(self, k)}" for k in ints if getattr(self, k) < 1]
        problems += [f"draft_vocab must be >= 0, got {self.draft_vocab}"] if self.draft_vocab < 0 else []
        problems += [msg for bad, msg in [
            (self.loss not in ("kl", "ce"), f"loss must be kl or ce, got {self.loss!r}"),
            (self.taps not in ("online", "cached"), f"taps must be online or cached, got {self.taps!r}"),
            (self.precision not in PRECISIONS, f"precision must be one of {PRECISIONS}, got {self.precision!r}"),
            (self.attention not in ATTENTIONS, f"attention must be one of {ATTENTIONS}, got {self.attention!r}"),
            (self.taps == "cached" and self.loss == "kl", "cached taps hold no teacher distribution: "
             "train with --loss ce, or with --taps online for kl"),
            (self.parts < 0, f"parts must be >= 0 (0: all), got {self.parts}"),
            (self.holdout < 0, f"holdout must be >= 0, got {self.holdout}"),
            (self.init not in BUILTIN_INITS and not (Path(self.init) / "config.json").is_file(),
             f"init must be target, random or a head directory holding config.json, got {self.init!r}"),
            (self.dtype not in DTYPES, f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}"),
            (self.block_size < 2 or self.max_len < 3, "block_size must be >= 2 and max_len >= 3"),
            (self.gamma < 0 or self.lr <= 0 or self.grad_clip <= 0, "need gamma >= 0, lr > 0, grad_clip > 0"),
            (self.gamma_start is not None and self.gamma_start < 0, "gamma_start must be >= 0"),
            (not 0 < self.curriculum <= 1, f"curriculum must lie in (0, 1], got {self.curriculum}"),
            (not 0 <= self.warmup < 1, f"warmup must lie in [0, 1), got {self.warmup}")] if bad]
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_name(cls, name: str, **overrides) -> "TrainConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)


PRESETS = {
    "paper": TrainConfig(),
    # 2 CPU cores, SmolLM2: ~4 s a step (1 thread, busy machine); a higher lr and gamma > 0 so the
    # shallow depths are not swamped by the deep ones early on (docs/field-notes.md)
    "cpu": TrainConfig(anchors_per_seq=32, seqs_per_step=4, steps=3000, lr=1e-3, gamma=4.0, max_len=512,
                       eval_every=100, eval_seqs=16, eval_stride=4, save_every=100, preset="cpu"),
    # seconds on a tiny model: tests and a first look at the pipeline
    "smoke": TrainConfig(anchors_per_seq=8, seqs_per_step=2, steps=4, lr=1e-3, max_len=128, eval_every=2,
                         eval_seqs=1, eval_stride=2, save_every=2, preset="smoke"),
}


# ----------------------------------------------------------------------------- schedule and anchors
def lr_factor(step: int, steps: int, warmup: float) -> float:
    """Linear warmup over round(warmup * steps) steps (at least 1), then cosine to 0 at ``steps``."""
    w = max(1, round(warmup * steps))
    if step < w:
        return (step + 1) / w
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - w) / max(1, steps - w))))


def sample_anchors(prompt_len: int, seq_len: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """(A,) sorted distinct anchors in [prompt_len, seq_len - 2], A = min(k, available): response
    tokens with a successor (at decode time the first anchor is position prompt_len)."""
    return (torch.randperm(seq_len - 1 - prompt_len, generator=generator)[:k] + prompt_len).sort().values


# ----------------------------------------------------------------------------- the head pass
class BlockForward(nn.Module):
    """All blocks of one sequence through the head (``DraftHead.sequence_blocks``). One module, so that
    DDP (``accelerate launch``) sees every trainable parameter (fc, hidden_norm, layers) used inside a
    single forward."""

    def __init__(self, head: DraftHead):
        super().__init__()
        self.head = head

    def forward(self, taps: torch.Tensor, x: torch.Tensor, anchors: torch.Tensor, blockwise: bool = False
                ) -> torch.Tensor:
        """taps (S, L, H), block rows x (A, Q, H), anchors (A,) -> hidden (A, D, H)."""
        return self.head.sequence_blocks(taps, x, anchors, blockwise)


def _unwrap(module: nn.Module) -> nn.Module:
    return getattr(module, "module", module)  # DDP keeps the wrapped module in .module


def block_hidden(blocks: nn.Module, target, taps, ids, anchors, blockwise: bool = False) -> torch.Tensor:
    """(A, D, H) final states of slots 1..D of the blocks at ``anchors``, over the target's embedding (detached)."""
    head = _unwrap(blocks).head
    x = head.block_inputs(ids[anchors], target.model.get_input_embeddings().weight.detach())  # (A, Q, H)
    return blocks(taps, x, anchors, blockwise)


def draft_logits(head: DraftHead, target, hidden: torch.Tensor, fp32: bool = True) -> torch.Tensor:
    """(..., K) logits of states (..., H) over the head's draft vocabulary (K = V without one), through
    the target's lm_head rows (detached); in fp32, or with ``fp32=False`` in the matmul's dtype."""
    lm = target.model.get_output_embeddings()
    bias = None if getattr(lm, "bias", None) is None else head.output_weight(lm.bias.detach()[:, None])[:, 0]
    weight = head.output_weight(lm.weight.detach())                                     # (K, H)
    logits = F.linear(hidden.to(weight.dtype), weight, bias)
    return logits.float() if fp32 else logits


def block_logits(blocks: nn.Module, target, taps, ids, anchors) -> torch.Tensor:
    """(A, D, K) fp32 logits of slots 1..D over the head's draft vocabulary (the packed fp32 pass)."""
    return draft_logits(_unwrap(blocks).head, target, block_hidden(blocks, target, taps, ids, anchors))


def head_compute(cfg: TrainConfig, device) -> tuple[torch.dtype, bool]:
    """(the head's compute dtype, whether blocks attend blockwise) of a training step on ``device``:
    ``precision`` and ``attention`` with auto resolved (``jetflow.util.hardware.fast_dtype``)."""
    device = torch.device(device)
    precision = fast_dtype(device)[0] if cfg.precision == "auto" else cfg.precision
    blockwise = cfg.attention == "blocks" or (cfg.attention == "auto" and device.type == "cpu")
    return DTYPES[precision], blockwise


def sequence_loss(blocks, target, ids, anchors, cfg: TrainConfig, step: int = 0, features=None
                  ) -> tuple[torch.Tensor, int]:
    """Depth-weighted loss of all blocks of one sequence, and its number of supervised slots. With a
    draft vocabulary, "ce" skips slots whose token lies outside it and "kl" renormalises the teacher
    over it. ``features`` = (teacher logits (S, V) or None, taps (S, L, H)) of the sequence, from a
    taps source (``jetflow.training.taps``); default: the target's forward."""
    head = _unwrap(blocks).head
    c = head.config
    teacher_logits, taps = features or target.sequence_taps(ids, c.target_layer_ids, logits=cfg.loss == "kl")
    pos, valid = slot_targets(anchors, ids.numel(), c.block_size)
    cols, known = draft_columns(head, ids)
    weights = curriculum_weights(c.block_size - 1, cfg, step).to(ids.device)
    dtype, blockwise = head_compute(cfg, ids.device)
    with torch.autocast(ids.device.type, dtype=dtype, enabled=dtype != torch.float32):
        hidden = block_hidden(blocks, target, taps, ids, anchors, blockwise)           # (A, D, H)
        if cfg.loss == "ce":  # only the slots that count reach the lm_head: (N, K) logits, N <= A*D
            valid = valid & known[pos]
            logits = draft_logits(head, target, hidden[valid], fp32=False)              # (N, K)
        else:
            logits = draft_logits(head, target, hidden)                                 # (A, D, K)
    if cfg.loss == "ce":
        return weighted_ce(logits, cols[pos][valid], weights.expand_as(valid)[valid]), int(valid.sum())
    if head.vocab is not None:
        teacher_logits = teacher_logits[:, head.vocab.to(ids.device)]
    per_slot = slot_losses(logits, pos, cfg.loss, cols, teacher_logits)
    return masked_mean(per_slot, valid, weights), int(valid.sum())


@torch.no_grad()
def evaluate(head: DraftHead, target, seqs: list[tuple[torch.Tensor, int]], *, stride: int = 1,
             chunk: int = 64) -> dict:
    """Per-depth accuracy of the head's argmax vs the target's greedy next token (= the regenerated
    token, up to bf16 argmax flips) at anchors prompt_len, prompt_len + stride, ... of each
    (ids, prompt_len), and the simulated tau. ``chunk`` anchors per pass bound the (chunk, D, V) logits."""
    blocks, c = BlockForward(head), head.config
    correct = count = torch.zeros(c.block_size - 1, dtype=torch.long)
    for ids, p in seqs:
        ids = ids.to(head.fc.weight.device)
        logits, taps = target.sequence_taps(ids, c.target_layer_ids)
        greedy = logits.argmax(-1)                                                      # (S,)
        for anchors in torch.arange(p, ids.numel() - 1, stride, device=ids.device).split(chunk):
            pos, valid = slot_targets(anchors, ids.numel(), c.block_size)
            pred = block_logits(blocks, target, taps, ids, anchors).argmax(-1)         # (A, D)
            if head.vocab is not None:
                pred = head.vocab.to(pred.device)[pred]                                  # columns -> ids
            ok, n = depth_accuracy(pred, greedy[pos - 1], valid)
            correct, count = correct + ok.cpu(), count + n.cpu()
    acc = (correct / count.clamp(min=1)).tolist()
    return {"acc": acc, "sim_tau": simulated_tau(acc), "anchors": int(count[0])}


# ----------------------------------------------------------------------------- data order
def as_sequences(rows: list[dict], max_len: int) -> list[tuple[torch.Tensor, int]]:
    """(ids (S,), prompt_len) per row, truncated to max_len; rows left without an anchor are dropped."""
    return [seq for _, seq in indexed_sequences(rows, range(len(rows)), max_len)]


def indexed_sequences(rows: list[dict], index, max_len: int) -> list[tuple[int, tuple[torch.Tensor, int]]]:
    """(row, (ids, prompt_len)) for the rows numbered ``index`` that keep an anchor after truncation."""
    seqs = ((i, (sequence_ids(rows[i], max_len), len(rows[i]["prompt_ids"]))) for i in index)
    return [(i, (ids, p)) for i, (ids, p) in seqs if ids.numel() - 1 > p]


def _seed(*key) -> int:
    """A 63-bit generator seed from a key such as (seed, position, "anchors")."""
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "little") >> 1


@lru_cache(maxsize=4)
def _epoch_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(_seed(seed, epoch, "order"))
    return tuple(torch.randperm(n, generator=g).tolist())


def row_at(position: int, n: int, seed: int) -> int:
    """Training row at a global data position; each epoch is a fresh seeded permutation of n rows."""
    epoch, i = divmod(position, n)
    return _epoch_order(n, seed, epoch)[i]


def anchors_at(position: int, prompt_len: int, seq_len: int, cfg: TrainConfig) -> torch.Tensor:
    """Anchors of the sequence at a data position: a pure function of (seed, position), so resuming
    needs no RNG state to reproduce them."""
    g = torch.Generator().manual_seed(_seed(cfg.seed, position, "anchors"))
    return sample_anchors(prompt_len, seq_len, cfg.anchors_per_seq, g)


# ----------------------------------------------------------------------------- one run
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


def train_step(run: TrainingRun, first: int) -> tuple[float, Counter]:
    """Accumulate the sequences at data positions first .. first+seqs_per_step-1 (this process's
    share), clip, step. -> mean loss over all processes, token counts."""
    cfg, acc = run.cfg, run.accelerator
    mine = list(range(first, first + cfg.seqs_per_step))[acc.process_index::acc.num_processes]
    losses, counts = [], torch.zeros(3, dtype=torch.long)
    for i, position in enumerate(mine):
        index = row_at(position, len(run.train_seqs), cfg.seed)
        ids, p = run.train_seqs[index]
        ids = ids.to(acc.device)
        anchors = anchors_at(position, p, ids.numel(), cfg).to(acc.device)
        features = run.source(run.train_rows[index], ids, cfg.loss == "kl")
        # under DDP, all-reduce the gradients once per step, after the last sequence
        with acc.no_sync(run.blocks) if i < len(mine) - 1 else contextlib.nullcontext():
            loss, slots = sequence_loss(run.blocks, run.target, ids, anchors, cfg, first // cfg.seqs_per_step,
                                        features)
            acc.backward(loss / len(mine))
        losses.append(loss.detach())
        counts += torch.tensor([ids.numel(), ids.numel() - p, slots])
    acc.clip_grad_norm_(run.blocks.parameters(), cfg.grad_clip)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    loss = acc.reduce(torch.stack(losses).mean(), "mean")
    counts = acc.reduce(counts.to(acc.device), "sum").tolist()
    return float(loss), Counter(dict(zip(("context_tokens", "response_tokens", "supervised_slots"), counts)))


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
        _swap_in(tmp, ckpt, old)
    run.accelerator.wait_for_everyone()


def _swap_in(new: Path, ckpt: Path, old: Path) -> None:
    """Replace ``ckpt`` by the whole folder ``new``. ``old`` left by a kill is stale once ``ckpt``
    exists (removed first), and the only whole copy while it does not (kept until ``new`` is in)."""
    if old.exists() and ckpt.exists():
        shutil.rmtree(old)
    if ckpt.exists():
        ckpt.rename(old)
    new.rename(ckpt)
    shutil.rmtree(old, ignore_errors=True)


def files_sha256(files: list[Path]) -> str:
    """The data by content: one file's sha256, or of several files the sha256 of their sha256s."""
    if len(files) == 1:
        return data_sha256(files[0])
    return hashlib.sha256("\n".join(data_sha256(f) for f in files).encode()).hexdigest()


def data_sha256(path: str | Path) -> str:
    """sha256 of a data file (resume and provenance identify the data by content, not by path)."""
    path = Path(path)
    stat = path.stat()
    return _sha256_of(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def lineage(cfg: TrainConfig) -> list[str]:
    """Commands that rebuild a warm-started head's ancestors, oldest first (from their provenance)."""
    if cfg.init in BUILTIN_INITS:
        return []
    prov = Path(cfg.init) / "provenance.json"
    if not prov.is_file():
        return [f"# {cfg.init} has no provenance.json: its training command is unknown"]
    parent = json.loads(prov.read_text())
    return [*parent.get("lineage", []), parent["command"]]


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


def train(cfg: TrainConfig, target=None, *, stop_at: int | None = None, progress: bool = True
          ) -> tuple[DraftHead, list[dict]]:
    """Train, or resume from ``cfg.out``, a head as ``cfg`` says. ``stop_at`` ends this call at that
    step with a checkpoint; the same call later continues it. -> (the fp32 head, history).
    The final head (bf16) and the provenance files are written once step ``cfg.steps`` is reached."""
    if not cfg.out:
        raise ValueError("TrainConfig.out (--out) must name an output directory")
    check_out(cfg.out)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)  # the lock lives inside it
    with jsonl.locked(cfg.out) if _is_main() else contextlib.nullcontext():
        run, rows = setup(cfg, target)
        state = load_checkpoint(run)
        history = read_history(run, state.step)
        last = _loop(run, state, history, min(stop_at or cfg.steps, cfg.steps), progress)
        if state.step == cfg.steps and run.accelerator.is_main_process:
            run.head.save_pretrained(run.out, dtype=torch.bfloat16)
            write_provenance(run, state, last, rows)
    return run.head, history


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


RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")  # torchrun, then mpirun's
WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")


def _launched(names: tuple[str, ...], default: str) -> str:
    """The first of the launcher's variables ``names`` that is set (read before accelerate starts)."""
    return next((os.environ[k] for k in names if k in os.environ), default)


def _is_main() -> bool:
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


# ----------------------------------------------------------------------------- the reproducing command
def command_for(cfg: TrainConfig) -> str:
    """The ``python -m jetflow train`` line that rebuilds ``cfg``: its preset plus each field that
    differs from it, written from the fields' flag metadata (``--set key=value`` where a field has none);
    paths through ``portable_path`` (no machine-local paths)."""
    prefix = ["python", "-m", "jetflow", "train", "--data", portable_path(cfg.data),
              "--out", portable_path(cfg.out), "--preset", cfg.preset]
    args = command_args(cfg, TrainConfig.from_name(cfg.preset), prefix, skip=("data", "out"))
    if cfg.init not in BUILTIN_INITS:
        args[args.index("--init") + 1] = portable_path(cfg.init)
    if cfg.taps_dir:
        args[args.index("--taps-dir") + 1] = portable_path(cfg.taps_dir)
    return shell_join(args)


def portable_config(cfg: TrainConfig) -> dict:
    """The config as provenance records it: its paths through ``portable_path`` (no machine-local paths)."""
    paths = {k: portable_path(getattr(cfg, k)) for k in ("data", "out", "taps_dir") if getattr(cfg, k)}
    return asdict(cfg) | paths | ({"init": portable_path(cfg.init)} if cfg.init not in BUILTIN_INITS else {})


"""One training step of a draft head: the anchors, the head over all blocks of a sequence, the loss, and
the held-out accuracy (docs/method.md, Training).

Per sequence ids (S,) = prompt + regenerated response: the frozen target gives the taps (S, L, H) and,
for the KL loss, the teacher logits (S, V); A random anchors inside the response each open a block
``[anchor, MASK x D]``; the head runs all blocks in one pass under ``training_mask``, and the
target's frozen lm_head turns slots 1..D (D = Q-1, Q the block size) into logits (A, D, V). Slot k of the block at
anchor a predicts token a+k (teacher: target logits at a+k-1); slots past the end are masked; depth k
weighs exp(-(k-1)/gamma) (gamma 0 = uniform).

A step's head pass runs under ``precision`` (autocast: bf16 matmuls where the device computes bf16
natively, fp32 master weights, AdamW and loss) and ``attention`` (blockwise on CPU, ``jetflow.drafting.blockwise``);
with loss ce only the counted slots reach the lm_head (``objective.weighted_ce``). Evaluation runs fp32.
Data order and anchors are pure functions of (seed, data position), so a resumed run draws the same ones.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
from collections import Counter
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from jetflow.drafting.head import DraftHead
from jetflow.engine.metrics import simulated_tau
from jetflow.engine.load import DTYPES
from jetflow.util.hardware import fast_dtype
from .config import TrainConfig
from .objective import (curriculum_weights, depth_accuracy, draft_columns, masked_mean, slot_losses, slot_targets,
                        weighted_ce)
from .run import TrainingRun
from .taps import sequence_ids


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


# ----------------------------------------------------------------------------- one optimiser step
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

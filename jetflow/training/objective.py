"""The training objective, pure tensors: which position each block slot predicts, the per-slot loss
(forward KL to the target's distribution, or cross-entropy on the regenerated token), depth weights and
their curriculum, the weighted mean over valid slots, per-depth accuracy, and the draft-vocabulary columns
of token ids. ``step.py`` runs the head and the target; everything here is checked on hand-made tensors.

Shapes: A anchors (blocks), D depths per block, S sequence tokens, K draft vocabulary (K = V without one).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .config import TrainConfig

if TYPE_CHECKING:  # annotations only
    from jetflow.drafting.head import DraftHead


def depth_weights(n_depths: int, gamma: float) -> torch.Tensor:
    """(D,) w_k = exp(-(k-1)/gamma) for depths k = 1..D; gamma 0 = uniform."""
    if gamma == 0:
        return torch.ones(n_depths)
    return torch.exp(-torch.arange(n_depths, dtype=torch.float32) / gamma)


def curriculum_weights(n_depths: int, cfg: TrainConfig, step: int) -> torch.Tensor:
    """(D,) depth weights at ``step``: gamma's, or with ``gamma_start`` a linear blend that moves from
    gamma_start's weights to gamma's over the first ``curriculum`` fraction of the steps. Early in
    training the deep, nearly unpredictable depths otherwise swamp depth 1 (docs/field-notes.md)."""
    final = depth_weights(n_depths, cfg.gamma)
    if cfg.gamma_start is None:
        return final
    s = min(1.0, step / max(1.0, cfg.curriculum * cfg.steps))
    return (1 - s) * depth_weights(n_depths, cfg.gamma_start) + s * final


def slot_targets(anchors: torch.Tensor, seq_len: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """pos (A, D) = anchor + k, the position slot k predicts (clamped); valid (A, D) = pos < seq_len."""
    pos = anchors[:, None] + torch.arange(1, block_size, device=anchors.device)
    return pos.clamp(max=seq_len - 1), pos < seq_len


def slot_losses(logits: torch.Tensor, pos: torch.Tensor, kind: str, ids: torch.Tensor,
                teacher_logits: torch.Tensor | None = None) -> torch.Tensor:
    """(A, D) loss of logits (A, D, K); slot (b, k) predicts ids[pos[b, k]], ids given as columns of
    the logits (draft-vocabulary indices). "ce": -log q(ids[pos]); "kl": KL(p || q), p = the teacher at
    pos - 1 (teacher_logits (S, K), same columns). The teacher's softmax and entropy are taken once per
    position (S rows), not once per slot (A*D rows, ~2.7x more here)."""
    logq = torch.log_softmax(logits.float(), dim=-1)                                    # (A, D, V)
    if kind == "ce":
        return -logq.gather(-1, ids[pos][..., None])[..., 0]
    logp = torch.log_softmax(teacher_logits.float(), dim=-1)                            # (S, V)
    p = logp.exp()
    return (p * logp).sum(-1)[pos - 1] - (p[pos - 1] * logq).sum(-1)


def weighted_ce(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean cross-entropy of the counted slots alone: logits (N, K), target columns (N,),
    depth weights (N,). Equals ``masked_mean(slot_losses(..., "ce"), valid, w)`` over the A*D slots
    whose N valid ones these are, without a log-softmax over the slots that do not count."""
    return (_ChunkedCE.apply(logits, targets) * weights).sum() / weights.sum().clamp(min=1e-12)


class _ChunkedCE(torch.autograd.Function):
    """Per-row cross-entropy (N,) of logits (N, K) in fp32 math, ``CE_ROWS`` rows at a time: neither
    direction materialises an fp32 (N, K) copy of bf16 logits, a log-softmax or a one-hot, and the
    gradient (softmax - onehot) comes back in the logits' dtype."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        lse = torch.cat([_logsumexp(chunk) for chunk in logits.split(CE_ROWS)]) if len(logits) else \
            logits.new_zeros(0, dtype=torch.float32)                                     # (N,)
        ctx.save_for_backward(logits, targets, lse)
        return lse - logits.gather(1, targets[:, None])[:, 0].float()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        out = torch.empty_like(logits)
        for start in range(0, len(logits), CE_ROWS):
            rows = slice(start, start + CE_ROWS)
            p = logits[rows].to(torch.float32, copy=True).sub_(lse[rows, None]).exp_()  # softmax of the rows
            p[torch.arange(p.shape[0], device=p.device), targets[rows]] -= 1
            out[rows] = p.mul_(grad[rows, None])
        return out, None


CE_ROWS = 128  # rows of (rows, K) fp32 scratch: 4 MB at K = 8192, inside a core's L2


def _logsumexp(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    top = x.amax(-1, keepdim=True)
    return (x - top).exp_().sum(-1).log_().add_(top[:, 0])


def masked_mean(per_slot: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Depth-weighted mean over valid slots; invalid slots (even NaN ones) contribute nothing."""
    w = weights.to(per_slot.device)[None] * valid                                       # (A, D)
    return torch.where(valid, per_slot, 0.0).mul(w).sum() / w.sum().clamp(min=1e-12)


def depth_accuracy(pred: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """pred, truth, valid (A, D) -> correct (D,), count (D,) over valid slots."""
    return ((pred == truth) & valid).sum(0), valid.sum(0)


def draft_columns(head: DraftHead, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids -> (column in the head's draft vocabulary, clamped to 0 outside it; in-vocabulary mask)."""
    vocab = head.vocab
    if vocab is None:
        return ids, torch.ones_like(ids, dtype=torch.bool)
    index = torch.full((head.config.vocab_size,), -1, dtype=torch.long, device=ids.device)
    index[vocab.to(ids.device)] = torch.arange(vocab.numel(), device=ids.device)
    cols = index[ids]
    return cols.clamp(min=0), cols >= 0

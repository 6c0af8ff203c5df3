"""Blockwise attention: the A blocks of one sequence as A separate rows of Q queries over one shared
context, for training on CPU (``DraftHead.blocks(..., blockwise=True)``).

The packed pass (one row of A*Q queries under ``head.training_mask``) scores every block against every
other and masks all but its own: (A*Q)^2 scores of which A*Q^2 are used. Here each block scores only the
context rows and its own Q slots, so the attention work is A*Q*(T+Q) and nothing is computed to be
masked. The scores are materialised (A*h*Q*(T+Q) floats), which is small on CPU-sized runs and large
for the paper's 512 anchors over 3072-token sequences: there the packed pass's fused kernel is the
right one. Both give the same states up to float rounding (tests/test_head.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BlockwiseMask:
    """``training_mask`` with each block's rows kept apart: block b sees the context rows before its
    anchor and, inside itself, what ``inner`` allows; the other blocks' columns (all False) are dropped."""
    context: torch.Tensor         # (A, T) bool: block b may attend context row t (t < anchors[b])
    inner: torch.Tensor           # (Q, Q) bool: slot i may attend slot j (lower triangle when causal)

    def dense(self) -> torch.Tensor:
        """(A, Q, T + Q) bool: block b's rows of ``training_mask`` over the context and its own slots."""
        a, q = self.context.shape[0], self.inner.shape[0]
        return torch.cat([self.context[:, None].expand(-1, q, -1), self.inner.expand(a, -1, -1)], dim=-1)


def blockwise_mask(anchors: torch.Tensor, n_ctx: int, block_size: int, causal: bool) -> BlockwiseMask:
    """The mask of the A blocks anchored at ``anchors`` (A,) over ``n_ctx`` context rows, block by block."""
    inner = torch.ones(block_size, block_size, dtype=torch.bool, device=anchors.device)
    context = torch.arange(n_ctx, device=anchors.device) < anchors.reshape(-1, 1)       # (A, T)
    return BlockwiseMask(context, inner.tril() if causal else inner)


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx_kv, mask: BlockwiseMask
                        ) -> torch.Tensor:
    """Attention of A blocks over one shared context, without the (A*Q)^2 block-to-block scores that the
    packed pass computes and masks: q (A, h, Q, d), the blocks' own k, v (A, kv, Q, d), the context's
    ctx_kv (1, kv, T, d) x2 -> (A, h, Q, d). Context scores are one matmul per kv head over all A*g*Q
    query rows (GQA: kv head i serves q heads i*g..i*g+g-1); the softmax runs over context + own slots."""
    A, h, Q, d = q.shape
    kv, T = k.shape[1], ctx_kv[0].shape[2]
    q = q.view(A, kv, h // kv, Q, d) * d ** -0.5                                       # (A, kv, g, Q, d)
    rows = q.permute(1, 0, 2, 3, 4).reshape(kv, -1, d)                                 # (kv, A*g*Q, d)
    s_ctx = (rows @ ctx_kv[0][0].transpose(1, 2)).view(kv, A, -1, Q, T).permute(1, 0, 2, 3, 4)  # (A, kv, g, Q, T)
    s_own = q @ k[:, :, None].transpose(-1, -2)                                        # (A, kv, g, Q, Q)
    s = torch.cat([s_ctx.masked_fill(~mask.context[:, None, None, None], float("-inf")),
                   s_own.masked_fill(~mask.inner, float("-inf"))], dim=-1)
    p_ctx, p_own = s.float().softmax(-1).to(q.dtype).split([T, Q], dim=-1)
    y = (p_ctx.permute(1, 0, 2, 3, 4).reshape(kv, -1, T) @ ctx_kv[1][0]).view(kv, A, -1, Q, d)
    return (y.permute(1, 0, 2, 3, 4) + p_own @ v[:, :, None]).reshape(A, h, Q, d)

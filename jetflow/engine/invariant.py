"""Row invariance: a verify's rows computed exactly as one-token AR steps compute them.

Greedy speculation equals AR only where every row of a verify pass equals, bit for bit, the row an AR step computes
for the same token at the same position. fp32 rarely notices when it does not; in bf16 and the quantized backends the
multi-row kernels round differently from the one-row ones often enough that a greedy pick flips within 64 tokens
(docs/speed.md, "Exact attention"). ``make_invariant(model)`` removes the attention's part by construction:

- **attention** (``exact_attention``, registered with transformers as ``EXACT``): each query row after the prefix
  attends over its own keys only (the prefix and its ancestors, gathered in cache order, so the same keys at the
  same offsets an AR step sees), padded with masked keys to a multiple of ``BUCKET``. Rows are batched per padded
  length (a tree rarely spans two), and the batched matmuls compute each batch element alone, so a row's output
  depends on its own keys, never on the other rows. AR steps go through the same function with a batch of one. The
  prefill attends with transformers' SDPA as usual: AR and speculation share it.
- **linears** are the backend's: the packed int8 and int4 kernels (``jetflow.engine.quant``) compute each row
  alone, at any row count; ``row_invariant`` checks a model's linears on heavy-tailed rows.

The norms, rotary embedding, activations and residual adds are elementwise or per-row reductions and stay equal:
``tools/attention_invariance.py`` finds no decoder site of the embedded q4 model where a chain verify differs from
the AR steps, and ``tests/test_invariant.py`` checks every row of random trees against the AR steps along its path.
The cost is the gathered keys, measured in docs/speed.md.
"""
from __future__ import annotations

import torch

EXACT = "jetflow_exact"
BUCKET = 64   # keys per padding step: a row's keys are padded (masked) to a multiple of this


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, masked: torch.Tensor,
            scaling: float) -> torch.Tensor:
    """(n, H, D): ``n`` single queries (n, H, D), each over its own padded fp32 keys/values (KVH, n, L, D), with
    ``masked`` (n, L) marking the padding; fp32 scores, softmax and weighted sum, the output in the query's dtype.
    The matmuls' batch is (KVH, n): each batch element is one query's heads of one KV head, computed alone."""
    n, heads, dim = query.shape
    kv_heads = key.shape[0]
    q = (query.float() * scaling).reshape(n, kv_heads, heads // kv_heads, dim).transpose(0, 1)  # (KVH, n, G, D)
    scores = torch.matmul(q, key.transpose(-1, -2)).masked_fill_(masked[None, :, None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, -1), value)                                        # (KVH, n, G, D)
    return out.transpose(0, 1).reshape(n, heads, dim).to(query.dtype)


class Plan:
    """Which keys each query row reads, grouped by padded length: worked out once per forward (every layer
    shares the mask) and kept beside the mask it came from. A group: its rows, each row's key indices in cache order padded with index 0 (n, size), and where the padding is (n, size)."""

    def __init__(self, visible: torch.Tensor):
        t, length = visible.shape
        device = visible.device
        counts = visible.sum(-1)
        padded = (counts + BUCKET - 1) // BUCKET * BUCKET
        width = max(int(padded.max()), length)
        # each row's keys in cache order, then index 0 (any real row: its score is masked) up to ``width``
        order = torch.where(visible, torch.arange(length, device=device), length).sort(-1).values
        order = torch.cat([order.masked_fill_(order == length, 0), order.new_zeros(t, width - length)], 1)
        self.groups = []
        for size in padded.unique().tolist():
            rows = (padded == size).nonzero().flatten()
            masked = torch.arange(size, device=device)[None, :] >= counts[rows, None]
            self.groups.append((rows, order[rows, :size].contiguous(), masked))


def visible_keys(attention_mask: torch.Tensor | None, t: int, length: int, device) -> torch.Tensor:
    """(T, length) bool: which of the first ``length`` cache rows each of the last ``t`` query rows may read, from an
    additive or boolean (1, 1, T, >= length) mask, or causal where there is none."""
    if attention_mask is None:
        rows = torch.arange(length, device=device)
        return rows[None, :] <= rows[length - t:, None]
    mask = attention_mask[0, 0, :, :length]
    return mask if mask.dtype == torch.bool else mask == 0


_last: tuple = (None, None)  # (the mask a plan was made for, the plan): holding the mask keeps its identity unique


def _plan(attention_mask: torch.Tensor | None, t: int, length: int, device) -> Plan:
    global _last
    if attention_mask is not None and _last[0] is attention_mask:
        return _last[1]
    plan = Plan(visible_keys(attention_mask, t, length, device))
    if attention_mask is not None:
        _last = (attention_mask, plan)
    return plan


def exact_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query`` (1, H, T, D) over ``key``/``value`` (1, KVH, L, D), the last T
    keys the queries' own; ``attention_mask`` additive or boolean (1, 1, T, >= L), or None (causal). Returns the
    (1, T, H, D) output and no weights."""
    batch, heads, t, dim = query.shape
    length = key.shape[2]
    scaling = scaling if scaling is not None else dim ** -0.5
    if (length == t and t > 1) or torch.compiler.is_compiling():
        # a prefill (or a batch of sequences without a cache, as training reads taps): shared by AR and speculation,
        # so any kernel is exact here; a compiled target (whose traced graphs cannot gather per row) attends with
        # SDPA and is not row-exact
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if batch != 1:
        raise ValueError(f"exact attention serves one sequence at a time after a prefill, got a batch of {batch}")
    plan = _plan(attention_mask, t, length, query.device)
    keys, values, queries = key[0].float(), value[0].float(), query[0].transpose(0, 1)  # queries (T, H, D)
    if len(plan.groups) == 1:  # every row in one padded length (AR, most trees): no scatter
        _, idx, masked = plan.groups[0]
        return attend(queries, keys[:, idx], values[:, idx], masked, scaling)[None], None
    out = query.new_empty(1, t, heads, dim)
    for rows, idx, masked in plan.groups:
        out[0, rows] = attend(queries[rows], keys[:, idx], values[:, idx], masked, scaling)
    return out, None


def register(name: str = EXACT, attention=exact_attention) -> str:
    """Make the attention function ``attention`` known to transformers as ``name`` (idempotent; default: this
    module's exact attention); its mask is the eager path's, always materialized, so the function sees which keys
    each row may read."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, eager_mask)
    return name


@torch.no_grad()
def row_invariant(model: torch.nn.Module, rows: int = 33, seed: int = 0) -> dict[str, list[int]]:
    """Per linear of ``model`` (any module with ``in_features``): the row counts 2..``rows`` at which some row of the
    call differs from the same row computed alone (empty: row-invariant). The rows are heavy-tailed (normal times
    log-normal), like real activations: on plain normal rows a kernel's differing sums hide in the output's bf16
    rounding and the check passes by luck."""
    gen = torch.Generator().manual_seed(seed)
    found = {}
    for name, layer in model.named_modules():
        if not hasattr(layer, "in_features"):
            continue
        shape = (rows, layer.in_features)
        x = (torch.randn(shape, generator=gen) * torch.exp(2 * torch.randn(shape, generator=gen)))
        dtype = getattr(layer, "dtype", None) if not isinstance(layer, torch.nn.Linear) else layer.weight.dtype
        x = x.to(dtype or torch.float32)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(rows)])
        found[name] = [r for r in range(2, rows + 1) if not torch.equal(layer(x[:r]), alone[:r])]
    return found


def make_invariant(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (in place) computing attention with ``exact_attention``."""
    model.set_attn_implementation(register())
    return model

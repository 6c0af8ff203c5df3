"""Why bf16 and q4 speculation is not always identical to the same backend's AR, measured (docs/speed.md).

Run from the repository root, one thread, the machine otherwise quiet (about 15 minutes):

    OMP_NUM_THREADS=1 python tools/attention_invariance.py > attention-invariance.json

A verify pass computes T rows at once where AR computes one; greedy speculation equals AR only where every row of
the verify equals, bit for bit, the row AR computes for the same token. Three measurements, printed as one JSON
object (with the CPU model and its bf16 support):

  linears   every linear of the bf16 and q4 backends (lm_head included) computing 2-33 heavy-tailed rows at once
            against each row alone (``jetflow.engine.invariant.row_invariant``): the row counts at which some row
            differs, for the linears where any does (empty = every linear row-invariant)
  kernels   fp32 matmuls shaped like attention (9 heads, 17 queries or 1, keys 10-2,500): does one query's row equal
            its row in the 17-query call, for the scores (q @ k^T) and for the weights times values with the
            query's keys contiguous (AR) or scattered among masked tree slots (verify)? Counts of unequal cases
  layers    bf16 and q4, six AR steps against a 6-token chain verify of the same tokens: the first decoder layer and
            site (attention input after the norm, attention output, MLP middle, MLP output) where a position differs,
            and per layer how many of the six positions' attention outputs differ, with SDPA, with fp32 attention
            and with the kit's exact attention (``jetflow.engine.invariant``)
  decode    4 prompts x (ddtree, jetflow-pc, lookup, jetflow+lookup), 64 new tokens, budget 16: how many
            speculative outputs equal the same backend's AR, with transformers' SDPA attention, with attention
            computed in fp32 (``fp32_attention`` below: scores, softmax and weighted values in fp32, the output
            cast back) and with exact attention
  cost      q4, one verify of a 1-, 4-, 8- and 17-token chain after a prompt, median ms of 9, SDPA and exact

What it found is in docs/speed.md: in a decode the rows part first in SDPA's bf16 attention; with attention in fp32
(the cheap idea: differences shrink to fp32's last bits before the cast to bf16) they part a little later, in a bf16
linear at a row count where it is not row-invariant, and the decode agrees no more often; the fp32 kernels are not
row-invariant either (``kernels``). Exact attention (each row through the call an AR step makes) makes q4 equal at
every site, because its packed linears compute each row alone; bf16's down projection does not.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jetflow.engine.target as target_module  # noqa: E402
from jetflow.drafting.methods import make_proposer  # noqa: E402
from jetflow.engine import invariant  # noqa: E402
from jetflow.engine.decode import generate  # noqa: E402
from jetflow.engine.load import load_backend  # noqa: E402
from jetflow.engine.tree import Tree  # noqa: E402
from jetflow.engine.verify import tree_attention_mask  # noqa: E402
from jetflow.util import hardware  # noqa: E402

PROMPTS = ("Natalia sold clips to 48 of her friends in April, and then half as many in May. How many in all?",
           "What is the sum of all positive divisors of 36?",
           "Solve for x: 3x + 7 = 22. Explain each step.",
           "Write a Python function that returns the n-th Fibonacci number.")
METHODS = ("ddtree", "jetflow-pc", "lookup", "jetflow+lookup")
FP32_ATTENTION = "jetflow_fp32"
ATTENTIONS = ("sdpa", FP32_ATTENTION, invariant.EXACT)
ROW_COUNTS = (2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 24, 32, 33)


def fp32_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                   **kwargs) -> tuple[torch.Tensor, None]:
    """(B, T, H, D) attention of ``query`` (B, H, T, D) over ``key``/``value`` (B, KVH, L, D) with every product
    and sum in fp32; ``attention_mask``: additive or boolean (B, 1, T, >= L), or None (causal, the last T keys
    being the queries' own)."""
    rep = query.shape[1] // key.shape[1]
    key = key.float().repeat_interleave(rep, 1) if rep > 1 else key.float()
    value = value.float().repeat_interleave(rep, 1) if rep > 1 else value.float()
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query.float(), key.transpose(-1, -2)) * scale
    t, length = scores.shape[-2:]
    if attention_mask is not None:
        mask = attention_mask[..., :length]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    elif t > 1:
        rows = torch.arange(t, device=scores.device)[:, None] + (length - t)
        scores = scores.masked_fill(torch.arange(length, device=scores.device)[None, :] > rows, float("-inf"))
    out = torch.matmul(torch.softmax(scores, -1), value)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def register() -> str:
    """Make ``FP32_ATTENTION`` known to transformers (``invariant.register``) and to the kit's check of what takes a
    tree mask (idempotent)."""
    invariant.register(FP32_ATTENTION, fp32_attention)
    if FP32_ATTENTION not in target_module.ATTENTION:
        target_module.ATTENTION = target_module.ATTENTION + (FP32_ATTENTION,)
    return FP32_ATTENTION


@contextlib.contextmanager
def attention_of(target, name: str):
    """``target`` (a cached, shared model) computing attention with ``name`` inside the block, as before after it."""
    before = target.model.config._attn_implementation
    target.model.set_attn_implementation(name)
    try:
        yield target
    finally:
        target.model.set_attn_implementation(before)


def linears(backend: str) -> dict:
    """The linears of ``backend`` that are not row-invariant at some of 2-33 heavy-tailed rows, with those counts."""
    return {name: rows for name, rows in invariant.row_invariant(load_backend(backend).model).items() if rows}


def cost(backend: str, attention: str, sizes=(1, 4, 8, 17), reps: int = 9) -> dict:
    """Median ms of one verify of an n-token chain after the first prompt (the prefill excluded), per n."""
    with attention_of(load_backend(backend), attention) as target:
        ids = target.encode(PROMPTS[0])
        out = {}
        for n in sizes:
            chain = Tree.from_lists(list(range(100, 100 + n)), list(range(-1, n - 1)))
            cache = target.new_cache()
            target.forward(ids, cache)
            past = cache.get_seq_length()
            mask = tree_attention_mask(chain, past, target.dtype, target.device) if n > 1 else None
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                target.forward(chain.tokens, cache, positions=chain.depth + past, mask=mask)
                times.append(time.perf_counter() - t0)
                for layer in cache.layers:
                    layer.keys, layer.values = layer.keys[..., :past, :], layer.values[..., :past, :]
            out[n] = round(1000 * sorted(times)[reps // 2], 1)
    return out


def kernels() -> dict:
    torch.manual_seed(0)
    heads, nodes, row = 9, 17, 5
    scores = values = cases = 0
    for keys in (10, 60, 100, 250, 256, 300, 512, 1000, 1024, 2048, 2500):
        q, k = torch.randn(1, heads, nodes, 64), torch.randn(1, heads, keys + nodes, 64)
        scores += not torch.equal(q[:, :, row:row + 1] @ k.transpose(-1, -2), (q @ k.transpose(-1, -2))[:, :, row:row + 1])
        v = torch.randn(1, heads, keys + nodes, 64)
        for depth in (0, 3, 7, 12):
            path = torch.tensor(sorted(torch.randperm(nodes)[:depth + 1].tolist()))
            w = torch.rand(1, heads, 1, keys + depth + 1)
            ar = w @ torch.cat([v[:, :, :keys], v[:, :, keys:][:, :, path]], 2)
            tree = torch.rand(1, heads, nodes, keys + nodes)
            tree[:, :, row] = 0
            tree[:, :, row, :keys], tree[:, :, row, keys + path] = w[:, :, 0, :keys], w[:, :, 0, keys:]
            values += not torch.equal(ar[:, :, 0], (tree @ v)[:, :, row])
            cases += 1
    return {"scores_unequal": scores, "scores_cases": 11, "values_unequal": values, "values_cases": cases}


def first_differences(backend: str, attention: str, steps: int = 6) -> dict:
    """Six AR steps against one 6-token chain verify of the same tokens: per decoder layer, at the attention's
    input (after the norm), its output (before o_proj), the MLP's middle (before down_proj) and its output (after
    down_proj), the positions whose values differ at all; the first layer and site where any does."""
    target = load_backend(backend)
    seen: dict[str, list[torch.Tensor]] = {}
    sites = {"attention input": ("self_attn.q_proj", "in"), "attention output": ("self_attn.o_proj", "in"),
             "mlp middle": ("mlp.down_proj", "in"), "mlp output": ("mlp.down_proj", "out")}
    handles = []
    for i, layer in enumerate(target.model.model.layers):
        for site, (path, side) in sites.items():
            def keep(module, args, output, key=f"{i} {site}", side=side):
                x = args[0] if side == "in" else output
                seen.setdefault(key, []).append(x.detach().reshape(-1, x.shape[-1]).clone())
            handles.append(layer.get_submodule(path).register_forward_hook(keep))
    try:
        with attention_of(target, attention):
            ids = target.encode(PROMPTS[0])
            cache = target.new_cache()
            tokens = [int(target.forward(ids, cache).logits[-1].argmax())]
            seen.clear()
            for _ in range(steps):
                tokens.append(int(target.forward(torch.tensor(tokens[-1:]), cache).logits[-1].argmax()))
            ar = {k: torch.cat(v) for k, v in seen.items()}
            cache = target.new_cache()
            target.forward(ids, cache)
            seen.clear()
            target.forward(torch.tensor(tokens[:steps]), cache)
    finally:
        for h in handles:
            h.remove()
    differing = {k: [p for p in range(steps) if not torch.equal(ar[k][p], seen[k][0][p])] for k in ar}
    order = [f"{i} {site}" for i in range(len(target.model.model.layers)) for site in sites]
    first = next((k for k in order if differing[k]), None)
    return {"first": first, "first_positions": differing[first] if first else [],
            "attention_outputs_differing_per_layer": [len(differing[f"{i} attention output"])
                                                      for i in range(len(target.model.model.layers))]}


def decode(backend: str, attention: str) -> dict:
    same = {m: 0 for m in METHODS}
    with attention_of(load_backend(backend), attention) as target:
        for prompt in PROMPTS:
            ref = generate(target, prompt, None, max_new_tokens=64).tokens
            for m in METHODS:
                same[m] += generate(target, prompt, make_proposer(m, target), budget=16, max_new_tokens=64).tokens == ref
    return {"identical_to_ar": same, "prompts": len(PROMPTS)}


def main() -> None:
    register()
    invariant.register()
    torch.set_num_threads(1)
    report = {"cpu": hardware.cpu_model(), "bf16_flags": list(hardware.cpu_bf16_flags()), "torch": torch.__version__,
              "linears": {b: linears(b) for b in ("bf16", "q4")}, "kernels": kernels(),
              "layers": {f"{b} {a}": first_differences(b, a) for b in ("bf16", "q4") for a in ATTENTIONS},
              "cost": {a: cost("q4", a) for a in ("sdpa", invariant.EXACT)}, "decode": {}}
    print(json.dumps(report["layers"]), "<- layers", file=sys.stderr)
    for backend in ("bf16", "q4"):
        for attention in ATTENTIONS:
            report["decode"][f"{backend} {attention}"] = decode(backend, attention)
            print(json.dumps(report["decode"][f"{backend} {attention}"]), f"<- {backend} {attention}", file=sys.stderr)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""llama.cpp's own verify-cost curve: what one batched ``llama_decode`` of k draft tokens costs after a
cached prefix, against its one-token step (issue 40, deliverable 5: llama.cpp as the verifying target).

Two shapes per size: a ``chain`` (one sequence id, k tokens in a row) and a ``tree`` (a root shared by
up to ``paths`` root-to-leaf paths, one sequence id per path; the root carries them all, every other
node the id of its path, so llama.cpp's mask lets a node see the prefix, the root and its own path's
earlier nodes only). The prefix is copied to every sequence id once (one KV buffer, ``kv_unified``); after
each timed decode the draft cells are removed again, so every decode sees the same prefix.
``ar_agreement`` checks the route's exactness: the argmax after each of k tokens decoded in one batch
against the same tokens decoded one at a time (llama.cpp's AR).
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from jetflow.drafting.cost import interp_cost
from .llamacpp import bench_extra

SIZES = (1, 2, 4, 8, 12, 16, 24, 32)  # the issue's query lengths; a run adds its trees' sizes (budget + 1)


def tree_layout(size: int, paths: int) -> list[tuple[int, tuple[int, ...]]]:
    """(depth below the root, sequence ids) of each node of a ``size``-node tree with up to ``paths``
    root-to-leaf paths: the root on every path, the other nodes dealt to the paths in turn."""
    n = max(1, min(paths, size - 1))
    nodes, depth = [(0, tuple(range(n)))], [0] * n
    for i in range(size - 1):
        depth[i % n] += 1
        nodes.append((depth[i % n], (i % n,)))
    return nodes


def chain_layout(size: int) -> list[tuple[int, tuple[int, ...]]]:
    return [(i, (0,)) for i in range(size)]


class BatchContext:
    """A second llama.cpp context on ``llm``'s model (same threads and attention settings as ``llm``'s),
    with room for ``n_seq`` sequence ids over one KV buffer and batches of up to ``n_batch`` tokens."""

    def __init__(self, llm, n_seq: int, n_ctx: int, n_batch: int):
        self.lib = bench_extra()
        params = type(llm.context_params).from_buffer_copy(llm.context_params)
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, n_batch
        params.n_seq_max, params.kv_unified = n_seq, True
        self.ctx = self.lib.llama_init_from_model(llm.model, params)
        self.batch = self.lib.llama_batch_init(n_batch, 0, n_seq)
        self.mem = self.lib.llama_get_memory(self.ctx)
        self.n_vocab = llm.n_vocab()

    def decode(self, tokens, nodes, start: int) -> None:
        """Decode ``tokens`` at positions ``start + depth`` with the nodes' sequence ids, logits for all."""
        b = self.batch
        b.n_tokens = len(tokens)
        for i, (tok, (depth, seqs)) in enumerate(zip(tokens, nodes)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, start + depth, len(seqs), 1
            for j, s in enumerate(seqs):
                b.seq_id[i][j] = s
        if self.lib.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax(self, i: int) -> int:
        ptr = self.lib.llama_get_logits_ith(self.ctx, i)
        return int(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def drop_from(self, pos: int) -> None:
        self.lib.llama_memory_seq_rm(self.mem, -1, pos, -1)

    def share_prefix(self, n_seq: int) -> None:
        for s in range(1, n_seq):
            self.lib.llama_memory_seq_cp(self.mem, 0, s, -1, -1)

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)


def _prefill(bc: BatchContext, prefix: list[int], paths: int) -> None:
    bc.drop_from(0)
    bc.decode(prefix, chain_layout(len(prefix)), 0)
    bc.share_prefix(paths)


def verify_curve(llm, sizes=SIZES, *, past_len: int = 256, repeats: int = 5, paths: int = 4,
                 seed: int = 0) -> list[dict]:
    """Median seconds of one batched decode per (shape, size), sweeps interleaved over shapes and sizes,
    over a random ``past_len``-token prefix; ``ar_steps`` = seconds over the chain's 1-token decode."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(100, llm.n_vocab(), past_len).tolist()
    bc = BatchContext(llm, paths, past_len + max(sizes) + 8, max(past_len, max(sizes)))
    shapes = {"chain": chain_layout, "tree": lambda k: tree_layout(k, paths)}
    times = {(s, k): [] for s in shapes for k in sizes}
    try:
        _prefill(bc, prefix, paths)
        for _ in range(repeats + 1):  # the first sweep warms up, untimed
            for (shape, k), got in times.items():
                tokens = rng.integers(100, llm.n_vocab(), k).tolist()
                t0 = time.perf_counter()
                bc.decode(tokens, shapes[shape](k), past_len)
                bc.argmax(k - 1)
                got.append(time.perf_counter() - t0)
                bc.drop_from(past_len)
    finally:
        bc.close()
    one = statistics.median(times[("chain", min(sizes))][1:])
    return [{"kind": "llama-verify", "shape": shape, "size": k, "paths": min(paths, max(1, k - 1)) if shape == "tree" else 1,
             "seconds": statistics.median(t[1:]), "ar_steps": statistics.median(t[1:]) / one, "past_len": past_len}
            for (shape, k), t in times.items()]


def ar_agreement(llm, prompt: list[int], size: int = 32) -> dict:
    """Greedy AR (one token per decode) for ``size`` tokens after ``prompt``, then the same tokens in one
    batch: how many of the batch's argmaxes equal the AR tokens they should predict."""
    bc = BatchContext(llm, 1, len(prompt) + size + 8, max(len(prompt), size))
    try:
        bc.decode(prompt, chain_layout(len(prompt)), 0)
        ar = [bc.argmax(len(prompt) - 1)]
        for i in range(size):
            bc.decode([ar[-1]], chain_layout(1), len(prompt) + i)
            ar.append(bc.argmax(0))
        bc.drop_from(len(prompt))
        bc.decode(ar[:size], chain_layout(size), len(prompt))
        batched = [bc.argmax(i) for i in range(size)]
    finally:
        bc.close()
    same = sum(a == b for a, b in zip(batched, ar[1:]))
    return {"kind": "llama-verify-agreement", "size": size, "same_argmax": same,
            "first_difference": next((i for i, (a, b) in enumerate(zip(batched, ar[1:])) if a != b), None)}


def route_rows(decode: list[dict], curve: list[dict]) -> list[dict]:
    """llama.cpp as the verifying target, modelled: every kit head-method row (backend, method, budget,
    tau) verified as llama.cpp's tree of budget + 1 tokens instead. ``bound_tokens_per_s`` = tau over
    that tree's decode seconds, drafting counted free: an upper bound of the route on this machine, set
    beside llama.cpp's own AR (``vs_llama_cpp_ar``) and the kit's measured tokens/s for the same row."""
    cost = {r["size"]: r["seconds"] for r in curve if r["shape"] == "tree"}
    ar = next((r["tokens_per_s"] for r in decode if r["backend"] == "llama.cpp" and r["method"] == "ar"), None)
    rows = []
    for r in decode:
        if r["backend"] == "llama.cpp" or r["budget"] is None or not r["tau"] or r["budget"] + 1 > max(cost, default=0):
            continue
        verify_s = interp_cost(cost, r["budget"] + 1)
        bound = r["tau"] / verify_s
        rows.append({"kind": "llama-route", "backend": r["backend"], "method": r["method"], "budget": r["budget"],
                     "tau": r["tau"], "verify_s": verify_s, "bound_tokens_per_s": bound,
                     "vs_llama_cpp_ar": None if ar is None else bound / ar, "kit_tokens_per_s": r["tokens_per_s"]})
    return rows

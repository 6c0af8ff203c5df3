"""Where a quantized target's decode step goes, through transformers' forward and through the lean forward
(jetflow.engine.lean), in one process: docs/speed.md, "The lean forward", quotes this tool's output.

    OMP_NUM_THREADS=1 python tools/lean_forward.py [--backends q4,int8] [--compiled] [--json OUT]

Per backend: the median milliseconds of a verify of 1, 2, 4, 8 and 17 chain tokens after a one-sentence chat prompt on both
forwards (the two interleave, so a shared machine's load hits them alike), whether the two give the same logits bit
for bit, and the share of the lean one-token step spent inside the packed kernels (torch's profiler); and the packed
lm_head's own cost at 1-16 rows. ``--compiled`` adds the compiled lean forward (jetflow.engine.lean_compiled) as a
third column, its graph's compile (or cache-load) seconds apart. Record the CPU: the output names it and its bf16
support.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from jetflow.engine.lean_compiled import compile_lean
from jetflow.engine.load import load_backend
from jetflow.engine.target import Target, keep_path
from jetflow.util import hardware

PROMPT = "A rectangle has a perimeter of 30 units and its length is twice its width. What is its area? Show each step."
SIZES = (1, 2, 4, 8, 17)
KERNELS = ("aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int8pack_mm")


def verify_ms(target, ids: torch.Tensor, size: int) -> float:
    """One chain verify of ``size`` tokens after ``ids`` (the rows dropped after it), in ms."""
    cache = target.new_cache()
    target.forward(ids, cache, last_only=True)
    past = cache.get_seq_length()
    tokens = ids[-size:].clone()
    t0 = time.perf_counter()
    target.forward(tokens, cache)
    ms = (time.perf_counter() - t0) * 1e3
    keep_path(cache, past, [])
    return ms


def same_logits(a, b, ids: torch.Tensor) -> bool:
    """The prefill and a 4-token chain after it give the same logits on both targets."""
    out = []
    for target in (a, b):
        cache = target.new_cache()
        out.append((target.forward(ids, cache).logits, target.forward(ids[-4:], cache).logits))
    return all(torch.equal(x, y) for x, y in zip(*out))


def kernel_share(target, ids: torch.Tensor, steps: int = 10) -> float:
    """The share of one-token steps' wall time spent inside the packed kernels."""
    from torch.profiler import ProfilerActivity, profile
    cache = target.new_cache()
    target.forward(ids, cache, last_only=True)
    past = cache.get_seq_length()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            target.forward(ids[-1:], cache)
            keep_path(cache, past, [])
        wall = time.perf_counter() - t0
    inside = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in KERNELS) / 1e6
    return inside / wall


def lm_head_ms(target, rows=(1, 2, 4, 8, 16), repeats: int = 20) -> dict[int, float]:
    head = target.model.get_output_embeddings()
    out = {}
    for n in rows:
        x = torch.randn(n, head.in_features, dtype=target.dtype)
        head(x)
        t0 = time.perf_counter()
        for _ in range(repeats):
            head(x)
        out[n] = (time.perf_counter() - t0) / repeats * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="q4,int8")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--compiled", action="store_true", help="time the compiled lean forward too")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    report = {"cpu": hardware.cpu_model(), "bf16_flags": list(hardware.cpu_bf16_flags()),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "backends": {}}
    with torch.inference_mode():
        for name in args.backends.split(","):
            lean = load_backend(name)
            plain = Target(lean.model, lean.tokenizer, lean.name)  # the same model through transformers' forward
            ids = lean.encode(PROMPT)
            forwards = {"transformers": plain, "lean": lean}
            if args.compiled:
                forwards["lean-compiled"] = compile_lean(lean)
                compile_s = forwards["lean-compiled"].warm()[0]["seconds"]
            times = {key: {n: [] for n in SIZES} for key in forwards}
            for _ in range(args.repeats):
                for n in SIZES:
                    for key, target in forwards.items():
                        times[key][n].append(verify_ms(target, ids, n))
            med = {key: {n: round(statistics.median(v), 2) for n, v in per.items()} for key, per in times.items()}
            report["backends"][name] = {
                "forward": type(lean).__name__, "verify_ms": med,
                "speedup_1": round(med["transformers"][1] / med["lean"][1], 2),
                "same_logits": same_logits(plain, lean, ids),
                "kernel_share_lean_step": round(kernel_share(lean, ids), 3),
                "kernel_share_transformers_step": round(kernel_share(plain, ids), 3),
                "lm_head_ms": {n: round(v, 2) for n, v in lm_head_ms(lean).items()}}
            if args.compiled:
                report["backends"][name].update({"compile_s": round(compile_s, 1),
                                                 "compiled_speedup_1": round(med["lean"][1] / med["lean-compiled"][1], 2)})
            print(json.dumps({name: report["backends"][name]}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "backends"}))


if __name__ == "__main__":
    main()

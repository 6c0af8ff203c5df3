"""The GPU path's checks that need a CUDA device and no hub: one GPU, under 10 minutes, nothing downloaded.

Run from the repository root on a CUDA machine (docs/gpu.md, "A device review"):

    set -o pipefail; PYTHONUNBUFFERED=1 OUT=gpu-review timeout 590 python tools/gpu_review.py 2>&1 | tee gpu-review.log

It has not run on a GPU yet (no session so far had one). It writes $OUT/device-report.json (every section's
result, rewritten after each), $OUT/gpu-check.json and $OUT/compiled-tiny.log. Each section is guarded: a crash
is recorded with its traceback and the next section still runs; the heavy ones are skipped when too little of the
time budget is left. Weights are random throughout (no hub), so the times are speeds and tau means nothing, except
for the oracle proposers, which replay AR's own answer.

  env      torch, CUDA, transformers and GPU; transformers' cache argument; whether StaticLayer has the fields the
           compiled target reads (cumulative_length, is_initialized)
  sdpa     which SDPA backends take the verify's additive bf16 mask at 257 queries x 3,557 keys: ms, error vs fp32
  real     a random target of Qwen3-8B's shape in bf16 and random heads of the published shape (5 layers, block 16;
           dflash and ddtree share one head, as a bench does): AR, oracle trees at 15/63/255 (identical to AR?),
           every method at 15 and 255: tokens/s, median draft and verify ms, peak GiB beside the plan's estimate
           (jetflow.evaluation.memory), and the quick preset's decode time projected from these speeds
  fp32     the real vocabulary (151,936), head_dim 128, fp32: oracle trees and random-head methods decode exactly
           what transformers' greedy generate does, on CUDA kernels
  compiled a tiny target compiled over a static cache: greedy tokens equal the eager target's (subprocess, its log
           with inductor's perf hints in $OUT/compiled-tiny.log)
  gpucheck python -m jetflow gpu-check --skip-embedded (the kit's own check)
  plan     bench --preset qwen3-8b-quick --plan and --preset qwen3-8b --plan (what `make gpu-quick` and the full run
           would do; they need the hub, which this script never touches)
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
T0 = time.time()
BUDGET_S = 560.0
OUT = Path(os.environ.get("OUT") or "gpu-review")
REPORT: dict = {}
ASSUMED_TAU = 6.0  # the quick projection's tau where the paper reports none (DDTree at 16)


def left() -> float:
    return BUDGET_S - (time.time() - T0)


def say(*parts) -> None:
    print(f"[{time.time() - T0:6.1f}s]", *parts, flush=True)


def section(name: str, fn, min_left: float = 0.0) -> None:
    """Run one section into REPORT[name]; a crash is recorded (never hidden), a short budget skips it."""
    if left() < min_left:
        REPORT[name] = {"skipped": f"{left():.0f} s left < {min_left:.0f} s"}
    else:
        t = time.time()
        try:
            REPORT[name] = fn() or {}
        except Exception as err:  # noqa: BLE001  the finding goes into the report
            REPORT[name] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-2000:]}
        REPORT[name]["seconds"] = round(time.time() - t, 1)
    say(name, json.dumps(REPORT[name], default=str)[:1500])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "device-report.json").write_text(json.dumps(REPORT, indent=1, default=str) + "\n")


# ----------------------------------------------------------------------------- env and sdpa
def env() -> dict:
    import torch
    import transformers
    from transformers import Qwen3ForCausalLM
    from transformers.cache_utils import StaticLayer
    from jetflow.engine.target import cache_argument
    p = torch.cuda.get_device_properties(0)
    try:
        layer = StaticLayer(8)
        static = {f: hasattr(layer, f) for f in ("cumulative_length", "is_initialized")}
    except Exception as err:  # noqa: BLE001
        static = {"error": f"StaticLayer(8) raised {type(err).__name__}: {err}"}
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "gpu": p.name, "gpu_gib": round(p.total_memory / 2**30, 1), "python": sys.version.split()[0],
            "cache_argument": cache_argument(Qwen3ForCausalLM), "static_layer": static}


def sdpa() -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 32, 257, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 32, 3557, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    allowed = torch.rand(257, 3557, device="cuda", generator=g) < 0.9
    allowed[:, :3300] = True  # the prefix: every node sees it
    mask = torch.zeros(1, 1, 257, 3557, device="cuda", dtype=torch.bfloat16).masked_fill_(
        ~allowed, torch.finfo(torch.bfloat16).min)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float())
    out = {}
    for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
        try:
            with sdpa_kernel([b]):
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(20):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                torch.cuda.synchronize()
            out[b.name] = {"ok": True, "ms": round((time.perf_counter() - t) / 20 * 1e3, 3),
                           "max_abs_err_vs_fp32": float((y.float() - ref).abs().max()), "nan": bool(y.isnan().any())}
        except Exception as err:  # noqa: BLE001  a backend that refuses the mask is a finding
            out[b.name] = {"ok": False, "error": str(err).splitlines()[0][:200]}
    return out


# ----------------------------------------------------------------------------- the real shape
def _stats(res, peak: float) -> dict:
    r = res.rounds
    return {"tokens": res.new_tokens, "rounds": len(r), "tau": round(res.tau, 2),
            "tokens_per_s": round(res.new_tokens / res.decode_s, 1) if res.decode_s else None,
            "draft_ms": round(statistics.median(x.draft_s for x in r) * 1e3, 2) if r else None,
            "verify_ms": round(statistics.median(x.verify_s for x in r) * 1e3, 2) if r else None,
            "peak_gib": round(peak, 2)}


def real_shape_proposers(target):
    """method -> proposer with random heads of the published shape; dflash and ddtree share one head object."""
    import torch
    from jetflow.drafting import methods as registry
    from jetflow.drafting.proposers import HeadProposer
    from jetflow.gpu_check import SHAPES, random_head
    shape = SHAPES["qwen3-8b"]
    heads = {causal: random_head(target, shape["head_layers"], causal, shape["mask_token_id"], torch.bfloat16)
             for causal in (True, False)}
    return {m: HeadProposer(heads[registry.method(m).head == "jetflow"], target, registry.method(m).builder)
            for m in ("dflash", "ddtree", "jetflow")}


def real() -> dict:
    import torch
    from jetflow.drafting.proposers import OracleProposer
    from jetflow.engine.decode import generate
    from jetflow.gpu_check import SHAPES, random_target
    target = random_target(SHAPES["qwen3-8b"], "cuda", torch.bfloat16, 0, "random qwen3-8b", init=0.02)
    ids = torch.randint(0, 151_000, (1024,), generator=torch.Generator().manual_seed(0))
    out = {"target_gib": round(torch.cuda.memory_allocated() / 2**30, 2)}
    proposers = real_shape_proposers(target)
    out["weights_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)

    def timed(key, proposer, budget, new, prompt=ids):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        res = generate(target, prompt, proposer, budget=budget, max_new_tokens=new)
        torch.cuda.synchronize()
        out[key] = _stats(res, torch.cuda.max_memory_allocated() / 2**30)
        return res

    generate(target, ids, None, max_new_tokens=4)  # first-call costs, untimed
    ar = timed("ar", None, 1, 96)
    for b in (15, 63, 255):  # bf16: a near-tie may flip a token (docs/method.md); counted, not asserted
        res = timed(f"oracle@{b}", OracleProposer(ar.tokens, 151936), b, 96)
        out[f"oracle@{b}"]["identical_to_ar"] = res.tokens == ar.tokens
    for m, proposer in proposers.items():
        for b in (15, 255):
            timed(f"{m}@{b}", proposer, b, 48)
    long_ids = torch.randint(0, 151_000, (3000,), generator=torch.Generator().manual_seed(1))
    timed("jetflow@255 after 3000 prompt tokens", proposers["jetflow"], 255, 16, long_ids)
    out["estimate"] = plan_estimate()
    out["quick_projection"] = quick_projection(out)
    del target, proposers
    torch.cuda.empty_cache()
    return out


def plan_estimate() -> dict:
    """The plan's meta-device memory estimate of the quick preset, to set beside the measured peaks."""
    from jetflow.evaluation import bench, memory
    est = memory.estimate(bench.BenchConfig.from_name("qwen3-8b-quick"))
    return {"resident_gib": round(est.resident / 2**30, 2), "run_peak_gib": round(est.run_peak / 2**30, 2),
            "per_method_gib": {m: round(b / 2**30, 2) for m, b in est.peak.items()}}


def quick_projection(out: dict) -> dict:
    """The quick preset's decode minutes from this GPU's measured round times: AR at its measured speed, each
    head method at the paper's tau (rounds = tokens / tau, each costing its measured draft + verify ms)."""
    from jetflow.evaluation import bench, paper, plan
    cfg = bench.BenchConfig.from_name("qwen3-8b-quick")
    p, tokens = plan.plan(cfg), cfg.max_new_tokens
    seconds = {"ar": tokens / out["ar"]["tokens_per_s"]}
    for c in p["decoded"][1:]:
        m, _, b = c.partition("@")
        tau = statistics.mean((paper.paper_row(m, int(b) + 1, ds) or (None, ASSUMED_TAU))[1] for ds in cfg.datasets)
        row = out[f"{m}@{b}"]
        seconds[c] = tokens / tau * (row["draft_ms"] + row["verify_ms"]) / 1e3
    total = p["n_prompts"] * sum(seconds.values())
    return {"per_prompt_s": {k: round(v, 2) for k, v in seconds.items()}, "decode_min": round(total / 60, 1),
            "note": f"tau: the paper's at that budget where it has one, else {ASSUMED_TAU} (assumed)"}


# ----------------------------------------------------------------------------- fp32, compiled, gpu-check, plan
def fp32() -> dict:
    import torch
    from jetflow.drafting import methods as registry
    from jetflow.drafting.proposers import HeadProposer, OracleProposer
    from jetflow.engine.decode import generate
    from jetflow.gpu_check import hf_greedy, random_head, random_target
    shape = dict(vocab_size=151936, hidden_size=1024, intermediate_size=2816, num_hidden_layers=6,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=128, rope_theta=1e6,
                 max_position_embeddings=4096)
    target = random_target(shape, "cuda", torch.float32, 3, "fp32 real vocabulary", init=0.2)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 151_000, (n,), generator=gen) for n in (12, 200, 700)]
    refs = [hf_greedy(target, p, 40) for p in prompts]
    heads = {c: random_head(target, 2, c, 151669, torch.float32) for c in (True, False)}
    runs = {}
    for b in (15, 255):
        runs[f"oracle@{b}"] = lambda ref, b=b: (OracleProposer(ref, 151936), b)
        runs[f"oracle wrong at 2 @{b}"] = lambda ref, b=b: (OracleProposer(ref, 151936, wrong_at=2, siblings=2), b)
        for m in ("jetflow", "dflash", "ddtree"):
            e = registry.method(m)
            runs[f"{m}@{b}"] = lambda ref, e=e, b=b: (HeadProposer(heads[e.head == "jetflow"], target, e.builder), b)
    out = {}
    for name, build in runs.items():
        same = 0
        for p, ref in zip(prompts, refs):
            proposer, b = build(ref)
            same += generate(target, p, proposer, budget=b, max_new_tokens=len(ref)).tokens == ref
        out[name] = f"{same}/{len(prompts)} equal"
    out["all_equal"] = all(v.startswith(f"{len(prompts)}/") for v in out.values())
    return out


def compiled_child() -> dict:
    import torch
    from jetflow.drafting.proposers import HeadProposer
    from jetflow.engine.compiled import CompileConfig, compile_target
    from jetflow.engine.decode import generate
    from jetflow.gpu_check import SHAPES, random_head, random_target
    target = random_target(SHAPES["tiny"], "cuda", torch.float32, 0, "tiny")
    head = random_head(target, 2, True, 511, torch.float32)
    ids = torch.randint(0, 500, (10,), generator=torch.Generator().manual_seed(0))
    want = {"ar": generate(target, ids, None, max_new_tokens=40).tokens,
            "jetflow": generate(target, ids, HeadProposer(head, target, "accum_logp"), budget=16,
                                max_new_tokens=40).tokens}
    compiled = compile_target(target, CompileConfig(cache_len=256, query_sizes=(1, 17), head_contexts=(64, 256)))
    t = time.time()
    got = {"ar": generate(compiled, ids, None, max_new_tokens=40).tokens,
           "jetflow": generate(compiled, ids, HeadProposer(head, compiled, "accum_logp"), budget=16,
                               max_new_tokens=40).tokens}
    return {"equal_to_eager": {k: got[k] == want[k] for k in want}, "first_run_s": round(time.time() - t, 1)}


def child(name: str, timeout: float, log: str) -> dict:
    env = dict(os.environ, TORCH_LOGS="perf_hints", PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True,
                              timeout=max(30.0, timeout))
        text, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:  # keep what it printed before the limit
        text = "".join(x.decode() if isinstance(x, bytes) else (x or "") for x in (err.stdout, err.stderr))
        code = f"timeout after {timeout:.0f} s"
    (OUT / log).write_text(text)
    result = next((json.loads(line[7:]) for line in text.splitlines()[::-1] if line.startswith("RESULT ")),
                  {"error": f"exit {code}", "tail": text[-1500:]})
    return result | {"skipping_cudagraphs_lines": text.count("skipping cudagraphs"),
                     "recompile_lines": text.lower().count("recompil")}


def command(*argv: str, timeout: float) -> dict:
    proc = subprocess.run([sys.executable, "-m", "jetflow", *argv], capture_output=True, text=True,
                          timeout=max(30.0, timeout))
    return {"exit": proc.returncode, "output": (proc.stdout + proc.stderr)[-3000:]}


def main() -> None:
    import torch
    if not torch.cuda.is_available():
        sys.exit("CUDA is not available: this script checks the GPU path (docs/gpu.md)")
    section("env", env)
    section("sdpa", sdpa)
    section("plan", lambda: {p: command("bench", "--preset", p, "--plan", timeout=120)
                             for p in ("qwen3-8b-quick", "qwen3-8b")})
    section("real", real, min_left=200)
    section("fp32", fp32, min_left=90)
    section("compiled", lambda: child("compiled", min(200.0, left() - 20), "compiled-tiny.log"), min_left=120)
    section("gpucheck", lambda: command("gpu-check", "--skip-embedded", "--samples", "300", "--reps", "5",
                                        "--out", str(OUT / "gpu-check.json"), timeout=min(240.0, left() - 10)),
            min_left=100)
    say("done; report in", OUT / "device-report.json")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print("RESULT " + json.dumps({"compiled": compiled_child}[sys.argv[2]](), default=str), flush=True)
    else:
        main()

"""``python -m jetflow demo``: the kit doing its job on the embedded target, in about two minutes.

    rows = run(DemoConfig())                   # prints as it goes; one row per method, AR first
    rows = run(DemoConfig(max_new_tokens=8), target=load_target(None), say=lambda *a: None)

The demo decodes a few prompts with plain autoregressive decoding (AR), the paper's JetFlow
(``jetflow``), prompt lookup alone (``lookup``) and the kit's best methods on a CPU, JetFlow with the path
correction (``jetflow-pc``) and that with lookup merged in (``jetflow-pc+lookup``), all at budget 16 (see
docs/results.md), in the fastest dtype of this machine (``hardware.fast_dtype``), methods interleaved
prompt by prompt exactly as ``jetflow.evaluation.bench`` does. Its prompts are the kind the kit is for: answers
that reuse their prompt and themselves (a math word problem, a code edit). It then decodes a short
prompt in fp32 with every method and says whether each output is identical to AR's: greedy speculative
decoding is lossless in fp32. In bf16 a many-token verify sums in another order than a one-token AR
step, so at a near-tie the argmax can flip and the answer then goes its own way; the demo counts those.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from jetflow.util import hardware
from jetflow.evaluation import bench
from jetflow.data.prompts import math_prompt
from jetflow.drafting.methods import names
from jetflow.engine.metrics import summarize
from jetflow.util.hardware import environment
from jetflow.engine.target import Target
from jetflow.engine.load import BACKENDS, DTYPES, load_backend, load_target

PROMPTS = (  # a math word problem in the benchmarks' format, a code edit, another word problem
    math_prompt("Lena buys 3 notebooks at $4 each and 2 pens at $1.50 each. She pays with a $20 bill. "
                "How much change does she get?"),
    "Add type hints and a docstring to this function, and keep the code otherwise unchanged:\n\n"
    "def moving_average(values, window):\n"
    "    if window <= 0:\n"
    "        raise ValueError('window must be positive')\n"
    "    averages = []\n"
    "    for i in range(len(values) - window + 1):\n"
    "        chunk = values[i:i + window]\n"
    "        averages.append(sum(chunk) / window)\n"
    "    return averages\n",
    math_prompt("A train travels at 60 miles per hour for 2.5 hours, then at 40 miles per hour for 1.5 hours. "
                "How many miles does it travel in total?"),
)


@dataclass(frozen=True)
class DemoConfig:
    methods: tuple[str, ...] = ("lookup", "jetflow", "jetflow-pc", "jetflow-pc+lookup")  # the paper's, and the best
    budget: int = 16             # draft nodes excluding the root; the best measured budget on a CPU
    max_new_tokens: int = 160    # per prompt and method
    prompts: int = len(PROMPTS)  # the first this many of PROMPTS
    check_new_tokens: int = 48   # the fp32 losslessness check: new tokens of PROMPTS[0]
    dtype: str | None = None     # None: hardware.fast_dtype() (bf16 where the CPU computes it natively)

    def __post_init__(self):
        METHODS = names(lambda m: m.decodes)  # what generate runs: the registry's methods but hf
        bad = [m for m in self.methods if m not in METHODS or m == "ar"]
        if bad or not self.methods:
            raise ValueError(f"--methods: unknown or empty {bad or list(self.methods)}; choose from "
                             f"{', '.join(m for m in METHODS if m != 'ar')} (AR always runs)")
        if self.budget < 1:
            raise ValueError(f"--budget must be >= 1, got {self.budget}")
        if self.max_new_tokens < 2:
            raise ValueError(f"--max-new-tokens must be >= 2 (the first token comes from the prefill, "
                             f"a speedup needs decoding rounds), got {self.max_new_tokens}")
        if not 1 <= self.prompts <= len(PROMPTS):
            raise ValueError(f"--prompts must be between 1 and {len(PROMPTS)}, got {self.prompts}")
        if self.check_new_tokens < 2:
            raise ValueError(f"check_new_tokens must be >= 2, got {self.check_new_tokens}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


def in_dtype(target: Target, dtype: str) -> Target:
    """``target`` with its weights cast to ``dtype`` (a copy; the same as loading in that dtype)."""
    if target.dtype == DTYPES[dtype]:
        return target
    return dataclasses.replace(target, model=copy.deepcopy(target.model).to(DTYPES[dtype]))


def decode_all(target: Target, methods: Sequence[str], prompts: Sequence[str], budget: int,
               max_new_tokens: int, progress: bool = True) -> tuple[list[dict], list[list[str]]]:
    """AR and every method on every prompt, interleaved prompt by prompt after a short warm-up.

    Returns bench rows (one per method, AR first: tau, speedup, identical_to_ar, ...) and the texts,
    ``texts[k][i]`` for configuration k (AR first) on prompt i."""
    cfgs = bench.variants(target, methods, [budget])
    encoded = [target.encode(p) for p in prompts]
    for cfg in cfgs:  # untimed: the first calls of a kernel are slow
        bench.run_config(target, cfg, encoded[0], min(4, max_new_tokens), 0.0, 0)
    runs: list[list[bench.PromptRun]] = [[] for _ in cfgs]
    bar = tqdm(total=len(cfgs) * len(prompts), desc="decoding", unit="gen", disable=not progress,
               file=sys.stderr)
    for i, ids in enumerate(encoded):
        for k, cfg in enumerate(cfgs):
            runs[k].append(bench.run_config(target, cfg, ids, max_new_tokens, 0.0, i))
            bar.update()
    bar.close()
    env = environment(target)
    rows = [{"method": c.method, "budget": c.budget, **summarize(r, runs[0]), **env}
            for c, r in zip(cfgs, runs)]
    return rows, [[target.decode(run.tokens) for run in r] for r in runs]


def identical_in_fp32(target32: Target, methods: Sequence[str], prompt: str, budget: int,
                      max_new_tokens: int) -> dict[str, bool]:
    """Method -> whether its greedy fp32 output on ``prompt`` equals AR's token for token."""
    rows, _ = decode_all(target32, methods, [prompt], budget, max_new_tokens, progress=False)
    return {r["method"]: r["identical_to_ar"] == 1 for r in rows if r["method"] != "ar"}


def run(cfg: DemoConfig = DemoConfig(), *, target: Target | None = None,
        say: Callable[..., None] = print) -> list[dict]:
    """The demo: prints what it does through ``say`` and returns one row per method (AR first) with
    ``identical_in_fp32`` and ``dtype_reason`` added. ``target``: an fp32 target (default: the embedded)."""
    if cfg.dtype:
        (backend, (dtype, quant)), why = next(((b, v) for b, v in BACKENDS.items() if v == (cfg.dtype, None)),
                                              (cfg.dtype, (cfg.dtype, None))), "asked for"
    else:  # q4 only on the embedded target, whose 4-bit blocks are the file's own
        backend, why = hardware.fast_backend("cpu", file_blocks=target is None)
        dtype, quant = BACKENDS[backend]
    say(f"CPU: {hardware.describe()}")
    say(f"dtype: {dtype} ({why})")
    say(f"backend: {backend} (the fastest lossless one measured here; --dtype float32 decodes in fp32)")
    if target is None:
        say("loading the embedded target SmolLM2-135M-Instruct (~20 s) ...")
        target = load_target(None, dtype="float32")
    fast = load_backend(backend) if quant else in_dtype(target, dtype)
    prompts = PROMPTS[:cfg.prompts]
    rows, texts = decode_all(fast, cfg.methods, prompts, cfg.budget, cfg.max_new_tokens)
    for i, prompt in enumerate(prompts):
        say(_answers(prompt, rows, [t[i] for t in texts]))
    if dtype == "float32":
        say("the timed run was in fp32, so it is the losslessness check")
        same = {r["method"]: r["identical_to_ar"] == r["n_prompts"] for r in rows}
    else:
        say(f"checking losslessness in fp32 on a short prompt ({cfg.check_new_tokens} new tokens) ...")
        same = identical_in_fp32(target, cfg.methods, PROMPTS[0], cfg.budget, cfg.check_new_tokens)
    for row in rows:
        row.update(dtype=dtype, backend=backend, dtype_reason=why, identical_in_fp32=same.get(row["method"], True))
    say(summary(rows))
    return rows


def _answers(prompt: str, rows: Sequence[dict], texts: Sequence[str]) -> str:
    """One prompt: AR's answer, then each method's, or a note that it is AR's answer."""
    lines = [f"\n> {prompt.strip()}", "", f"[ar] {texts[0].strip()}", ""]
    for row, text in zip(rows[1:], texts[1:]):
        lines.append(f"[{row['method']}] " + ("same text as AR" if text == texts[0] else text.strip()))
    return "\n".join(lines)


def summary(rows: Sequence[dict]) -> str:
    """The table of tau and speedup per method, and what was and was not identical to AR."""
    dtype, n = rows[0]["dtype"], rows[0]["n_prompts"]
    lines = ["", f"{'method':16s} {'budget':>6s} {'tau':>5s} {'tokens/s':>9s} {'speedup':>8s}  "
             f"identical to AR in {dtype}"]
    for r in rows:
        budget = "-" if r["budget"] is None else str(r["budget"])
        lines.append(f"{r['method']:16s} {budget:>6s} {r['tau']:5.2f} {r['tokens_per_s']:9.1f} "
                     f"{r['speedup']:7.2f}x  {r['identical_to_ar']}/{n}")
    lines.append("")
    lines += [f"{r['method']:16s} identical to AR in fp32: {'yes' if r['identical_in_fp32'] else 'no'}"
              for r in rows[1:]]
    if dtype != "float32":
        differ = sum(r["n_prompts"] - r["identical_to_ar"] for r in rows[1:])
        lines.append(f"In {dtype} a verify of many tokens rounds differently from a one-token AR step, so at a "
                     f"near-tie the argmax can flip and the answer goes its own way: {differ} of "
                     f"{n * (len(rows) - 1)} answers here differ from AR's. In fp32 every answer must be AR's.")
    lines.append(f"tau = mean tokens committed per round including the bonus token; budget = draft nodes "
                 f"excluding the root; speedup = decode tokens/s over AR in this run ({dtype}, methods "
                 f"interleaved prompt by prompt), prefill excluded.")
    return "\n".join(lines)


def add_arguments(d) -> None:
    """The flags of ``python -m jetflow demo`` (defaults: ``DemoConfig``)."""
    demo = DemoConfig()
    d.add_argument("--methods", default=",".join(demo.methods), help="comma list (AR always runs first)")
    d.add_argument("--budget", type=int, default=demo.budget, help="draft nodes excluding the root")
    d.add_argument("--max-new-tokens", type=int, default=demo.max_new_tokens, help="per prompt and method")
    d.add_argument("--prompts", type=int, default=demo.prompts, help="how many of the demo's prompts")
    d.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="default: bf16 where the CPU computes it natively (AVX-512 BF16, AMX), else fp32")
    d.add_argument("--json", action="store_true", help="print one JSON row per method (AR first)")


def run_args(args) -> int:
    """``python -m jetflow demo``: the demo with the parsed flags; ``--json``: its rows on stdout, the rest on stderr."""
    cfg = DemoConfig(methods=tuple(m for m in args.methods.split(",") if m), budget=args.budget,
                     max_new_tokens=args.max_new_tokens, prompts=args.prompts, dtype=args.dtype)
    rows = run(cfg, say=(lambda *a: print(*a, file=sys.stderr)) if args.json else print)
    for row in rows if args.json else ():
        print(json.dumps(row))
    return 0

"""Command line: ``python -m jetflow demo|generate|regenerate|train|bench|replay|report``.

Bad input ends with one ``error: ...`` line on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

EXIT_BAD_INPUT = 2


def _quiet() -> None:
    """Keep library chatter (GGUF progress bars, deprecation notes) off the user's screen."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    from huggingface_hub.utils import logging as hub_logging
    hub_logging.set_verbosity_error()


def _check_generate_args(args) -> None:
    if not args.prompt or not args.prompt.strip():
        raise ValueError("--prompt must not be empty")
    if args.budget != "auto" and int(args.budget) < 1:
        raise ValueError(f"--budget must be >= 1, got {args.budget}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    from .decode import check_temperature
    check_temperature(args.temperature, "--temperature")


def cmd_generate(args) -> int:
    from . import checks
    from .proposers import METHODS
    if args.method not in METHODS:
        raise ValueError(f"unknown method {args.method!r}; choose from {', '.join(METHODS)}")
    _check_generate_args(args)
    checks.head_dir(args.head, "--head")
    from .decode import generate
    from .proposers import make_proposer
    from .target import load_target
    target = load_target(args.model, dtype=args.dtype, compile=args.compile)
    proposer = make_proposer(args.method, target, head=args.head)
    budget, prediction = args.budget, None
    if budget == "auto":
        from .budget import auto_budget
        budget, prediction = auto_budget(target, args.method, args.prompt, head=args.head)
    res = generate(target, args.prompt, proposer, budget=int(budget), max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, seed=args.seed)
    row = {"method": args.method, "budget": int(budget), "prompt": args.prompt, "tokens": res.tokens,
           "text": res.text, "new_tokens": res.new_tokens, "rounds": len(res.rounds), "tau": res.tau,
           "prefill_s": res.prefill_s, "decode_s": res.decode_s, "tokens_per_s": res.tokens_per_s}
    if prediction is not None:
        row["predicted_tokens_per_s"] = prediction
    if args.json:
        print(json.dumps(row))
    else:
        print(res.text)
        print(f"\n[{args.method} budget={budget}] {res.new_tokens} tokens, {len(res.rounds)} rounds, "
              f"tau={res.tau:.2f} (tokens per round incl. bonus), {res.tokens_per_s:.1f} tok/s decode",
              file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from .demo import DemoConfig, run
    cfg = DemoConfig(methods=tuple(m for m in args.methods.split(",") if m), budget=args.budget,
                     max_new_tokens=args.max_new_tokens, prompts=args.prompts, dtype=args.dtype)
    rows = run(cfg, say=(lambda *a: print(*a, file=sys.stderr)) if args.json else print)
    for row in rows if args.json else ():
        print(json.dumps(row))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jetflow", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    from .demo import DemoConfig
    demo = DemoConfig()
    d = sub.add_parser("demo", help="AR vs the best methods on this CPU (~2 min)",
                       description="Decode the demo's prompts with AR and the kit's best CPU methods in this "
                       "machine's fast dtype (interleaved), print text, tau and speedup per method, and check "
                       "in fp32 that every output is identical to AR's.")
    d.add_argument("--methods", default=",".join(demo.methods), help="comma list (AR always runs first)")
    d.add_argument("--budget", type=int, default=demo.budget, help="draft nodes excluding the root")
    d.add_argument("--max-new-tokens", type=int, default=demo.max_new_tokens, help="per prompt and method")
    d.add_argument("--prompts", type=int, default=demo.prompts, help="how many of the demo's prompts")
    d.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="default: bf16 where the CPU computes it natively (AVX-512 BF16, AMX), else fp32")
    d.add_argument("--json", action="store_true", help="print one JSON row per method (AR first)")
    d.set_defaults(func=cmd_demo)

    g = sub.add_parser("generate", help="generate one answer with a chosen method")
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default="ar", help="ar, lookup, jetflow, dflash, ddtree, jetflow-bp, "
                   "jetflow+lookup, ddtree+lookup or jetflow-bp+lookup")
    g.add_argument("--budget", default="16", help="draft nodes excluding the root, or 'auto'")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--model", default=None, help="hub id or local dir (default: embedded SmolLM2)")
    g.add_argument("--head", default=None, help="draft head dir or hub id (default: shipped head)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--json", action="store_true", help="print one JSON object")
    add_compile_flag(g)
    g.set_defaults(func=cmd_generate)
    for register in _extra_commands():
        register(sub)
    return p


def add_compile_flag(parser) -> None:
    """``--compile``: decode on ``load_target(..., compile=True)`` (docs/compiled.md); off by default."""
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the target over a static cache (each graph compiles on first use, "
                             "minutes on a CPU; when it pays: docs/compiled.md)")


def _extra_commands():
    """Sub-commands that live beside their module (regenerate/train/bench)."""
    from . import cli_extra
    return cli_extra.REGISTER


def _validate_budget(args) -> None:
    if getattr(args, "budget", None) not in (None, "auto"):
        try:
            int(args.budget)
        except ValueError:
            raise ValueError(f"--budget must be an integer or 'auto', got {args.budget!r}") from None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    _quiet()
    try:
        _validate_budget(args)
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as err:  # e.g. permission denied or a full disk while writing: the file and the reason
        print(f"error: {err.filename or ''}: {err.strerror or err}; free space or fix permissions and rerun "
              "(finished work is kept and resumes)", file=sys.stderr)
        return EXIT_BAD_INPUT


def _one_line(err: Exception) -> str:
    """An error message on one line (library messages sometimes span several)."""
    return " ".join(str(err).split())

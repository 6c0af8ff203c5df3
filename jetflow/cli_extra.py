"""Sub-commands for the data, training and benchmark stages (kept apart from cli.py's core)."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def cmd_regenerate(args) -> int:
    from .data import regenerate, training_prompts, cache_dir
    from .target import load_target
    out = Path(args.out) if args.out else cache_dir() / f"regen-{args.n}.jsonl"
    prompts = training_prompts(args.n, seed=args.seed, data_dir=args.data_dir)
    target = load_target(args.model, dtype=args.dtype)
    regenerate(target, prompts, out, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    print(out)
    return 0


def add_regenerate(sub) -> None:
    r = sub.add_parser("regenerate", help="let the target answer training prompts (resumable)")
    r.add_argument("--n", type=int, default=3000)
    r.add_argument("--out", default=None)
    r.add_argument("--batch-size", type=int, default=16)
    r.add_argument("--max-new-tokens", type=int, default=192)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--data-dir", default=None)
    r.add_argument("--model", default=None)
    r.add_argument("--dtype", default="bfloat16")
    r.set_defaults(func=cmd_regenerate)


REGISTER = [add_regenerate]

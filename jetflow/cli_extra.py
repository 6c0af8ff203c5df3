"""Sub-commands for the data, training and benchmark stages (kept apart from cli.py's core)."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def regenerate_command(args, out: Path) -> str:
    """The ``python -m jetflow regenerate`` line that (re)makes ``out`` with these settings."""
    import shlex
    argv = ["python", "-m", "jetflow", "regenerate", "--n", str(args.n), "--out", out.name,
            "--batch-size", str(args.batch_size), "--max-new-tokens", str(args.max_new_tokens),
            "--max-prompt-tokens", str(args.max_prompt_tokens), "--seed", str(args.seed)]
    argv += ["--model", args.model] if args.model else []
    argv += ["--dtype", args.dtype] if args.dtype != "bfloat16" else []
    return shlex.join(argv)


def default_regen_out(args) -> Path:
    """The default output names the model, dtype and n: answers of another target never share a file."""
    from .data import cache_dir
    from .target import EMBEDDED
    model = (args.model or EMBEDDED).rstrip("/").replace("/", "--")
    return cache_dir() / f"regen-{model}-{args.dtype}-{args.n}.jsonl"


def cmd_regenerate(args) -> int:
    from . import checks
    from .data import regenerate, training_prompts
    from .target import load_target
    checks.positive(n=args.n, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                    max_prompt_tokens=args.max_prompt_tokens)
    out = Path(args.out) if args.out else default_regen_out(args)
    checks.writable_file(out, "--out")
    checks.data_source(args.data_dir)
    prompts = checks.prompt_source(lambda: training_prompts(args.n, seed=args.seed, data_dir=args.data_dir))
    target = load_target(args.model, dtype=args.dtype)
    regenerate(target, prompts, out, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
               max_prompt_tokens=args.max_prompt_tokens, settings={"seed": args.seed, "n": args.n})
    meta = out.with_name(out.name + ".meta.json")  # read by training provenance
    meta.write_text(json.dumps({"command": regenerate_command(args, out)}) + "\n")
    print(out)
    return 0


def add_regenerate(sub) -> None:
    r = sub.add_parser("regenerate", help="let the target answer training prompts (resumable)")
    r.add_argument("--n", type=int, default=3000)
    r.add_argument("--out", default=None)
    r.add_argument("--batch-size", type=int, default=16)
    r.add_argument("--max-new-tokens", type=int, default=192)
    r.add_argument("--max-prompt-tokens", type=int, default=512)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--data-dir", default=None)
    r.add_argument("--model", default=None)
    r.add_argument("--dtype", default="bfloat16")
    r.set_defaults(func=cmd_regenerate)


def _check_io(args, cfg) -> None:
    """Output, prompt and head inputs of bench/replay, checked before any model loads."""
    from . import checks
    if args.out:
        checks.writable_dir(args.out, "--out")
    checks.prompts_file(cfg["prompts_file"])
    if cfg["prompts_file"] is None:
        checks.data_source(cfg["data_dir"])
    checks.head_dir(args.jetflow_head, "--jetflow-head")
    checks.head_dir(args.dflash_head, "--dflash-head")


def cmd_bench(args) -> int:
    from . import bench, checks
    from .target import load_target
    cfg = bench.resolve_preset(args.preset, {
        "methods": args.methods, "datasets": args.datasets, "budgets": args.budgets, "limit": args.limit,
        "max_new_tokens": args.max_new_tokens, "prompts_file": args.prompts_file, "dtype": args.dtype,
        "model": args.model, "data_dir": args.data_dir,
        "heads": {k: v for k, v in (("jetflow", args.jetflow_head), ("dflash", args.dflash_head)) if v}})
    _check_io(args, cfg)
    prompts = checks.prompt_source(lambda: bench.prompt_sets(cfg))
    target = load_target(cfg["model"], dtype=cfg["dtype"], device=cfg["device"],
                         chat_kwargs=cfg.get("chat_template_kwargs"), compile=args.compile)
    journal = Path(args.out) / "runs.jsonl" if args.out else None
    rows = bench.run_settings(target, cfg, prompts, progress=not args.json, journal=journal)
    return _emit(rows, args, bench)


def _emit(rows: list[dict], args, module) -> int:
    """``--out``: rows.json + table.md via ``module.write``; then JSON lines (``--json``) or the table."""
    if args.out:
        print(f"wrote {module.write(rows, args.out)}", file=sys.stderr)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print(module.to_markdown(rows))
    return 0


def add_bench(sub) -> None:
    b = sub.add_parser("bench", help="tau and speedup tables: methods x datasets x budgets")
    b.add_argument("--preset", default="cpu", help="cpu (embedded target) or qwen3-8b (GPU)")
    b.add_argument("--methods", default=None, help="comma list: ar,hf,hf-lookup,lookup,dflash,ddtree,jetflow,jetflow-bp,"
                   "jetflow+lookup,ddtree+lookup,jetflow-bp+lookup")
    b.add_argument("--datasets", default=None, help="comma list: gsm8k,math500,humaneval,mbpp,mt_bench,spec_bench")
    b.add_argument("--budgets", default=None, help="comma list, e.g. 16,32,64,128,255; 'auto' (pick among the preset's budgets) or "
                        "'8,16,32,auto' (pick among these, and run each of them too for comparison)")
    b.add_argument("--limit", type=int, default=None, help="first N prompts of each dataset")
    b.add_argument("--max-new-tokens", type=int, default=None)
    b.add_argument("--prompts-file", default=None, help='JSONL of {"id", "prompt"} per line')
    b.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    b.add_argument("--model", default=None)
    b.add_argument("--jetflow-head", default=None)
    b.add_argument("--dflash-head", default=None)
    b.add_argument("--data-dir", default=None)
    b.add_argument("--out", default=None, help="write rows.json and table.md here; every finished prompt goes to "
                        "runs.jsonl there, so rerunning the same command resumes (delete it to measure afresh)")
    b.add_argument("--json", action="store_true", help="one JSON row per line")
    from .cli import add_compile_flag
    add_compile_flag(b)
    b.set_defaults(func=cmd_bench)


def cmd_replay(args) -> int:
    from . import bench, checks, replay
    from .data import cache_dir
    from .target import load_target
    cfg = bench.resolve_preset("cpu", {
        "methods": args.methods, "datasets": args.datasets, "budgets": args.budgets, "limit": args.limit,
        "max_new_tokens": args.max_new_tokens, "prompts_file": args.prompts_file, "model": args.model,
        "data_dir": args.data_dir, "dtype": "float32"})
    widths = tuple(int(w) for w in bench._as_tuple(args.widths))
    heads = {k: v for k, v in (("jetflow", args.jetflow_head), ("dflash", args.dflash_head)) if v}
    _check_io(args, cfg)
    cache = checks.writable_dir(Path(args.cache) if args.cache else cache_dir() / "replay", "--cache")
    prompts = checks.prompt_source(lambda: bench.prompt_sets(cfg))
    target = load_target(cfg["model"], dtype="float32")
    traces = {ds: replay.ar_traces(target, ps, cfg["max_new_tokens"], dataset=ds, progress=not args.json,
                                   cache=cache / f"ar-{target.name.replace('/', '--')}-{ds}.jsonl")
              for ds, ps in prompts.items()}
    rows = replay.replay(target, cfg["methods"], traces, cfg["budgets"], heads=heads, widths=widths,
                         progress=not args.json)
    return _emit(rows, args, replay)


def add_replay(sub) -> None:
    r = sub.add_parser("replay", help="exact greedy tau of every tree and budget (replayed)")
    r.add_argument("--methods", default="jetflow,ddtree,dflash,jetflow-bp", help="head methods: jetflow,ddtree,dflash,jetflow-bp,"
                   "jetflow+lookup,ddtree+lookup,jetflow-bp+lookup")
    r.add_argument("--datasets", default=None, help="comma list: gsm8k,math500,humaneval,mbpp,mt_bench,spec_bench")
    r.add_argument("--budgets", default="16,32,64,128,255", help="comma list")
    r.add_argument("--widths", default="7", help="widths W to try for jetflow's accum_logp tree, comma list")
    r.add_argument("--limit", type=int, default=None, help="first N prompts of each dataset")
    r.add_argument("--max-new-tokens", type=int, default=None)
    r.add_argument("--prompts-file", default=None, help='JSONL of {"id", "prompt"} per line')
    r.add_argument("--model", default=None)
    r.add_argument("--jetflow-head", default=None)
    r.add_argument("--dflash-head", default=None)
    r.add_argument("--data-dir", default=None)
    r.add_argument("--cache", default=None, help="folder for the AR answers (resumable; default: the jetflow cache)")
    r.add_argument("--out", default=None, help="write rows.json and table.md here")
    r.add_argument("--json", action="store_true", help="one JSON row per line")
    r.set_defaults(func=cmd_replay)


def train_config(args):
    """TrainConfig from parsed ``train`` arguments: the preset, then ``--set``, then the named flags."""
    import dataclasses
    from .train import BUILTIN_INITS, TrainConfig, parse_set
    flags = {"model": args.model, "causal": args.causal, "gamma": args.gamma, "loss": args.loss,
             "gamma_start": args.gamma_start, "curriculum": args.curriculum,
             "steps": args.steps, "lr": args.lr, "anchors_per_seq": args.anchors,
             "seqs_per_step": args.seqs_per_step, "eval_every": args.eval_every,
             "save_every": args.save_every, "seed": args.seed, "draft_vocab": args.draft_vocab,
             "init": args.init if args.init in (None, *BUILTIN_INITS) else str(Path(args.init).resolve())}
    cfg = parse_set(TrainConfig.from_name(args.preset, data=args.data, out=args.out), args.set)
    return dataclasses.replace(cfg, **{k: v for k, v in flags.items() if v is not None})


def cmd_train(args) -> int:
    from . import checks
    from .train import train
    checks.head_dir(args.init if args.init not in (None, "target", "random") else None, "--init")
    cfg = train_config(args)
    checks.writable_dir(cfg.out, "--out")
    _, history = train(cfg)
    print(json.dumps({k: history[-1][k] for k in ("step", "loss", "acc", "sim_tau")}))
    print(Path(cfg.out) / "PROVENANCE.md" if history[-1]["step"] == cfg.steps else Path(cfg.out))
    return 0


def add_train(sub) -> None:
    t = sub.add_parser("train", help="train a draft head on regenerated answers (resumable)")
    t.add_argument("--data", required=True, help="regenerated JSONL (python -m jetflow regenerate)")
    t.add_argument("--out", required=True, help="output dir; rerunning resumes from its checkpoint")
    t.add_argument("--preset", default="cpu", help="smoke | cpu | paper (default: cpu)")
    mode = t.add_mutually_exclusive_group()
    mode.add_argument("--causal", dest="causal", action="store_const", const=True, default=None,
                      help="JetFlow's causal block (the default)")
    mode.add_argument("--bidirectional", dest="causal", action="store_const", const=False,
                      help="DFlash's bidirectional block")
    t.add_argument("--gamma", type=float, default=None, help="depth weights exp(-(k-1)/gamma); 0 = uniform")
    t.add_argument("--gamma-start", type=float, default=None,
                   help="depth curriculum: start from this gamma's weights (e.g. 0.5) and move to --gamma's")
    t.add_argument("--curriculum", type=float, default=None, help="fraction of steps the curriculum takes")
    t.add_argument("--loss", choices=["kl", "ce"], default=None)
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--anchors", type=int, default=None, help="anchors per sequence")
    t.add_argument("--seqs-per-step", type=int, default=None)
    t.add_argument("--eval-every", type=int, default=None)
    t.add_argument("--save-every", type=int, default=None)
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--draft-vocab", type=int, default=None,
                   help="draft only the K most frequent response tokens of the data (0 = whole vocabulary)")
    t.add_argument("--model", default=None, help="target hub id or local dir (default: embedded SmolLM2)")
    t.add_argument("--init", default=None,
                   help="target (default) | random | a trained head's directory to continue training from")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other TrainConfig field, e.g. --set max_len=256 (repeatable)")
    t.set_defaults(func=cmd_train)


def cmd_report(args) -> int:
    from . import report
    args.readme, args.results = Path(args.readme or report.README), Path(args.results or report.RESULTS)
    if args.write:
        changed = report.update(args.readme, args.results)
        print(f"rewrote {len(changed)} table(s) in {args.readme}: {', '.join(changed) or 'none changed'}")
        return 0
    if args.check:
        stale = report.check(args.readme, args.results)
        print(f"stale or missing README tables: {', '.join(stale)} (python -m jetflow report --write)"
              if stale else f"every README table matches {args.results}")
        return 1 if stale else 0
    for name, render in report.TABLES.items():
        print(f"<!-- table:{name} -->\n{render(args.results)}\n<!-- /table:{name} -->\n")
    return 0


def add_report(sub) -> None:
    r = sub.add_parser("report", help="check or rewrite the README and docs/ result tables")
    r.add_argument("--results", default=None, help="result folders (default: data/results of this checkout)")
    r.add_argument("--readme", default=None, help="default: README.md of this checkout")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if a README table differs from the rows")
    mode.add_argument("--write", action="store_true", help="rewrite the README tables from the rows")
    r.set_defaults(func=cmd_report)


REGISTER = [add_regenerate, add_train, add_bench, add_replay, add_report]
from .gpu_check import add_gpu_check  # noqa: E402
REGISTER.append(add_gpu_check)

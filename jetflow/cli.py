"""Command line: ``python -m jetflow demo|generate|regenerate|pack|unpack|taps|train|bench|replay|profile|train-correction|correction-cost|diagnose|cost|speed|throughput|curve|report|results``.

The flags of ``regenerate``, ``taps``, ``train``, ``bench`` and ``replay`` are generated from their config
dataclasses' field metadata (``jetflow.util.flags``), as are the commands that reproduce a config; method
names and help come from the method registry. Bad input ends with one ``error: ...`` line on stderr
and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from dataclasses import replace
from pathlib import Path

from jetflow.data.regenerate import RegenerateConfig, regenerate_files
from jetflow.drafting import methods as registry
from jetflow.training.taps import TapsConfig, cache_taps
from jetflow.util.flags import add_flags, given

EXIT_BAD_INPUT = 2


class Parser(argparse.ArgumentParser):
    """argparse with the one-line contract: a usage error prints ``error: ...`` and exits 2."""

    def error(self, message: str):
        print(f"error: {self.prog.removeprefix('jetflow ')}: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


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


def _add_output(p) -> None:
    p.add_argument("--out", default=None, help="write rows.json and table.md here")
    p.add_argument("--json", action="store_true", help="one JSON row per line")


def _add_heads(p) -> None:
    for kind in registry.HEAD_KINDS:
        p.add_argument(f"--{kind}-head", default=None, help=f"the {kind} head's directory or hub id "
                       "(default: the shipped head)")


def _heads(args) -> dict[str, str]:
    return {kind: path for kind in registry.HEAD_KINDS if (path := getattr(args, f"{kind}_head"))}


def _check_io(args, cfg) -> None:
    """Output, prompt and head inputs of bench/replay, checked before any model loads."""
    from jetflow.util import checks
    if args.out:
        checks.writable_dir(args.out, "--out")
    checks.prompts_file(cfg.prompts_file)
    if cfg.prompts_file is None:
        checks.data_source(cfg.data_dir)
    for kind in registry.HEAD_KINDS:
        checks.head_dir(getattr(args, f"{kind}_head"), f"--{kind}-head")


# ----------------------------------------------------------------------------- demo and generate
def cmd_demo(args) -> int:
    from jetflow.demo import DemoConfig, run
    cfg = DemoConfig(methods=tuple(m for m in args.methods.split(",") if m), budget=args.budget,
                     max_new_tokens=args.max_new_tokens, prompts=args.prompts, dtype=args.dtype)
    rows = run(cfg, say=(lambda *a: print(*a, file=sys.stderr)) if args.json else print)
    for row in rows if args.json else ():
        print(json.dumps(row))
    return 0


def add_demo(sub) -> None:
    from jetflow.demo import DemoConfig
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


def _check_generate_args(args) -> None:
    if not args.prompt or not args.prompt.strip():
        raise ValueError("--prompt must not be empty")
    if args.budget != "auto":
        try:
            budget = int(args.budget)
        except ValueError:
            raise ValueError(f"--budget must be an integer or 'auto', got {args.budget!r}") from None
        if budget < 1:
            raise ValueError(f"--budget must be >= 1, got {args.budget}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    from jetflow.engine.decode import check_temperature
    check_temperature(args.temperature, "--temperature")


def cmd_generate(args) -> int:
    from jetflow.util import checks
    registry.check([args.method], lambda m: m.decodes)
    _check_generate_args(args)
    checks.head_dir(args.head, "--head")
    from jetflow.engine.decode import generate
    from jetflow.drafting.proposers import make_proposer
    from jetflow.engine.target import load_target
    target = load_target(args.model, dtype=args.dtype, compile=args.compile)
    proposer = make_proposer(args.method, target, head=args.head)
    budget, prediction = args.budget, None
    if budget == "auto":
        from jetflow.evaluation.budget import auto_budget
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


def add_generate(sub) -> None:
    decodes = (lambda m: m.decodes)
    g = sub.add_parser("generate", help="generate one answer with a chosen method")
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default="ar", help=registry.help_text(decodes))
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


# ----------------------------------------------------------------------------- data and training
def cmd_regenerate(args) -> int:
    regenerate_files(RegenerateConfig(**given(args, RegenerateConfig)))
    return 0


def add_regenerate(sub) -> None:
    r = sub.add_parser("regenerate", help="let the target answer training prompts (resumable)")
    add_flags(r, RegenerateConfig)
    r.set_defaults(func=cmd_regenerate)


def cmd_taps(args) -> int:
    print(cache_taps(TapsConfig(**given(args, TapsConfig))), flush=True)
    return 0


def add_taps(sub) -> None:
    t = sub.add_parser("taps", help="cache the target's taps of regenerated data")
    add_flags(t, TapsConfig)
    t.set_defaults(func=cmd_taps)


def cmd_pack(args) -> int:
    from jetflow.util import checks
    from jetflow.data.packed import pack
    checks.writable_dir(args.out, "--out")
    print(pack(args.data, args.out, args.parts))
    return 0


def cmd_unpack(args) -> int:
    from jetflow.util import checks
    from jetflow.data.packed import unpack
    checks.writable_dir(args.out, "--out")
    for path in unpack(args.packed, args.out):
        print(path)
    return 0


def add_pack(sub) -> None:
    p = sub.add_parser("pack", help="pack regenerated ids to publish, with provenance")
    p.add_argument("--data", required=True, help="regenerated JSONL or a chunked folder")
    p.add_argument("--parts", type=int, default=0, help="with a chunked folder: its first K parts (0: all)")
    p.add_argument("--out", required=True, help="folder for the .npz files and provenance.json")
    p.set_defaults(func=cmd_pack)
    u = sub.add_parser("unpack", help="packed ids back to JSONL (sha256 checked)")
    u.add_argument("--packed", required=True, help="a folder written by `jetflow pack`")
    u.add_argument("--out", required=True, help="folder for the JSONL files")
    u.set_defaults(func=cmd_unpack)


def train_config(args):
    """TrainConfig from parsed ``train`` arguments: the preset, then ``--set``, then the named flags."""
    from jetflow.training.config import TrainConfig
    return replace(TrainConfig.from_name(args.preset), **given(args, TrainConfig))


def cmd_train(args) -> int:
    from jetflow.util import checks
    from jetflow.training.train import train
    checks.head_dir(args.init if args.init not in (None, "target", "random") else None, "--init")
    cfg = train_config(args)
    checks.writable_dir(cfg.out, "--out")
    _, history = train(cfg)
    print(json.dumps({k: history[-1][k] for k in ("step", "loss", "acc", "sim_tau")}))
    print(Path(cfg.out) / "PROVENANCE.md" if history[-1]["step"] == cfg.steps else Path(cfg.out))
    return 0


def add_train(sub) -> None:
    from jetflow.training.config import PRESETS, TrainConfig
    t = sub.add_parser("train", help="train a draft head on regenerated data (resumable)")
    t.add_argument("--preset", default="cpu", help=" | ".join(PRESETS) + " (default: cpu)")
    add_flags(t, TrainConfig, set_flag=True)
    t.set_defaults(func=cmd_train)


# ----------------------------------------------------------------------------- measuring
def cmd_bench(args) -> int:
    from jetflow.util import checks
    from jetflow.evaluation import bench
    from jetflow.engine.target import load_target
    cfg = bench.BenchConfig.from_name(args.preset, **given(args, bench.BenchConfig), heads=_heads(args))
    _check_io(args, cfg)
    prompts = checks.prompt_source(lambda: bench.prompt_sets(cfg))
    target = load_target(cfg.model, dtype=cfg.dtype, device=cfg.device, chat_kwargs=cfg.chat_template_kwargs,
                         compile=args.compile)
    journal = Path(args.out) / "runs.jsonl" if args.out else None
    rows = bench.run_settings(target, cfg, prompts, progress=not args.json, journal=journal)
    return _emit(rows, args, bench)


def add_bench(sub) -> None:
    from jetflow.evaluation.bench import PRESETS, BenchConfig
    b = sub.add_parser("bench", help="tau and speedup tables: methods x datasets x budgets")
    b.add_argument("--preset", default="cpu", help=" or ".join(PRESETS) + " (default: cpu, the embedded target)")
    add_flags(b, BenchConfig)
    _add_heads(b)
    _add_output(b)
    add_compile_flag(b)
    b.set_defaults(func=cmd_bench)


def cmd_replay(args) -> int:
    from jetflow.util import checks
    from jetflow.evaluation import replay
    from jetflow.evaluation.bench import prompt_sets
    from jetflow.util.paths import cache_dir
    from jetflow.engine.target import load_target
    cfg = replay.ReplayConfig(**given(args, replay.ReplayConfig), heads=_heads(args))
    _check_io(args, cfg)
    cache = checks.writable_dir(Path(cfg.cache) if cfg.cache else cache_dir() / "replay", "--cache")
    prompts = checks.prompt_source(lambda: prompt_sets(cfg))
    target = load_target(cfg.model, dtype="float32")
    traces = {ds: replay.ar_traces(target, ps, cfg.max_new_tokens, dataset=ds, progress=not args.json,
                                   cache=replay.trace_cache(target, ds, cache))
              for ds, ps in prompts.items()}
    rows = replay.replay(target, cfg.methods, traces, cfg.budgets, heads=cfg.heads, widths=cfg.widths,
                         progress=not args.json)
    return _emit(rows, args, replay)


def add_replay(sub) -> None:
    from jetflow.evaluation.replay import ReplayConfig
    r = sub.add_parser("replay", help="exact greedy tau of every tree from one AR decode")
    add_flags(r, ReplayConfig)
    _add_heads(r)
    _add_output(r)
    r.set_defaults(func=cmd_replay)


def cmd_profile(args) -> int:
    from jetflow.drafting.profile import ProfileConfig, profile_for_head
    print(profile_for_head(ProfileConfig(**given(args, ProfileConfig)), progress=not args.quiet))
    return 0


def add_profile(sub) -> None:
    from jetflow.drafting.profile import ProfileConfig
    p = sub.add_parser("profile", help="the head's acceptance profile from training prompts")
    add_flags(p, ProfileConfig)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_profile)


def cmd_train_correction(args) -> int:
    from jetflow.training.correction_train import CorrectionTrainConfig, train_correction
    print(train_correction(CorrectionTrainConfig(**given(args, CorrectionTrainConfig)), progress=not args.quiet))
    return 0


def add_train_correction(sub) -> None:
    from jetflow.training.correction_train import CorrectionTrainConfig
    p = sub.add_parser("train-correction", help="train the path correction beside the causal head")
    add_flags(p, CorrectionTrainConfig)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train_correction)


def cmd_correction_cost(args) -> int:
    from jetflow.training.correction_train import CostConfig, correction_cost, cost_markdown
    from jetflow.results.report import write_rows
    rows = correction_cost(CostConfig(**given(args, CostConfig)))
    if args.out:
        print(f"wrote {write_rows(rows, args.out, cost_markdown)}", file=sys.stderr)
    print("\n".join(json.dumps(r) for r in rows) if args.json else cost_markdown(rows))
    return 0


def add_correction_cost(sub) -> None:
    from jetflow.training.correction_train import CostConfig
    c = sub.add_parser("correction-cost", help="the path correction's cost per round")
    add_flags(c, CostConfig)
    _add_output(c)
    c.set_defaults(func=cmd_correction_cost)


def cmd_diagnose(args) -> int:
    from jetflow.drafting import profile
    from jetflow.results.report import write_rows
    rows = profile.diagnose(profile.DiagnoseConfig(**given(args, profile.DiagnoseConfig)), progress=not args.json)
    if args.out:
        print(f"wrote {write_rows(rows, args.out, profile.diagnosis_markdown)}", file=sys.stderr)
    print("\n".join(json.dumps(r) for r in rows) if args.json else profile.diagnosis_markdown(rows))
    return 0


def add_diagnose(sub) -> None:
    from jetflow.drafting.profile import DiagnoseConfig
    d = sub.add_parser("diagnose", help="acceptance on and off the argmax spine")
    add_flags(d, DiagnoseConfig)
    _add_output(d)
    d.set_defaults(func=cmd_diagnose)


def cmd_cost(args) -> int:
    from jetflow.evaluation.budget import CostConfig, measure_cost
    print(f"wrote {measure_cost(CostConfig(**given(args, CostConfig)))}")
    return 0


def add_cost(sub) -> None:
    from jetflow.evaluation.budget import CostConfig
    c = sub.add_parser("cost", help="the round-cost curve in AR steps, beside a head")
    add_flags(c, CostConfig)
    c.set_defaults(func=cmd_cost)


# ----------------------------------------------------------------------------- results
def cmd_report(args) -> int:
    from jetflow.results import report
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
    r = sub.add_parser("report", help="check or rewrite the README/docs tables from the rows")
    r.add_argument("--results", default=None, help="result folders (default: data/results of this checkout)")
    r.add_argument("--readme", default=None, help="default: README.md of this checkout")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if a README table differs from the rows")
    mode.add_argument("--write", action="store_true", help="rewrite the README tables from the rows")
    r.set_defaults(func=cmd_report)


def cmd_results(args) -> int:
    from jetflow.results import manifest as results
    if args.batches:
        print("\n".join(",".join(names) for names in results.batches(args.batches)))
        return 0
    if not args.names:
        print("\n".join(f"{e.name}  [{e.group}]  python -m jetflow {' '.join(results.command(e.name))}"
                        for e in results.ENTRIES.values()))
        return 0
    for name in args.names:
        if args.render:
            print(results.render(name))
        elif main(results.command(name)) != 0:
            return EXIT_BAD_INPUT
    return 0


def add_results(sub) -> None:
    r = sub.add_parser("results", help="reproduce a committed result folder by name")
    r.add_argument("names", nargs="*", help="entries of the manifest (none: list them with their commands)")
    r.add_argument("--batches", default=None, metavar="GROUP",
                   help="print a make target's entries (results, table or merged), one batch per line")
    r.add_argument("--render", action="store_true", help="rewrite table.md from the committed rows.json only")
    r.set_defaults(func=cmd_results)


def cmd_throughput(args) -> int:
    from jetflow.util import checks
    from jetflow.results import throughput
    from jetflow.results.report import write_rows
    cfg = throughput.ThroughputConfig(**given(args, throughput.ThroughputConfig))
    checks.positive(prompts=cfg.prompts, steps=cfg.steps, rounds=cfg.rounds, seqs_per_step=cfg.seqs_per_step,
                    max_new_tokens=cfg.max_new_tokens, anchors=min(cfg.anchors, default=0))
    checks.writable_dir(cfg.out, "--out")
    checks.data_source(cfg.data_dir)
    rows = throughput.measure(cfg)
    print(f"wrote {write_rows(rows, cfg.out, throughput.to_markdown)}", file=sys.stderr)
    print(throughput.to_markdown(rows))
    return 0


def add_throughput(sub) -> None:
    from jetflow.results.throughput import ThroughputConfig
    t = sub.add_parser("throughput", help="training slots/s: cached taps vs the online target")
    add_flags(t, ThroughputConfig)
    t.set_defaults(func=cmd_throughput)


def cmd_curve(args) -> int:
    from jetflow.util import checks
    from jetflow.results import curve
    cfg = curve.CurveConfig(**given(args, curve.CurveConfig))
    checks.writable_dir(cfg.out, "--out")
    checks.data_source(cfg.data_dir)
    rows = curve.run(cfg)
    if rows:  # a data-parallel peer of an `accelerate launch` returns none: the main process prints them
        print(curve.to_markdown(rows))
    return 0


def add_curve(sub) -> None:
    from jetflow.results.curve import CurveConfig
    c = sub.add_parser("curve", help="replayed tau against training data (k parts)")
    add_flags(c, CurveConfig)
    c.set_defaults(func=cmd_curve)


def add_gpu_check(sub) -> None:
    from jetflow.gpu_check import add_gpu_check as add
    add(sub)


def add_speed(sub) -> None:
    from jetflow.results import speed
    s = sub.add_parser("speed", help="eager vs compiled target vs llama.cpp")
    speed.add_arguments(s)
    s.set_defaults(func=speed.run_args)


SUBCOMMANDS = [add_demo, add_generate, add_regenerate, add_pack, add_taps, add_train, add_bench, add_replay, add_profile,
               add_train_correction, add_correction_cost, add_diagnose, add_cost, add_speed, add_throughput, add_curve,
               add_report, add_results, add_gpu_check]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="jetflow", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for register in SUBCOMMANDS:
        register(sub)
    return p


def add_compile_flag(parser) -> None:
    """``--compile``: decode on ``load_target(..., compile=True)`` (docs/compiled.md); off by default."""
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the target over a static cache (each graph compiles on first use, "
                             "minutes on a CPU; when it pays: docs/compiled.md)")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    _quiet()
    try:
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

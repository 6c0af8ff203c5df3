"""What each subcommand of ``python -m jetflow`` does with its parsed flags (``jetflow.cli`` parses them
and holds the table of subcommands): check the input before any model loads, run the module that owns the
command, print or write its rows. Shared flags: ``--out``/``--json``, ``--quiet``, ``--compile`` and one
``--KIND-head`` per head kind of the method registry.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from safetensors import SafetensorError

from jetflow.data.packed import pack, unpack
from jetflow.drafting import methods as registry
from jetflow.drafting.head import DraftHead
from jetflow.drafting.methods import make_proposer
from jetflow.engine.decode import check_temperature, generate
from jetflow.engine.load import (DEVICE_HELP, NO_THINKING, THINKING_HELP, backend_of, load_for_run, load_target,
                                 pick_backend)
from jetflow.engine.quant import QUANT_HELP, QUANTS
from jetflow.evaluation import bench, budget, plan, replay
from jetflow.evaluation.rows import write_rows
from jetflow.results import correction_cost, curve, diagnose, throughput, verify_curve
from jetflow.training import correction_train
from jetflow.training.train import TrainConfig, train
from jetflow.util import checks
from jetflow.util.flags import given
from jetflow.util.paths import cache_dir
from jetflow.views import site
from jetflow.views.player import write_player
from jetflow.views.trace import record


def _emit(rows: list[dict], args, markdown: Callable[[list[dict]], str]) -> int:
    """``--out``: rows.json + table.md (``markdown``); then JSON lines (``--json``) or the table."""
    if args.out:
        print(f"wrote {write_rows(rows, args.out, markdown)}", file=sys.stderr)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print(markdown(rows))
    return 0


# ----------------------------------------------------------------------------- shared flags and checks
def add_output_flags(p) -> None:
    p.add_argument("--out", default=None, help="write rows.json and table.md here")
    p.add_argument("--json", action="store_true", help="one JSON row per line")


def add_quiet_flag(p) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def add_head_flags(p) -> None:
    for kind in registry.HEAD_KINDS:
        p.add_argument(f"--{kind}-head", default=None, help=f"the {kind} head's directory or hub id "
                       "(default: the shipped head)")


def add_compile_flag(parser) -> None:
    """``--compile``: decode on ``load_target(..., compile=True)`` (docs/compiled.md); off by default; ``--quant``:
    on ``load_target(..., quant=...)`` (int8, q4 or q4x8 linears, ``jetflow.engine.quant``)."""
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the target: with int8/q4/q4x8 on a CPU (and the default there) the "
                             "lean forward as one graph, compiled once per machine and loaded from the disk cache "
                             "after; fp32/bf16 over a static cache, a graph per query length. Compile seconds are "
                             "reported apart from tokens/s (docs/compiled.md)")
    parser.add_argument("--cache-len", type=int, default=None, metavar="ROWS",
                        help="with --compile: the static KV cache's rows (default: sized from the run, the longest "
                             "prompt + max new tokens + the largest budget + 1, rounded up to 256)")
    parser.add_argument("--quant", default=None, choices=QUANTS, help=QUANT_HELP)


def add_plan_flag(parser) -> None:
    parser.add_argument("--plan", action="store_true", help="print prompts x methods x budgets and a rough time, "
                        "then stop (loads no model, head or prompt)")


def _check_cache_len(args) -> None:
    if args.cache_len is not None and (args.cache_len < 2 or not args.compile):
        raise ValueError(f"--cache-len sizes the compiled target's cache: it needs --compile and at least 2 "
                         f"rows, got {args.cache_len}")


def add_thinking_flags(parser) -> None:
    """``--thinking`` / ``--no-thinking`` (default: decided by ``chat_kwargs_for``, off where the template
    knows the switch)."""
    pair = parser.add_mutually_exclusive_group()
    pair.add_argument("--thinking", dest="thinking", action="store_const", const=True, default=None,
                      help=THINKING_HELP)
    pair.add_argument(NO_THINKING[0], dest="thinking", action="store_const", const=False, help=NO_THINKING[1])


def _heads(args) -> dict[str, str]:
    return {kind: path for kind in registry.HEAD_KINDS if (path := getattr(args, f"{kind}_head"))}


def check_head_dir(path: str | os.PathLike | None, name: str) -> None:
    """A local head folder loads: config.json complete and matching its safetensors, which are whole.
    Hub ids and None (the shipped head) are left to the loader."""
    if path is None or not Path(path).is_dir():
        return
    try:
        DraftHead.from_pretrained(str(path))
    except KeyError as err:
        raise ValueError(f"{name} {str(path)!r}: config.json lacks the key {err}; restore the head's "
                         "config.json (it is written by save_pretrained)") from None
    except (SafetensorError, RuntimeError, TypeError, json.JSONDecodeError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{name} {str(path)!r} does not hold a loadable head ({type(err).__name__}: {first}); "
                         "the weights may be truncated or disagree with config.json: copy or train the head "
                         "again") from None
    except ValueError as err:
        raise ValueError(f"{name} {str(path)!r}: {err}") from None


def _check_io(args, cfg) -> None:
    """Output, prompt and head inputs of bench/replay, checked before any model loads."""
    if args.out:
        checks.writable_dir(args.out, "--out")
    checks.prompts_file(cfg.prompts_file)
    if cfg.prompts_file is None:
        checks.data_source(cfg.data_dir)
    for kind in registry.HEAD_KINDS:
        check_head_dir(getattr(args, f"{kind}_head"), f"--{kind}-head")


# ----------------------------------------------------------------------------- generate
def _check_generate_args(args) -> None:
    if not args.prompt or not args.prompt.strip():
        raise ValueError("--prompt must not be empty")
    if args.budget != "auto":
        try:
            nodes = int(args.budget)
        except ValueError:
            raise ValueError(f"--budget must be an integer or 'auto', got {args.budget!r}") from None
        if nodes < 1:
            raise ValueError(f"--budget must be >= 1, got {args.budget}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    check_temperature(args.temperature, "--temperature")


def decode_once(args):
    """Check ``generate``'s flags, load the target and decode ``args.prompt`` once -> (target, Result, budget used,
    the auto budget's predicted tokens/s or None). ``generate`` and ``trace`` both decode through here."""
    registry.check([args.method], lambda m: m.decodes)
    _check_generate_args(args)
    check_head_dir(args.head, "--head")
    _check_cache_len(args)
    largest = max(budget.CANDIDATES) if args.budget == "auto" else int(args.budget)
    dtype, quant, args.backend_why = pick_backend(args.model, args.dtype, args.quant, args.device,
                                                   compile=args.compile)
    target = load_for_run(args.model, [args.prompt], max_new_tokens=args.max_new_tokens, budget=largest,
                          dtype=dtype, device=args.device, thinking=args.thinking, compile=args.compile,
                          cache_len=args.cache_len, quant=quant)
    proposer = make_proposer(args.method, target, head=args.head)
    nodes, prediction = args.budget, None
    if nodes == "auto":
        nodes, prediction = budget.auto_budget(target, args.method, args.prompt, head=args.head)
    res = generate(target, args.prompt, proposer, budget=int(nodes), max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, seed=args.seed)
    return target, res, int(nodes), prediction


def cmd_generate(args) -> int:
    target, res, nodes, prediction = decode_once(args)
    row = {"method": args.method, "budget": nodes, "backend": backend_of(target), "backend_reason": args.backend_why,
           "prompt": args.prompt, "tokens": res.tokens,
           "text": res.text, "new_tokens": res.new_tokens, "rounds": len(res.rounds), "tau": res.tau,
           "prefill_s": res.prefill_s, "decode_s": res.decode_s, "tokens_per_s": res.tokens_per_s,
           "compile_s": res.compile_s}  # --compile: graphs compiled (or loaded) before the clock, never in decode_s
    if prediction is not None:
        row["predicted_tokens_per_s"] = prediction
    if args.json:
        print(json.dumps(row))
    else:
        print(res.text)
        print(f"\n[{args.method} budget={nodes} backend={row['backend']} ({args.backend_why})] "
              f"{res.new_tokens} tokens, {len(res.rounds)} rounds, "
              f"tau={res.tau:.2f} (tokens per round incl. bonus), {res.tokens_per_s:.1f} tok/s decode"
              + (f"; compile {res.compile_s:.1f} s before it (untimed)" if args.compile else ""), file=sys.stderr)
    return 0


def generate_flags(g) -> None:
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default="ar", help=registry.help_text(lambda m: m.decodes))
    g.add_argument("--budget", default="16", help="draft nodes excluding the root, or 'auto'")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--model", default=None, help="hub id or local dir (default: embedded SmolLM2)")
    g.add_argument("--head", default=None, help="draft head dir or hub id (default: shipped head)")
    g.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="the target's dtype (default, without --quant: the embedded target in q4 where the CPU has "
                        "bf16 natively, the fastest backend whose speculation equals its own AR; else float32, whose "
                        "output equals fp32 AR token for token; with --quant: bf16 where native)")
    g.add_argument("--device", default=None, help=DEVICE_HELP)
    add_thinking_flags(g)
    g.add_argument("--json", action="store_true", help="print one JSON object")
    add_compile_flag(g)


def cmd_trace(args) -> int:
    """Decode once as ``generate`` does and write the tree player (``jetflow.views.player``) to ``--out``."""
    if not args.out.endswith((".html", ".htm")):
        raise ValueError(f"--out names the player's HTML file, e.g. tree.html; got {args.out!r}")
    checks.writable_file(args.out, "--out")
    target, res, nodes, _ = decode_once(args)
    trace = record(res, target.decode, method=args.method, budget=nodes, prompt=args.prompt,
                   temperature=args.temperature, model=target.name, dtype=str(target.dtype).removeprefix("torch."),
                   head=args.head or "shipped", max_new_tokens=args.max_new_tokens)
    path = write_player(trace, args.out)
    if args.json:
        print(json.dumps(trace, ensure_ascii=False))
    else:
        print(res.text)
    print(f"wrote {path}: {len(res.rounds)} rounds, tau={res.tau:.2f}; open it in a browser (no server needed)",
          file=sys.stderr)
    return 0


def trace_flags(t) -> None:
    """``generate``'s flags (``--json`` prints the trace instead of the text) and ``--out FILE.html``."""
    generate_flags(t)
    t.add_argument("--out", required=True, help="the player's HTML file (self-contained; opens from file://)")


def cmd_site(args) -> int:
    """The static site of the notebooks' stored outputs (``jetflow.views.site``); no kernel, no model."""
    checks.writable_dir(args.out, "--out")
    pages = site.build(args.notebooks, args.out)
    print(f"wrote {len(pages)} pages to {args.out}; open {pages[0]} in a browser (no server needed)")
    return 0


def site_flags(s) -> None:
    s.add_argument("notebooks", nargs="+", help="the .ipynb files, e.g. notebooks/*.ipynb")
    s.add_argument("--out", default="site", help="the site's folder (default: site); the index also links every "
                   "tree player under OUT/players (python -m jetflow trace --out OUT/players/NAME.html)")


# ----------------------------------------------------------------------------- data
def cmd_pack(args) -> int:
    checks.writable_dir(args.out, "--out")
    print(pack(args.data, args.out, args.parts))
    return 0


def cmd_unpack(args) -> int:
    checks.writable_dir(args.out, "--out")
    for path in unpack(args.packed, args.out):
        print(path)
    return 0


def pack_flags(p) -> None:
    p.add_argument("--data", required=True, help="regenerated JSONL or a chunked folder")
    p.add_argument("--parts", type=int, default=0, help="with a chunked folder: its first K parts (0: all)")
    p.add_argument("--out", required=True, help="folder for the .npz files and provenance.json")


def unpack_flags(u) -> None:
    u.add_argument("--packed", required=True, help="a folder written by `jetflow pack`")
    u.add_argument("--out", required=True, help="folder for the JSONL files")


# ----------------------------------------------------------------------------- training
def train_config(args):
    """TrainConfig from parsed ``train`` arguments: the preset, then ``--set``, then the named flags."""
    return replace(TrainConfig.from_name(args.preset), **given(args, TrainConfig))


def cmd_train(args) -> int:
    check_head_dir(args.init if args.init not in (None, "target", "random") else None, "--init")
    cfg = train_config(args)
    checks.writable_dir(cfg.out, "--out")
    _, history = train(cfg)
    print(json.dumps({k: history[-1][k] for k in ("step", "loss", "acc", "sim_tau")}))
    print(Path(cfg.out) / "PROVENANCE.md" if history[-1]["step"] == cfg.steps else Path(cfg.out))
    return 0


# ----------------------------------------------------------------------------- measuring
def cmd_bench(args) -> int:
    cfg = bench.BenchConfig.from_name(args.preset, **given(args, bench.BenchConfig), heads=_heads(args))
    if args.plan:  # loads nothing: counts, configurations and a rough cost
        print(plan.plan_text(cfg, args.preset))
        return 0
    _check_cache_len(args)
    _check_io(args, cfg)
    prompts = checks.prompt_source(lambda: bench.prompt_sets(cfg))
    dtype = cfg.dtype
    if args.quant is not None and args.dtype is None:  # packed kernels want bf16 inputs: 10-40x slower in fp32
        dtype = pick_backend(cfg.model, None, args.quant, cfg.device)[0]
    target = load_for_run(cfg.model, [p["prompt"] for ps in prompts.values() for p in ps],
                          max_new_tokens=cfg.max_new_tokens, budget=max(cfg.budgets), dtype=dtype,
                          device=cfg.device, chat_kwargs=cfg.chat_template_kwargs, thinking=cfg.thinking,
                          compile=args.compile,
                          cache_len=args.cache_len, quant=args.quant)
    journal = Path(args.out) / "runs.jsonl" if args.out else None
    rows = bench.run_settings(target, cfg, prompts, progress=not args.json, journal=journal)
    return _emit(rows, args, bench.to_markdown)


def cmd_replay(args) -> int:
    cfg = replay.ReplayConfig(**given(args, replay.ReplayConfig), heads=_heads(args))
    _check_io(args, cfg)
    cache = checks.writable_dir(Path(cfg.cache) if cfg.cache else cache_dir() / "replay", "--cache")
    prompts = checks.prompt_source(lambda: bench.prompt_sets(cfg))
    target = load_target(cfg.model, dtype="float32", device=cfg.device, thinking=cfg.thinking)
    traces = {ds: replay.ar_traces(target, ps, cfg.max_new_tokens, dataset=ds, progress=not args.json,
                                   cache=replay.trace_cache(target, ds, cache))
              for ds, ps in prompts.items()}
    rows = replay.replay(target, cfg.methods, traces, cfg.budgets, heads=cfg.heads, widths=cfg.widths,
                         progress=not args.json)
    return _emit(rows, args, replay.to_markdown)


def cmd_profile(args) -> int:
    print(diagnose.profile_for_head(diagnose.ProfileConfig(**given(args, diagnose.ProfileConfig)),
                                   progress=not args.quiet))
    return 0


def cmd_train_correction(args) -> int:
    cfg = correction_train.CorrectionTrainConfig(**given(args, correction_train.CorrectionTrainConfig))
    print(correction_train.train_correction(cfg, progress=not args.quiet))
    return 0


def cmd_correction_cost(args) -> int:
    rows = correction_cost.correction_cost(correction_cost.CostConfig(**given(args, correction_cost.CostConfig)))
    return _emit(rows, args, correction_cost.cost_markdown)


def cmd_diagnose(args) -> int:
    rows = diagnose.diagnose(diagnose.DiagnoseConfig(**given(args, diagnose.DiagnoseConfig)), progress=not args.json)
    return _emit(rows, args, diagnose.diagnosis_markdown)


def cmd_cost(args) -> int:
    print(f"wrote {budget.measure_cost(budget.CostConfig(**given(args, budget.CostConfig)))}")
    return 0


def cmd_throughput(args) -> int:
    cfg = throughput.ThroughputConfig(**given(args, throughput.ThroughputConfig))
    checks.positive(prompts=cfg.prompts, steps=cfg.steps, rounds=cfg.rounds, seqs_per_step=cfg.seqs_per_step,
                    max_new_tokens=cfg.max_new_tokens, anchors=min(cfg.anchors, default=0))
    checks.writable_dir(cfg.out, "--out")
    checks.data_source(cfg.data_dir)
    rows = throughput.measure(cfg)
    print(f"wrote {write_rows(rows, cfg.out, throughput.to_markdown)}", file=sys.stderr)
    print(throughput.to_markdown(rows))
    return 0


def cmd_verify_curve(args) -> int:
    cfg = verify_curve.VerifyCurveConfig(**given(args, verify_curve.VerifyCurveConfig))
    checks.writable_dir(verify_curve.out_dir(cfg), "--out")
    if cfg.calibrate:
        checks.data_source(cfg.data_dir)
    rows = verify_curve.run(cfg)
    print(f"wrote {verify_curve.out_dir(cfg)}", file=sys.stderr)
    print(verify_curve.to_markdown(rows))
    return 0


def cmd_curve(args) -> int:
    cfg = curve.CurveConfig(**given(args, curve.CurveConfig))
    checks.writable_dir(cfg.out, "--out")
    checks.data_source(cfg.data_dir)
    rows = curve.run(cfg)
    if rows:  # a data-parallel peer of an `accelerate launch` returns none: the main process prints them
        print(curve.to_markdown(rows))
    return 0

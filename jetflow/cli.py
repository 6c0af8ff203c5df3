"""Command line: ``python -m jetflow demo|generate|trace|site|regenerate|pack|unpack|taps|train|bench|replay|profile|train-correction|correction-cost|diagnose|cost|verify-curve|speed|throughput|curve|report|results``.

The flags of ``regenerate``, ``taps``, ``train``, ``bench`` and ``replay`` are generated from their config
dataclasses' field metadata (``jetflow.util.flags``), as are the commands that reproduce a config; method
names and help come from the method registry. Bad input ends with one ``error: ...`` line on stderr
and exit status 2, never a traceback. ``COMMANDS`` is the one table of subcommands (name, help line, flags,
handler); ``cli_help`` renders their ``--help`` pages for docs/cli.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jetflow.data.regenerate import RegenerateConfig, regenerate_files
from jetflow.evaluation import bench, budget, replay
from jetflow.results import backends, correction_cost, curve, diagnose, manifest, report, speed, throughput, verify_curve
from jetflow.training import correction_train
from jetflow.training.config import PRESETS as TRAIN_PRESETS
from jetflow.training.config import TrainConfig
from jetflow.training.taps import TapsConfig, cache_taps
from jetflow.util.flags import add_flags, given

from . import demo, gpu_check
from .commands import (add_compile_flag, add_head_flags, add_plan_flag, add_output_flags, add_quiet_flag, cmd_bench, cmd_correction_cost,
                       cmd_cost, cmd_curve, cmd_verify_curve, cmd_diagnose, cmd_generate, cmd_pack, cmd_profile, cmd_replay,
                       cmd_site, cmd_throughput, cmd_trace, cmd_train, cmd_train_correction, cmd_unpack, generate_flags, pack_flags,
                       site_flags, trace_flags, unpack_flags)

EXIT_BAD_INPUT = 2
Flags = Callable[[argparse.ArgumentParser], None]  # adds a subcommand's flags to its parser


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


# ----------------------------------------------------------------------------- data and training
def cmd_regenerate(args) -> int:
    regenerate_files(RegenerateConfig(**given(args, RegenerateConfig)))
    return 0


def cmd_taps(args) -> int:
    print(cache_taps(TapsConfig(**given(args, TapsConfig))), flush=True)
    return 0


# ----------------------------------------------------------------------------- results
def cli_help(width: int = 100) -> str:
    """``jetflow --help`` and every subcommand's ``--help`` as markdown, wrapped at ``width`` columns
    whatever the terminal (docs/cli.md holds it, so the page cannot drift from the parser)."""
    parser, saved = build_parser(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)  # argparse wraps at the terminal's width
    try:
        subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        parts = [("jetflow --help", parser.format_help())]
        parts += [(f"jetflow {name} --help", sub.format_help()) for name, sub in subs.items()]
    finally:
        os.environ.pop("COLUMNS") if saved is None else os.environ.update(COLUMNS=saved)
    return "\n\n".join(f"### `{title}`\n\n```text\n{text.rstrip()}\n```" for title, text in parts)


def help_tables() -> dict[str, dict[str, str]]:
    """The tables the CLI renders for ``report`` (document -> table name -> text): docs/cli.md's --help pages."""
    return {"docs/cli.md": {"cli-help": cli_help()}}


def cmd_report(args) -> int:
    readme, results, extra = Path(args.readme or report.README), Path(args.results or report.RESULTS), help_tables()
    if args.write:
        changed = report.update(readme, results, extra)
        print(f"rewrote {len(changed)} table(s) in {readme}: {', '.join(changed) or 'none changed'}")
        return 0
    if args.check:
        stale = report.check(readme, results, extra)
        print(f"stale or missing README tables: {', '.join(stale)} (python -m jetflow report --write)"
              if stale else f"every README table matches {results}")
        return 1 if stale else 0
    for name, render in report.renderers(extra).items():
        print(f"<!-- table:{name} -->\n{render(results)}\n<!-- /table:{name} -->\n")
    return 0


def _report_flags(r) -> None:
    r.add_argument("--results", default=None, help="result folders (default: data/results of this checkout)")
    r.add_argument("--readme", default=None, help="default: README.md of this checkout")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if a README table differs from the rows")
    mode.add_argument("--write", action="store_true", help="rewrite the README tables from the rows")


def cmd_results(args) -> int:
    if args.batches:
        print("\n".join(",".join(names) for names in manifest.batches(args.batches)))
        return 0
    if not args.names:
        print("\n".join(f"{e.name}  [{e.group}]  python -m jetflow {' '.join(manifest.command(e.name))}"
                        for e in manifest.ENTRIES.values()))
        return 0
    for name in args.names:
        if args.render:
            print(manifest.render(name))
        elif main(manifest.command(name)) != 0:
            return EXIT_BAD_INPUT
    return 0


def _results_flags(r) -> None:
    r.add_argument("names", nargs="*", help="entries of the manifest (none: list them with their commands)")
    r.add_argument("--batches", default=None, metavar="GROUP",
                   help="print a make target's entries (results, table or merged), one batch per line")
    r.add_argument("--render", action="store_true", help="rewrite table.md from the committed rows.json only")


# ----------------------------------------------------------------------------- the table of subcommands
def _flags(*parts) -> Flags:
    """Flags from ``parts`` in order: a config class adds its fields (``add_flags``), a function adds its own."""
    def add(parser) -> None:
        for part in parts:
            add_flags(parser, part) if isinstance(part, type) else part(parser)
    return add


def _preset(help: str) -> Flags:
    return lambda p: p.add_argument("--preset", default="cpu", help=help)


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, its line in ``jetflow --help``, what adds its flags, what runs it."""
    name: str
    help: str
    flags: Flags
    run: Callable[[argparse.Namespace], int]
    description: str | None = None


COMMANDS = (
    Command("demo", "AR vs the best methods on this CPU (~2 min)", demo.add_arguments, demo.run_args,
            "Decode the demo's prompts with AR and the kit's best CPU methods in this machine's fast dtype "
            "(interleaved), print text, tau and speedup per method, and check in fp32 that every output is "
            "identical to AR's."),
    Command("generate", "generate one answer with a chosen method", generate_flags, cmd_generate),
    Command("regenerate", "let the target answer training prompts (resumable)", _flags(RegenerateConfig),
            cmd_regenerate),
    Command("pack", "pack regenerated ids to publish, with provenance", pack_flags, cmd_pack),
    Command("unpack", "packed ids back to JSONL (sha256 checked)", unpack_flags, cmd_unpack),
    Command("taps", "cache the target's taps of regenerated data", _flags(TapsConfig), cmd_taps),
    Command("train", "train a draft head on regenerated data (resumable)",
            _flags(_preset(" | ".join(TRAIN_PRESETS) + " (default: cpu)"),
                   lambda p: add_flags(p, TrainConfig, set_flag=True)), cmd_train),
    Command("bench", "tau and speedup tables: methods x datasets x budgets",
            _flags(_preset(" or ".join(bench.PRESETS) + " (default: cpu, the embedded target)"), bench.BenchConfig,
                   add_head_flags, add_output_flags, add_compile_flag, add_plan_flag), cmd_bench),
    Command("replay", "exact greedy tau of every tree from one AR decode",
            _flags(replay.ReplayConfig, add_head_flags, add_output_flags), cmd_replay),
    Command("profile", "the head's acceptance profile from training prompts",
            _flags(diagnose.ProfileConfig, add_quiet_flag), cmd_profile),
    Command("train-correction", "train the path correction beside the causal head",
            _flags(correction_train.CorrectionTrainConfig, add_quiet_flag), cmd_train_correction),
    Command("correction-cost", "the path correction's cost per round",
            _flags(correction_cost.CostConfig, add_output_flags), cmd_correction_cost),
    Command("diagnose", "acceptance on and off the argmax spine", _flags(diagnose.DiagnoseConfig, add_output_flags),
            cmd_diagnose),
    Command("cost", "the round-cost curve in AR steps, beside a head", _flags(budget.CostConfig), cmd_cost),
    Command("verify-curve", "verify cost per backend, eager and compiled",
            _flags(verify_curve.VerifyCurveConfig), cmd_verify_curve),
    Command("speed", "eager vs compiled, or --backends, vs llama.cpp",
            backends.speed_arguments, backends.speed_run),
    Command("throughput", "training slots/s: cached taps vs the online target", _flags(throughput.ThroughputConfig),
            cmd_throughput),
    Command("curve", "replayed tau against training data (k parts)", _flags(curve.CurveConfig), cmd_curve),
    Command("report", "check or rewrite the README/docs tables from the rows", _report_flags, cmd_report),
    Command("results", "reproduce a committed result folder by name", _results_flags, cmd_results),
    Command("gpu-check", "on a GPU: correctness, timing, projected speedup", gpu_check.add_arguments,
            gpu_check.cmd_gpu_check),
    Command("trace", "decode once and write the tree player (one HTML file)", trace_flags, cmd_trace,
            "Decode the prompt once as `generate` does and write a self-contained HTML page that steps through "
            "the rounds: each drafted tree, the accepted path, the rejected children with the target's token, "
            "the bonus token and the acceptance per branch. It opens from file:// with no server or network."),
    Command("site", "static site of the notebooks (stored outputs)", site_flags, cmd_site),
)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="jetflow", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        parser = sub.add_parser(command.name, help=command.help, description=command.description)
        command.flags(parser)
        parser.set_defaults(func=command.run)
    return p


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

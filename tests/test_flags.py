"""Tests for jetflow/util/flags.py: flags, parsing and reproducing commands from config field metadata."""
import argparse
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from jetflow.data.regenerate import RegenerateConfig, regenerate_command
from jetflow.util.flags import add_flags, command_line, given, option, parse_set


@dataclass(frozen=True)
class Toy:
    steps: int = option(10, "optimiser steps")
    anchors_per_seq: int = option(8, "anchors", flag="--anchors")
    max_len: int = option(64, "no flag of its own", flag=None)
    gamma: float | None = option(None, "optional float")
    names: tuple[str, ...] = option(("a",), "comma list")
    causal: bool = option(True, "causal", negate=("--bidirectional", "bidirectional"))
    loss: str = option("kl", "loss", choices=("kl", "ce"))
    preset: str = "base"          # no metadata: never a flag


def parse(*argv) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_flags(p, Toy, set_flag=True)
    return p.parse_args(argv)


def test_flags_come_from_the_metadata():
    args = parse("--steps", "3", "--anchors", "5", "--gamma", "0.5", "--names", "x, y", "--bidirectional")
    assert given(args, Toy) == {"steps": 3, "anchors_per_seq": 5, "gamma": 0.5, "names": ("x", "y"),
                                "causal": False}
    assert given(parse(), Toy) == {}  # nothing given: the base stays
    with pytest.raises(SystemExit):
        parse("--max-len", "3")       # flag=None: only --set reaches it
    with pytest.raises(SystemExit):
        parse("--preset", "x")


def test_a_flag_wins_over_set():
    assert given(parse("--set", "max_len=9", "--set", "steps=1", "--steps", "2"), Toy) == {"max_len": 9, "steps": 2}


@pytest.mark.parametrize("argv, match", [(("--set", "max_len"), "key=value"), (("--set", "nope=1"), "key=value"),
                                         (("--set", "causal=maybe"), "true or false"), (("--steps", "x"), "--steps")])
def test_bad_values_are_clear_errors(argv, match):
    with pytest.raises(ValueError, match=match):
        given(parse(*argv), Toy)


@pytest.mark.parametrize("changes", [{}, {"steps": 3, "causal": False}, {"max_len": 9, "names": ("p", "q")},
                                     {"gamma": 0.25, "anchors_per_seq": 1, "loss": "ce"}])
def test_the_command_rebuilds_the_config(changes):
    cfg = replace(Toy(), **changes)
    argv = shlex.split(command_line(cfg, Toy(), ["prog"]))
    assert argv[0] == "prog" and replace(Toy(), **given(parse(*argv[1:]), Toy)) == cfg
    assert len(argv) == 1 + sum(1 if k == "causal" else 2 for k in changes)  # only what differs


def test_regenerate_command_names_every_size_and_only_changed_models():
    cmd = regenerate_command(RegenerateConfig(n=30, data_dir="/x"), Path("/tmp/regen-30.jsonl"))
    assert cmd == ("python -m jetflow regenerate --n 30 --chunks 1 --out regen-30.jsonl --batch-size 16 --max-new-tokens 192 "
                   "--max-prompt-tokens 512 --seed 0")
    cmd = regenerate_command(RegenerateConfig(model="m/x", dtype="float32"), Path("r.jsonl"))
    assert cmd.endswith("--seed 0 --model m/x --dtype float32")


@pytest.mark.parametrize("item, field, value", [("gamma=0.5", "gamma", 0.5), ("gamma=none", "gamma", None),
                                                ("max_len=256", "max_len", 256), ("causal=false", "causal", False)])
def test_set_parses_by_the_declared_type(item, field, value):
    assert getattr(parse_set(Toy(gamma=1.0), [item]), field) == value


@pytest.mark.parametrize("item, match", [("gamma=abc", "--set gamma expects a number or none"),
                                         ("steps=1.5", "--set steps expects a number"), ("max_len=none", "a number")])
def test_set_refuses_what_does_not_parse(item, match):
    with pytest.raises(ValueError, match=match):
        parse_set(Toy(), [item])

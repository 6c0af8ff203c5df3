"""Command-line flags written once, as metadata on the fields of a frozen config dataclass.

    @dataclass(frozen=True)
    class MyConfig:
        steps: int = option(100, "optimiser steps")
        anchors_per_seq: int = option(8, "anchors per sequence", flag="--anchors")
        max_len: int = option(512, "truncate prompt + response", flag=None)   # no flag: ``--set max_len=...``

    add_flags(parser, MyConfig)                        # --steps, --anchors (and --set KEY=VALUE)
    cfg = replace(base, **given(args, MyConfig))       # the flags the user gave, parsed
    command_line(cfg, base, ["python", "-m", "jetflow", "x"])   # the flags that rebuild cfg from base

A field's flag is ``--name-with-dashes`` unless ``flag`` names another (``flag=None``: reachable only
through ``--set``); ``parse`` turns the flag's text into the field's value (default: from the field's
type); a ``bool`` field with ``negate=(flag, help)`` gets a pair of switches (``--causal`` /
``--bidirectional``).
The same metadata writes the reproducing command, so a flag and its command cannot drift apart.
"""
from __future__ import annotations

import argparse
import dataclasses
import shlex
import types
import typing
from collections.abc import Callable, Sequence

_DASHES = object()  # the default flag: the field's name with dashes


def option(default, help: str, *, flag: str | None | object = _DASHES, parse: Callable | None = None,
           choices: Sequence | None = None, negate: tuple[str, str] | None = None, metavar: str | None = None,
           required: bool = False):
    """A dataclass field with a default, its help text and its command-line flag (see the module)."""
    meta = {"help": help, "flag": flag, "parse": parse, "choices": choices, "negate": negate,
            "metavar": metavar, "required": required}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def comma_list(text: str) -> tuple[str, ...]:
    """``"a, b,c"`` -> ("a", "b", "c"); empty items dropped."""
    return tuple(v.strip() for v in text.split(",") if v.strip())


def flag_of(f: dataclasses.Field) -> str | None:
    """The field's flag, or None when it has none of its own."""
    flag = f.metadata.get("flag", None) if "help" in f.metadata else None
    return f"--{f.name.replace('_', '-')}" if flag is _DASHES else flag


def _kind(cls, f: dataclasses.Field) -> tuple[type, bool]:
    """(the field's type with ``None`` taken out, whether it may be None)."""
    kind = typing.get_type_hints(cls)[f.name]
    optional = False
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None -> X
        optional = type(None) in typing.get_args(kind)
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    return typing.get_origin(kind) or kind, optional


def _parse(cls, f: dataclasses.Field, text: str, label: str):
    """Text -> value for field ``f``: its ``parse``, else by its declared type; an optional field also
    takes ``none``. ``label`` (the flag, or ``--set name``) starts the error message."""
    kind, optional = _kind(cls, f)
    if optional and text.lower() in ("none", "null", ""):
        return None
    if f.metadata.get("parse"):
        return f.metadata["parse"](text)
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError(f"{label} expects true or false, got {text!r}")
        return text.lower() == "true"
    if kind is tuple:
        return comma_list(text)
    try:
        return kind(text)
    except ValueError:
        what = "a number" if kind in (int, float) else f"a {kind.__name__}"
        raise ValueError(f"{label} expects {what}{' or none' if optional else ''} "
                         f"({kind.__name__}{' | None' if optional else ''}), got {text!r}") from None


def flagged(cls) -> list[dataclasses.Field]:
    """The fields of ``cls`` that carry flag metadata (``option``), in declaration order."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def add_flags(parser: argparse.ArgumentParser, cls, *, set_flag: bool = False) -> None:
    """One flag per ``option`` field with a flag (default None: "not given"); ``set_flag`` adds
    ``--set KEY=VALUE`` for every option field, flag or not."""
    for f in flagged(cls):
        flag, meta = flag_of(f), f.metadata
        if flag is None:
            continue
        if meta["negate"]:
            pair = parser.add_mutually_exclusive_group()
            pair.add_argument(flag, dest=f.name, action="store_const", const=True, default=None, help=meta["help"])
            off, off_help = meta["negate"]
            pair.add_argument(off, dest=f.name, action="store_const", const=False, help=off_help)
            continue
        choices = list(meta["choices"]) if meta["choices"] else None
        parser.add_argument(flag, dest=f.name, default=None, choices=choices, metavar=meta["metavar"],
                            required=meta["required"], help=meta["help"])
    if set_flag:
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="any other config field, e.g. --set max_len=256 (repeatable)")


def parse_value(cls, name: str, text, label: str | None = None):
    """The value of field ``name`` of ``cls`` from its command-line text (values already parsed pass)."""
    f = next((f for f in flagged(cls) if f.name == name), None)
    if f is None:
        raise ValueError(f"{cls.__name__} has no setting {name!r}")
    return text if not isinstance(text, str) else _parse(cls, f, text, label or flag_of(f) or f"--set {name}")


def _set_items(cls, items: Sequence[str]) -> dict:
    """Field -> parsed value of each ``--set KEY=VALUE`` item."""
    names, out = sorted(f.name for f in flagged(cls)), {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in names:
            raise ValueError(f"--set expects key=value with key one of {names}, got {item!r}")
        out[key] = parse_value(cls, key, raw, f"--set {key}")
    return out


def parse_set(cfg, items: Sequence[str]):
    """``cfg`` with ``--set KEY=VALUE`` items applied, each parsed by the field's declared type."""
    return dataclasses.replace(cfg, **_set_items(type(cfg), items))


def given(args: argparse.Namespace, cls) -> dict:
    """Field -> parsed value for every ``--set KEY=VALUE``, then every flag of ``cls`` the user gave (a
    flag wins over ``--set``)."""
    out = _set_items(cls, getattr(args, "set", None) or [])
    out.update({f.name: parse_value(cls, f.name, getattr(args, f.name))
                for f in flagged(cls) if flag_of(f) and getattr(args, f.name, None) is not None})
    return out


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def command_line(cfg, base, prefix: Sequence[str], *, skip: Sequence[str] = (),
                 always: Sequence[str] = ()) -> str:
    """``command_args`` joined for a shell."""
    return shlex.join(command_args(cfg, base, prefix, skip=skip, always=always))


def command_args(cfg, base, prefix: Sequence[str], *, skip: Sequence[str] = (),
                 always: Sequence[str] = ()) -> list[str]:
    """``prefix`` plus the flags that turn ``base`` into ``cfg`` (fields in ``skip`` left out, fields in
    ``always`` written even when equal): a field's own flag, else ``--set name=value``; a ``negate`` pair
    writes its switch."""
    args = list(prefix)
    for f in flagged(type(cfg)):
        value = getattr(cfg, f.name)
        if f.name in skip or (value == getattr(base, f.name) and f.name not in always):
            continue
        flag = flag_of(f)
        if f.metadata["negate"]:
            args.append(flag if value else f.metadata["negate"][0])
        elif flag is None:
            args += ["--set", f"{f.name}={_text(value)}"]
        else:
            args += [flag, _text(value)]
    return args

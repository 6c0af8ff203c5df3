"""Tests for jetflow/cli.py: one parser holds every subcommand, and bad input is one `error:` line, exit 2."""
import pytest

from jetflow.cli import build_parser, main

SUBCOMMANDS = {"demo", "generate", "regenerate", "train", "bench", "replay", "report", "results", "gpu-check"}


def test_one_parser_holds_every_subcommand():
    assert SUBCOMMANDS <= set(build_parser()._subparsers._group_actions[0].choices)


@pytest.mark.parametrize("argv", [["generate", "--prompt", "hi", "--method", "medusa"],
                                  ["generate", "--prompt", "hi", "--budget", "many"],
                                  ["generate", "--prompt", " "],
                                  ["bench", "--methods", "ar,medusa"], ["bench", "--budgets", "0,16"],
                                  ["bench", "--preset", "huge"], ["bench", "--dtype", "int8"],
                                  ["replay", "--datasets", "imdb"], ["train", "--out", "x"], ["nope"]])
def test_bad_input_is_one_error_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        raise SystemExit(main(argv))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err

"""The demo end to end on the embedded target with tiny settings: its rows, not its timings."""
from __future__ import annotations

import json

import pytest
import torch

from fakes import tiny_model
from jetflow import demo
from jetflow.cli import main
from jetflow.engine.target import Target


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_demo_rows(smol, dtype):
    said = []
    cfg = demo.DemoConfig(methods=("lookup", "jetflow+lookup"), max_new_tokens=12, prompts=2,
                          check_new_tokens=8, dtype=dtype)
    rows = demo.run(cfg, target=smol, say=said.append)
    assert [r["method"] for r in rows] == ["ar", "lookup", "jetflow+lookup"]
    assert [r["budget"] for r in rows] == [None, 16, 16]
    assert all(r["n_prompts"] == 2 and r["dtype"] == dtype for r in rows)
    assert rows[0]["tau"] == 1.0 and rows[0]["speedup"] == pytest.approx(1.0)
    assert all(r["tau"] >= 1.0 and r["speedup"] > 0 for r in rows)
    assert all(r["identical_in_fp32"] for r in rows)  # greedy speculative decoding is lossless in fp32
    if dtype == "float32":  # the timed run itself is the fp32 check: every answer is AR's
        assert all(r["identical_to_ar"] == 2 for r in rows)
    text = "\n".join(said)
    assert "identical to AR in fp32: yes" in text and "identical to AR in fp32: no" not in text
    assert f"dtype: {dtype} (asked for)" in text and ("near-tie" in text) == (dtype == "bfloat16")


@pytest.mark.slow
def test_cli_demo_json(smol, capsys):
    assert main(["demo", "--json", "--methods", "lookup", "--max-new-tokens", "6", "--prompts", "1"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["method"] for r in rows] == ["ar", "lookup"]
    assert {"tau", "speedup", "identical_to_ar", "identical_in_fp32", "dtype", "dtype_reason"} <= set(rows[1])


@pytest.mark.parametrize("argv, needle", [
    (["--max-new-tokens", "1"], "--max-new-tokens must be >= 2"),
    (["--budget", "0"], "--budget must be >= 1"),
    (["--methods", "jetflow,nope"], "unknown or empty"),
    (["--methods", ","], "unknown or empty"),
    (["--prompts", "0"], "--prompts must be between 1"),
])
def test_cli_demo_bad_input(capsys, argv, needle):
    assert main(["demo", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0]


def test_in_dtype_copies():
    target = Target(tiny_model("llama", 16), None, "tiny")
    cast = demo.in_dtype(target, "bfloat16")
    assert cast.dtype == torch.bfloat16 and target.dtype == torch.float32
    assert demo.in_dtype(target, "float32") is target

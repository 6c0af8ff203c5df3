"""Fault injection: resumable jobs (bench, replay's AR cache, regeneration, training) are SIGKILLed in a
child process, in the middle of a write, right after one, inside a checkpoint swap and at random
moments, then resumed, more than once; what they leave at the end equals an uninterrupted run's.

Children are forked from the test process (the job itself takes about a second on a tiny random
target; a fresh interpreter would spend most of its time importing torch). ``fault_child.py`` holds
the jobs and the kill points.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal

import pytest
import torch
from safetensors.torch import load_file

import fault_child
from jetflow.util import jsonl

FORK = multiprocessing.get_context("fork")
TIMING = ("decode_s", "prefill_s", "tokens_per_s", "speedup", "hardware")


def child(job: str, out, kill: str | None = None, kill_after: float | None = None) -> int:
    """Run ``job`` in a forked child; ``kill``: where it kills itself; ``kill_after``: seconds after
    which the test kills it. -> the exit code (-9 when SIGKILLed)."""
    proc = FORK.Process(target=fault_child.main, args=(job, str(out), kill))
    proc.start()
    proc.join(kill_after)
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    return proc.exitcode


def finished(job: str, out) -> dict:
    """What a job leaves that must not depend on interruptions (no timings)."""
    if job == "bench":
        rows = json.loads((out / "rows.json").read_text())
        # a prompt torn mid-write can leave some of its lines whole: it is decoded again, later lines win
        runs = {(r["dataset"], r["index"], r["config"]): (r["id"], r["head"], r["run"]["tokens"], r["run"]["rounds"])
                for r in jsonl.read(out / "runs.jsonl")[1:]}
        return {"rows": [{k: v for k, v in r.items() if k not in TIMING} for r in rows], "runs": runs}
    if job == "replay":
        return {"lines": (out / "ar.jsonl").read_text().splitlines()}
    if job == "regenerate":
        return {"lines": (out / "regen.jsonl").read_text().splitlines()}
    history = [{k: v for k, v in h.items() if k != "elapsed_s"} for h in jsonl.read(out / "history.jsonl")]
    return {"history": history, "weights": load_file(str(out / "model.safetensors"))}


def assert_same(a: dict, b: dict) -> None:
    for key in a:
        if key == "weights":
            assert a[key].keys() == b[key].keys()
            for name in a[key]:
                torch.testing.assert_close(a[key][name], b[key][name], atol=1e-6, rtol=0, msg=name)
        else:
            assert a[key] == b[key], key


# several kill points per job, each followed by a resume; the last run finishes
KILLS = {  # appends counted from each run's start: the bench journals one line per prompt (6 prompts)
    "bench": ["write:1", "write:2", "after:2", "write:1"],  # write:1 first tears the header line itself
    "replay": ["write:1", "after:2", "write:4"],
    "regenerate": ["write:1", "write:2", "after:1"],       # the header, then a batch torn mid-write
    # history torn; killed between the swap's renames; between its rename and rmtree (checkpoint.old left)
    "train": ["write:3", "rename:2", "rmtree:4", "after:2"],
}


@pytest.mark.parametrize("job", sorted(KILLS))
def test_killed_and_resumed_equals_uninterrupted(job, tmp_path):
    assert child(job, tmp_path / "straight") == 0
    out = tmp_path / "killed"
    for kill in KILLS[job]:
        assert child(job, out, kill) == -signal.SIGKILL, kill
    rng = random.Random(job)
    for _ in range(2):  # and twice from outside, at a random moment
        child(job, out, kill_after=rng.uniform(0.05, 1.0))
    assert child(job, out) == 0
    assert_same(finished(job, tmp_path / "straight"), finished(job, out))
    assert not (out / "checkpoint.old").exists() and not (out / "checkpoint.tmp").exists()


@pytest.mark.parametrize("job, path", [("bench", "runs.jsonl"), ("replay", "ar.jsonl"),
                                       ("regenerate", "regen.jsonl"), ("train", "")])
def test_a_second_writer_is_refused_and_the_first_finishes(job, path, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with jsonl.locked(out / path if path else out):  # another process holds the output
        with pytest.raises(ValueError, match="being written by another process"):
            fault_child.run(job, out)
    assert child(job, out) == 0  # the lock went with its holder
    assert child(job, tmp_path / "straight") == 0
    assert_same(finished(job, tmp_path / "straight"), finished(job, out))


def test_two_benches_started_together_leave_one_readable_journal(tmp_path):
    procs = [FORK.Process(target=fault_child.main, args=("bench", str(tmp_path))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert sorted(p.exitcode for p in procs) == [0, 1]  # one refused with the lock's ValueError
    lines = jsonl.read(tmp_path / "runs.jsonl")
    assert "settings" in lines[0] and not any("settings" in line for line in lines[1:])

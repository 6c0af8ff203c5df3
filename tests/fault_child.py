"""A resumable job on a tiny random target, run in a child process by ``test_faults.py`` to be killed.

    python tests/fault_child.py JOB OUT [KILL]      # or fork a process that calls main(JOB, OUT, KILL)

JOB is bench, replay, regenerate or train; OUT the folder it writes. KILL, when given, is where the
process SIGKILLs itself: ``write:N`` in the middle of the N-th JSON-lines append (half its bytes on
disk, fsynced: a torn last line), ``after:N`` right after it, ``rename:N`` before the N-th rename of a
checkpoint swap, ``rmtree:N`` before the N-th folder removal (of a swap). Without KILL the job runs to the end (the tests also kill it from outside at random
moments). Everything is seeded: two complete runs write the same rows.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # fakes, and this checkout's jetflow
from fakes import CharTokenizer, tiny_model  # noqa: E402

from jetflow.util import jsonl  # noqa: E402
from jetflow.engine.target import Target  # noqa: E402

V = 97
PROMPTS = [{"id": f"p{i}", "prompt": "abcdefgh"[: 3 + i] * (1 + i % 3)} for i in range(6)]


def target() -> Target:
    return Target(tiny_model("llama", V, seed=5, eos=2), CharTokenizer(V), "tiny-fault")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(kill: str | None) -> None:
    """Make the process kill itself at the point ``kill`` names (see the module docstring)."""
    if not kill:
        return
    kind, n = kill.split(":")
    count = {"n": 0}
    if kind in ("write", "after"):
        real = jsonl.append

        def append(path, rows):
            count["n"] += 1
            if count["n"] == int(n) and kind == "write":
                text = "".join(__import__("json").dumps(dict(r)) + "\n" for r in rows)
                with open(path, "a", encoding="utf-8") as f:
                    f.write(text[: max(1, len(text) // 2)])
                    f.flush()
                    os.fsync(f.fileno())
                die()
            real(path, rows)
            if count["n"] == int(n):
                die()
        jsonl.append = append
    elif kind == "rmtree":
        import shutil
        real_rmtree = shutil.rmtree

        def rmtree(*args, **kwargs):
            count["n"] += 1
            if count["n"] == int(n):
                die()
            return real_rmtree(*args, **kwargs)
        shutil.rmtree = rmtree
    elif kind == "rename":
        real_rename = Path.rename

        def rename(self, dest):
            count["n"] += 1
            if count["n"] == int(n):
                die()
            return real_rename(self, dest)
        Path.rename = rename


def run(job: str, out: Path) -> None:
    t = target()
    if job == "bench":
        from jetflow.evaluation import bench
        rows = bench.run(t, ["ar", "lookup", "random"], {"a": PROMPTS[:3], "b": PROMPTS[3:]}, [4, 8],
                         max_new_tokens=12, progress=False, warmup=False, journal=out / "runs.jsonl")
        bench.write(rows, out)
    elif job == "replay":
        from jetflow.evaluation.replay import ar_traces
        ar_traces(t, PROMPTS, 16, dataset="a", cache=out / "ar.jsonl", progress=False)
    elif job == "regenerate":
        from jetflow.data.regenerate import regenerate
        regenerate(t, PROMPTS, out / "regen.jsonl", batch_size=2, max_new_tokens=10, progress=False,
                   settings={"seed": 0})
    elif job == "train":
        import json
        from jetflow.training.train import train
        from jetflow.training.config import TrainConfig
        data = out.parent / "train-data.jsonl"
        g = torch.Generator().manual_seed(0)
        if not data.exists():
            data.write_text("".join(json.dumps({"id": f"s:{i}", "prompt_ids": torch.randint(3, V, (6 + i,), generator=g).tolist(),
                                                "response_ids": torch.randint(3, V, (12 + 2 * i,), generator=g).tolist()}) + "\n"
                                    for i in range(5)))
        cfg = TrainConfig.from_name("smoke", data=str(data), out=str(out), block_size=5, steps=6, save_every=1)
        train(cfg, t, progress=False)
    else:
        raise SystemExit(f"unknown job {job!r}")


def main(job: str, out: str | Path, kill: str | None = None) -> None:
    torch.set_num_threads(1)
    arm(kill)
    run(job, Path(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)

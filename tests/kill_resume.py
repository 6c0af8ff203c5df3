"""Kill a bench at random moments, resume it to the end, and compare its rows with an uninterrupted run.

    JETFLOW_DATA_DIR=... OMP_NUM_THREADS=1 python tests/kill_resume.py --kills 3 --out /tmp/kill-test -- \
        --methods ar,lookup,jetflow --datasets gsm8k --limit 5 --max-new-tokens 48 --budgets 16 --dtype float32

Runs ``python -m jetflow bench ARGS --out OUT/straight`` once, then ``... --out OUT/killed`` again and
again: each of the first ``--kills`` runs gets a SIGKILL at a random moment of its decoding (once it has
journaled a prompt of its own, after a further delay drawn from [0, ``--jitter``] s, seeded by
``--seed``), so every kill interrupts work in progress; the last run goes to the end. Prints one
JSON object: the kill delays, the runs journaled at each kill, and whether the deterministic columns
of every row (tokens, tau, acceptance, identical-to-AR counts; not
timings) are equal. Exit status 0 when they are.
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

DETERMINISTIC = ("method", "dataset", "budget", "n_prompts", "new_tokens", "tau", "tau_hist", "depth_accept",
                 "verify_tokens", "identical_to_ar")


def bench(args: list[str], out: Path, kill_after: float | None) -> float:
    """One bench run; with ``kill_after`` a SIGKILL that many seconds after it journals its first prompt
    (if it finishes first, it is not killed). -> its wall time."""
    cmd = [sys.executable, "-m", "jetflow", "bench", *args, "--out", str(out), "--json"]
    start, before = time.perf_counter(), journaled(out)
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if kill_after is not None:
        while child.poll() is None and journaled(out) <= before:
            time.sleep(0.2)
        try:
            child.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
    child.wait()
    elapsed = time.perf_counter() - start
    if kill_after is None and child.returncode != 0:
        raise SystemExit(f"bench exited with {child.returncode}: {' '.join(cmd)}")
    return elapsed


def journaled(out: Path) -> int:
    """Complete lines in the journal past its header (a torn last line not counted)."""
    path = out / "runs.jsonl"
    return max(path.read_bytes().count(b"\n") - 1, 0) if path.exists() else 0


def rows(out: Path) -> list[dict]:
    return [{k: r[k] for k in DETERMINISTIC} for r in json.loads((out / "rows.json").read_text())]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jitter", type=float, default=20.0, help="seconds: the most a kill waits past progress")
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    args = [x for x in a.bench_args if x != "--"]
    out = Path(a.out)
    straight = bench(args, out / "straight", None)
    rng, kills = random.Random(a.seed), []
    for _ in range(a.kills):
        delay = rng.uniform(0, a.jitter)
        wall = bench(args, out / "killed", delay)
        kills.append({"delay_past_progress_s": round(delay, 1), "run_s": round(wall, 1),
                      "runs_journaled": journaled(out / "killed")})
    bench(args, out / "killed", None)
    same = rows(out / "straight") == rows(out / "killed")
    print(json.dumps({"uninterrupted_s": round(straight, 1), "kills": kills, "rows": len(rows(out / "killed")),
                      "rows_identical": same, "rows_killed": rows(out / "killed")}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

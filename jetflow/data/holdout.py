"""Which training prompts a head never saw: the hold-out draws its acceptance profile and diagnosis read.

Two kinds. ``heldout_prompts``: training prompts drawn after the ones the shipped heads trained on
(``training_prompts(after + n)`` minus the first ``after``). ``holdout_prompts``: the rows ``train --holdout n``
kept out of a head's own training (``holdout_rows``: n evenly spaced rows of the data's last part), which the
head's provenance lists (``head_holdout_ids``, checked by ``check_holdout``). ``holdout_answers`` is where the
target's greedy answers to such prompts are cached.

    rows = load_regenerated(last_part)
    kept = holdout_rows(rows, 48, last_part)           # row numbers train --holdout 48 never trains on
    prompts = holdout_prompts(data, 48)                # their prompts, from the training pool
    check_holdout(head_dir, {p["id"] for p in prompts})
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .prompts import training_pool, training_prompts
from .regenerate import data_files, is_last_part, load_regenerated
from jetflow.util.paths import cache_dir


def holdout_rows(rows: list[dict], n: int, path: Path | str = "the data") -> list[int]:
    """The row numbers ``train --holdout n`` never trains on in the data's last file: n evenly spaced rows
    (a regenerated file is sorted by prompt length, so they span all lengths). A chunked part must be
    whole (``regenerate`` writes its .meta.json at the end), or the rows would move as it grows."""
    path = Path(path)
    if not 0 < n < len(rows):
        raise ValueError(f"cannot hold out {n} of the {len(rows)} rows of {path}")
    if path.name.startswith("part-") and not path.with_name(path.name + ".meta.json").is_file():
        raise ValueError(f"{path} is still being regenerated (no {path.name}.meta.json); hold rows out of a whole part")
    return [i * len(rows) // n for i in range(n)]


def heldout_prompts(n: int, *, after: int = 3030, seed: int = 0, data_dir=None) -> list[dict]:
    """``n`` training prompts the shipped heads never saw: ``training_prompts(after + n)`` minus the
    ``after`` they were regenerated from (a larger draw keeps a smaller one's prompts)."""
    seen = {p["id"] for p in training_prompts(after, seed=seed, data_dir=data_dir)}
    return [p for p in training_prompts(after + n, seed=seed, data_dir=data_dir) if p["id"] not in seen]


def holdout_prompts(data: str | Path, n: int, *, seed: int = 0, data_dir=None) -> list[dict]:
    """The prompts of the ``n`` rows that ``train --holdout n`` kept out of a head trained on ``data`` (a
    regenerated file, or a chunked folder: rows of its last part), from the training pool of ``seed``."""
    last = data_files(data)[-1]
    if not is_last_part(last):
        raise ValueError(f"{last} is not the last part of {data} (the rest are still to regenerate); train --holdout "
                         "holds rows of the last part out")
    rows = load_regenerated(last)
    ids = {rows[i]["id"] for i in holdout_rows(rows, n, last)}
    prompts = [p for p in training_pool(seed=seed, data_dir=data_dir) if p["id"] in ids]
    if len(prompts) != len(ids):
        raise ValueError(f"{len(ids) - len(prompts)} of the {n} held-out ids of {last} are not in the training "
                         "pool of this data folder (another --data-dir or seed?)")
    return prompts


def holdout_answers(ids: set[str], max_new_tokens: int) -> Path:
    """Where the greedy fp32 answers to a head's held-out prompts are cached (named by a hash of their ids),
    shared by ``profile --data`` and the ``heldout`` diagnosis."""
    tag = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:12]
    return cache_dir() / "replay" / f"holdout-{tag}-n{len(ids)}-{max_new_tokens}.jsonl"


def head_holdout_ids(head: str | Path) -> set[str]:
    """The ids of the rows a head's training held out for its profile (``train --holdout``; its provenance's
    ``data.holdout_ids``), empty for a head trained without."""
    prov = Path(head) / "provenance.json"
    return set(json.loads(prov.read_text())["data"].get("holdout_ids", ())) if prov.is_file() else set()


def check_holdout(head: Path, ids: set[str]) -> None:
    """Refuse to profile ``head`` on prompts it may have trained on: its provenance must list ``ids`` as the
    rows its training held out (``train --holdout``)."""
    kept = head_holdout_ids(head)
    if kept != ids:
        raise ValueError(f"{head} was not trained with these {len(ids)} rows held out (its provenance.json lists "
                         f"{len(kept)} held-out ids); train it with --holdout {len(ids)} on the same data")

"""JSON-lines files that long jobs append to and resume from: one rule for a torn last line, one lock.

    append(path, [{"a": 1}])          # write whole lines, flushed and fsynced
    rows = read(path)                 # every object; a torn last line is cut off the file (with a warning)
    with locked(path):                # one writer per file: a second one gets a clear ValueError
        ...

A job killed mid-write leaves at most one unterminated last line. ``read`` truncates the file back to
its last complete line and warns, so the next ``append`` starts on a fresh line (appending onto the torn
bytes would poison the file for every later reader). Any other line that is not a JSON object is an
error naming the file and line: that is damage, not an interruption, and guessing would mix data.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Iterable, Iterator, Mapping

log = logging.getLogger(__name__)


def _truncate_torn_tail(path: Path) -> bytes:
    """The file's bytes up to its last newline; a torn tail is removed from the file itself."""
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        log.warning("%s: its last line was cut short by an interruption (%d bytes); removed it", path,
                    len(data) - keep)
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    return data[:keep]


def read(path: str | os.PathLike, *, repair: bool = True) -> list[dict]:
    """Every JSON object of the file, in order ([] if it does not exist). With ``repair`` a torn last line
    is truncated away on disk; without it, it is only left out (for read-only callers)."""
    path = Path(path)
    if not path.exists():
        return []
    if repair:
        data = _truncate_torn_tail(path)
    else:
        data = path.read_bytes()
        data = data[: data.rfind(b"\n") + 1]
    rows = []
    for lineno, line in enumerate(data.decode("utf-8").split("\n"), start=1):  # not splitlines: U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {lineno}: not valid JSON ({err.msg}); the file is damaged, "
                             "move it away to start over") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}, line {lineno}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def append(path: str | os.PathLike, rows: Iterable[Mapping]) -> None:
    """Append whole lines in one write, flushed and fsynced (a kill leaves at most one torn last line)."""
    path = Path(path)
    text = "".join(json.dumps(dict(r)) + "\n" for r in rows)
    if not text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


class Busy(ValueError):
    """``path`` is being written by another process (its lock is held)."""


@contextlib.contextmanager
def locked(path: str | os.PathLike, *, wait: bool = False) -> Iterator[Path]:
    """Hold an exclusive lock on ``path`` (a file or a folder) while the block runs, through a
    ``.lock`` file beside a file or inside a folder. A second writer fails at once with ``Busy`` (a
    ValueError) naming the path, instead of interleaving its lines with the first one's; with ``wait`` it
    says so once and waits for the lock instead. The lock goes with the process, so a killed job never
    leaves a stale lock behind."""
    path = Path(path)
    lock_path = path / ".lock" if path.is_dir() else path.with_name(path.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    f = open(lock_path, "a")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if not wait:
            f.close()
            raise Busy(f"{path} is being written by another process (lock {lock_path}); wait for it to "
                       "finish or choose another output") from None
        print(f"waiting for another process to finish writing {path} (lock {lock_path})", flush=True)
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    try:
        yield path
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        f.close()

"""Checks of command-line input, run before any model loads: each failure is one ``ValueError`` that
names the flag or file and says how to fix it (``cli.main`` prints it as one ``error: ...`` line). Only
plain values and paths: a check that loads a model or a head lives with its command (``jetflow.commands``).

    positive(max_new_tokens=1)            # "--max-new-tokens must be >= 1, got 0"
    writable_dir("runs/x", "--out")       # creates it, proves a file can be written there
    prompts_file("p.jsonl")               # exists and is a file, not a folder
    data_source(None)                     # a data folder or a reachable hub, else a ValueError at once
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def flag(name: str) -> str:
    """``max_new_tokens`` -> ``--max-new-tokens``."""
    return "--" + name.replace("_", "-")


def positive(**values) -> None:
    """Every value given (flag name -> value) is an integer >= 1 (None: not given, skipped)."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise ValueError(f"{flag(name)} must be >= 1, got {value}")


def _probe(folder: Path, what: str, name: str) -> None:
    """Prove a file can be created in ``folder`` (permissions, read-only mounts, a full disk)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"{name} {str(what)!r} is not writable ({err.strerror or err}); choose another "
                         "location") from None


def writable_dir(path: str | os.PathLike, name: str = "--out") -> Path:
    """``path`` is (or can become) a folder this process can write in; nothing in it is touched."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name} {str(path)!r} is a file, not a folder; choose a folder")
    _probe(path, path, name)
    return path


def writable_file(path: str | os.PathLike, name: str = "--out") -> Path:
    """``path`` is (or can become) a file this process can append to; an existing file is not changed."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{name} {str(path)!r} is a folder; name a file, e.g. {str(path / 'regen.jsonl')!r}")
    _probe(path.parent, path, name)
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{name} {str(path)!r} is not writable; choose another file")
    return path


def prompts_file(path: str | os.PathLike | None, name: str = "--prompts-file") -> None:
    """A prompts file, when given, is an existing file (not a folder)."""
    if path is None:
        return
    if Path(path).is_dir():
        raise ValueError(f"{name} {str(path)!r} is a folder; name a JSONL file of {{\"id\", \"prompt\"}} lines")
    if not Path(path).is_file():
        raise ValueError(f"{name} {str(path)!r} does not exist")


def prompt_source(load):
    """``load()`` (prompts from the data folder or the hub); a hub failure becomes a ValueError (it
    already names JETFLOW_DATA_DIR / --data-dir as the fix)."""
    try:
        return load()
    except RuntimeError as err:
        raise ValueError(str(err)) from None


def hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers at all (False at once under ``HF_HUB_OFFLINE=1``)."""
    import socket
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def data_source(data_dir: str | os.PathLike | None) -> None:
    """Prompts need a data folder (``--data-dir`` / ``$JETFLOW_DATA_DIR``) or the hub: without either,
    say so now instead of after half a minute of download retries."""
    from .paths import data_dir as local
    try:
        if local(data_dir) is not None:
            return
    except FileNotFoundError as err:
        raise ValueError(f"{err}; fix --data-dir or JETFLOW_DATA_DIR") from None
    if not hub_reachable():
        raise ValueError("no data folder is set and the Hugging Face hub cannot be reached; pass --data-dir "
                         "(or set JETFLOW_DATA_DIR) to the offline JSONL folder, or use --prompts-file")

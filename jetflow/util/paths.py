"""Every path the kit computes from where its own files lie, and the folders it reads and writes.

``PACKAGE`` is the installed ``jetflow/`` folder, ``REPO`` the checkout around it (a wheel install has no
checkout: only ``PACKAGE`` then means something). No other module reads ``__file__`` for a path.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # jetflow/
REPO = PACKAGE.parent                           # the checkout: README.md, data/, docs/, notebooks/
FIXTURES = PACKAGE / "fixtures"                 # JETFLOW_DATA_DIR=fixtures: the bundled first rows of every set
UNQUOTED_PREFIXES = ("~/", "$JETFLOW_CACHE/")   # left for the shell to expand


def data_dir(arg: str | os.PathLike | None = None) -> Path | None:
    """The local data folder: ``arg``, else ``$JETFLOW_DATA_DIR``, else the fixtures in smoke mode,
    else None (use the hub). The word ``fixtures`` names ``jetflow/fixtures``."""
    root = arg if arg is not None else os.environ.get("JETFLOW_DATA_DIR") or None
    if root is None:
        return FIXTURES if os.environ.get("JETFLOW_SMOKE") == "1" else None
    if str(root) == "fixtures":
        return FIXTURES
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"data directory {str(root)!r} does not exist")
    return root


def source_name(root: Path | None) -> str:
    """What ``data_dir()``'s answer means for a row's provenance: "data_dir", "fixtures" or "hub"."""
    if root is None:
        return "hub"
    return "fixtures" if root.resolve() == FIXTURES else "data_dir"


def cache_dir() -> Path:
    """Where regenerated data goes by default: ``$JETFLOW_CACHE`` or ``~/.cache/jetflow``."""
    return Path(os.environ.get("JETFLOW_CACHE") or "~/.cache/jetflow").expanduser()




def portable_path(path: str | os.PathLike) -> str:
    """``path`` as a provenance file records it, so that it means the same on every machine: relative
    to the repository ("data/heads/x"), else to the cache folder ("~/.cache/jetflow/x", or
    "$JETFLOW_CACHE/x" when that is set), else to the home folder ("~/x"); anywhere else absolute."""
    p = Path(path).expanduser().resolve()
    cache = "$JETFLOW_CACHE" if os.environ.get("JETFLOW_CACHE") else "~/.cache/jetflow"
    for base, shown in ((REPO, None), (cache_dir().resolve(), cache), (Path.home().resolve(), "~")):
        if p.is_relative_to(base):
            rel = p.relative_to(base).as_posix()
            return rel if shown is None else f"{shown}/{rel}" if rel != "." else shown
    return str(p)


def shell_join(args: list[str]) -> str:
    """``shlex.join``, except that a leading ``~/`` or ``$JETFLOW_CACHE/`` stays unquoted for the shell."""
    import shlex
    out = []
    for arg in args:
        prefix = next((x for x in UNQUOTED_PREFIXES if arg.startswith(x)), "")
        out.append(prefix + shlex.quote(arg[len(prefix):]) if prefix and arg[len(prefix):] else shlex.quote(arg))
    return " ".join(out)


def shipped_heads_root() -> Path:
    """The folder of the heads shipped for the embedded target: ``$JETFLOW_HEADS_DIR`` if set (e.g. to try
    freshly trained heads), else ``jetflow/heads`` of an installed package (package data), else the
    checkout's ``data/heads``."""
    if os.environ.get("JETFLOW_HEADS_DIR"):
        return Path(os.environ["JETFLOW_HEADS_DIR"])
    installed = PACKAGE / "heads"
    return installed if (installed / "README.md").is_file() else REPO / "data" / "heads"


def shipped_head_dir(kind: str) -> Path:
    """Directory of the head shipped for the embedded target: ``shipped_heads_root()/smollm2-135m-{kind}``."""
    return shipped_heads_root() / f"smollm2-135m-{kind}"

"""The shipped heads travel with the package: package data in pyproject.toml, found installed or in a checkout."""
from __future__ import annotations

import fnmatch
import subprocess
import tomllib
from pathlib import Path

from jetflow import proposers

ROOT = Path(__file__).resolve().parent.parent


def test_package_data_covers_every_shipped_head_file():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    source = Path(setup["package-dir"]["jetflow.heads"])
    patterns = setup["package-data"]["jetflow.heads"]
    tracked = subprocess.run(["git", "ls-files", str(source)], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert any(t.endswith("model.safetensors") for t in tracked)
    for name in tracked:
        rel = Path(name).relative_to(source).as_posix()
        assert any(fnmatch.fnmatch(rel, p) and rel.count("/") == p.count("/") for p in patterns), rel


def test_shipped_heads_are_found_in_a_checkout_and_by_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("JETFLOW_HEADS_DIR", raising=False)
    assert proposers.shipped_heads_root() == ROOT / "data" / "heads"
    assert (proposers.shipped_head_dir("jetflow") / "config.json").is_file()
    monkeypatch.setenv("JETFLOW_HEADS_DIR", str(tmp_path))
    assert proposers.shipped_head_dir("dflash") == tmp_path / "smollm2-135m-dflash"

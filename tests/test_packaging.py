"""The shipped heads travel with the package: package data in pyproject.toml, found installed or in a checkout."""
from __future__ import annotations

import fnmatch
import subprocess
import tomllib
from pathlib import Path

from jetflow.util import paths

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
    assert paths.shipped_heads_root() == ROOT / "data" / "heads"
    assert (paths.shipped_head_dir("jetflow") / "config.json").is_file()
    monkeypatch.setenv("JETFLOW_HEADS_DIR", str(tmp_path))
    assert paths.shipped_head_dir("dflash") == tmp_path / "smollm2-135m-dflash"


def test_a_built_wheel_ships_every_folder_and_the_heads(tmp_path):
    """A non-editable install sees only what the wheel holds: every jetflow/**/__init__.py and the heads."""
    import sys
    import zipfile
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("jetflow-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    inits = {p.relative_to(ROOT).as_posix() for p in (ROOT / "jetflow").rglob("__init__.py")}
    assert inits and inits <= names, f"missing from the wheel: {sorted(inits - names)}"
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "jetflow").rglob("*.py")}
    assert modules <= names, f"missing from the wheel: {sorted(modules - names)}"
    data = set(subprocess.run(["git", "ls-files", "jetflow"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.split()) - modules  # package data: the player's page, fixtures
    assert "jetflow/views/player.html" in data and data <= names, f"missing from the wheel: {sorted(data - names)}"
    heads = subprocess.run(["git", "ls-files", "data/heads"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    shipped = {"jetflow/heads/" + Path(h).relative_to("data/heads").as_posix() for h in heads}
    assert any(s.endswith("model.safetensors") for s in shipped)
    assert shipped <= names, f"heads missing from the wheel: {sorted(shipped - names)[:5]}"


def test_the_package_list_is_every_folder():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.relative_to(ROOT).parent.parts) for p in (ROOT / "jetflow").rglob("__init__.py")}
    assert listed == folders | {"jetflow.heads"}, f"pyproject.toml packages: add {sorted(folders - listed)}, " \
                                                  f"drop {sorted(listed - folders - {'jetflow.heads'})}"


def test_import_jetflow_is_light():
    """``import jetflow`` loads no model library: the public names are imported on first use (PEP 562)."""
    import sys
    out = subprocess.run([sys.executable, "-c", "import jetflow, sys; print('transformers' in sys.modules)"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_public_name_resolves():
    """Each name of ``jetflow.__all__`` comes from the module the package docstring names for it."""
    import importlib

    import jetflow
    assert sorted(jetflow.__all__) == sorted(jetflow.HOMES) and set(jetflow.__all__) <= set(dir(jetflow))
    for name in jetflow.__all__:
        assert getattr(jetflow, name) is getattr(importlib.import_module(jetflow.HOMES[name]), name), name
        assert f"``{jetflow.HOMES[name]}``" in jetflow.__doc__, name

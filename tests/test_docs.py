"""The repository's documents: every link and anchor they name exists, code points only at docs that
exist, and the command line's help lists each subcommand on one line."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import jetflow
from jetflow.cli import COMMANDS, build_parser
from jetflow.drafting.methods import describe

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


def test_slug():
    assert slug(" Speed in bf16, with the hardware-aware budget") == "speed-in-bf16-with-the-hardware-aware-budget"
    assert slug("The paper's setting") == "the-papers-setting"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_exists(doc):
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        assert path.exists(), f"{doc.name} links to missing {target}"
        if anchor:
            assert anchor in anchors(path), f"{doc.name} links to missing anchor {target}"


def test_code_points_only_at_documents_in_the_repository():
    for path in sorted((ROOT / "jetflow").rglob("*.py")):
        text = path.read_text()
        assert not re.search(r"\b(METHOD|FIELD_NOTES|NOTEBOOKS)\.md", text), path.name
        for doc in re.findall(r"docs/[\w.-]+\.md", text):
            assert (ROOT / doc).is_file(), f"{path.name} names {doc}"


def test_help_lists_every_subcommand_on_one_line(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    parser = build_parser()
    text = parser.format_help()
    subs = next(a for a in parser._actions if a.dest == "command")
    for name in subs.choices:
        line = next(l for l in text.splitlines() if l.strip().startswith(name + " "))
        following = text.splitlines()[text.splitlines().index(line) + 1]
        assert len(line.split(maxsplit=1)) == 2 and not following.startswith(" " * 20), name


DOTTED = re.compile(r"\bjetflow(?:\.[A-Za-z_]\w*)+")
PATHS = re.compile(r"\bjetflow/[\w/]+\.py\b")


def named_in_documents() -> tuple[set[str], set[str]]:
    """Every dotted ``jetflow.x.y`` name and every ``jetflow/x/y.py`` path in the documents and notebooks."""
    import json
    texts = [doc.read_text() for doc in DOCS]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        texts += ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"]]
    joined = "\n".join(texts)
    return set(DOTTED.findall(joined)) - {"jetflow.heads"}, set(PATHS.findall(joined))


def resolve(dotted: str):
    """Import the longest module prefix of ``dotted`` and look the rest up as attributes."""
    import importlib
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_every_module_and_name_the_documents_name_exists():
    dotted, paths = named_in_documents()
    assert dotted and paths
    missing = [p for p in sorted(paths) if not (ROOT / p).is_file()]
    assert not missing, f"documents name files that do not exist: {missing}"
    broken = []
    for name in sorted(dotted):
        try:
            resolve(name)
        except (ImportError, AttributeError):
            broken.append(name)
    assert not broken, f"documents name modules or names that do not exist: {broken}"


def test_the_package_docstring_documents_every_public_name_and_method():
    """The docstring is the public contract: each name of ``__all__`` and the registry's list of methods."""
    for name in jetflow.__all__:
        assert f"``{name}" in jetflow.__doc__, name
    assert describe() in jetflow.__doc__, "rewrite the Methods list of jetflow/__init__.py from describe()"


def test_the_table_of_subcommands_is_the_parser():
    subs = next(a for a in build_parser()._actions if a.dest == "command")
    assert [c.name for c in COMMANDS] == list(subs.choices)

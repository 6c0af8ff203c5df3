"""The layer contract of the package, read from the source with `ast` (nothing is imported).

Every module of ``jetflow/`` belongs to one layer: a folder, or the top (the files directly in ``jetflow/``).
A module may import its own folder and the folders its layer lists in ``MAY_IMPORT``; nothing imports the top
but the top. Every import counts, wherever it sits (module level, inside a function, in a ``try``); only a block
under ``if TYPE_CHECKING:`` is left out. No cycle between modules, none between folders. Files of at most
``MAX_FILE_LINES`` lines, functions of at most ``MAX_FUNCTION_LINES``, no private (``_name``) name of another
module, at most ``MAX_TOP_FILES`` files in the top. ``ALLOWLIST`` lists, by ``file:line``, the imports that still
break a rule while the migration runs; it only shrinks.

``python tests/test_layers.py`` prints the layer graph that docs/architecture.md shows
(``--write`` rewrites the block between its markers).
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jetflow"
DOC = ROOT / "docs" / "architecture.md"

# folder -> the folders it may import (its own folder always); bottom up
MAY_IMPORT = {
    "util": set(),
    "engine": {"util"},
    "drafting": {"engine", "util"},
    "data": {"engine", "util"},
    "training": {"drafting", "data", "engine", "util"},
    "evaluation": {"drafting", "data", "engine", "util"},
    "views": {"evaluation", "drafting", "data", "engine", "util"},
    "results": {"views", "evaluation", "training", "drafting", "data", "engine", "util"},
}
TOP = "top"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_TOP_FILES = 6

# Imports that still run upward (or into the top) or close a cycle, by "file:line"; each migration commit removes
# some, and it ends empty. An import listed here is left out of the cycle checks.
ALLOWLIST: set[str] = set()
# Files and functions still over the limits, by path / "path:function"; each commit removes some.
LONG_FILES: set[str] = set()
LONG_FUNCTIONS: set[str] = set()
# Private names of another module still used ("file:line module._name"); each commit removes some.
PRIVATE: set[str] = set()
# Flat modules not yet moved into their folder; each commit removes some.
UNMOVED: set[str] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 3 or (len(parts) == 2 and parts[1] in MAY_IMPORT):
        return parts[1] if parts[1] in MAY_IMPORT else f"unknown:{parts[1]}"
    return TOP


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST):
    """ast.walk that skips the body of `if TYPE_CHECKING:` (its `else` still counts)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for sub in child.orelse:
                yield sub
                yield from _walk(sub)
            continue
        yield child
        yield from _walk(child)


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str) -> list[tuple[str, int, str]]:
    """(imported jetflow module, line, name imported or '') for every import of `module`."""
    path = MODULES[module]
    out = []
    for node in _walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    out.append((alias.name, node.lineno, ""))
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            if target not in MODULES:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub, node.lineno, "") if sub in MODULES else (target, node.lineno, alias.name))
    return [x for x in out if x[0] != module]


GRAPH = {m: imports_of(m) for m in MODULES}


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT).as_posix()}:{line}"


def _allowed(src: str, dst: str) -> bool:
    a, b = layer_of(src), layer_of(dst)
    if a == TOP:
        return True
    if b == TOP:
        return False
    return a == b or b in MAY_IMPORT.get(a, set())


def upward_imports() -> set[str]:
    return {_where(m, line) for m, deps in GRAPH.items() for d, line, _ in deps if not _allowed(m, d)}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def module_edges() -> dict[str, set[str]]:
    # a package's __init__ re-exporting its own modules is not a cycle with them
    return {m: {d for d, line, _ in deps if not (MODULES[m].name == "__init__.py" and d.startswith(m + "."))
                and _where(m, line) not in ALLOWLIST} for m, deps in GRAPH.items()}


def folder_edges() -> dict[str, set[str]]:
    edges = defaultdict(set)
    for m, deps in GRAPH.items():
        for d, line, _ in deps:
            if layer_of(m) != layer_of(d) and _where(m, line) not in ALLOWLIST:
                edges[layer_of(m)].add(layer_of(d))
    return edges


def test_every_module_has_a_known_layer():
    unknown = [m for m in MODULES if layer_of(m).startswith("unknown")]
    assert not unknown, f"modules in a folder the layer table does not know: {unknown}"


def test_no_upward_import():
    found = upward_imports()
    new = sorted(found - ALLOWLIST)
    assert not new, "imports that run upward (or into the top): " + ", ".join(new)


def test_allowlist_has_no_stale_entry():
    every = {_where(m, line) for m, deps in GRAPH.items() for _, line, _ in deps}
    assert not ALLOWLIST - every, f"not an import any more, delete from ALLOWLIST: {sorted(ALLOWLIST - every)}"


def test_no_module_cycle():
    assert not _cycles(module_edges()), f"import cycles between modules: {_cycles(module_edges())}"


def test_no_folder_cycle():
    assert not _cycles(folder_edges()), f"import cycles between folders: {_cycles(folder_edges())}"


def private_uses() -> set[str]:
    """"file:line module._name" for every private name of another jetflow module imported or read."""
    bad = set()
    for m, deps in GRAPH.items():
        bad |= {f"{_where(m, line)} {d}.{name}" for d, line, name in deps
                if name.startswith("_") and not name.startswith("__")}
        tree = ast.parse(MODULES[m].read_text())
        modules = {}   # local name -> the jetflow module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules.update({(a.asname or a.name): a.name for a in node.names if a.name in MODULES})
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(m, MODULES[m], node)
                modules.update({(a.asname or a.name): f"{target}.{a.name}" for a in node.names
                                if f"{target}.{a.name}" in MODULES})
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in modules):
                bad.add(f"{_where(m, node.lineno)} {modules[node.value.id]}.{node.attr}")
    return bad


def test_no_private_name_of_another_module():
    found = private_uses()
    assert found <= PRIVATE, "private names used across modules: " + ", ".join(sorted(found - PRIVATE))
    assert PRIVATE <= found, f"gone, delete from PRIVATE: {sorted(PRIVATE - found)}"


def sizes() -> tuple[set[str], set[str]]:
    """(files over MAX_FILE_LINES, "file:function" over MAX_FUNCTION_LINES)."""
    long_files, long_functions = set(), set()
    for path in MODULES.values():
        rel = path.relative_to(ROOT).as_posix()
        src = path.read_text()
        if len(src.splitlines()) > MAX_FILE_LINES:
            long_files.add(rel)
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    long_functions.add(f"{rel}:{node.name}")
    return long_files, long_functions


def test_file_and_function_sizes():
    long_files, long_functions = sizes()
    assert long_files <= LONG_FILES, f"files over {MAX_FILE_LINES} lines: {sorted(long_files - LONG_FILES)}"
    assert long_functions <= LONG_FUNCTIONS, \
        f"functions over {MAX_FUNCTION_LINES} lines: {sorted(long_functions - LONG_FUNCTIONS)}"
    gone = (LONG_FILES - long_files) | (LONG_FUNCTIONS - long_functions)
    assert not gone, f"now within the limits, delete from the lists: {sorted(gone)}"


def test_top_holds_only_the_face_and_entry_points():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in UNMOVED)
    assert len(top) <= MAX_TOP_FILES, f"{len(top)} files directly in jetflow/ (at most {MAX_TOP_FILES}): {top}"
    assert UNMOVED <= {p.name for p in PACKAGE.glob("*.py")}, "moved: delete from UNMOVED"


@pytest.mark.parametrize("folder", sorted(MAY_IMPORT))
def test_each_folder_states_its_rule(folder):
    init = PACKAGE / folder / "__init__.py"
    if not init.exists():
        pytest.skip(f"jetflow/{folder}/ not made yet")
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    assert "may import" in doc.lower() and "never" in doc.lower(), \
        f"{init.relative_to(ROOT)}: the docstring states what the folder may import and what never"


def test_the_checker_catches_what_it_should():
    """The rules above, run on a planted graph: an upward import, a lazy cycle, a folder cycle."""
    assert not _allowed("jetflow.engine.tree", "jetflow.drafting.head")
    assert not _allowed("jetflow.util.flags", "jetflow.cli")
    assert _allowed("jetflow.cli", "jetflow.results.report") and _allowed("jetflow.drafting.head", "jetflow.engine.tree")
    assert not _allowed("jetflow.drafting.head", "jetflow.data.prompts")   # same level, different folders
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    lazy = ast.parse("def f():\n    from .x import y\nif TYPE_CHECKING:\n    from .z import w\n")
    seen = [n.module for n in _walk(lazy) if isinstance(n, ast.ImportFrom)]
    assert seen == ["x"], "a lazy import counts; one under TYPE_CHECKING does not"


def layer_graph() -> str:
    """The folder graph as a mermaid flowchart, each edge once, bottom layers last (the top, which may
    import anything, is left out)."""
    order = ["results", "views", "training", "evaluation", "data", "drafting", "engine", "util"]
    edges = folder_edges()
    lines = ["```mermaid", "flowchart TD"]
    for a in order:
        for b in order:
            if b in edges.get(a, ()):
                lines.append(f"    {a} --> {b}")
    lines.append("```")
    return "\n".join(lines)


BEGIN, END = "<!-- layer-graph -->", "<!-- /layer-graph -->"


def test_architecture_doc_shows_the_current_graph():
    if not DOC.exists():
        pytest.skip("docs/architecture.md not written yet")
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC.name}: no {BEGIN} block"
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == layer_graph(), "docs/architecture.md's layer graph is stale: python tests/test_layers.py --write"


if __name__ == "__main__":
    graph = layer_graph()
    if "--write" in sys.argv:
        text = DOC.read_text()
        head, rest = text.split(BEGIN, 1)
        DOC.write_text(head + BEGIN + "\n" + graph + "\n" + END + rest.split(END, 1)[1])
    print(graph)

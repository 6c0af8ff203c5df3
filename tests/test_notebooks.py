"""Tests for the committed notebooks as files (nbval runs them; see notebooks/conftest.py):

- nbval skips cells that were never run, so a checked cell (first line ``# NBVAL_CHECK_OUTPUT``) committed
  without its output would never be compared: every checked cell must be stored executed, without errors
  or stderr (``make notebooks-refresh`` re-executes them all in smoke mode);
- a checked cell pins only what is the same on every machine: no timings, no speedups, no bf16 numbers, and
  nothing that rests on a head's last rounding bits (its probabilities to two decimals, its tree's nodes per
  depth: 01 printed both, and they moved between an Intel Xeon and an AMD EPYC, so those cells are unchecked);
- every notebook starts with ``smoke = jetflow.notebook_setup()`` and opens with a header that links on.
"""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
CHECK = "# NBVAL_CHECK_OUTPUT"
# names whose values change with the machine or the load on it ("speedup" is left out: a checked cell may read
# the committed rows' speedups, which are the same on every machine)
MACHINE_DEPENDENT = ("tokens_per_s", "decode_s", "prefill_s", "draft_s", "verify_s", "elapsed_s",
                     "wall_time", "perf_counter", "time.time", "time.monotonic", "bfloat16", "bf16", "fast_dtype")


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def checked(path: Path) -> list[tuple[int, dict]]:
    return [(i, c) for i, c in enumerate(cells(path)) if c["cell_type"] == "code" and source(c).startswith(CHECK)]


def test_there_are_notebooks_with_checked_cells():
    assert len(NOTEBOOKS) >= 6 and all(checked(nb) for nb in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_checked_cells_are_committed_executed(path):
    unrun = [i for i, c in checked(path) if c.get("execution_count") is None]
    assert not unrun, f"{path.name}: checked cells {unrun} were committed unexecuted (run make notebooks-refresh)"
    for i, c in checked(path):
        kinds = {o["output_type"] for o in c["outputs"]}
        assert "error" not in kinds, f"{path.name} cell {i} was committed with an error"
        assert not any(o.get("name") == "stderr" for o in c["outputs"]), f"{path.name} cell {i} has stderr output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_checked_cells_pin_nothing_machine_dependent(path):
    for i, c in checked(path):
        found = [name for name in MACHINE_DEPENDENT if re.search(rf"\b{re.escape(name)}\b", source(c))]
        assert not found, f"{path.name} cell {i} is checked but prints {found}, which change with the machine"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_code_cell_is_notebook_setup(path):
    first = next(c for c in cells(path) if c["cell_type"] == "code")
    assert "smoke = jetflow.notebook_setup()" in source(first), f"{path.name}: first code cell is not the setup call"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_header_links_to_notebooks_that_exist(path):
    header = source(cells(path)[0])
    links = re.findall(r"\]\(([^)]+\.ipynb)\)", header)
    assert links, f"{path.name}: the header links to no other notebook"
    assert all((path.parent / link).is_file() for link in links), f"{path.name}: broken link in {links}"


@pytest.mark.parametrize("text, found", [("print(r['tokens_per_s'])", ["tokens_per_s"]), ("x = elapsed_s", ["elapsed_s"]),
                                         ("dtype=torch.bfloat16", ["bfloat16"]), ("print(r['tau'])", [])])
def test_machine_dependent_names_are_found(text, found):
    assert [n for n in MACHINE_DEPENDENT if re.search(rf"\b{re.escape(n)}\b", text)] == found


def test_notebook_04_ships_the_ar_answers_it_replays():
    """04's full mode replays the first 20 GSM8K prompts at 256 tokens from these AR answers (its cell checks
    each with a teacher-forced pass); they must be 20 whole traces of those prompts, in order."""
    from jetflow.util import jsonl
    from jetflow.evaluation import replay

    path = NOTEBOOKS[0].parent / "data" / "ar-smollm2-135m-gsm8k-20x256.jsonl"
    assert any("notebooks\" / \"data\"" in source(c) and "x{MAX_NEW}.jsonl" in source(c)
               for c in cells(NOTEBOOKS[0].parent / "04_reproduce_speedup_tables.ipynb"))
    traces = [replay.Trace(**row) for row in jsonl.read(path, repair=False)]
    assert [(t.dataset, t.id, t.max_new_tokens) for t in traces] == [("gsm8k", f"gsm8k:{i}", 256) for i in range(20)]
    assert all(0 < len(t.tokens) <= 256 and t.prompt_ids for t in traces)


def test_refresh_checked_only_rewrites_just_the_checked_cells(tmp_path):
    """`refresh.py --checked-only` runs the whole notebook but writes back only the # NBVAL_CHECK_OUTPUT cells'
    outputs; the other cells keep what they had."""
    import sys
    import nbformat
    sys.path.insert(0, str(NOTEBOOKS[0].parent))
    from refresh import refresh
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 6 * 7\nprint('free', x)"), nbformat.v4.new_code_cell(f"{CHECK}\nprint(x)")]
    for cell in nb.cells:
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="old\n")]
        cell.execution_count = 1
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    refresh(path, 60, checked_only=True)
    free, checked = nbformat.read(path, as_version=4).cells
    assert [o["text"] for o in free.outputs] == ["old\n"] and [o["text"] for o in checked.outputs] == ["42\n"]
    refresh(path, 60)
    assert [o["text"] for o in nbformat.read(path, as_version=4).cells[0].outputs] == ["free 42\n"]


def test_an_exercise_says_open_right_or_not_quite():
    from jetflow.views import exercises
    assert exercises.check(None, 15) == exercises.OPEN and "not answered yet" in exercises.OPEN
    assert exercises.check(15, 15) == exercises.check(2.571, 2.57) == exercises.check(" Lookup", "lookup") == "right"
    assert exercises.check(("a dog", "the dog sat"), ("a dog", "the dog sat")) == exercises.check([1, 2], (1, 2)) == "right"
    assert exercises.check(16, 15, hint="count the slots") == "not quite: count the slots"
    assert exercises.check(1, True).startswith("not quite") and exercises.check(False, 0).startswith("not quite")
    assert exercises.check(3.2, 3.0, tol=1e-6).startswith("not quite") and exercises.check(("a",), ("a", "b")) != "right"


def exercise_cells(path: Path) -> list[tuple[int, dict]]:
    """(index, cell) of every code cell between the "## ... Exercises" heading and the next "## " heading."""
    found, inside = [], False
    for i, c in enumerate(cells(path)):
        if c["cell_type"] == "markdown" and re.search(r"^## ", source(c), re.M):
            inside = bool(re.search(r"^## .*Exercises", source(c), re.M))
        elif inside and c["cell_type"] == "code":
            found.append((i, c))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_exercises_wait_for_the_learner(path):
    """Every exercise cell starts from ``answer = None`` and its stored output says it is open (the answer is
    never printed under the question), with the solution folded in a <details> block right after it."""
    from jetflow.views import exercises
    found = exercise_cells(path)
    assert len(found) >= 3, f"{path.name}: {len(found)} exercise cells"
    for i, c in found:
        assert "answer = None" in source(c) and "exercises.check(answer" in source(c), f"{path.name} cell {i}"
        stored = "".join("".join(o.get("text", "")) for o in c["outputs"])
        assert stored.strip() == exercises.OPEN, f"{path.name} cell {i} stores {stored[:80]!r}"
        after = cells(path)[i + 1]
        assert after["cell_type"] == "markdown" and source(after).startswith("<details>"), f"{path.name} cell {i + 1}"


# a figure whose stored output is the smoke run's own (4 training steps): a picture of it would teach nothing
NO_PICTURE = {("02_train_a_draft_head", "viz_train.training_curves(histories[name])")}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_stored_figure_has_its_picture_next(path):
    """A plotly figure shows nothing on GitHub: the markdown cell after it shows its PNG (``make screenshots``)."""
    nb = cells(path)
    for i, c in enumerate(nb):
        if c["cell_type"] != "code" or not any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in c["outputs"]):
            continue
        if any((path.stem, line) in NO_PICTURE for line in source(c).splitlines()):
            continue
        nxt = nb[i + 1] if i + 1 < len(nb) else {"cell_type": "code", "source": ""}
        assert nxt["cell_type"] == "markdown" and re.search(r"!\[[^\]]*\]\(figures/[^)]+\.png\)", source(nxt)), \
            f"{path.name} cell {i}: a figure without its PNG in the next cell"

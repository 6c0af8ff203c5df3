"""The verdict of a notebook exercise: the learner sets ``answer``, the cell compares it with what the kit computes.

    answer = None  # exercise 2: the most tokens one round can commit at budget 1
    print(exercises.check(answer, expected, hint="a draft and ..."))

``answer = None`` (the stored outputs and the tests) prints that the exercise is open, never the answer itself,
so a reader predicts before looking; the reasoning sits in a ``<details>`` block under the cell. Numbers match
within ``tol`` (learners type rounded values), strings after stripping and ignoring case, and sequences element
by element; ``True``/``False`` only match themselves.
"""
from __future__ import annotations

OPEN = "not answered yet: set `answer` above and run this cell again (the solution is folded under it)"


def matches(answer, expected, tol: float = 0.005) -> bool:
    """Whether ``answer`` is ``expected``: numbers within ``tol``, text ignoring case and outer spaces,
    lists and tuples element by element, booleans exactly."""
    if isinstance(expected, bool) or isinstance(answer, bool):
        return isinstance(answer, bool) and isinstance(expected, bool) and answer == expected
    if isinstance(expected, (int, float)):
        return isinstance(answer, (int, float)) and abs(answer - expected) <= tol
    if isinstance(expected, str):
        return isinstance(answer, str) and answer.strip().casefold() == expected.strip().casefold()
    if isinstance(expected, (list, tuple)):
        return (isinstance(answer, (list, tuple)) and len(answer) == len(expected)
                and all(matches(a, e, tol) for a, e in zip(answer, expected)))
    return answer == expected


def check(answer, expected, *, hint: str = "", tol: float = 0.005) -> str:
    """The line an exercise cell prints: open while ``answer`` is None, else right or not quite (with ``hint``)."""
    if answer is None:
        return OPEN
    if matches(answer, expected, tol):
        return "right"
    return "not quite" + (f": {hint}" if hint else "; the solution is folded under this cell")

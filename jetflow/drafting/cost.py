"""The round-cost curve as data: what one speculative round costs on this machine, in AR steps.

``CostCurve`` maps k verified tokens (root included) to the verify forward's cost relative to a one-token
step, plus one draft pass; ``interp_cost`` reads a curve between its measured sizes. The curve is saved
beside the causal head (``COST_FILE``, ``save_cost``) and loaded with it (``load_cost``, by
``jetflow.drafting.methods.make_proposer``), so the per-round stop rule (``tree.calibrated_stop``, the
``jetflow-stop`` method) weighs each next node against it. Timing it is ``jetflow.evaluation.budget``'s
(``python -m jetflow cost --out data/heads/smollm2-135m-jetflow``).
"""
from __future__ import annotations

import bisect
import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

COST_FILE = "verify_cost.json"  # beside the causal head: the round-cost curve the per-round stop rule reads
COST_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # verified tokens, root included


def interp_cost(cost_by_size: Mapping[int, float], size: int) -> float:
    """Cost at ``size``: measured, or interpolated linearly in log(cost) vs log(size) between the two
    nearest measured sizes. Sizes outside the measured range raise rather than extrapolate."""
    xs = sorted(cost_by_size)
    if size in cost_by_size:
        return cost_by_size[size]
    if not xs or not xs[0] < size < xs[-1]:
        raise ValueError(f"size {size} is outside the measured sizes {xs}; measure it")
    hi = bisect.bisect(xs, size)
    lo = hi - 1
    t = (math.log(size) - math.log(xs[lo])) / (math.log(xs[hi]) - math.log(xs[lo]))
    return math.exp((1 - t) * math.log(cost_by_size[xs[lo]]) + t * math.log(cost_by_size[xs[hi]]))


@dataclass(frozen=True)
class CostCurve:
    """A measured round cost in AR steps (one-token verifies): ``ar_steps`` maps k verified tokens (root
    included) to the verify forward's cost, ``draft`` is one head pass. ``round_costs`` is what the
    ``calibrated_stop`` builder reads."""
    ar_steps: dict[int, float]
    draft: float = 0.0

    def __post_init__(self):
        if 1 not in self.ar_steps or self.draft < 0:
            raise ValueError(f"a cost curve needs size 1 and a draft cost >= 0, got sizes {sorted(self.ar_steps)} "
                             f"and draft {self.draft}")

    def round_cost(self, size: int) -> float:
        """AR steps of a round that verifies ``size`` tokens: the draft pass plus the verify forward."""
        return self.draft + interp_cost(self.ar_steps, size)

    @functools.lru_cache(maxsize=8)
    def round_costs(self, n: int) -> tuple[float, ...]:
        """Entry k (1 <= k <= n): ``round_cost(k)``; entry 0 is unused (0.0)."""
        return (0.0, *(self.round_cost(k) for k in range(1, n + 1)))

    __hash__ = object.__hash__  # one curve per proposer: cached by identity

    def predicted_speedup(self, sizes: Sequence[int], committed: Sequence[int]) -> float | None:
        """Predicted decode speed over AR of rounds that verified ``sizes`` tokens and committed ``committed``:
        tokens per AR step (an AR round verifies 1 token, commits 1, and drafts nothing)."""
        cost = sum(self.round_cost(k) for k in sizes)
        return sum(committed) / cost * interp_cost(self.ar_steps, 1) if cost else None


def save_cost(curve: CostCurve, folder: str | Path, **about) -> Path:
    """Write ``COST_FILE`` under ``folder`` with the measurement's settings (``about``)."""
    path = Path(folder) / COST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"ar_steps": {str(k): v for k, v in sorted(curve.ar_steps.items())}, "draft": curve.draft, **about}
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def load_cost(folder: str | Path | None) -> CostCurve | None:
    """The cost curve saved in ``folder`` (a head directory), None when it has none."""
    path = Path(folder) / COST_FILE if folder else None
    if path is None or not path.is_file():
        return None
    body = json.loads(path.read_text())
    try:
        return CostCurve({int(k): float(v) for k, v in body["ar_steps"].items()}, float(body["draft"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a cost curve ({err}); measure it again with python -m jetflow cost") from None

"""Tests for jetflow/evaluation/budget.py: log-space interpolation (jetflow/drafting/cost.py's interp_cost)
against hand values, the picker against a brute-force optimum on synthetic curves, and measurement/calibration
plumbing on a tiny random Llama."""
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from jetflow.drafting.cost import interp_cost
from jetflow.evaluation import budget
from jetflow.engine.target import Target

SIZES = (1, 16, 32, 64, 128, 256)
CANDIDATES = (7, 15, 31, 63, 127, 255)
KNEE, C0 = 32, 0.05


class NoTextTokenizer:
    """Prompts are passed as ids; generate only needs ``decode``."""
    def decode(self, ids, skip_special_tokens=True):
        return ""


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=97, max_position_embeddings=128, eos_token_id=96)
    return Target(LlamaForCausalLM(cfg).eval().requires_grad_(False), NoTextTokenizer(), "tiny")


def knee_cost(k: int) -> float:
    """Flat up to the knee, linear beyond it (a GPU-like verify cost curve)."""
    return C0 * max(1.0, k / KNEE)


def saturating_tau(b: int, scale: float = 20.0) -> float:
    return 1 + 6 * (1 - math.exp(-b / scale))


# ----------------------------------------------------------------------------- interpolation
@pytest.mark.parametrize("size, want", [(1, 1.0), (16, 2.0), (4, math.sqrt(2.0)), (64, 4.0), (256, 8.0),
                                        (2, 2 ** 0.25)])
def test_interp_cost_is_linear_in_log_log(size, want):
    assert interp_cost({1: 1.0, 16: 2.0, 256: 8.0}, size) == pytest.approx(want)


@pytest.mark.parametrize("size", [257, 0])
def test_interp_cost_refuses_to_extrapolate(size):
    with pytest.raises(ValueError, match="outside the measured sizes"):
        interp_cost({1: 1.0, 256: 8.0}, size)


def test_interp_cost_exact_on_piecewise_power_law():
    cost = {k: knee_cost(k) for k in SIZES}
    for k in range(1, 257):
        assert interp_cost(cost, k) == pytest.approx(knee_cost(k))


def test_relative():
    assert budget.relative({16: 3.0, 1: 2.0}) == {1: 1.0, 16: 1.5}


# ----------------------------------------------------------------------------- prediction and picking
def test_predict_tokens_per_s_by_hand():
    pred = budget.predict_tokens_per_s({15: 3.0, 31: 4.0}, {1: 0.1, 16: 0.2, 32: 0.3}, draft_cost={15: 0.1, 31: 0.2})
    assert pred == pytest.approx({15: 3.0 / 0.3, 31: 4.0 / 0.5})
    assert budget.predict_tokens_per_s({15: 3.0}, {1: 0.1, 16: 0.2}, 0.1) == pytest.approx({15: 10.0})


def test_pick_budget_finds_the_knee():
    """tau saturating, cost flat then linear: tau(B)/cost(B+1) peaks where the flat part ends."""
    cost = {k: knee_cost(k) for k in SIZES}
    tau = {b: saturating_tau(b) for b in CANDIDATES}
    dense_best = max(range(1, 256), key=lambda b: saturating_tau(b) / knee_cost(b + 1))
    best, table = budget.pick_budget(tau, cost)
    assert best == dense_best == KNEE - 1
    assert [row["budget"] for row in table] == list(CANDIDATES)
    for row in table:
        b = row["budget"]
        assert row["predicted_tokens_per_s"] == pytest.approx(saturating_tau(b) / knee_cost(b + 1))


@pytest.mark.parametrize("draft_s", [0.0, 0.02, 0.2, 2.0, {b: 0.001 * b for b in CANDIDATES}])
@pytest.mark.parametrize("scale", [5.0, 20.0, 200.0])
def test_pick_budget_matches_brute_force(draft_s, scale):
    cost = {k: knee_cost(k) for k in SIZES}
    tau = {b: saturating_tau(b, scale) for b in CANDIDATES}
    draft = (lambda b: draft_s[b]) if isinstance(draft_s, dict) else (lambda b: draft_s)
    want = max(CANDIDATES, key=lambda b: saturating_tau(b, scale) / (knee_cost(b + 1) + draft(b)))
    assert budget.pick_budget(tau, cost, draft_s=draft_s)[0] == want


def test_pick_budget_prefers_the_smaller_budget_on_ties():
    assert budget.pick_budget({64: 2.0, 16: 2.0}, {1: 1.0, 65: 1.0})[0] == 16


def test_slow_drafting_pushes_the_budget_up():
    cost, tau = {k: knee_cost(k) for k in SIZES}, {b: saturating_tau(b, 200.0) for b in CANDIDATES}
    assert budget.pick_budget(tau, cost, draft_s=10.0)[0] > budget.pick_budget(tau, cost)[0]


# ----------------------------------------------------------------------------- measurement on a tiny model
@pytest.mark.parametrize("size", [1, 2, 9, 40])
def test_random_tree_size(size):
    tree = budget.random_tree(size, 97, torch.Generator().manual_seed(0))
    assert len(tree) == size and int(tree.depth.max()) <= 15


def test_measure_verify_cost_shape(target):
    cost = budget.measure_verify_cost(target, sizes=(8, 1, 4), past_len=16, repeats=1)
    assert list(cost) == [1, 4, 8] and all(c > 0 for c in cost.values())
    assert budget.relative(cost)[1] == 1.0


def test_measure_verify_cost_checks_context(target):
    with pytest.raises(ValueError, match="context"):
        budget.measure_verify_cost(target, sizes=(1, 64), past_len=100)


def test_calibrate_on_tiny_model(target):
    prompts = [torch.tensor([3, 4, 5, 3, 4, 5, 3, 4]), {"prompt": torch.tensor([7, 8, 9, 7, 8])}]
    cal = budget.calibrate(target, "lookup", prompts, [2, 4], max_new_tokens=6)
    assert set(cal.tau) == set(cal.draft_s) == set(cal.verify_s) == {2, 4}
    assert all(1.0 <= t <= 5.0 for t in cal.tau.values())
    assert budget.calibrate(target, "ar", prompts[:1], [3], max_new_tokens=4).tau == {3: 1.0}


def test_auto_budget_returns_the_picked_budget_and_its_prediction(target):
    cost = {1: 1.0, 3: 1.1, 5: 1.2, 9: 5.0}  # seconds, so the measured draft time (<< 1 ms) cannot matter
    prompt = torch.tensor([3, 4, 5, 3, 4, 5, 3, 4])
    best, pred = budget.auto_budget(target, "lookup", prompt, budgets=(2, 4, 8), max_new_tokens=6, cost_by_size=cost)
    tau = budget.calibrate(target, "lookup", [prompt], (2, 4, 8), max_new_tokens=6).tau  # greedy: reproducible
    assert (best, pred) == (budget.pick_budget(tau, cost)[0], pytest.approx(tau[best] / cost[best + 1], rel=1e-3))
    assert budget.auto_budget(target, "ar", prompt, cost_by_size={1: 0.02}) == (1, 50.0)
    best, pred = budget.auto_budget(target, "lookup", prompt, budgets=(2, 4), max_new_tokens=4)  # measured
    assert best in (2, 4) and pred > 0


def _curve_rows(target, path, seconds, **change):
    import json
    from jetflow.util import hardware
    row = {"kind": "curve", "backend": "fp32", "model": target.name, "cpu": hardware.cpu_model(),
           "threads": torch.get_num_threads(), "seconds": {str(k): v for k, v in seconds.items()}}
    other = {**row, **change, "seconds": {"1": 9.0, "2": 9.0}}
    path.write_text(json.dumps([{"kind": "setup"}, *([other] if change else []), row]))
    return path


@pytest.mark.parametrize("change", [{"backend": "bf16"}, {"model": "other"}, {"cpu": "another CPU"},
                                    {"threads": 99}, {"backend": "fp32-compiled"}, {"forward": "LeanTarget"}])
def test_saved_cost_reads_the_curve_of_this_backend_model_cpu_and_threads(target, tmp_path, change):
    """The row of this target's key is read, never another's; a row without "forward" (saved before it was a key)
    is transformers' forward, this target's."""
    path = _curve_rows(target, tmp_path / "rows.json", {1: 1.0, 3: 1.5}, **change)
    assert budget.saved_cost(target, [tmp_path / "missing.json", path]) == {1: 1.0, 3: 1.5}
    only_other = _curve_rows(target, tmp_path / "other.json", {1: 1.0}, **change)
    rows = __import__("json").loads(only_other.read_text())
    only_other.write_text(__import__("json").dumps(rows[:2]))  # the mismatching row alone
    assert budget.saved_cost(target, [only_other]) is None


def test_auto_budget_picks_against_the_saved_curve_without_timing(target, tmp_path, monkeypatch):
    """With a saved curve of this backend, auto_budget times nothing and weighs only the trees the curve holds."""
    cost = {1: 1.0, 3: 1.1, 5: 1.2}
    path = _curve_rows(target, tmp_path / "rows.json", cost)
    monkeypatch.setattr(budget, "curve_files", lambda: (path,))
    monkeypatch.setattr(budget, "measure_verify_cost", lambda *a, **k: pytest.fail("timed a curve"))
    prompt = torch.tensor([3, 4, 5, 3, 4, 5, 3, 4])
    best, pred = budget.auto_budget(target, "lookup", prompt, budgets=(2, 4, 8), max_new_tokens=6)
    tau = budget.calibrate(target, "lookup", [prompt], (2, 4), max_new_tokens=6).tau  # 8 + 1 lies past the curve
    assert (best, pred) == (budget.pick_budget(tau, cost)[0], pytest.approx(tau[best] / cost[best + 1], rel=1e-3))

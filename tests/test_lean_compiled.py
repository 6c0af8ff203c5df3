"""The compiled lean forward (jetflow.engine.lean_compiled): one graph for every step after the prefill, rows
equal to its own AR steps bit for bit, speculation equal to its own AR, nothing compiled after ``warm``."""
from __future__ import annotations

import pytest
import torch

from jetflow.engine import lean_compiled
from jetflow.engine.decode import generate
from jetflow.engine.load import backend_of
from test_decode import stub_proposers
from test_invariant import VOCAB, assert_rows_are_ar_steps, random_tree
from test_lean import pair


@pytest.fixture(scope="module")
def compiled():
    """A tiny q4 Llama's compiled lean target, warmed once for the module (inductor's first compile here)."""
    _, lt = pair("q4", layers=2)
    target = lean_compiled.compile_lean(lt)
    rows = target.warm()
    assert [r["graph"] for r in rows] == ["target"] and rows[0]["seconds"] > 0
    assert target.warm() == [] and lean_compiled.compile_lean(target) is target
    assert backend_of(target) == "q4-compiled"
    return target


def _frames() -> int:
    import torch._dynamo.utils
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("past", [5, 60, 300])
def test_every_tree_row_equals_the_compiled_ar_step_at_its_node(compiled, past):
    """A 17-node tree across the 64-key bucket edge and past the cache's first 256 rows: every row equals, bit for bit,
    the compiled AR step that reaches its node, and neither compiles a graph after warm."""
    before = _frames()
    prompt = torch.randint(3, VOCAB, (past,), generator=torch.Generator().manual_seed(past))
    assert_rows_are_ar_steps(compiled, prompt, random_tree(17, past), range(17))
    assert _frames() == before


def test_greedy_speculation_equals_compiled_ar(compiled):
    before = _frames()
    for seed in (0, 1):
        ids = torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(seed))
        res = generate(compiled, ids, None, max_new_tokens=24)
        own = res.tokens
        assert res.compile_s == 0.0  # warmed by the fixture: nothing left to compile before the clock
        for name, proposer in stub_proposers(compiled, own).items():
            for budget in (3, 16):
                assert generate(compiled, ids, proposer, budget=budget, max_new_tokens=24).tokens == own, (name, budget)
    assert _frames() == before


def test_compiled_logits_stay_close_to_the_eager_lean_forward(compiled):
    """Inductor's fused norms and rotary round differently from the eager ops (so the compiled target is its own
    backend), but only by rounding: the two forwards' logits agree closely."""
    _, eager = pair("q4", layers=2)
    prompt = torch.randint(3, VOCAB, (30,), generator=torch.Generator().manual_seed(3))
    got = []
    for target in (eager, compiled):
        cache = target.new_cache()
        target.forward(prompt, cache)
        got.append(target.forward(prompt[-6:], cache).logits)
    assert got[0].shape == got[1].shape
    assert torch.allclose(got[0], got[1], atol=0.1, rtol=0.05)


def test_the_attention_op_refuses_to_run_outside_a_forward():
    q = torch.zeros(1, 2, 4)
    with pytest.raises(RuntimeError, match="inside a compiled lean target's forward"):
        torch.ops.jetflow.lean_attention(q, q, q, 0)

"""The per-round budget (``builders.calibrated_stop``, the ``jetflow-stop`` methods) and the cost curve it reads."""
import json
import math

import pytest
import torch

from fakes import random_profile
from jetflow.evaluation import replay as rp
from jetflow.drafting.cost import COST_FILE, CostCurve, load_cost, save_cost
from jetflow.engine.decode import generate
from jetflow.drafting.proposers import HeadProposer, LookupMerged
from jetflow.drafting.methods import make_proposer
from jetflow.training.train import build_head
from jetflow.training.config import TrainConfig
from jetflow.drafting.builders import BUILDERS, calibrated_prefix, calibrated_stop, stop_size

# verify cost in AR steps, flat then linear (the shape measured on a CPU)
CURVE = CostCurve({1: 1.0, 8: 1.3, 32: 2.0, 128: 5.0, 256: 9.0}, draft=0.3)


def ref_stop(logp, budget, profile, cost):
    """Slow reference: the calibrated tree at every budget k on its own, its expected tau (1 + the sum of
    its nodes' path acceptances), and the first k whose next budget predicts fewer tokens per cost."""
    trees = []
    for k in range(1, budget + 1):
        tree = calibrated_prefix(logp, k, 0, profile)
        if tree.budget < k:                                           # no node left to add
            break
        trees.append(tree)
    rate = [(1 + t.score[1:].exp().sum().item()) / cost.round_cost(len(t)) for t in trees]
    k = next((i for i in range(len(rate) - 1) if rate[i + 1] < rate[i] - 1e-12), len(rate) - 1)
    return trees[k]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [1, 5, 40, 255])
def test_calibrated_stop_matches_the_slow_reference(seed, budget):
    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(6, 64, generator=g) * (1 + seed), -1)
    profile = random_profile(4, 8, seed)
    tree = calibrated_stop(logp, budget, 0, profile=profile, cost=CURVE)
    ref = ref_stop(logp, budget, profile, CURVE)
    assert tree.tokens.tolist() == ref.tokens.tolist() and tree.parents.tolist() == ref.parents.tolist()
    assert 1 <= tree.budget <= budget


def test_stop_follows_the_cost_curve():
    logp = torch.log_softmax(torch.randn(6, 64, generator=torch.Generator().manual_seed(1)) * 3, -1)
    profile = random_profile(4, 8, 1)
    free = CostCurve({1: 1.0, 256: 1.0})                     # verification free: the whole cap
    steep = CostCurve({1: 1.0, 2: 3.0, 256: 500.0})          # a second token triples the round: one node
    assert calibrated_stop(logp, 30, 0, profile=profile, cost=free).budget == 30
    assert calibrated_stop(logp, 30, 0, profile=profile, cost=steep).budget == 1
    sizes = [calibrated_stop(torch.log_softmax(torch.randn(6, 64, generator=torch.Generator().manual_seed(s)) * t, -1),
                             255, 0, profile=profile, cost=CURVE).budget for s, t in ((2, 0.3), (2, 8.0))]
    assert len(set(sizes)) == 2, "rounds with different drafts get trees of their own size"


def test_stop_size_on_hand_worked_numbers():
    costs = [0.0, 1.0, 1.2, 1.4, 1.6]                        # each node costs a fifth of an AR step
    assert stop_size([0.9, 0.8, 0.1], costs) == 2            # 2.7/1.4 >= 1.9/1.2, then 2.8/1.6 < 2.7/1.4
    assert stop_size([0.9, 0.8, 0.1], [0.0, 1.0, 2.0, 3.0, 4.0]) == 1  # a whole AR step each: 2.7/3 < 1.9/2
    assert stop_size([0.01, 0.005], costs) == 1              # the first node is always kept


def test_calibrated_stop_needs_a_cost_curve():
    with pytest.raises(ValueError, match="needs a round-cost curve"):
        calibrated_stop(torch.zeros(3, 8), 4, 0, profile=random_profile(2, 4))
    assert BUILDERS["calibrated_stop"].options == ("profile", "cost")


def test_cost_curve_round_trip_and_prediction(tmp_path):
    assert load_cost(tmp_path) is None
    save_cost(CURVE, tmp_path, dtype="float32")
    back = load_cost(tmp_path)
    assert back.ar_steps == CURVE.ar_steps and back.draft == CURVE.draft
    assert json.loads((tmp_path / COST_FILE).read_text())["dtype"] == "float32"
    assert math.isclose(back.round_cost(8), 1.6)
    # two rounds of 8 verified tokens committing 3 each: 6 tokens over 3.2 AR steps
    assert math.isclose(back.predicted_speedup([8, 8], [3, 3]), 6 / 3.2)
    (tmp_path / COST_FILE).write_text('{"ar_steps": {"4": 2.0}, "draft": 0.1}')
    with pytest.raises(ValueError, match="size 1"):
        load_cost(tmp_path)


def tiny_head(target, block_size=6):
    rows = [{"prompt_ids": [], "response_ids": list(range(400, 1000))}]
    return build_head(TrainConfig(block_size=block_size, draft_vocab=300), target, rows).eval()


PROMPTS = [[1, 400, 401, 402, 403, 400, 401], [5, 17, 900, 33, 17, 900, 33, 17], [7, 7, 7, 8]]


@pytest.mark.parametrize("merged", [False, True])
def test_stop_is_lossless_on_a_tiny_target(tiny_target, merged):
    proposer = HeadProposer(tiny_head(tiny_target), tiny_target, "calibrated_stop", profile=random_profile(5, 8),
                            cost=CURVE)
    proposer = LookupMerged(proposer) if merged else proposer
    sizes = set()
    for ids in PROMPTS:
        ref = generate(tiny_target, torch.tensor(ids), None, max_new_tokens=24).tokens
        res = generate(tiny_target, torch.tensor(ids), proposer, budget=40, max_new_tokens=24)
        assert res.tokens == ref
        sizes |= {r.tree.budget for r in res.rounds}
    assert len(sizes) > 1 or merged, "the per-round budget must vary"


def test_replayed_rounds_equal_decoded_rounds(tiny_target):
    proposer = HeadProposer(tiny_head(tiny_target), tiny_target, "calibrated_stop", profile=random_profile(5, 8),
                            cost=CURVE)
    prompts = [{"id": "a", "prompt": "Count to five."}, {"id": "b", "prompt": "Name a colour."}]
    for trace in rp.ar_traces(tiny_target, prompts, 20, progress=False):
        table = rp.draft_table(proposer, trace, k=64)
        real = generate(tiny_target, torch.tensor(trace.prompt_ids), proposer, budget=30, max_new_tokens=20).rounds
        build = rp.tree_builder("calibrated_stop", profile=proposer.profile, cost=proposer.cost)
        walked = rp.walk(table, trace, build, 30, tiny_target.eos_ids)
        assert [r.tree.tokens.tolist() for r in walked] == [r.tree.tokens.tolist() for r in real]
        assert [r.committed for r in walked] == [r.committed for r in real]


def test_sampling_with_the_stop_builder_matches_the_target_distribution(small_vocab_target):
    """Sample-and-match over trees whose size changes round by round keeps the target's distribution."""
    from test_decode import assert_samples_match
    target, ids, n_samples, temperature = small_vocab_target, [1, 2, 3, 1, 2], 800, 0.7
    head = build_head(TrainConfig(block_size=4, num_layers=1), target).eval()
    proposer = HeadProposer(head, target, "calibrated_stop", profile=random_profile(3, 4),
                            cost=CostCurve({1: 1.0, 4: 1.1, 16: 1.5}))
    assert_samples_match(target, ids, proposer, temperature, n_samples)


def test_shipped_head_has_its_cost_curve():
    from jetflow.util.paths import shipped_head_dir
    curve = load_cost(shipped_head_dir("jetflow"))
    assert curve is not None and curve.ar_steps[1] == 1.0 and max(curve.ar_steps) >= 256 and curve.draft > 0


@pytest.mark.slow
@pytest.mark.parametrize("method", ["jetflow-stop", "jetflow-stop+lookup"])
def test_embedded_greedy_equals_hf_generate(smol, method):
    proposer = make_proposer(method, smol)
    for prompt in ("What is 12 times 7? Think step by step.", "Write a haiku about the sea."):
        ids = smol.encode(prompt)
        ref = smol.model.generate(ids[None], max_new_tokens=24, do_sample=False)[0, ids.numel():].tolist()
        assert generate(smol, prompt, proposer, budget=64, max_new_tokens=24).tokens == ref

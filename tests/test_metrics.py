"""Tests for jetflow/engine/metrics.py: the row statistics on hand-made rounds (nothing decoded)."""
import pytest

from jetflow.engine import metrics
from jetflow.engine.metrics import PromptRun
from metrics_cases import HAND_ROUNDS, rnd


def test_tau_hist_and_verify_tokens():
    assert metrics.tau_hist(HAND_ROUNDS) == {1: 2, 2: 1, 3: 1}
    assert metrics.tau(HAND_ROUNDS) == 7 / 4
    assert metrics.verify_tokens(HAND_ROUNDS) == 13 / 4
    assert metrics.tau([]) is None and metrics.verify_tokens([]) is None and metrics.tau_hist([]) == {}


def test_depth_accept_conditions_on_a_drafted_child():
    assert metrics.depth_accept(HAND_ROUNDS) == [2 / 3, 1.0, 0.0]
    assert metrics.depth_accept(HAND_ROUNDS[3:]) == []
    # depth 2 drafted only under a rejected depth-1 node: nobody had the chance
    assert metrics.depth_accept([rnd([5, 6, 7, 8], [-1, 0, 0, 2], [0], [4])]) == [0.0, None]


def run_(tokens, n, seconds, prefill=0.1):
    return PromptRun(tokens, n, seconds, prefill)


def test_speedup_is_a_ratio_of_totals():
    assert metrics.speedup(100, 2.0, 50, 2.0) == 2.0
    assert metrics.speedup(0, 0.0, 50, 2.0) is None and metrics.speedup(10, 1.0, 0, 0.0) is None
    runs = [run_([1, 2], 10, 1.0), run_([3], 30, 3.0, None)]
    ar = [run_([1, 2], 10, 2.0), run_([4], 30, 1.0)]
    row = metrics.summarize(runs, ar)
    assert row["tokens_per_s"] == 10.0
    assert row["speedup"] == pytest.approx(10.0 / (40 / 3))  # not the mean of per-prompt ratios
    assert row["identical_to_ar"] == 1 and row["new_tokens"] == 3 and row["n_prompts"] == 2
    assert row["prefill_s"] is None  # one run could not separate prefill
    assert metrics.summarize(ar, ar)["speedup"] == 1.0


def test_round_stats_keep_what_the_rows_need():
    stats = [metrics.RoundStat.of(r) for r in HAND_ROUNDS]
    assert stats[0] == metrics.RoundStat(committed=3, accepted=2, verified=4, deepest=3, chances=3,
                                         spine_hit=1, spine_n=2)  # a chain: spine only, never branched
    assert stats[2].chances == 1 and stats[3] == metrics.RoundStat(1, 0, 1, 0, 0)
    assert metrics.tau(stats) == metrics.tau(HAND_ROUNDS) and metrics.tau_hist(stats) == metrics.tau_hist(HAND_ROUNDS)
    assert metrics.depth_accept(stats) == metrics.depth_accept(HAND_ROUNDS)
    assert metrics.verify_tokens(stats) == metrics.verify_tokens(HAND_ROUNDS)


def test_simulated_tau_formula():
    assert metrics.simulated_tau([0.5, 0.5, 0.0]) == pytest.approx(1 + 0.5 + 0.25)
    assert metrics.simulated_tau([1.0] * 15) == pytest.approx(16.0)
    assert metrics.simulated_tau([0.0, 1.0]) == pytest.approx(1.0)


def test_decode_result_and_rows_share_one_tau():
    from jetflow.engine.decode import Result
    assert Result([1], [6, 7, 9], "", HAND_ROUNDS).tau == metrics.tau(HAND_ROUNDS) == 7 / 4
    assert Result([1], [6], "").tau == 0.0  # no round: nothing to average


def test_round_stats_are_the_rows_statistics():
    # one round branches (the third), so continuation has values: no accepted sibling, two spine chances
    assert metrics.round_stats(HAND_ROUNDS) == {"tau": 7 / 4, "tau_hist": {1: 2, 2: 1, 3: 1},
                                                "depth_accept": [2 / 3, 1.0, 0.0], "verify_tokens": 13 / 4,
                                                "sibling_continuation": None, "sibling_n": 0,
                                                "spine_continuation": 0.5, "spine_n": 2}

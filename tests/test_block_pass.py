"""The one block pass of jetflow/drafting/head.py: decoding (one anchor over cached context), replay (every anchor of
an AR answer) and training (every sampled anchor of a sequence) give the same draft log-probs."""
import pytest
import torch

from jetflow.evaluation import replay as rp
from jetflow.drafting.proposers import HeadDraftState, HeadProposer
from jetflow.training.train import build_head
from jetflow.training.step import BlockForward, block_logits
from jetflow.training.config import TrainConfig


@pytest.mark.parametrize("causal", [True, False])
def test_decode_replay_and_training_draft_the_same_logprobs(tiny_target, causal):
    rows = [{"prompt_ids": [], "response_ids": list(range(400, 1000))}]
    head = build_head(TrainConfig(block_size=5, draft_vocab=64, causal=causal), tiny_target, rows).eval()
    proposer = HeadProposer(head, tiny_target)
    trace = rp.Trace("toy", "a", list(range(500, 507)), list(range(600, 612)), 12)
    ids = torch.tensor(trace.prompt_ids + trace.tokens)                             # (S,)
    _, taps = tiny_target.sequence_taps(ids, proposer.taps)                          # (S, L, H)
    anchors = torch.arange(len(trace.prompt_ids), ids.numel() - 1)                  # (A,)

    with torch.no_grad():
        trained = torch.log_softmax(block_logits(BlockForward(head), tiny_target, taps, ids, anchors), -1)
    table = rp.draft_table(proposer, trace, k=64)                                    # top-64 of K = 64: all
    replayed = torch.full_like(trained, float("-inf")).scatter_(-1, _columns(head, table.ids), table.logp)
    decoded = torch.stack([proposer.depth_logp(HeadDraftState(), ids[:a + 1].tolist(), taps[:a])
                           for a in anchors.tolist()])                              # (A, D, K)

    assert trained.shape == decoded.shape == (anchors.numel(), 4, 64)
    torch.testing.assert_close(decoded, trained, atol=1e-4, rtol=0)
    torch.testing.assert_close(replayed, trained, atol=1e-4, rtol=0)


def _columns(head, token_ids):
    """Token ids -> their columns in the head's draft vocabulary."""
    index = torch.full((int(head.draft_vocab.max()) + 1,), -1, dtype=torch.long)
    index[head.draft_vocab] = torch.arange(head.draft_vocab.numel())
    return index[token_ids]


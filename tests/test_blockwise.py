"""Tests for jetflow/drafting/blockwise.py: the blockwise mask against the diagonal blocks of the packed
``training_mask`` (and a loop), and blockwise attention against the packed pass: the same head states and
gradients, causal and bidirectional, with grouped kv heads."""
import pytest
import torch

from jetflow.drafting.blockwise import blockwise_mask
from jetflow.drafting.head import training_mask
from test_head import H, N, tiny_head


@pytest.mark.parametrize("causal", [True, False])
def test_blockwise_mask_is_the_packed_masks_own_blocks(causal):
    anchors, seq_len = torch.tensor([2, 7, 0, 9]), 9
    dense = blockwise_mask(anchors, seq_len, N, causal).dense()                     # (A, Q, S+Q)
    packed = training_mask(anchors, seq_len, N, causal)                             # (A*Q, S+A*Q)
    assert dense.shape == (4, N, seq_len + N)
    for b in range(4):
        rows = packed[b * N:(b + 1) * N]
        assert torch.equal(dense[b], torch.cat([rows[:, :seq_len], rows[:, seq_len + b * N:seq_len + (b + 1) * N]], 1))
        for j in range(N):  # the loop: context before the anchor, own slots up to j (all when bidirectional)
            want = [c < anchors[b] for c in range(seq_len)] + [not causal or i <= j for i in range(N)]
            assert dense[b, j].tolist() == want


@pytest.mark.parametrize("causal", [True, False])
def test_blockwise_pass_gives_the_packed_states_and_gradients(causal):
    head = tiny_head(causal).train()
    seq_len, anchors = 11, torch.tensor([0, 3, 4, 9])
    taps, x = torch.randn(seq_len, 2, H), torch.randn(4, N, H)
    states, grads = [], []
    for blockwise in (False, True):
        head.zero_grad()
        out = head.sequence_blocks(taps, x, anchors, blockwise)                     # (A, D, H)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        states.append(out.detach())
        grads.append({n: p.grad.clone() for n, p in head.named_parameters()})
    assert states[0].shape == (4, N - 1, H)
    torch.testing.assert_close(states[1], states[0], atol=1e-5, rtol=1e-5)
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_a_later_block_does_not_change_an_earlier_one_blockwise():
    head = tiny_head(True)
    taps, x = torch.randn(8, 2, H), torch.randn(2, N, H)
    x2 = x.clone()
    x2[1] += 1.0
    a = head.sequence_blocks(taps, x, torch.tensor([2, 5]), blockwise=True)
    b = head.sequence_blocks(taps, x2, torch.tensor([2, 5]), blockwise=True)
    assert torch.equal(a[0], b[0]) and not torch.allclose(a[1], b[1])

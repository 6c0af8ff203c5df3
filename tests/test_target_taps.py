"""``target.decoder_taps``: the taps of a whole sequence without running the layers above the deepest tap."""
import pytest
import torch

from jetflow.engine.target import decoder_taps


def whole_pass(decoder, ids, taps):
    out = decoder(input_ids=ids, use_cache=False, output_hidden_states=True)
    return torch.stack([out.hidden_states[l + 1] for l in taps], dim=2)


def layer_calls(decoder):
    calls = []
    handles = [layer.register_forward_hook(lambda m, a, o, i=i: calls.append(i)) for i, layer in enumerate(decoder.layers)]
    return calls, handles


@pytest.mark.parametrize("taps", [(1,), (0, 2), (2, 0), (1, 1)])
def test_taps_equal_the_whole_pass_and_stop_at_the_deepest_tap(tiny_target, taps):
    decoder = tiny_target.model.get_decoder()
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = whole_pass(decoder, ids, taps)
    before = [len(layer._forward_hooks) for layer in decoder.layers]
    calls, handles = layer_calls(decoder)
    try:
        got = decoder_taps(decoder, ids, taps)
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(got, expected) and got.shape == (2, 9, len(taps), tiny_target.config.hidden_size)
    assert calls == list(range(max(taps) + 1))          # nothing above the deepest tap ran
    assert [len(layer._forward_hooks) for layer in decoder.layers] == before  # its hooks are gone again
    with torch.no_grad():  # and the model's own output capture still works after the early stop
        assert torch.equal(whole_pass(decoder, ids, taps), expected)


def test_a_tap_on_the_last_layer_runs_the_whole_decoder(tiny_target):
    """Some models hand back the last layer's entry of hidden_states after the final norm: that path stays."""
    decoder = tiny_target.model.get_decoder()
    top = len(decoder.layers) - 1
    ids = torch.arange(5)[None]
    with torch.no_grad():
        assert torch.equal(decoder_taps(decoder, ids, (1, top)), whole_pass(decoder, ids, (1, top)))


def test_sequence_taps_of_the_embedded_target_are_unchanged(smol):
    """slow: SmolLM2's head taps (1 and 27 of 30 layers) equal the whole pass's hidden states bit for bit."""
    from jetflow.drafting.head import HeadConfig
    layers = HeadConfig.for_target(smol.config).target_layer_ids
    ids = smol.encode("Name three prime numbers.")
    _, got = smol.sequence_taps(ids, layers, logits=False)
    with torch.no_grad():
        expected = whole_pass(smol.model.get_decoder(), ids[None], layers)[0]
    assert max(layers) < smol.config.num_hidden_layers - 1 and torch.equal(got, expected)
    _, with_logits = smol.sequence_taps(ids, layers)
    assert torch.allclose(with_logits, got, atol=1e-5)

"""Tests for jetflow/drafting/head.py: masks vs nested-loop references, KV-cache consistency, training vs
decoding agreement, checkpoints, and initialisation from tiny random Llama / Qwen3 targets."""
import json

import pytest
import torch
from safetensors import safe_open
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from jetflow.drafting.checkpoint import check_compatible, init_from_target
from jetflow.drafting.head import DraftHead, HeadConfig, block_mask, block_positions, draft_logp, training_mask

H, V, N = 64, 97, 5
SIZES = dict(hidden_size=H, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, vocab_size=V)


def tiny_config(causal=True) -> HeadConfig:
    return HeadConfig(hidden_size=H, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=V, block_size=N,
                      target_layer_ids=(1, 3), num_target_layers=6, mask_token_id=V - 1, causal=causal)


def tiny_head(causal=True, seed=0) -> DraftHead:
    torch.manual_seed(seed)
    head = DraftHead(tiny_config(causal))
    with torch.no_grad():  # norms start at ones; perturb them so a wrong norm would show
        for name, p in head.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return head.eval()


def run_block(head, state, x):
    """Forward one block x (1, N, H) after the cached context of ``state``."""
    n = x.shape[1]
    positions = torch.arange(state.n_ctx, state.n_ctx + n)[None]
    return head(x, positions, state.kv, block_mask(state.n_ctx, n, head.config.causal)[None])


# ----------------------------------------------------------------------------- masks
def ref_block_mask(n_ctx, n, causal):
    return torch.tensor([[c < n_ctx or (not causal or c - n_ctx <= j) for c in range(n_ctx + n)]
                         for j in range(n)])


def ref_training_mask(anchors, seq_len, n, causal):
    rows = []
    for a in anchors:
        for j in range(n):
            row = [c < a for c in range(seq_len)]
            for b2 in range(len(anchors)):
                row += [b2 == anchors.index(a) and (not causal or j2 <= j) for j2 in range(n)]
            rows.append(row)
    return torch.tensor(rows)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_ctx,n", [(0, 4), (3, 4), (5, 1)])
def test_block_mask_matches_reference(causal, n_ctx, n):
    mask = block_mask(n_ctx, n, causal)
    assert mask.dtype == torch.bool and torch.equal(mask, ref_block_mask(n_ctx, n, causal))
    inner = mask[:, n_ctx:]
    assert torch.equal(inner, inner.tril()) if causal else bool(inner.all())


@pytest.mark.parametrize("causal", [True, False])
def test_training_mask_matches_reference(causal):
    anchors, seq_len = [2, 7, 0], 9
    mask = training_mask(torch.tensor(anchors), seq_len, N, causal)
    assert mask.shape == (3 * N, seq_len + 3 * N)
    assert torch.equal(mask, ref_training_mask(anchors, seq_len, N, causal))
    blocks = mask[:, seq_len:].reshape(3, N, 3, N)
    for b in range(3):
        for b2 in range(3):
            assert b == b2 or not blocks[b, :, b2].any()  # blocks never see each other
        own = blocks[b, :, b]
        assert torch.equal(own, own.tril()) if causal else bool(own.all())
        assert int(mask[b * N, :seq_len].sum()) == anchors[b]  # context strictly before the anchor


def test_block_positions():
    assert block_positions(torch.tensor([2, 7]), 3).tolist() == [2, 3, 4, 7, 8, 9]


# ----------------------------------------------------------------------------- head outputs
@pytest.mark.parametrize("causal", [True, False])
def test_extend_in_chunks_matches_one_pass(causal):
    head = tiny_head(causal)
    taps, x = torch.randn(7, 2, H), torch.randn(1, N, H)
    state = head.extend(head.extend(None, taps[:3]), taps[3:])
    assert state.n_ctx == 7 and state.kv[0][0].shape == (1, 2, 7, 16)
    ctx_kv = head.context_kv(head.fuse(taps[None]), torch.arange(7)[None])
    positions = torch.arange(7, 7 + N)[None]
    full = head(x, positions, ctx_kv, block_mask(7, N, causal)[None])
    torch.testing.assert_close(run_block(head, state, x), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_training_pass_matches_decoding(causal):
    """All blocks of a sequence in one pass == each block decoded after its own context."""
    head, seq_len = tiny_head(causal), 9
    taps, anchors = torch.randn(seq_len, 2, H), torch.tensor([3, 0, 6])
    x = torch.randn(1, 3 * N, H)
    ctx_kv = head.context_kv(head.fuse(taps[None]), torch.arange(seq_len)[None])
    mask = training_mask(anchors, seq_len, N, causal)[None]
    out = head(x, block_positions(anchors, N)[None], ctx_kv, mask)  # (1, 3N, H)
    for b, a in enumerate(anchors.tolist()):
        state = head.extend(None, taps[:a])
        expected = run_block(head, state, x[:, b * N:(b + 1) * N])
        torch.testing.assert_close(out[:, b * N:(b + 1) * N], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("depth", [1, 3, N - 1, N + 4])
def test_draft_block_to_a_depth_is_the_whole_blocks_first_rows(causal, depth):
    """``draft_block(depth=k)``: the first k depth states of the whole block's pass; a causal head gets them from the
    block's first k + 1 slots alone (equal up to rounding), a bidirectional head from the whole block."""
    head = tiny_head(causal)
    state = head.extend(None, torch.randn(5, 2, H))
    embed = torch.randn(V, H)
    whole = head.draft_block(state, 7, embed)
    cut = head.draft_block(state, 7, embed, depth)
    assert whole.shape == (N - 1, H) and cut.shape == (min(depth, N - 1), H)
    torch.testing.assert_close(cut, whole[:depth], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_later_slot_changes_earlier_slots_only_when_bidirectional(causal):
    head = tiny_head(causal)
    state = head.extend(None, torch.randn(4, 2, H))
    x = torch.randn(1, N, H)
    x2 = x.clone()
    x2[0, 3] += 1.0
    before, after = run_block(head, state, x), run_block(head, state, x2)
    unchanged = torch.allclose(before[0, :3], after[0, :3], atol=1e-6)
    assert unchanged == causal
    assert not torch.allclose(before[0, 3], after[0, 3])


@pytest.mark.parametrize("causal", [True, False])
def test_draft_logp_rows_are_logprobs(causal):
    head = tiny_head(causal)
    embed, lm_head = nn.Embedding(V, H), nn.Linear(H, V, bias=False)
    state = head.extend(None, torch.randn(4, 2, H))
    logp = draft_logp(head, state, 5, embed, lm_head)
    assert logp.shape == (N - 1, V) and logp.dtype == torch.float32
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(N - 1))
    ids = torch.tensor([5] + [V - 1] * (N - 1))
    expected = torch.log_softmax(lm_head(run_block(head, state, embed(ids)[None])[0, 1:]), -1)
    torch.testing.assert_close(logp, expected)


# ----------------------------------------------------------------------------- checkpoints
def expected_keys(num_layers):
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                 "input_layernorm", "post_attention_layernorm"]
    keys = {f"layers.{i}.{name}.weight" for i in range(num_layers) for name in per_layer}
    return keys | {"fc.weight", "hidden_norm.weight", "norm.weight"}


@pytest.mark.parametrize("causal", [True, False])
def test_checkpoint_round_trip(tmp_path, causal):
    head = tiny_head(causal)
    head.save_pretrained(tmp_path, dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["block_size"] == N and cfg["num_target_layers"] == 6
    assert cfg["dflash_config"] == {"target_layer_ids": [1, 3], "mask_token_id": V - 1, "block_size": N,
                                    "causal_head": causal, "causal": causal}
    assert cfg["is_causal"] is causal  # every dialect's flag, one value (tests/test_checkpoint.py)
    assert Qwen3Config.from_dict(cfg).num_hidden_layers == 2  # a valid transformers Qwen3 config
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == expected_keys(2)
    loaded = DraftHead.from_pretrained(str(tmp_path))
    assert loaded.config == head.config
    state, x = head.extend(None, torch.randn(4, 2, H)), torch.randn(1, N, H)
    assert torch.equal(run_block(loaded, loaded.extend(None, torch.randn(0, 2, H)), x),
                       run_block(head, head.extend(None, torch.randn(0, 2, H)), x))
    assert torch.equal(run_block(loaded, state, x), run_block(head, state, x))


def test_default_save_is_bf16(tmp_path):
    tiny_head().save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
    assert DraftHead.from_pretrained(str(tmp_path)).fc.weight.dtype == torch.float32


def test_published_dflash_config_is_bidirectional():
    cfg = tiny_config().to_hf_dict()
    del cfg["dflash_config"]["causal_head"], cfg["dflash_config"]["causal"], cfg["is_causal"]
    # z-lab DFlash configs carry no causal flag
    assert HeadConfig.from_hf_dict(cfg).causal is False


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not a local directory"):
        DraftHead.from_pretrained(str(tmp_path / "no" / "such" / "head"))


@pytest.mark.parametrize("change,message", [
    (dict(hidden_size=32, intermediate_size=64), "hidden size 64, target has 32"),
    (dict(vocab_size=98), "vocabulary size 97, target has 98"),
    (dict(num_hidden_layers=4), "6-layer target"),
])
def test_check_compatible_rejects_mismatch(change, message):
    base = dict(SIZES, num_hidden_layers=6)
    check_compatible(tiny_config(), LlamaConfig(**base))
    with pytest.raises(ValueError, match=message):
        check_compatible(tiny_config(), LlamaConfig(**(base | change)))


# ----------------------------------------------------------------------------- target-derived heads
def tiny_target(kind, layers=6):
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**SIZES, num_hidden_layers=layers, eos_token_id=V - 1))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**SIZES, num_hidden_layers=layers, head_dim=16))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()


def test_for_target_derives_sizes():
    cfg = HeadConfig.for_target(LlamaConfig(**SIZES, num_hidden_layers=6, eos_token_id=V - 1), causal=False)
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.num_layers) == (16, 2, 2)
    assert cfg.target_layer_ids == (1, 3) and cfg.num_target_layers == 6
    assert cfg.mask_token_id == V - 2 and cfg.causal is False  # V - 1 is EOS here


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_init_from_target_copies_weights(kind):
    target = tiny_target(kind)
    head = DraftHead(HeadConfig.for_target(target.config, num_layers=2))
    init_from_target(head, target)
    src = target.get_decoder()
    for i, layer in enumerate(head.layers):
        theirs = src.layers[4 + i].state_dict()
        for name, w in layer.state_dict().items():
            expected = theirs.get(name, torch.ones_like(w))  # Llama has no q_norm / k_norm
            assert torch.equal(w, expected), name
    assert torch.equal(head.norm.weight, src.norm.weight)
    assert torch.equal(head.hidden_norm.weight, src.layers[4].input_layernorm.weight)  # last tap 3 -> 4
    taps = torch.randn(1, 3, 2, H)
    torch.testing.assert_close(head.fuse(taps), src.layers[4].input_layernorm(taps[:, :, -1]))


def test_head_matches_transformers_qwen3_on_empty_context():
    """With no context and a causal block, the head is a plain Qwen3 stack: check our RMSNorm,
    RoPE and GQA attention against transformers on the same weights."""
    target = tiny_target("qwen3")
    head = DraftHead(HeadConfig.for_target(target.config, num_layers=2)).eval()
    init_from_target(head, target)
    small = Qwen3ForCausalLM(replace_layers(target.config, 2)).eval()
    small.get_decoder().layers.load_state_dict(target.get_decoder().layers[4:].state_dict())
    small.get_decoder().norm.load_state_dict(target.get_decoder().norm.state_dict())
    x, positions = torch.randn(1, N, H), torch.arange(3, 3 + N)[None]
    ours = head(x, positions, head.extend(None, torch.randn(0, 2, H)).kv, block_mask(0, N, True)[None])
    with torch.no_grad():
        theirs = small.get_decoder()(inputs_embeds=x, position_ids=positions).last_hidden_state
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def replace_layers(config, layers):
    return Qwen3Config(**(config.to_dict() | {"num_hidden_layers": layers, "layer_types": None}))


def test_reduced_draft_vocabulary_round_trips_and_masks_the_rest(tmp_path):
    cfg = tiny_config()
    head = DraftHead(HeadConfig(**{**cfg.__dict__, "draft_vocab_size": 7})).eval()
    head.draft_vocab.copy_(torch.tensor([3, 50, 4, 96, 0, 11, 12]))
    head.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dflash_config"]["draft_vocab_size"] == 7
    loaded = DraftHead.from_pretrained(str(tmp_path))
    assert loaded.vocab.dtype == torch.long and loaded.vocab.tolist() == [3, 50, 4, 96, 0, 11, 12]
    embed, lm_head = nn.Embedding(V, H), nn.Linear(H, V, bias=False)
    state = loaded.extend(None, torch.randn(4, 2, H))
    logp = draft_logp(loaded, state, 5, embed, lm_head)
    assert logp.shape == (N - 1, V)
    outside = torch.ones(V, dtype=torch.bool)
    outside[loaded.vocab] = False
    assert torch.isinf(logp[:, outside]).all()
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(N - 1))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        HeadConfig(**{**cfg.__dict__, "draft_vocab_size": V + 1})

"""Tests for jetflow/drafting/checkpoint.py: config dialects, refused fields, draft-vocabulary checks, and the
published head shapes (Qwen3-8B, Qwen3-30B-A3B) built on the meta device."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config

from jetflow.drafting import checkpoint
from jetflow.drafting.checkpoint import read_causal, read_rope_theta, to_hf_dict
from jetflow.drafting.head import DraftHead, HeadConfig

V = 97


def tiny_config(**change) -> HeadConfig:
    base = dict(hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=V, block_size=5, target_layer_ids=(1, 3),
                num_target_layers=6, mask_token_id=V - 1, causal=True)
    return HeadConfig(**(base | change))


def bare_dict(**top) -> dict:
    """A kit config dict with every causal flag, the nested rope and the nested block size removed."""
    d = to_hf_dict(tiny_config())
    for key in ("is_causal", "rope_parameters"):
        d.pop(key)
    for key in ("causal_head", "causal", "block_size"):
        d["dflash_config"].pop(key)
    return d | top


def with_dflash(d: dict, **fields) -> dict:
    return d | {"dflash_config": d["dflash_config"] | fields}


# ----------------------------------------------------------------------------- the causal flag
@pytest.mark.parametrize("flags,expected", [
    ({}, False),                                                       # published DFlash: bidirectional
    ({"causal_head": True}, True), ({"causal_head": False}, False),    # JetSpec
    ({"causal": True}, True), ({"causal": False}, False),              # vLLM
    ({"is_causal": True}, True), ({"is_causal": False}, False),        # dflash package, ASpec, DFlash2
    ({"causal_head": True, "causal": True, "is_causal": True}, True),  # what this kit writes
    ({"causal_head": None, "is_causal": True}, True),                  # null = absent
])
def test_causal_flag_is_read_from_every_dialect(flags, expected):
    d = bare_dict(**({"is_causal": flags["is_causal"]} if "is_causal" in flags else {}))
    d = with_dflash(d, **{k: v for k, v in flags.items() if k != "is_causal"})
    assert read_causal(d) is expected
    assert HeadConfig.from_hf_dict(d).causal is expected


@pytest.mark.parametrize("flags", [
    {"causal_head": True, "causal": False}, {"causal_head": False, "is_causal": True},
    {"causal": True, "is_causal": False},
])
def test_conflicting_causal_flags_are_an_error(flags):
    d = bare_dict(**({"is_causal": flags.pop("is_causal")} if "is_causal" in flags else {}))
    with pytest.raises(ValueError, match="disagree"):
        HeadConfig.from_hf_dict(with_dflash(d, **flags))


def test_causal_flag_must_be_a_bool():
    with pytest.raises(ValueError, match="true or false"):
        read_causal(bare_dict(is_causal="yes"))


@pytest.mark.parametrize("causal", [True, False])
def test_every_causal_flag_is_written_with_one_value(causal):
    d = to_hf_dict(tiny_config(causal=causal))
    assert d["is_causal"] is causal
    assert d["dflash_config"]["causal_head"] is causal and d["dflash_config"]["causal"] is causal


# ----------------------------------------------------------------------------- rope_theta and block_size
@pytest.mark.parametrize("fields,expected", [
    ({"rope_theta": 5e5}, 5e5),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, 1e6),
    ({"rope_theta": 1e6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, 1e6),
    ({}, 10000.0),
])
def test_rope_theta_flat_or_nested(fields, expected):
    d = bare_dict()
    d.pop("rope_theta")
    assert read_rope_theta(d | fields) == expected
    assert HeadConfig.from_hf_dict(d | fields).rope_theta == expected


def test_conflicting_rope_theta_is_an_error():
    d = bare_dict(rope_theta=1e6, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    with pytest.raises(ValueError, match="rope_parameters.rope_theta"):
        HeadConfig.from_hf_dict(d)


@pytest.mark.parametrize("top,nested,expected", [(7, None, 7), (None, 9, 9), (6, 6, 6), (None, None, 16)])
def test_block_size_top_level_or_in_dflash_config(top, nested, expected):
    d = bare_dict()
    d.pop("block_size")
    d = d | ({"block_size": top} if top else {})
    d = with_dflash(d, block_size=nested) if nested else d
    assert HeadConfig.from_hf_dict(d).block_size == expected


def test_conflicting_block_size_is_an_error():
    with pytest.raises(ValueError, match="block_size=5, dflash_config.block_size=8"):
        HeadConfig.from_hf_dict(with_dflash(bare_dict(), block_size=8))


def test_kit_dict_round_trips_and_reads_back_through_transformers():
    """What the kit writes survives transformers' Qwen3Config (which nests rope_theta and adds
    layer_types), as it does when another package re-saves the config."""
    for c in (tiny_config(), tiny_config(causal=False, draft_vocab_size=7)):
        assert HeadConfig.from_hf_dict(to_hf_dict(c)) == c
        assert HeadConfig.from_hf_dict(Qwen3Config(**to_hf_dict(c)).to_dict()) == c


# ----------------------------------------------------------------------------- refused fields
@pytest.mark.parametrize("fields,key", [
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"use_swa": True}, "use_swa"),
    ({"attention_sink_bias": True}, "attention_sink_bias"),
    ({"conv_kernel_size": 4}, "conv_kernel_size"),
    ({"dflash_config": {"mask_token_id": V - 1, "conv_group_size": 64}}, "dflash_config.conv_group_size"),
    ({"selector_rank": 64}, "selector_rank"),
    ({"dflash_config": {"mask_token_id": V - 1, "selector_top_k": 8}}, "dflash_config.selector_top_k"),
    ({"input_embedding_scale": 2.0}, "input_embedding_scale"),
    ({"output_multiplier": 0.5}, "output_multiplier"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e6}}, "rope_parameters.rope_type"),
])
def test_fields_that_change_the_math_are_refused_by_name(fields, key):
    with pytest.raises(ValueError, match=rf"config field {key}=.*not implemented"):
        HeadConfig.from_hf_dict(bare_dict() | fields)


@pytest.mark.parametrize("fields", [
    {"layer_types": ["full_attention"] * 2}, {"use_sliding_window": False, "sliding_window": None},
    {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},  # Qwen3's defaults
    {"input_embedding_scale": 1.0, "output_multiplier": 1}, {"final_logit_softcapping": None},
    {"final_logit_softcapping": 0.0}, {"hidden_act": "silu"}, {"rope_scaling": {"rope_type": "default"}},
    {"attention_sink_bias": None, "use_swa": False},
])
def test_harmless_values_of_those_fields_are_accepted(fields):
    assert HeadConfig.from_hf_dict(bare_dict() | fields) == HeadConfig.from_hf_dict(bare_dict())


def test_speculators_configs_are_refused_with_what_they_are():
    d = bare_dict(speculators_config={"algorithm": "dflash"}, speculators_model_type="dflash")
    with pytest.raises(ValueError, match=r"speculators_config \(algorithm 'dflash'\): .* vLLM `speculators` library"):
        HeadConfig.from_hf_dict(d)


def test_config_without_mask_token_is_not_a_head():
    d = bare_dict()
    d["dflash_config"].pop("mask_token_id")
    with pytest.raises(ValueError, match="not a DFlash/JetSpec draft head"):
        HeadConfig.from_hf_dict(d)


def test_missing_required_field_is_named():
    d = bare_dict()
    del d["num_target_layers"]
    with pytest.raises(ValueError, match="lacks num_target_layers"):
        HeadConfig.from_hf_dict(d)


def test_mask_token_and_taps_may_sit_top_level():
    d = bare_dict(mask_token_id=V - 1, target_layer_ids=[1, 3])
    d["dflash_config"] = {}
    assert HeadConfig.from_hf_dict(d) == HeadConfig.from_hf_dict(bare_dict())


def test_taps_stored_as_l_plus_one_are_caught():
    """vLLM / llama.cpp store l + 1: a 6-layer target tapped at layer 6 does not exist."""
    with pytest.raises(ValueError, match=r"hidden_states\[l \+ 1\]"):
        HeadConfig.from_hf_dict(with_dflash(bare_dict(), target_layer_ids=[2, 6]))


# ----------------------------------------------------------------------------- draft vocabulary
def save_with_vocab(tmp_path, ids) -> str:
    head = DraftHead(tiny_config(draft_vocab_size=len(ids)))
    head.save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["draft_vocab"] = torch.tensor(ids)
    save_file(weights, str(tmp_path / "model.safetensors"))
    return str(tmp_path)


@pytest.mark.parametrize("ids,message", [
    ([3, 50, V], r"ids must lie in \[0, 97\), got \[3, 97\]"),
    ([-1, 4, 5], r"ids must lie in \[0, 97\)"),
    ([3, 4, 3], "more than once"),
])
def test_draft_vocab_is_range_checked_on_load(tmp_path, ids, message):
    with pytest.raises(ValueError, match=message):
        DraftHead.from_pretrained(save_with_vocab(tmp_path, ids))


def test_valid_draft_vocab_loads(tmp_path):
    assert DraftHead.from_pretrained(save_with_vocab(tmp_path, [0, 96, 5])).vocab.tolist() == [0, 96, 5]


def test_wrong_tensor_shape_is_a_clear_error(tmp_path):
    DraftHead(tiny_config()).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 128}))
    with pytest.raises(ValueError, match="does not match its config"):
        DraftHead.from_pretrained(str(tmp_path))


def test_the_layout_reads_plain_dicts():
    d = to_hf_dict(tiny_config())
    assert HeadConfig(**checkpoint.head_fields(d)) == tiny_config()
    del d["dflash_config"]["target_layer_ids"]
    assert checkpoint.head_fields(d)["target_layer_ids"] == ()  # the head derives them (head.tap_layers)


# ----------------------------------------------------------------------------- published shapes
def published(hidden, intermediate, layers, heads, kv_heads, taps, target_layers, **extra) -> dict:
    """A config.json as the published heads write it (Qwen3 fields, transformers 4 style)."""
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "attention_bias": False,
            "attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu", "hidden_size": hidden,
            "intermediate_size": intermediate, "max_position_embeddings": 40960, "max_window_layers": layers,
            "num_attention_heads": heads, "num_hidden_layers": layers, "num_key_value_heads": kv_heads,
            "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
            "use_sliding_window": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "vocab_size": 151936, "block_size": 16, "num_target_layers": target_layers,
            "dflash_config": {"target_layer_ids": taps, "mask_token_id": 151669}, **extra}


QWEN3_8B = published(4096, 12288, 5, 32, 8, [1, 9, 17, 25, 33], 36)          # z-lab/Qwen3-8B-DFlash-b16
QWEN3_30B_A3B = published(2048, 6144, 8, 32, 4, [1, 12, 23, 34, 45], 48)     # the Qwen3-30B-A3B DFlash head


def expected_shapes(d: dict) -> dict:
    """Every tensor of the head, written out by hand from the config."""
    H, I, hd = d["hidden_size"], d["intermediate_size"], d["head_dim"]
    q, kv = d["num_attention_heads"] * hd, d["num_key_value_heads"] * hd
    shapes = {"fc.weight": (H, len(d["dflash_config"]["target_layer_ids"]) * H), "hidden_norm.weight": (H,),
              "norm.weight": (H,)}
    for i in range(d["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
                   p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
                   p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                   p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                   p + "mlp.down_proj.weight": (H, I), p + "input_layernorm.weight": (H,),
                   p + "post_attention_layernorm.weight": (H,)}
    return shapes


@pytest.mark.parametrize("d,causal,tensors,params", [
    (QWEN3_8B, False, 58, 1_048_626_432),
    (QWEN3_8B | {"dflash_config": QWEN3_8B["dflash_config"] | {"causal_head": True}}, True, 58, 1_048_626_432),
    (QWEN3_30B_A3B, False, 91, 473_995_264),
])
def test_published_head_shapes_on_meta(d, causal, tensors, params):
    config = HeadConfig.from_hf_dict(d)
    assert config.causal is causal and config.mask_token_id == 151669 and config.block_size == 16
    with torch.device("meta"):
        head = DraftHead(config)
    state = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert len(state) == tensors
    assert state == expected_shapes(d)
    assert sum(p.numel() for p in head.parameters()) == params
    assert HeadConfig.from_hf_dict(to_hf_dict(config)) == config


@pytest.mark.parametrize("kind, causal", [("jetflow", True), ("dflash", False)])
def test_shipped_configs_state_the_causal_flag_in_every_dialect(kind, causal):
    """vLLM reads dflash_config.causal, the dflash package is_causal: a shipped config that spelled only
    causal_head would run the JetFlow head bidirectionally there."""
    from jetflow.util.paths import shipped_head_dir
    d = json.loads((shipped_head_dir(kind) / "config.json").read_text())
    assert (d["dflash_config"]["causal_head"], d["dflash_config"]["causal"], d["is_causal"]) == (causal,) * 3

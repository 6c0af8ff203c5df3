"""Device memory of a bench's methods, estimated on the meta device: nothing is read from the hub, downloaded or
allocated.

    est = estimate(BenchConfig.from_name("qwen3-8b"))
    est.resident     # target + one copy of each distinct head the run loads (bytes)
    est.peak         # method -> bytes: resident + KV at the longest context + its largest round's transients

Parameters are counted by building the modules on the meta device: the target from its config (a local folder's
or cached config.json, else ``KNOWN_TARGETS``), each head from its config.json (a local folder or the hub cache),
else in the published Qwen3-8B heads' layout (5 layers, block 16, taps 1/9/17/25/33). Methods drafting with the same
checkpoint share one copy (``jetflow.drafting.methods.load_head``), and a bench loads every head before its first
prompt, so the run's resident bytes count each distinct head once. Per method the peak adds the KV cache at
``PROMPT_TOKENS`` + max new tokens + its largest budget + 1 rows, and one verify pass at that budget: logits in the
target's dtype and their fp32 copy, every layer's hidden states (taps), and SDPA's K/V expanded to all query heads
for one layer (a float tree mask rules out its GQA path). Not counted: activations inside a layer, the allocator's
slack, CUDA's context (~0.5 GiB): treat the peak as a floor.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from jetflow.drafting import methods as registry
from jetflow.drafting.head import DraftHead, HeadConfig
from jetflow.util.paths import shipped_head_dir

PROMPT_TOKENS = 1024  # assumed: the longest prompt of a run (GSM8K/MATH-500/HumanEval/MBPP/MT-Bench stay below it)
PUBLISHED_HEAD_LAYERS = 5  # JetSpec's and z-lab's Qwen3-8B heads: 5 decoder layers, block 16
# config.json of hub targets, for a plan on a machine that has not downloaded them (the published values)
KNOWN_TARGETS = {
    "Qwen/Qwen3-8B": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                          num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                          rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960,
                          tie_word_embeddings=False, eos_token_id=151645, bos_token_id=151643),
}
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Estimate:
    target: int                 # the target's parameters, bytes
    heads: dict[str, int]       # head path -> bytes (one copy each)
    head_source: dict[str, str]  # head path -> where its shape came from
    resident: int               # target + every distinct head: what a bench of all the methods holds
    peak: dict[str, int]        # method -> bytes run alone: target + its head + KV + its largest round
    run_peak: int               # the whole bench: resident + KV + the largest round of any method
    kv_rows: int


def target_config(model: str | None):
    """The transformers config of a local folder, a cached hub id or a ``KNOWN_TARGETS`` id; None otherwise (the
    embedded GGUF target: no estimate)."""
    from transformers import AutoConfig
    if model is None:
        return None
    if model in KNOWN_TARGETS:
        d = dict(KNOWN_TARGETS[model])
        return AutoConfig.for_model(d.pop("model_type"), **d)
    try:
        return AutoConfig.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError):
        return None


def param_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers in their dtypes (works on the meta device)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def target_bytes(config, dtype: torch.dtype) -> int:
    """The target's weight bytes in ``dtype``, built on the meta device."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return param_bytes(model)


def head_config(path: str, target_cfg) -> tuple[HeadConfig, str]:
    """A head's config without its weights: a folder's or the hub cache's config.json, else the published layout."""
    local = Path(path) / "config.json"
    if not local.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache
            cached = try_to_load_from_cache(path, "config.json")
            local = Path(cached) if isinstance(cached, str) else local
        except Exception:  # not a valid hub id either: the published layout below  # noqa: BLE001
            pass
    if local.is_file():
        return HeadConfig.from_hf_dict(json.loads(local.read_text())), str(local)
    return (HeadConfig.for_target(target_cfg, num_layers=PUBLISHED_HEAD_LAYERS),
            f"assumed: the published layout ({PUBLISHED_HEAD_LAYERS} layers, block 16)")


def head_bytes(config: HeadConfig, dtype: torch.dtype) -> int:
    with torch.device("meta"):
        return param_bytes(DraftHead(config).to(dtype))


def round_bytes(config, dtype_bytes: int, rows: int, verified: int) -> int:
    """KV at ``rows`` plus one verify pass of ``verified`` tokens (see the module docstring)."""
    layers, kv, dim = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    kv_cache = layers * 2 * kv * dim * dtype_bytes * rows
    logits = verified * config.vocab_size * (dtype_bytes + 4)
    hidden = (layers + 1) * verified * config.hidden_size * dtype_bytes
    sdpa = 2 * config.num_attention_heads * rows * dim * dtype_bytes
    return kv_cache + logits + hidden + sdpa


def estimate(cfg) -> Estimate | None:
    """The memory of a ``BenchConfig`` on its device; None for a target whose shape is unknown here."""
    tcfg = target_config(cfg.model)
    if tcfg is None:
        return None
    dtype = getattr(torch, cfg.dtype)
    draft = torch.bfloat16 if str(cfg.device or "cpu").startswith("cuda") else dtype  # default_draft_dtype
    paths = {m: registry.head_path(m, cfg.heads) or str(shipped_head_dir(registry.method(m).head))
             for m in cfg.methods if registry.method(m).head}
    heads, source, blocks = {}, {}, {}
    for path in dict.fromkeys(paths.values()):
        hc, source[path] = head_config(path, tcfg)
        heads[path], blocks[path] = head_bytes(hc, draft), hc.block_size
    weights = target_bytes(tcfg, dtype)
    rows = PROMPT_TOKENS + cfg.max_new_tokens + max(cfg.budgets) + 1
    peak, rounds = {}, {}
    for m in dict.fromkeys(("ar", *cfg.methods)):
        entry, path = registry.method(m), paths.get(m)
        drafts = 0 if entry.budget_free else max(cfg.budgets)
        if entry.builder == "chain":  # a chain holds at most block size - 1 drafts
            drafts = min(drafts, blocks[path] - 1)
        rounds[m] = round_bytes(tcfg, BYTES[cfg.dtype], rows, drafts + 1)
        peak[m] = weights + heads.get(path, 0) + rounds[m]
    resident = weights + sum(heads.values())
    return Estimate(weights, heads, source, resident, peak, resident + max(rounds.values()), rows)


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"

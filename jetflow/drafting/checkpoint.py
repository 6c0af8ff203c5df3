"""Draft-head checkpoints in the published DFlash / JetSpec layout, and the config dialects around it.

The file layout only: config dicts <-> files, the dialects, the hub download and the checks. It knows no class:
it reads and writes dicts and works on any head with ``config`` and ``state_dict()`` (``DraftHead`` in
``jetflow.drafting.head`` builds its objects from what this module reads).

A checkpoint is a directory with ``config.json`` (a Hugging Face Qwen3 config plus the DFlash fields)
and ``*.safetensors`` keyed ``layers.{i}.*``, ``fc``, ``hidden_norm``, ``norm`` (plus ``draft_vocab``,
this kit's extension, when the head drafts a reduced vocabulary). ``z-lab/Qwen3-8B-DFlash-b16``,
``JetSpec/jetspec-qwen3-8b`` and the ``dflash`` PyPI package's ``save_pretrained`` all write it. A head in a
subfolder of a repo or directory (one head per folder, as in a sweep) is named ``"repo::subfolder"``.

Dialects read (and, for the flags, all written with one value, so every reader agrees):
- the causal flag: ``dflash_config.causal_head`` (JetSpec), ``dflash_config.causal`` (vLLM) and a
  top-level ``is_causal`` (the ``dflash`` package, ASpec, DFlash2); absent everywhere = bidirectional,
  as published DFlash heads are; two that disagree are an error;
- ``rope_theta`` flat (transformers 4) or inside ``rope_parameters`` (transformers 5);
- ``block_size``, ``mask_token_id``, ``target_layer_ids`` top-level or inside ``dflash_config``
  (both present and different = an error).
Fields that would change the head's math but that this head does not implement (sliding windows,
attention sinks, DFlash2's convolutions and candidate selector, embedding/logit scales, logit
soft-capping, activations other than SiLU, scaled RoPE, biases) are refused by name, never ignored.

Tap-index convention: ``target_layer_ids`` holds the 0-based index ``l`` of the target decoder layer
whose *output* is tapped, i.e. transformers' ``hidden_states[l + 1]`` (``hidden_states[0]`` is the
embedding output). The published configs and the ``dflash`` package use this convention; vLLM
(``eagle_aux_hidden_state_layer_ids``) and llama.cpp's GGUF metadata store ``l + 1`` instead, so add
one when exporting there and subtract one when importing from there.

Engines other than this kit ignore ``draft_vocab``: they score drafts over the whole vocabulary, which
stays lossless but drafts differently from a head trained on a reduced draft vocabulary.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn


CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
WEIGHT_FILES = "model*.safetensors"  # model.safetensors or HF shards model-0000k-of-0000n; not side files
CAUSAL_KEYS = ("dflash_config.causal_head", "dflash_config.causal", "is_causal")
DEFAULT_BLOCK_SIZE, DEFAULT_ROPE_THETA = 16, 10000.0


# ----------------------------------------------------------------------------- reading config dicts
def _lookup(d: dict, dotted: str):
    """Value at ``dotted`` ("a" or "a.b") in a config dict, or None."""
    head, _, tail = dotted.partition(".")
    value = d.get(head)
    return (value or {}).get(tail) if tail else value


def _agreed(d: dict, keys, default=None):
    """The one value that the present (non-null) ``keys`` hold; ValueError when two disagree."""
    found = {k: _lookup(d, k) for k in keys if _lookup(d, k) is not None}
    values = {json.dumps(v) for v in found.values()}
    if len(values) > 1:
        raise ValueError("config fields disagree: " + ", ".join(f"{k}={v!r}" for k, v in found.items()))
    return next(iter(found.values())) if found else default


def read_causal(d: dict) -> bool:
    """The head's causal flag from any of ``CAUSAL_KEYS``; none present = bidirectional (DFlash)."""
    value = _agreed(d, CAUSAL_KEYS, default=False)
    if not isinstance(value, bool):
        raise ValueError(f"the causal flag must be true or false, got {value!r}")
    return value


def read_rope_theta(d: dict) -> float:
    """rope_theta, flat or nested in ``rope_parameters``."""
    return float(_agreed(d, ("rope_theta", "rope_parameters.rope_theta"), DEFAULT_ROPE_THETA))


def _dflash_field(d: dict, name: str, default=None):
    return _agreed(d, (name, f"dflash_config.{name}"), default)


# Config fields (top-level or in dflash_config) -> when their value changes the math in a way this head
# does not implement. conv_* / selector_* are DFlash2's convolutions and candidate selector, whatever the value.
UNSUPPORTED = {
    "use_swa": bool, "use_sliding_window": bool, "attention_sink_bias": bool,
    "attention_bias": bool, "mlp_bias": bool,                         # the head's projections have no bias
    "input_embedding_scale": lambda v: float(v) != 1.0, "output_multiplier": lambda v: float(v) != 1.0,
    "final_logit_softcapping": lambda v: float(v) > 0, "hidden_act": lambda v: v != "silu",
    "layer_types": lambda v: any(t != "full_attention" for t in v),   # sliding-window layers
}
UNSUPPORTED_PREFIXES = ("conv_", "selector_")


def _unsupported(d: dict) -> list[tuple[str, object]]:
    """(key, value) of every field that this head would silently get wrong."""
    bad = []
    for scope, fields in (("", d), ("dflash_config.", d.get("dflash_config") or {})):
        for key, value in fields.items():
            if value is not None and (key.startswith(UNSUPPORTED_PREFIXES)
                                      or (key in UNSUPPORTED and UNSUPPORTED[key](value))):
                bad.append((scope + key, value))
    for key in ("rope_scaling", "rope_parameters"):                     # scaled RoPE (yarn, llama3, ...)
        rope = d.get(key) or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            bad.append((f"{key}.rope_type", kind))
    return bad


def check_supported(d: dict) -> None:
    """Raise ValueError naming the first config field this head cannot honour."""
    if "speculators_config" in d:
        algorithm = (d["speculators_config"] or {}).get("algorithm", "unknown")
        raise ValueError(
            f"config has speculators_config (algorithm {algorithm!r}): this is a checkpoint of the vLLM "
            "`speculators` library, whose config nests the algorithm, proposal methods and verifier under "
            "speculators_config and the draft layers under transformer_layer_config; this kit reads the "
            "DFlash/JetSpec layout only, so load the original DFlash/JetSpec checkpoint instead")
    bad = _unsupported(d)
    if bad:
        key, value = bad[0]
        raise ValueError(f"config field {key}={value!r} changes the draft head's math and is not implemented "
                         "by this kit's head; loading it would silently run a different model")


REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "rms_norm_eps",
            "vocab_size", "num_target_layers")


def head_fields(d: dict) -> dict:
    """The ``HeadConfig`` keyword arguments of a published (or this kit's) config.json dict, in any dialect
    above; ``target_layer_ids`` is () when the config names none (the head then derives them)."""
    check_supported(d)
    mask = _dflash_field(d, "mask_token_id")
    if mask is None:
        raise ValueError("config has no dflash_config.mask_token_id: not a DFlash/JetSpec draft head")
    missing = [k for k in REQUIRED if k not in d]
    if missing:
        raise ValueError(f"draft-head config lacks {', '.join(missing)}")
    layers, heads = d["num_hidden_layers"], d["num_attention_heads"]
    return dict(
        hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"], num_layers=layers,
        num_heads=heads, num_kv_heads=d.get("num_key_value_heads") or heads,
        head_dim=d.get("head_dim") or d["hidden_size"] // heads, rms_norm_eps=d["rms_norm_eps"],
        rope_theta=read_rope_theta(d), vocab_size=d["vocab_size"],
        block_size=int(_dflash_field(d, "block_size", DEFAULT_BLOCK_SIZE)),
        target_layer_ids=tuple(_dflash_field(d, "target_layer_ids") or ()), num_target_layers=d["num_target_layers"],
        mask_token_id=int(mask), causal=read_causal(d), draft_vocab_size=int(_dflash_field(d, "draft_vocab_size", 0)))


def to_hf_dict(c) -> dict:
    """The published config of head config ``c`` (a ``HeadConfig``, or anything with its fields): a Qwen3
    config plus the DFlash fields, every dialect's keys written with the same value (``draft_vocab_size`` only
    when the head has a reduced draft vocabulary)."""
    dflash = {"target_layer_ids": list(c.target_layer_ids), "mask_token_id": c.mask_token_id,
              "block_size": c.block_size, "causal_head": c.causal, "causal": c.causal}
    if c.draft_vocab_size:
        dflash["draft_vocab_size"] = c.draft_vocab_size
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "vocab_size": c.vocab_size, "hidden_act": "silu", "attention_bias": False,
        "tie_word_embeddings": False, "is_causal": c.causal, "block_size": c.block_size,
        "num_target_layers": c.num_target_layers, "dflash_config": dflash,
    }


# ----------------------------------------------------------------------------- files
def save(head: nn.Module, directory, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``head``'s ``config.json`` + ``model.safetensors`` in ``dtype`` (integer buffers keep theirs)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cfg = to_hf_dict(head.config) | {"dtype": str(dtype).removeprefix("torch.")}
    (out / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
    weights = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
               for k, v in head.state_dict().items()}
    save_file(weights, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    return out


SUBFOLDER = "::"  # "repo::subfolder": a head in a subfolder of a repo or directory (JetSpec's load_draft_head form)


def read(path_or_hub_id: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json dict, weights by name) of a local directory, else of a Hugging Face hub id (config and
    safetensors only); ``"repo::sub"`` reads the head in the subfolder ``sub`` of either."""
    source, _, sub = str(path_or_hub_id).partition(SUBFOLDER)
    root = Path(source)
    if not root.is_dir():
        root = download(source, sub)
    path = root / sub if sub else root
    if not (path / CONFIG_FILE).is_file():
        raise ValueError(_no_config(path_or_hub_id, path))
    weights = {}
    for file in sorted(path.glob(WEIGHT_FILES)):
        weights |= load_file(str(file))
    if not weights:
        raise ValueError(f"head {path_or_hub_id!r} has a config.json but no {WEIGHT_FILES} beside it in {path}")
    return json.loads((path / CONFIG_FILE).read_text()), weights


def _no_config(source: str, path: Path) -> str:
    """Why ``path`` holds no head, naming the subfolders that do (to be read as ``repo::subfolder``)."""
    subs = sorted(p.parent.relative_to(path).as_posix() for p in path.glob(f"*/**/{CONFIG_FILE}")) \
        if path.is_dir() else []
    hint = (f"; its subfolders {subs} hold one: name it as '{source}{SUBFOLDER}{subs[0]}'" if subs
            else "; a head in a subfolder is named 'repo::subfolder'")
    return f"head {source!r}: no {CONFIG_FILE} in {path}{hint}"


def load_weights(head: nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Fill ``head`` (built from the checkpoint's config) with ``weights``; ValueError naming ``source`` when
    they do not match its layout or its draft vocabulary is not one."""
    try:
        missing, unexpected = head.load_state_dict(weights, strict=False)
    except RuntimeError as err:  # a tensor of the wrong shape
        raise ValueError(f"checkpoint {source!r} does not match its config: {err}") from err
    if missing or unexpected:
        raise ValueError(f"checkpoint {source!r} does not match the head layout: "
                         f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    if head.vocab is not None:
        check_draft_vocab(head.vocab, head.config.vocab_size)


def check_draft_vocab(vocab: torch.Tensor, vocab_size: int) -> None:
    """A draft vocabulary must be distinct token ids inside [0, vocab_size)."""
    if vocab.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"draft_vocab must hold integer token ids, got {vocab.dtype}")
    if vocab.numel() and not (0 <= int(vocab.min()) and int(vocab.max()) < vocab_size):
        raise ValueError(f"draft_vocab ids must lie in [0, {vocab_size}), got [{int(vocab.min())}, "
                         f"{int(vocab.max())}]")
    if vocab.unique().numel() != vocab.numel():
        raise ValueError("draft_vocab lists a token id more than once")


HUB_ERROR_PACKAGES = ("huggingface_hub", "httpx", "httpx2", "requests", "urllib3")  # where download errors come from


def download(hub_id: str, subfolder: str = "") -> Path:
    """The cached (or downloaded) snapshot folder of ``hub_id``, holding its config and safetensors only
    (those of ``subfolder`` when given). Any failure of the hub client, offline or online (a missing repo, no
    network, ``HF_HUB_OFFLINE`` with nothing cached, a revision or transfer error), is one ValueError."""
    from huggingface_hub import snapshot_download
    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    try:
        return Path(snapshot_download(hub_id, allow_patterns=[prefix + CONFIG_FILE, prefix + "*.safetensors"]))
    except Exception as err:  # the hub client raises its own, httpx's and OS errors: all mean "not available"
        if not isinstance(err, (OSError, ValueError)) and \
                type(err).__module__.split(".")[0] not in HUB_ERROR_PACKAGES:
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{hub_id!r} is not a local directory and could not be downloaded from the "
                         f"Hugging Face hub ({type(err).__name__}: {first})") from err


# ----------------------------------------------------------------------------- head <-> target
def check_compatible(head_config, target_config) -> None:
    """Raise ValueError when the head cannot read this target's taps or speak its vocabulary."""
    c = head_config
    if c.hidden_size != target_config.hidden_size:
        raise ValueError(f"head expects hidden size {c.hidden_size}, target has {target_config.hidden_size}")
    if c.vocab_size != target_config.vocab_size:
        raise ValueError(f"head expects vocabulary size {c.vocab_size}, target has {target_config.vocab_size}")
    n = target_config.num_hidden_layers
    if c.num_target_layers != n or max(c.target_layer_ids) >= n:
        raise ValueError(f"head expects a {c.num_target_layers}-layer target tapped at layers "
                         f"{list(c.target_layer_ids)}, target has {n} layers")


@torch.no_grad()
def init_from_target(head: nn.Module, target_model: nn.Module) -> None:
    """Start the head from the target (a random init stalls, see docs/field-notes.md).

    - head layer i <- target layer ``n - num_layers + i`` (attention, MLP, both norms); q_norm and
      k_norm start at ones when the target has none (Llama).
    - ``norm`` <- the target's final norm, so the frozen ``lm_head`` sees familiar statistics.
    - ``fc`` = identity on the last tap, zeros elsewhere, and ``hidden_norm`` <- the
      ``input_layernorm`` of the layer after the last tapped one: the fused feature starts equal
      to what that target layer itself reads (taps are <= n - 3, so the successor always exists).
    """
    check_compatible(head.config, target_model.config)
    decoder = target_model.get_decoder()
    c, H = head.config, head.config.hidden_size
    for mine, theirs in zip(head.layers, decoder.layers[-c.num_layers:]):
        _copy_layer(mine, theirs)
    head.norm.weight.copy_(decoder.norm.weight)
    head.fc.weight.zero_()
    head.fc.weight[:, -H:] = torch.eye(H, dtype=head.dtype, device=head.fc.weight.device)
    head.hidden_norm.weight.copy_(decoder.layers[c.target_layer_ids[-1] + 1].input_layernorm.weight)


def _copy_layer(mine: nn.Module, theirs: nn.Module) -> None:
    src, dst = theirs.state_dict(), mine.state_dict()
    extra = set(src) - set(dst)
    if extra:
        raise ValueError(f"target decoder layer has parameters the head lacks: {sorted(extra)}")
    for name, tensor in dst.items():
        tensor.copy_(src[name] if name in src else torch.ones_like(tensor))

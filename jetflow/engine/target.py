"""The frozen target LLM and the one forward seam everything else goes through.

``jetflow.engine.load.load_target`` builds a ``Target``. ``Target.forward``
takes token ids (+ an optional 4-D tree mask and explicit positions) on top of a transformers
cache and returns logits plus the tapped hidden states, using only the public transformers API.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .invariant import EXACT

ATTENTION = ("sdpa", "eager", EXACT)  # implementations that take the 4-D additive tree mask as it is


@dataclass(frozen=True)
class Step:
    logits: torch.Tensor       # (T, V) float32
    taps: torch.Tensor | None  # (T, L, H) outputs of the requested decoder layers, or None


@dataclass
class Target:
    model: torch.nn.Module
    tokenizer: object
    name: str
    chat_kwargs: dict = field(default_factory=dict)  # extra chat-template switches, e.g. enable_thinking

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def max_context(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 2048))

    @property
    def context_limit(self) -> str:
        """What bounds ``max_context``, for error messages."""
        return f"the model's context of {self.max_context} tokens"

    @property
    def eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return {e for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None}

    def encode(self, prompt: str, chat: bool = True) -> torch.Tensor:
        """(T,) long prompt ids, through the chat template when the tokenizer has one."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        if chat and getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True,
                **self.chat_kwargs)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = self.tokenizer(prompt)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache: DynamicCache, *, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, taps: tuple[int, ...] = (), last_only: bool = False) -> Step:
        """Run ``ids`` (T,) after the cached prefix; ``mask`` is an additive (1, 1, T, past+T) tree mask
        with ``positions`` (T,). Without a mask the tokens are plain causal continuations. ``last_only``: the
        logits of the last position alone, (1, V) (a prefill: the lm_head and the fp32 cast skip the other
        T - 1 rows, 2.7 GB at 3,000 tokens of Qwen3's vocabulary); the taps stay (T, L, H)."""
        past = cache.get_seq_length()
        if positions is None:
            positions = torch.arange(past, past + ids.numel())
        kwargs = {}
        if mask is not None:
            kwargs["attention_mask"] = mask.to(device=self.device, dtype=self.dtype)
        kwargs[cache_argument(type(self.model))] = cache
        out = self.model(input_ids=ids[None].to(self.device), position_ids=positions[None].to(self.device),
                         use_cache=True, output_hidden_states=bool(taps), logits_to_keep=int(last_only), **kwargs)
        tapped = torch.stack([out.hidden_states[l + 1][0] for l in taps], dim=1) if taps else None
        return Step(out.logits[0].float(), tapped)

    def sequence_taps(self, ids: torch.Tensor, taps: tuple[int, ...], logits: bool = True
                      ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """One teacher-forced pass over a whole sequence (S,) (training and replay): logits (S, V) fp32
        (None when ``logits`` is False: the decoder alone runs, up to the deepest tap, skipping the lm_head)
        and taps (S, L, H), on ids' device."""
        if logits:
            step = self.forward(ids, self.new_cache(), taps=taps)
            return step.logits.to(ids.device), step.taps.to(ids.device)
        return None, decoder_taps(self.model.get_decoder(), ids[None].to(self.device), taps)[0].to(ids.device)


class _Tapped(Exception):
    """Raised by the hook on the deepest tapped layer: the layers above it are not run."""


@torch.no_grad()
def decoder_taps(decoder: torch.nn.Module, ids: torch.Tensor, taps: tuple[int, ...]) -> torch.Tensor:
    """(B, S, L, H) outputs of the decoder layers ``taps`` for ``ids`` (B, S), without a cache, running no
    layer above the deepest tap (the head's taps stop below the top layers: 28 of SmolLM2's 30 layers run).

    Forward hooks read the layer outputs, the values ``output_hidden_states`` gives as ``hidden_states[l + 1]``;
    a decoder without a ``layers`` list, or a tap on its last layer (whose ``hidden_states`` entry some models
    return after the final norm), runs whole through ``output_hidden_states``."""
    layers = getattr(decoder, "layers", None)
    if not taps or not isinstance(layers, torch.nn.ModuleList) or max(taps) >= len(layers) - 1:
        out = decoder(input_ids=ids, use_cache=False, output_hidden_states=True)
        return torch.stack([out.hidden_states[l + 1] for l in taps], dim=2)
    got: dict[int, torch.Tensor] = {}
    last = max(taps)

    def hook(index: int):
        def keep(module, args, output):
            got[index] = output[0] if isinstance(output, tuple) else output
            if index == last:
                raise _Tapped
        return keep

    handles = [layers[i].register_forward_hook(hook(i)) for i in set(taps)]
    try:
        decoder(input_ids=ids, use_cache=False)
    except _Tapped:
        pass
    finally:
        for h in handles:
            h.remove()
    return torch.stack([got[l] for l in taps], dim=2)


@functools.lru_cache(maxsize=None)
def cache_argument(model_class) -> str:
    """The forward argument that takes the KV cache: ``cache`` in recent transformers (which deprecate
    ``past_key_values``), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def move_rows(rows: torch.Tensor, past_len: int, path: list[int]) -> None:
    """Move the tree rows ``path`` (after the first ``past_len`` rows, along dim -2 of (..., rows, D)) to follow the
    prefix in order, in place: what every cache's ``keep_path`` does to its keys and values."""
    idx = torch.tensor(path, device=rows.device) + past_len
    rows[..., past_len:past_len + len(path), :] = rows.index_select(-2, idx)


def keep_path(cache: DynamicCache, past_len: int, path: list[int]) -> None:
    """Keep the first ``past_len`` rows plus the tree rows ``path`` (indices after the prefix, in order).

    Keeps the rows ``verify.kept_positions(past_len, path)``, moving only the accepted ones: a
    contiguous path (plain AR, an accepted chain prefix) is a crop that copies nothing. A cache that
    compacts itself (the compiled target's static cache, ``jetflow.engine.compiled.StaticKV``) does so."""
    if hasattr(cache, "keep_path"):
        return cache.keep_path(past_len, path)
    n = len(path)
    moved = path != list(range(n))
    for layer in cache.layers:
        if moved:
            move_rows(layer.keys, past_len, path)
            move_rows(layer.values, past_len, path)
        layer.keys, layer.values = layer.keys[..., :past_len + n, :], layer.values[..., :past_len + n, :]


def unsupported(model: torch.nn.Module) -> str | None:
    """Why the tree path cannot serve ``model`` (None if it can). Tree verification needs every layer to
    attend fully to the cached prefix and the 4-D tree mask, and a plain per-layer KV cache whose rows
    ``keep_path`` can move: a sliding window (its cache counts rows ``keep_path`` never updates, and the
    tree mask ignores the window), linear/recurrent layers (state, not rows) or a kernel that drops the
    custom mask would decode something other than AR output, silently."""
    config = model.config
    impl = getattr(config, "_attn_implementation", None)
    if impl not in ATTENTION:
        return f"attention implementation {impl!r} (need one of {', '.join(ATTENTION)}, which take the tree mask)"
    kinds = sorted(set(getattr(config, "layer_types", None) or ()) - {"full_attention"})
    if kinds:
        return f"layer types {kinds} (every layer must be full attention)"
    for key in ("sliding_window", "attention_chunk_size"):
        if getattr(config, key, None) is not None and not getattr(config, "layer_types", None):
            return f"{key}={getattr(config, key)} (every layer must attend to the whole context)"
    layers = {type(layer).__name__ for layer in DynamicCache(config=config).layers if type(layer) is not DynamicLayer}
    if layers:
        return f"cache layers {sorted(layers)} (need plain DynamicLayer KV rows)"
    return None


def check_supported(model: torch.nn.Module, name: str = "the target") -> None:
    """Refuse a model the tree path cannot serve losslessly (see ``unsupported``), with the reason."""
    why = unsupported(model)
    if why is not None:
        raise ValueError(f"{name} ({type(model).__name__}) cannot be served by tree verification: {why}; "
                         "use a model whose layers are all full attention (e.g. Llama, Qwen3, Qwen2 without "
                         "sliding window) with attn_implementation='sdpa' or 'eager'")

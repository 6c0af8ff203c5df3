"""The parallel draft head: fused target taps in, one block of drafts out (docs/method.md, The draft head).

A few Qwen3-style decoder layers of the target's width. Queries come from the block rows
``[anchor, MASK x D]`` only; keys/values are the concatenation of k/v projections of the
*context features* (fused target taps, one row per committed token) and of the block rows
("KV injection"). The head owns no embedding and no LM head: the target's frozen ones are passed
in. ``causal=True`` is JetFlow (slot j sees slots 0..j), ``causal=False`` is DFlash (the whole block).

The module only holds parameters. Decoding state lives in ``HeadState`` (cached context K/V),
grown by ``DraftHead.extend`` and read by ``draft_logp``. Training uses ``training_mask`` to run
many blocks of one sequence in a single pass.

Dimensions (the package legend): B batch, T context rows, L taps, H hidden, Q block size, D = Q - 1
depths, A anchors, K draft vocabulary, V vocabulary.
The published checkpoint layout (config dialects, files, download, ``check_compatible``, ``init_from_target``)
lives in ``jetflow.drafting.checkpoint``, on dicts; ``HeadConfig.from_hf_dict`` and ``DraftHead.from_pretrained``
build this module's objects from what it reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import checkpoint
from .blockwise import BlockwiseMask, blockwise_attention, blockwise_mask


def tap_layers(num_layers: int, num_taps: int) -> tuple[int, ...]:
    """The target decoder layers a head of ``num_taps`` taps reads: evenly spaced from 1 to num_layers - 3
    (the middle one if only one)."""
    if num_taps < 1:
        raise ValueError(f"num_taps must be >= 1, got {num_taps}")
    if num_taps == 1:
        return (num_layers // 2,)
    last = num_layers - 3
    return tuple(round(1 + i * (last - 1) / (num_taps - 1)) for i in range(num_taps))


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int                   # draft decoder layers
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float                 # plain RoPE; the head's positions need no target scaling
    vocab_size: int
    block_size: int = 16              # Q: anchor + D = Q-1 draftable depths
    target_layer_ids: tuple[int, ...] = ()  # tapped target layers: hidden_states[l + 1]
    num_target_layers: int = 0
    mask_token_id: int = 0            # embedded into the D slots after the anchor
    causal: bool = True               # JetFlow; False = DFlash's bidirectional block
    draft_vocab_size: int = 0         # K > 0: the head drafts only K token ids (buffer ``draft_vocab``,
                                      # read from the training data), scored by those rows of lm_head

    def __post_init__(self):
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must name at least one target layer")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary "
                             f"[0, {self.vocab_size})")
        if not 0 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must lie in [0, {self.vocab_size}], got {self.draft_vocab_size}")
        if self.num_target_layers and not all(0 <= l < self.num_target_layers for l in self.target_layer_ids):
            raise ValueError(f"target_layer_ids {list(self.target_layer_ids)} must be 0-based layers of the "
                             f"{self.num_target_layers}-layer target (layer l's output = hidden_states[l + 1])")

    @classmethod
    def for_target(cls, target_config, *, num_layers: int = 2, causal: bool = True, block_size: int = 16,
                   mask_token_id: int | None = None, draft_vocab_size: int = 0) -> "HeadConfig":
        """Size a head for a Llama or Qwen3 transformers config, one tap per draft layer.

        Default ``mask_token_id``: the largest id that is not EOS/BOS/PAD (normally ``vocab_size - 1``),
        chosen without a tokenizer; the head learns its embedding's meaning during training."""
        c = target_config
        heads = c.num_attention_heads
        if mask_token_id is None:
            special = {i for k in ("eos_token_id", "bos_token_id", "pad_token_id")
                       for i in _as_list(getattr(c, k, None))}
            mask_token_id = next(i for i in range(c.vocab_size - 1, -1, -1) if i not in special)
        return cls(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_layers=num_layers,
                   num_heads=heads, num_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
                   head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
                   rms_norm_eps=c.rms_norm_eps, rope_theta=checkpoint.read_rope_theta(c.to_dict()), vocab_size=c.vocab_size,
                   block_size=block_size, target_layer_ids=tap_layers(c.num_hidden_layers, num_layers),
                   num_target_layers=c.num_hidden_layers, mask_token_id=mask_token_id, causal=causal,
                   draft_vocab_size=draft_vocab_size)

    def to_hf_dict(self) -> dict:
        """The published checkpoint config (``jetflow.drafting.checkpoint.to_hf_dict``)."""
        return checkpoint.to_hf_dict(self)

    @classmethod
    def from_hf_dict(cls, d: dict) -> "HeadConfig":
        """Read a published config in any dialect (``jetflow.drafting.checkpoint.head_fields``); a config that
        names no tapped layers gets ``tap_layers``' default."""
        fields = checkpoint.head_fields(d)
        if not fields["target_layer_ids"]:
            fields["target_layer_ids"] = tap_layers(fields["num_target_layers"], fields["num_layers"])
        return cls(**fields)


def _as_list(x) -> list:
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


# ----------------------------------------------------------------------------- masks and positions
def block_mask(n_ctx: int, block_size: int, causal: bool, device=None) -> torch.Tensor:
    """(Q, n_ctx + Q) bool, True = may attend: one decoding block after ``n_ctx`` context rows, i.e.
    ``training_mask`` of the one block anchored at ``n_ctx`` (decoding and training share the mask)."""
    return training_mask(torch.tensor([n_ctx], device=device), n_ctx, block_size, causal)


def training_mask(anchors: torch.Tensor, seq_len: int, block_size: int, causal: bool) -> torch.Tensor:
    """(A*Q, seq_len + A*Q) bool for all A blocks of one sequence in one pass.

    Block b (anchor position ``anchors[b]``) sees context rows strictly before its anchor (the
    anchor's own hidden state does not exist at decode time), its own slots, no other block."""
    nb, n = anchors.numel(), block_size
    rows = torch.arange(nb * n, device=anchors.device)
    start = anchors.reshape(-1).repeat_interleave(n)                                  # (A*Q,)
    ctx = torch.arange(seq_len, device=anchors.device)[None] < start[:, None]         # (A*Q, S)
    inner = (rows[:, None] // n) == (rows[None] // n)                                 # (A*Q, A*Q)
    if causal:
        inner &= rows[None] <= rows[:, None]
    return torch.cat([ctx, inner], dim=1)


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """(A*Q,) long: block b slot j sits at position ``anchors[b] + j``."""
    return (anchors.reshape(-1, 1) + torch.arange(block_size, device=anchors.device)).reshape(-1)


# ----------------------------------------------------------------------------- building blocks
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()  # normalise in fp32, as the Qwen3/Llama reference does
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate x (B, h, T, d) at positions (B, T) (half-split layout, as Qwen3/Llama)."""
    d = x.shape[-1]
    inv_freq = theta ** -(torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)  # (d/2,)
    angles = positions[..., None].float() * inv_freq                                       # (B, T, d/2)
    angles = torch.cat([angles, angles], dim=-1)[:, None]                                  # (B, 1, T, d)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm, self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps), RMSNorm(c.head_dim, c.rms_norm_eps)

    def _heads(self, y: torch.Tensor) -> torch.Tensor:
        B, T, C = y.shape
        return y.view(B, T, C // self.c.head_dim, self.c.head_dim).transpose(1, 2)  # (B, heads, T, d)

    def kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, H) -> k, v (B, kv_heads, T, d); k is normed and RoPE'd at positions (B, T)."""
        k = rope(self.k_norm(self._heads(self.k_proj(x))), positions, self.c.rope_theta)
        return k, self._heads(self.v_proj(x))

    def forward(self, x, positions, ctx_kv, mask) -> torch.Tensor:
        """x (B, Q, H) block rows, ctx_kv (B, kv_heads, T, d) x2, mask (B|1, Q, T+Q) -> (B, Q, H); or,
        with a ``BlockwiseMask``, x holds B = A separate blocks over one context (ctx_kv (1, ...))."""
        B, Q, _ = x.shape
        q = rope(self.q_norm(self._heads(self.q_proj(x))), positions, self.c.rope_theta)  # (B, h, Q, d)
        k_blk, v_blk = self.kv(x, positions)
        if isinstance(mask, BlockwiseMask):
            return self.o_proj(blockwise_attention(q, k_blk, v_blk, ctx_kv, mask).transpose(1, 2).reshape(B, Q, -1))
        groups = self.c.num_heads // self.c.num_kv_heads  # GQA: kv head i serves q heads i*g..i*g+g-1
        k = torch.cat([ctx_kv[0], k_blk], dim=2).repeat_interleave(groups, dim=1)  # (B, h, T+Q, d)
        v = torch.cat([ctx_kv[1], v_blk], dim=2).repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])        # (B, h, Q, d)
        return self.o_proj(y.transpose(1, 2).reshape(B, Q, -1))


class MLP(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, positions, ctx_kv, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


# ----------------------------------------------------------------------------- the head
@dataclass(frozen=True)
class HeadState:
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: k, v (1, kv_heads, n_ctx, head_dim)
    n_ctx: int                                   # committed context rows (= the anchor's position)


class DraftHead(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        c = self.config = config
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        if c.draft_vocab_size:  # token id of each draft-vocabulary entry; set from data before training
            self.register_buffer("draft_vocab", torch.arange(c.draft_vocab_size))

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def vocab(self) -> torch.Tensor | None:
        """(K,) token ids the head drafts, or None when it drafts the whole vocabulary."""
        return getattr(self, "draft_vocab", None)

    def output_weight(self, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """The rows of the target's (V, H) lm_head weight that score the draft vocabulary: (K, H)."""
        vocab = self.vocab
        return lm_head_weight if vocab is None else lm_head_weight[vocab.to(lm_head_weight.device)]

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """taps (B, T, L, H) -> context features (B, T, H)."""
        return self.hidden_norm(self.fc(taps.to(self.dtype).flatten(-2)))

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """features (B, T, H) at positions (B, T) -> per layer (k, v), each (B, kv_heads, T, head_dim).
        Context rows skip ``input_layernorm``: ``hidden_norm`` already normalised them."""
        return [layer.self_attn.kv(features, positions) for layer in self.layers]

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx_kv, mask: torch.Tensor) -> torch.Tensor:
        """x (B, Q, H) block-row embeddings at positions (B, Q); mask (B|1, Q, T_ctx+Q) bool -> (B, Q, H)."""
        for layer, kv in zip(self.layers, ctx_kv):
            x = layer(x, positions, kv, mask)
        return self.norm(x)

    @torch.no_grad()
    def extend(self, state: HeadState | None, taps: torch.Tensor) -> HeadState:
        """Append committed rows: taps (T_new, L, H) at positions n_ctx .. n_ctx+T_new-1."""
        n_ctx = 0 if state is None else state.n_ctx
        positions = torch.arange(n_ctx, n_ctx + taps.shape[0], device=taps.device)[None]  # (1, T_new)
        new = self.context_kv(self.fuse(taps[None]), positions)
        if state is not None:
            new = [(torch.cat([k0, k], 2), torch.cat([v0, v], 2)) for (k0, v0), (k, v) in zip(state.kv, new)]
        return HeadState(new, n_ctx + taps.shape[0])

    # The block pass, one code path for decoding, training and replay: block rows [anchor, MASK x D]
    # at positions anchor .. anchor + D, each block seeing the context rows before its anchor and itself.
    def block_inputs(self, anchor_ids: torch.Tensor, embed_weight: torch.Tensor) -> torch.Tensor:
        """anchor_ids (A,) -> block-row embeddings (A, Q, H): each anchor's token, then D mask tokens."""
        c = self.config
        ids = torch.full((anchor_ids.numel(), c.block_size), c.mask_token_id, device=embed_weight.device)
        ids[:, 0] = anchor_ids.to(embed_weight.device)
        return F.embedding(ids, embed_weight)

    def blocks(self, x: torch.Tensor, anchors: torch.Tensor, ctx_kv, n_ctx: int, blockwise: bool = False
               ) -> torch.Tensor:
        """x (A, Q, H) block rows of the blocks anchored at positions anchors (A,), over the per-layer
        context K/V of ``n_ctx`` rows -> final states (A, Q-1, H) of slots 1..Q-1 (head dtype; Q is x's, the
        block size or, for a causal head drafting fewer depths, the block's first slots). The A blocks
        run as one packed row of A*Q queries under ``training_mask`` (one fused attention kernel, memory
        linear in A*Q: the decoding and replay path), or with ``blockwise`` as A rows of Q queries under
        ``blockwise_mask`` (attention work A*Q*(n_ctx+Q) instead of A*Q*(n_ctx+A*Q): training on CPU)."""
        a, q, device = anchors.numel(), x.shape[1], self.fc.weight.device
        anchors = anchors.to(device)
        if blockwise:
            mask = blockwise_mask(anchors, n_ctx, q, self.config.causal)
            return self(x.to(device, self.dtype), block_positions(anchors, q).view(a, q), ctx_kv, mask)[:, 1:]
        mask = training_mask(anchors, n_ctx, q, self.config.causal)[None]               # (1, A*Q, n_ctx+A*Q)
        hidden = self(x.reshape(1, a * q, -1).to(device, self.dtype), block_positions(anchors, q)[None], ctx_kv, mask)
        return hidden.view(a, q, -1)[:, 1:]

    @torch.no_grad()
    def draft_block(self, state: HeadState, anchor_token: int, embed_weight: torch.Tensor,
                    depth: int | None = None) -> torch.Tensor:
        """Decoding: the block at the next anchor over the cached context -> (D, H). ``depth``: only depths
        1..depth are wanted -> (min(depth, D), H); a causal head then runs only the block's first depth + 1 slots
        (a slot sees none after it, so the states are those of the whole block's pass up to rounding)."""
        x = self.block_inputs(torch.tensor([anchor_token]), embed_weight)
        if depth is not None and self.config.causal:
            x = x[:, :depth + 1]
        hidden = self.blocks(x, torch.tensor([state.n_ctx]), state.kv, state.n_ctx)[0]
        return hidden if depth is None else hidden[:depth]

    def sequence_blocks(self, taps: torch.Tensor, x: torch.Tensor, anchors: torch.Tensor, blockwise: bool = False
                        ) -> torch.Tensor:
        """Training and replay: every block of one sequence in one pass. taps (S, L, H) of the whole
        sequence, block rows x (A, Q, H) (``block_inputs``), anchors (A,) -> (A, D, H); ``blockwise``
        as in ``blocks`` (the same states up to float rounding)."""
        n = taps.shape[0]
        ctx_kv = self.context_kv(self.fuse(taps[None]), torch.arange(n, device=taps.device)[None])
        return self.blocks(x, anchors, ctx_kv, n, blockwise)

    def save_pretrained(self, directory, dtype: torch.dtype = torch.bfloat16) -> Path:
        """Write ``config.json`` + ``model.safetensors`` (published layout, ``jetflow.drafting.checkpoint.save``)."""
        return checkpoint.save(self, directory, dtype)

    @classmethod
    def from_pretrained(cls, path_or_hub_id: str, dtype: torch.dtype = torch.float32) -> "DraftHead":
        """Load a local directory or hub id in any published dialect (``jetflow.drafting.checkpoint.read``)."""
        config, weights = checkpoint.read(path_or_hub_id)
        head = cls(HeadConfig.from_hf_dict(config))
        checkpoint.load_weights(head, weights, path_or_hub_id)
        return head.to(dtype).eval()


@torch.no_grad()
def draft_logp(head: DraftHead, state: HeadState, anchor_token: int, embed: nn.Embedding,
               lm_head: nn.Module) -> torch.Tensor:
    """(D, V) float32 log-probs for depths 1..D over the whole vocabulary (-inf outside a reduced
    draft vocabulary). The decode loop's proposers use the faster ``HeadProposer.depth_logp``."""
    hidden = head.draft_block(state, anchor_token, embed.weight)
    weight = head.output_weight(lm_head.weight)
    logp = torch.log_softmax(F.linear(hidden.to(weight.dtype), weight).float(), dim=-1)  # (D, K)
    vocab = head.vocab
    if vocab is None:
        return logp
    full = logp.new_full((logp.shape[0], lm_head.weight.shape[0]), float("-inf"))
    return full.index_copy_(1, vocab.to(full.device), logp)


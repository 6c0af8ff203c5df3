"""The path-conditioned correction: a depth's draft distribution made to depend on the parent node.

The causal head drafts every depth in one pass, so the depth-d row is one marginal shared by every node
at depth d-1; off the argmax spine it is conditioned on the wrong context (``python -m jetflow diagnose``:
the next argmax is right 0.46-0.92 of the time on the spine, 0.15-0.28 off it). The correction keeps the
one head pass and adds, per tree node, a small sequential step on the head's own state:

    h'_d = h_d + up(silu(down([h_d ; norm(E(p))])))     p: the parent's token (depth d-1), E: the target's
                                                        frozen embedding; ``up`` starts at zero
    logits'_d = W h'_d on the head's top-C candidates   W: the head's frozen output rows; a round of budget B
                                                        re-scores C' = min(C, max(32, B)) (``table_size``)

Only the C candidates of depth d (the head's top-C) are re-scored; every other token keeps the head's
logit, so the corrected row is a normalised distribution over the whole draft vocabulary
(``corrected_logp``) and a zero ``up`` gives back the head's row exactly. Depth 1's parent is the
anchor, which the head already sees: depths 2..D are corrected. Per round, ``path_table`` scores every
(depth, parent candidate, child candidate) triple at once, (D-1, C', C') numbers from small matmuls, and
``builders.path_prefix`` expands nodes by corrected path log-prob from that table (a pure function, so
replay and decode build the same trees).

Training (``jetflow.training.correction_train``): teacher forcing on the true previous token, the head and the
target frozen, cross-entropy against the regenerated token at depth d.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .head import RMSNorm

WEIGHTS_FILE, CONFIG_FILE = "correction.safetensors", "correction.json"
MIN_CANDIDATES = 32  # a round re-scores min(C, max(32, budget)) candidates per depth (``PathCorrection.table_size``)


@dataclass(frozen=True)
class CorrectionConfig:
    hidden_size: int           # H, the head's (= the target's) width
    rank: int = 128            # the low-rank MLP's inner width
    candidates: int = 64       # C: at most the head's top-C tokens per depth are re-scored; the builder expands only them
    rms_norm_eps: float = 1e-5
    spine: bool = False        # also fed norm(E(s)), s the head's first choice at the parent's depth (what it assumed)
    bigram_rank: int = 0       # > 0: plus a low-rank bigram bias u[p] . v[c] over token ids (context-free)
    vocab_size: int = 0        # the bigram tables' rows (the target's vocabulary)


class PathCorrection(nn.Module):
    """h (..., H), parent embedding e (..., H) -> the state correction delta (..., H)."""

    def __init__(self, config: CorrectionConfig):
        super().__init__()
        c = self.config = config
        self.parent_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # the target's embedding is not at h's scale
        self.down = nn.Linear((3 if c.spine else 2) * c.hidden_size, c.rank)
        self.up = nn.Linear(c.rank, c.hidden_size, bias=False)
        nn.init.zeros_(self.up.weight)  # starts as the identity: the head's own rows
        if c.bigram_rank:
            self.bigram_u = nn.Embedding(c.vocab_size, c.bigram_rank)
            self.bigram_v = nn.Embedding(c.vocab_size, c.bigram_rank)
            nn.init.normal_(self.bigram_u.weight, std=0.02)
            nn.init.zeros_(self.bigram_v.weight)  # a zero bias to start

    def table_size(self, budget: int | None = None) -> int:
        """C' of a round of ``budget`` draft nodes: its table re-scores the top-C' candidates per depth,
        ``min(C, max(MIN_CANDIDATES, budget))`` (C for ``budget`` None). A small tree never holds more
        than ``budget`` nodes at a depth, so it pays for no more; a big one can use all C."""
        c = self.config.candidates
        return c if budget is None else min(c, max(MIN_CANDIDATES, budget))

    def forward(self, h: torch.Tensor, e: torch.Tensor, s: torch.Tensor | None = None) -> torch.Tensor:
        """h, e (the parent's embedding) and, with ``config.spine``, s (the head's first choice there) -> delta."""
        parts = [h, self.parent_norm(e)] + ([self.parent_norm(s)] if self.config.spine else [])
        return self.up(F.silu(self.down(torch.cat(parts, dim=-1))))

    def bigram(self, parent: torch.Tensor, child: torch.Tensor) -> torch.Tensor | float:
        """Token ids parent (..., P, 1) and child (..., 1, C) -> the bigram bias (..., P, C) (0 without one)."""
        if not self.config.bigram_rank:
            return 0.0
        return (self.bigram_u(parent) * self.bigram_v(child)).sum(-1)

    def save(self, folder: str | Path, provenance: dict) -> Path:
        """``correction.safetensors`` (fp32) and ``correction.json`` (config + ``provenance``) in ``folder``."""
        from safetensors.torch import save_file
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().float().contiguous().cpu() for k, v in self.state_dict().items()},
                  str(folder / WEIGHTS_FILE))
        (folder / CONFIG_FILE).write_text(json.dumps({"config": asdict(self.config), "provenance": provenance},
                                                     indent=1) + "\n")
        return folder / WEIGHTS_FILE


def load_correction(folder: str | Path | None) -> PathCorrection | None:
    """The correction saved beside a head (None when ``folder`` is not a directory or holds none), fp32."""
    if folder is None or not (Path(folder) / WEIGHTS_FILE).is_file():
        return None
    from safetensors.torch import load_file
    body = json.loads((Path(folder) / CONFIG_FILE).read_text())
    module = PathCorrection(CorrectionConfig(**body["config"]))
    module.load_state_dict(load_file(str(Path(folder) / WEIGHTS_FILE)))
    return module.eval()


def corrected_logp(cand_logp: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Head log-probs of C candidates (..., C) and their logit corrections (..., C) -> corrected log-probs
    (..., C); the tokens outside the candidates keep their logits, so the whole row stays normalised."""
    inside = torch.logsumexp(cand_logp, dim=-1, keepdim=True)                  # (..., 1) log P(candidates)
    rest = torch.log1p(-inside.exp().clamp(max=1 - 1e-7))                       # log P(everything else)
    z = torch.logaddexp(torch.logsumexp(cand_logp + delta, dim=-1, keepdim=True), rest)
    return cand_logp + delta - z


def candidates(logp: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., D, K) log-probs -> the top-C per depth (values, columns), each (..., D, C). The builder takes
    its candidates with this same call, so the table's rows and the tree's tokens line up."""
    return logp.float().topk(min(c, logp.shape[-1]), dim=-1)


@torch.no_grad()
def path_table(correction: PathCorrection, hidden: torch.Tensor, cand_logp: torch.Tensor, cand_ids: torch.Tensor,
               cand_rows: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
    """The corrected log-probs of every depth-d candidate under every depth-(d-1) candidate as parent.

    hidden (..., D, H) the head's final states; cand_logp (..., D, C) its top-C log-probs per depth (best
    first), cand_ids (..., D, C) their token ids, cand_rows (..., D, C, H) their output rows; embed (V, H)
    the target's embedding -> (..., D-1, C, C): [d-2, r, c] = log P'(candidate c of depth d | parent =
    candidate r of depth d-1), d = 2..D."""
    dtype = next(correction.parameters()).dtype
    h = hidden[..., 1:, None, :].to(dtype)                                       # (..., D-1, 1, H)
    e = F.embedding(cand_ids[..., :-1, :], embed).to(dtype)                      # (..., D-1, C, H) parents
    s = F.embedding(cand_ids[..., :-1, :1], embed).to(dtype).expand(*e.shape)    # the head's first choices
    delta = correction(h.expand(*e.shape), e, s)                                 # (..., D-1, C, H)
    shift = delta @ cand_rows[..., 1:, :, :].to(dtype).transpose(-1, -2)         # (..., D-1, C, C)
    shift = shift + correction.bigram(cand_ids[..., :-1, :, None], cand_ids[..., 1:, None, :])
    return corrected_logp(cand_logp[..., 1:, None, :].float(), shift.float())


def random_correction(hidden_size: int, candidates: int = 8, rank: int = 16, seed: int = 0, scale: float = 0.5,
                      **extra) -> PathCorrection:
    """A correction with random weights (``up`` included, so it does change the rows): for tests and the
    checks that run random heads; ``extra``: more ``CorrectionConfig`` fields (spine, bigram_rank, vocab_size)."""
    g = torch.Generator().manual_seed(seed)
    module = PathCorrection(CorrectionConfig(hidden_size, rank, candidates, **extra))
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale / p.shape[-1] ** 0.5)
    return module.eval()

"""Train the path-conditioned correction (``jetflow.drafting.correction``) on the regenerated data.

    python -m jetflow train-correction --max-seqs 800 --epochs 30

1. ``features``: per sequence, the taps (one frozen target forward, ``Target.sequence_taps``, or with
   ``taps="cached"`` a read of the taps cache that ``python -m jetflow taps`` built for the curve, so no
   target forward at all), then the frozen head over ``anchors`` random anchors: its final states (A, D, H), its top-C candidates per depth
   and the true tokens, stored once in the cache folder (resumable, one shard per ``shard`` sequences).
2. ``fit``: many cheap epochs of the small module on those features, teacher-forced on the true token
   at depth d-1 (the parent), cross-entropy against the true token at depth d (d >= 2) under
   ``corrected_logp``; a held-out slice of sequences (by id) reports the loss and the corrected argmax
   accuracy on and off the argmax spine after each epoch. Checkpointed per epoch; rerunning resumes.
3. The module goes beside the head (``correction.safetensors`` + ``correction.json``), loaded with it.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from jetflow.drafting.correction import CorrectionConfig, PathCorrection, candidates, corrected_logp
from jetflow.util.flags import command_args, option

REGEN = "~/.cache/jetflow/regen-smollm2-135m-bfloat16-all-256"


@dataclass(frozen=True)
class CorrectionTrainConfig:
    """``python -m jetflow train-correction``: features once, then epochs of the small module."""
    data: str = option(REGEN, "folder of regenerated part-*.jsonl files (or one .jsonl file)")
    max_seqs: int = option(800, "regenerated sequences to use (first N rows; 0: all)")
    spread: bool = option(False, "take the --max-seqs rows evenly spaced through the whole data instead of the first "
                          "N (regenerate writes each part longest prompt first, so the first rows lean to long "
                          "code prompts)", negate=("--first-rows", "take the first --max-seqs rows (the default)"))
    spread_from: int = option(0, "with --spread: list the rows of a --max-seqs N --spread run first, in its order, "
                              "then the other rows of this spread (a run on twice the rows reuses all the features of "
                              "the run on half; 0: the spread in pool order)")
    add_sources: tuple[str, ...] = option((), "after the --max-seqs rows, every other row whose id starts with one of "
                                          "these sources (comma list, the id before its ':', e.g. "
                                          "hh-rlhf-helpful-base-test), in pool order: more answers of one kind, "
                                          "the features of the run without it reused")
    anchors: int = option(48, "random anchors per sequence")
    max_response: int = option(240, "anchors come from the first N response tokens (shorter target forwards)")
    dtype: str = option("bfloat16", "the target's dtype for the taps (the regenerated answers are bf16's)")
    taps: str = option("online", "online: one target forward per sequence; cached: read the taps cache of "
                       "--data (python -m jetflow taps), no target forward", choices=("online", "cached"))
    taps_dir: str | None = option(None, "the taps cache folder (default: the one `jetflow taps` writes for --data)")
    heldout: float = option(0.05, "share of sequences held out (by a hash of the id)")
    rank: int = option(128, "inner width of the low-rank MLP")
    candidates: int = option(64, "C: the head's top-C candidates per depth that are re-scored (a round uses its first C')")
    spine: bool = option(False, "also feed the correction the embedding of the head's first choice at the parent's depth "
                         "(the token the head's row assumed)")
    bigram_rank: int = option(0, "> 0: add a low-rank bigram bias from the parent's token to its children's logits")
    init: str = option("none", "none: a fresh module; the head's: start from the correction beside the head (its "
                       "weights copied in, new inputs at zero) and fine-tune all; stack: the same, frozen, training "
                       "only the new parts", choices=("none", "head", "stack"))
    keep: str = option("best", "best: the epoch of least held-out loss (epoch 0 is the starting module); last: the last "
                       "epoch (to measure what the training did)", choices=("best", "last"))
    variant: str | None = option(None, "write to the folder <head>-<variant> beside the head (a correction "
                                 "`replay --correction` picks) instead of the head's own folder")
    epochs: int = option(6, "passes over the training features (the held-out best is kept)")
    batch_size: int = option(512, "(anchor, depth) examples per step")
    lr: float = option(2e-3, "peak AdamW learning rate (cosine to 0)")
    weight_decay: float = option(0.01, "AdamW weight decay")
    seed: int = option(0, "anchors, data order and init")
    out: str | None = option(None, "head folder to write correction.safetensors into (default: the shipped causal head)")
    cache: str | None = option(None, "features and checkpoint folder (default: the jetflow cache)")
    data_dir: str | None = option(None, "offline data folder, to leave out the profile's held-out prompts")


def _hash01(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 16 ** 8


def training_rows(cfg: CorrectionTrainConfig) -> list[dict]:
    """The regenerated rows used (``indexed_rows`` without the numbers)."""
    return [r for _, r in indexed_rows(cfg)[1]]


def indexed_rows(cfg: CorrectionTrainConfig) -> tuple[list[Path], list[tuple[int, dict]]]:
    """(the data files, [(row number across the files in order, row)]): the regenerated rows used, minus the held-out training prompts of the acceptance profile
    (``holdout.heldout_prompts``: the diagnosis reads them, so the correction never trains on them) and the
    rows the head's own training held out for its profile (``train --holdout``)."""
    from jetflow.data.regenerate import load_regenerated
    from jetflow.data.holdout import head_holdout_ids, heldout_prompts
    from jetflow.util.paths import shipped_head_dir
    folder = Path(cfg.data).expanduser()
    files = sorted(folder.glob("part-*.jsonl")) if folder.is_dir() else [folder]
    if not files or not all(f.is_file() for f in files):
        raise ValueError(f"no regenerated data at {cfg.data} (expected part-*.jsonl files or a .jsonl file)")
    unseen = {p["id"] for p in heldout_prompts(48, data_dir=cfg.data_dir)}
    unseen |= head_holdout_ids(cfg.out or shipped_head_dir("jetflow"))
    rows = [r for f in files for r in load_regenerated(f)]
    rows = [(i, r) for i, r in enumerate(rows) if r["id"] not in unseen and len(r["response_ids"]) > 2]
    if not cfg.max_seqs or cfg.max_seqs >= len(rows):
        return files, rows
    order = spread_order(len(rows), cfg.max_seqs, cfg.spread_from) if cfg.spread else list(range(cfg.max_seqs))
    return files, [rows[i] for i in order + added_rows([r["id"] for _, r in rows], order, cfg.add_sources)]


def added_rows(ids: list[str], picked: list[int], sources: tuple[str, ...]) -> list[int]:
    """Indices (pool order) of the rows not in ``picked`` whose id's source (the id before its first ':') is one
    of ``sources``; a source that no row has is refused, so a typo does not silently add nothing."""
    from jetflow.data.packed import source_of
    if not sources:
        return []
    kinds = [source_of(i) for i in ids]
    have = set(kinds)
    if missing := [s for s in sources if s not in have]:
        raise ValueError(f"--add-sources: no row comes from {', '.join(missing)} (the data has: {', '.join(sorted(have))})")
    taken = set(picked)
    return [i for i, kind in enumerate(kinds) if i not in taken and kind in sources]


def spread_order(n: int, k: int, first: int = 0) -> list[int]:
    """Indices of ``k`` of ``n`` rows evenly spaced through them; with ``first`` (0 < first < k), the ``first``-row
    spread leads, in its own order, and the rest of the ``k``-row spread follows (a row of the smaller spread
    that the larger one lacks stays in: with k = 2 x first the two agree and nothing is added). Features are
    cached by position, so the leading rows reuse a smaller run's features."""
    picked = [i * n // k for i in range(k)]
    if not 0 < first < k:
        return picked
    lead = [i * n // first for i in range(first)]
    seen = set(lead)
    return lead + [i for i in picked if i not in seen]


def cached_source(cfg: CorrectionTrainConfig, target, files: list[Path], layers: tuple[int, ...]):
    """The taps cache of ``cfg.data`` (``jetflow.training.taps.CachedTaps``), refused with one line when it is
    missing, incomplete or was built under other settings (target, dtype, layers, data bytes)."""
    from .taps import CachedTaps, cache_for, default_dir
    root = Path(cfg.taps_dir).expanduser() if cfg.taps_dir else default_dir(Path(cfg.data).expanduser(), target.name, layers)
    chunked = Path(cfg.data).expanduser().is_dir()
    return CachedTaps.open(target, files, [cache_for(root, f, chunked) for f in files], layers=layers, max_len=3)


@torch.no_grad()
def sequence_features(proposer, row: dict, n_anchors: int, c: int, generator: torch.Generator,
                      max_response: int = 10 ** 9, source=None, number: int = 0) -> dict:
    """One sequence's features (its taps from the target's forward, or ``source(number, ids)``, a taps
    source of ``jetflow.training.taps``): hidden (A, D, H) bf16, cand_logp (A, D, C), cand_col (A, D, C) draft
    columns, truth (A, D) token ids (-1 past the end), truth_logp (A, D) the head's log-prob of the truth
    (-inf outside the draft vocabulary), truth_pos (A, D) its index among the candidates (-1: not one)."""
    from .step import sample_anchors
    head, target = proposer.head, proposer.target
    ids = torch.tensor(row["prompt_ids"] + row["response_ids"][:max_response + head.config.block_size])
    p, s, depths = len(row["prompt_ids"]), ids.numel(), head.config.block_size - 1
    anchors = sample_anchors(p, min(s - 1, p + max_response), n_anchors, generator)  # each has depths 1 and 2
    from .taps import OnlineTaps
    _, taps = (source or OnlineTaps(target, proposer.taps))(number, ids.to(target.device))
    hidden = head.sequence_blocks(taps.to(head.fc.weight.device), head.block_inputs(ids[anchors], proposer.embed),
                                  anchors).float().cpu()                                  # (A, D, H)
    logp = proposer.logp(hidden.to(proposer.out.dtype)).cpu()                             # (A, D, K)
    cand_logp, cand_col = candidates(logp, c)
    pos = anchors[:, None] + torch.arange(1, depths + 1)                                  # (A, D)
    truth = torch.where(pos < s, ids[pos.clamp(max=s - 1)], -1)
    col = _columns(proposer, logp.shape[-1])[truth.clamp(min=0)]                         # (A, D), -1: outside
    truth_logp = torch.where((col >= 0) & (truth >= 0), logp.gather(-1, col.clamp(min=0)[..., None])[..., 0],
                             float("-inf"))
    hit = cand_col == col[..., None]
    truth_pos = torch.where(hit.any(-1) & (truth >= 0), hit.float().argmax(-1), -1)
    return {"hidden": hidden.bfloat16(), "cand_logp": cand_logp, "cand_col": cand_col.int(), "truth": truth,
            "truth_logp": truth_logp, "truth_pos": truth_pos}


def _columns(proposer, k: int) -> torch.Tensor:
    """(V,) token id -> draft column, -1 for a token outside the draft vocabulary."""
    v = proposer.embed.shape[0]
    if proposer.vocab is None:
        return torch.arange(v)
    out = torch.full((v,), -1, dtype=torch.long)
    out[proposer.vocab] = torch.arange(k)
    return out


def features(cfg: CorrectionTrainConfig, proposer, rows: list[dict], folder: Path, progress: bool = True,
             shard: int = 64, source=None, numbers: list[int] | None = None) -> dict:
    """Every row's features (``sequence_features``) concatenated, plus ``seq`` (N,) the row index and
    ``heldout`` (N,) bool; computed once into ``folder`` (shards of ``shard`` rows, resumable). ``source``
    and ``numbers`` (each row's number in it): where the taps come from (default: the target's forward)."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    with tqdm(total=len(rows), desc="features", disable=not progress) as bar:
        for start in range(0, len(rows), shard):
            path = folder / f"shard-{start // shard:05d}-{shard}.pt"
            chunk = rows[start:start + shard]
            if path.is_file() and torch.load(path)["ids"] == [r["id"] for r in chunk]:
                parts.append(torch.load(path))
                bar.update(len(chunk))
                continue
            feats = []
            for i, row in enumerate(chunk):
                g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + start + i)
                feats.append(sequence_features(proposer, row, cfg.anchors, cfg.candidates, g, cfg.max_response, source,
                                               numbers[start + i] if numbers else 0))
                bar.update(1)
            part = {k: torch.cat([f[k] for f in feats]) for k in feats[0]}
            part["seq"] = torch.cat([torch.full((f["truth"].shape[0],), start + i) for i, f in enumerate(feats)])
            part["ids"] = [r["id"] for r in chunk]
            torch.save(part, path.with_suffix(".tmp"))
            path.with_suffix(".tmp").rename(path)
            parts.append(part)
    out = {k: torch.cat([p[k] for p in parts]) for k in parts[0] if k != "ids"}
    held = torch.tensor([_hash01(r["id"]) < cfg.heldout for r in rows])
    out["heldout"] = held[out["seq"]]
    return out


def examples(feats: dict, mask: torch.Tensor) -> torch.Tensor:
    """(E, 2) long (anchor, depth index d-1) of every trainable example: d >= 2, the truth known and in the
    draft vocabulary, anchors where ``mask`` (A,) holds."""
    ok = (feats["truth"] >= 0) & torch.isfinite(feats["truth_logp"]) & mask[:, None]
    ok[:, 0] = False
    return ok.nonzero()


def batch_logp(module: PathCorrection, feats: dict, ex: torch.Tensor, out: torch.Tensor, embed: torch.Tensor,
               vocab: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrected candidate log-probs (E, C) of examples ``ex`` with the true parent, and the truth's
    corrected log-prob (E,) (a non-candidate truth keeps its head logit). ``vocab`` (K,): each draft
    column's token id (None: the identity)."""
    a, d = ex[:, 0], ex[:, 1]
    token = (lambda col: col.long()) if vocab is None else (lambda col: vocab[col.long()])
    h = feats["hidden"][a, d].float()                                         # (E, H)
    truth_parent = feats["truth"][a, d - 1]
    parent = embed[truth_parent].float()                                      # (E, H)
    spine = embed[token(feats["cand_col"][a, d - 1, 0])].float()              # (E, H) the head's first choice
    rows = out[feats["cand_col"][a, d].long()]                                # (E, C, H)
    shift = (rows @ module(h, parent, spine)[:, :, None])[..., 0]             # (E, C)
    shift = shift + module.bigram(truth_parent[:, None], token(feats["cand_col"][a, d]))
    lp = corrected_logp(feats["cand_logp"][a, d], shift)
    pos = feats["truth_pos"][a, d]
    z = (feats["cand_logp"][a, d] + shift - lp)[:, 0]                         # the normaliser
    truth = torch.where(pos >= 0, lp.gather(1, pos.clamp(min=0)[:, None])[:, 0], feats["truth_logp"][a, d] - z)
    return lp, truth


@torch.no_grad()
def evaluate(module: PathCorrection, feats: dict, ex: torch.Tensor, out, embed, batch: int = 1024,
             vocab: torch.Tensor | None = None) -> dict:
    """Held-out loss and argmax accuracy, corrected and not, split by whether the parent (the true token
    at depth d-1) is the head's argmax there (spine) or not (off)."""
    sums = {k: 0.0 for k in ("loss", "n", "spine_n", "off_n", "spine_head", "off_head", "spine_corr", "off_corr")}
    ex = ex[feats["truth_pos"][ex[:, 0], ex[:, 1] - 1] >= 0]  # the parent is a candidate: a node a tree can hold
    for part in ex.split(batch):
        lp, truth = batch_logp(module, feats, part, out, embed, vocab)
        a, d = part[:, 0], part[:, 1]
        on = feats["truth_pos"][a, d - 1] == 0
        right = feats["truth_pos"][a, d]
        head_ok, corr_ok = right == 0, (right >= 0) & (lp.argmax(-1) == right)
        sums["loss"] -= float(truth.sum()); sums["n"] += part.shape[0]
        for key, sel in (("spine", on), ("off", ~on)):
            sums[f"{key}_n"] += int(sel.sum())
            sums[f"{key}_head"] += int((head_ok & sel).sum()); sums[f"{key}_corr"] += int((corr_ok & sel).sum())
    n = max(sums["n"], 1)
    return {"loss": sums["loss"] / n, "examples": int(sums["n"]),
            **{f"{k}_{w}_acc": sums[f"{k}_{w}"] / max(sums[f"{k}_n"], 1) for k in ("spine", "off") for w in ("head", "corr")}}


def initial_module(cfg: CorrectionTrainConfig, hidden: int, vocab_size: int, start: PathCorrection | None
                   ) -> PathCorrection:
    """The module a fit starts from: fresh, or (``cfg.init`` head/stack) ``start``'s weights copied in (a wider
    ``down`` gets them in its first columns, the new ones zero); with stack, every whole copied tensor frozen."""
    module = PathCorrection(CorrectionConfig(hidden, cfg.rank, cfg.candidates, spine=cfg.spine,
                                             bigram_rank=cfg.bigram_rank, vocab_size=vocab_size))
    if cfg.init == "none" or start is None:
        return module
    own = dict(module.named_parameters())
    with torch.no_grad():
        for name, value in start.state_dict().items():
            if value.shape == own[name].shape:
                own[name].copy_(value)
                own[name].requires_grad_(cfg.init != "stack")
            else:
                own[name].zero_()[..., :value.shape[-1]].copy_(value)
    return module


def fit(cfg: CorrectionTrainConfig, feats: dict, out: torch.Tensor, embed: torch.Tensor, ckpt: Path,
        progress: bool = True, vocab: torch.Tensor | None = None, start: PathCorrection | None = None
        ) -> tuple[PathCorrection, list[dict]]:
    """AdamW on the training examples for ``cfg.epochs`` epochs (cosine schedule), the held-out slice
    evaluated after each; returns the module of the epoch with the least held-out loss. ``ckpt`` (module,
    optimiser, history, that best state) is rewritten per epoch and resumed from. ``vocab``: the draft
    columns' token ids; ``start``: the correction beside the head (``cfg.init``)."""
    torch.manual_seed(cfg.seed)
    module = initial_module(cfg, out.shape[1], embed.shape[0], start)
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay)
    train_ex, held_ex = examples(feats, ~feats["heldout"]), examples(feats, feats["heldout"])
    steps = math.ceil(len(train_ex) / cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(i / (cfg.epochs * steps), 1))))
    history = [{"epoch": 0, **evaluate(module, feats, held_ex, out, embed, vocab=vocab)}]
    best = {k: v.clone() for k, v in module.state_dict().items()}  # the epoch of least held-out loss so far
    if ckpt.is_file():
        state = torch.load(ckpt)
        module.load_state_dict(state["module"]); opt.load_state_dict(state["opt"]); sched.load_state_dict(state["sched"])
        history, best = state["history"], state["best"]
    bar = tqdm(total=cfg.epochs * steps, initial=(len(history) - 1) * steps, desc="train-correction", disable=not progress)
    for epoch in range(len(history), cfg.epochs + 1):
        order = train_ex[torch.randperm(len(train_ex), generator=torch.Generator().manual_seed(cfg.seed + epoch))]
        total = 0.0
        for part in order.split(cfg.batch_size):
            _, truth = batch_logp(module, feats, part, out, embed, vocab)
            loss = -truth.mean()  # the truth's corrected log-prob, under its true parent
            opt.zero_grad(); loss.backward(); opt.step(); sched.step()
            total += loss.item() * part.shape[0]
            bar.update(1)
        history.append({"epoch": epoch, "train_loss": total / len(train_ex), **evaluate(module, feats, held_ex, out, embed, vocab=vocab)})
        bar.set_postfix(held=f"{history[-1]['loss']:.3f}", off=f"{history[-1]['off_corr_acc']:.3f}")
        if history[-1]["loss"] <= min(h["loss"] for h in history):
            best = {k: v.detach().clone() for k, v in module.state_dict().items()}
        torch.save({"module": module.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "history": history, "best": best}, ckpt.with_suffix(".tmp"))
        ckpt.with_suffix(".tmp").rename(ckpt)
    bar.close()
    if cfg.keep == "best":
        module.load_state_dict(best)  # few sequences overfit in a few epochs: keep the held-out best
    return module.eval(), history


def train_correction(cfg: CorrectionTrainConfig, progress: bool = True) -> Path:
    """Features (cached), epochs, then ``correction.safetensors`` + ``correction.json`` in the head folder
    with the command, the data, the held-out history and no machine-local path."""
    from jetflow.util.paths import cache_dir, portable_path, shell_join
    from jetflow.drafting.methods import make_proposer
    from jetflow.util.paths import shipped_head_dir
    from jetflow.engine.load import load_target
    head_dir = Path(cfg.out) if cfg.out else shipped_head_dir("jetflow")
    files, indexed = indexed_rows(cfg)
    rows = [r for _, r in indexed]
    target = load_target(None, dtype=cfg.dtype)
    proposer = make_proposer("jetflow", target, head=str(head_dir), draft_dtype=torch.float32)
    source = cached_source(cfg, target, files, tuple(proposer.taps)) if cfg.taps == "cached" else None
    tag = f"{head_dir.name}-{cfg.dtype}-c{cfg.candidates}-a{cfg.anchors}-r{cfg.max_response}-s{cfg.seed}"
    work = Path(cfg.cache).expanduser() if cfg.cache else cache_dir() / "correction" / tag
    import time
    began = time.perf_counter()
    feats = features(cfg, proposer, rows, work / "features", progress, source=source, numbers=[i for i, _ in indexed])
    feature_minutes, began = (time.perf_counter() - began) / 60, time.perf_counter()
    fields = {k: v for k, v in asdict(cfg).items() if k not in ("taps", "taps_dir")}  # both sources: the same features
    run = hashlib.sha256(json.dumps(fields | {"out": None, "cache": None}, sort_keys=True).encode()).hexdigest()[:12]
    vocab = None if proposer.vocab is None else proposer.vocab.cpu()
    module, history = fit(cfg, feats, proposer.out.float(), proposer.embed.float(), work / f"fit-{run}.pt", progress,
                          vocab, proposer.correction.float().cpu() if proposer.correction is not None else None)
    shown = replace(cfg, data=portable_path(Path(cfg.data).expanduser()))  # the command as any machine reads it
    provenance = {"command": shell_join(command_args(shown, CorrectionTrainConfig(), ["python", "-m", "jetflow", "train-correction"],
                                                     skip=("out", "cache", "data_dir", "taps_dir"), always=("max_seqs", "epochs"))),
                  "data": shown.data, "sequences": len(rows),
                  "sequence_ids_sha256": hashlib.sha256("\n".join(r["id"] for r in rows).encode()).hexdigest(),
                  "anchors": int(feats["truth"].shape[0]), "heldout_anchors": int(feats["heldout"].sum()),
                  "head": head_dir.name, "features": f"{cfg.dtype} target taps ({cfg.taps}), fp32 head",
                  "kept_epoch": min(history, key=lambda h: h["loss"])["epoch"] if cfg.keep == "best" else len(history) - 1, "history": history,
                  "minutes_this_call": {"features": round(feature_minutes, 2),
                                        "fit": round((time.perf_counter() - began) / 60, 2)}}
    return module.save(head_dir.parent / f"{head_dir.name}-{cfg.variant}" if cfg.variant else head_dir, provenance)

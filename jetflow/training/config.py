"""The training config: ``TrainConfig`` (each field's flag and help are its metadata), the presets, and what
rebuilds or records a config: the ``python -m jetflow train`` command that reproduces it, the config as
provenance records it, and the commands of the heads a warm-started head descends from.

    cfg = TrainConfig.from_name("cpu", data="regen.jsonl", out="runs/jf")  # vary with dataclasses.replace
    command_for(cfg)   # 'python -m jetflow train --data regen.jsonl --out runs/jf --preset cpu'
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from jetflow.engine.load import DTYPES
from jetflow.util.flags import command_args, option
from jetflow.util.paths import portable_path, shell_join

BUILTIN_INITS = ("target", "random")  # any other ``init`` names a trained head's directory (warm start)
PRECISIONS, ATTENTIONS = ("auto", "float32", "bfloat16"), ("auto", "blocks", "packed")
LEGACY = {"precision": "float32", "attention": "packed", "holdout": 0}  # what checkpoints before these fields used


def _init_path(text: str) -> str:
    """``--init``: a built-in init as given, a head directory made absolute (the command must work anywhere)."""
    return text if text in BUILTIN_INITS else str(Path(text).resolve())


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Each field's help and flag (``--name``, or ``--set name=value`` for fields
    without one) are its metadata: the ``train`` subcommand and ``command_for`` are generated from it."""
    data: str = option("", "regenerated JSONL, or a chunked folder of them (python -m jetflow regenerate)",
                       required=True)
    parts: int = option(0, "with a chunked --data folder: train on its first K parts (0: all); the "
                        "held-out rows are part 0's last, whatever K")
    holdout: int = option(0, "never train on N evenly spaced rows of the chunked --data folder's last part (or "
                          "of a single --data file), when the data reaches it: a head trained on the whole pool "
                          "keeps prompts for its acceptance profile (python -m jetflow profile --data)")
    taps: str = option("online", "online: the target runs over each sequence every step; cached: read "
                       "the taps cache (python -m jetflow taps), the step is the head's alone (loss ce)",
                       choices=("online", "cached"))
    taps_dir: str | None = option(None, "the taps cache folder (default: the one `jetflow taps` writes for "
                                  "--data)", parse=lambda text: str(Path(text).resolve()))
    out: str = option("", "output dir (checkpoint, history, head, provenance); rerunning resumes from its "
                      "checkpoint", required=True)
    model: str | None = option(None, "target hub id or local dir (default: the embedded SmolLM2-135M-Instruct)")
    dtype: str = option("bfloat16", "the frozen target forward's dtype; head params and AdamW stay fp32", flag=None)
    precision: str = option("auto", "the head's compute dtype in a training step (autocast; fp32 weights, AdamW "
                            "and loss). auto: bfloat16 where the device has it natively (CUDA, a CPU with AVX-512 "
                            "BF16 or AMX), else float32", choices=PRECISIONS)
    attention: str = option("auto", "blocks: each block attends the context and its own slots (no masked "
                            "block-to-block scores: CPUs); packed: all blocks as one masked row (one fused kernel, "
                            "memory linear in the anchors: GPUs, long sequences). auto: blocks on CPU, else packed",
                            choices=ATTENTIONS)
    causal: bool = option(True, "JetFlow's causal block (the default)", negate=("--bidirectional", "DFlash's bidirectional block"))
    num_layers: int = option(2, "draft decoder layers (= taps)", flag=None)
    block_size: int = option(16, "Q: the anchor + Q-1 draftable depths", flag=None)
    gamma: float = option(0.0, "depth weights exp(-(k-1)/gamma); 0 = uniform (JetFlow), DFlash uses 7")
    gamma_start: float | None = option(None, "depth curriculum: start from this gamma's weights (e.g. 0.5: "
                                       "depth 1 dominates) and move to --gamma's")
    curriculum: float = option(0.5, "fraction of the steps the curriculum takes (with --gamma-start only)")
    loss: str = option("kl", "kl: forward KL to the target's distribution; ce: the regenerated tokens",
                       choices=("kl", "ce"))
    anchors_per_seq: int = option(512, "random anchors inside each response (paper: up to 512)", flag="--anchors")
    seqs_per_step: int = option(16, "sequences per optimiser step (accumulated, split across processes)")
    steps: int = option(300_000, "optimiser steps (the paper: ~800K examples x 6 epochs / 16)")
    lr: float = option(3e-4, "peak AdamW lr, weight decay 0")
    warmup: float = option(0.04, "warmup fraction of the steps, then cosine to 0", flag=None)
    grad_clip: float = option(1.0, "gradient norm clip", flag=None)
    max_len: int = option(3072, "truncate prompt + response to this many tokens", flag=None)
    init: str = option("target", "target (init_from_target) | random (stalls) | a trained head's directory "
                       "to continue training from", parse=_init_path)
    draft_vocab: int = option(0, "draft only the K most frequent response tokens of the data, plus EOS "
                              "(0 = whole vocabulary): a K-row lm_head, cheaper to train and to draft with")
    seed: int = option(0, "seed of the data order, the anchors and the head's init")
    eval_every: int = option(1000, "steps between evaluations (step 0 and the last step always)")
    eval_seqs: int = option(64, "held out: the last eval_seqs rows of the file, never trained on", flag=None)
    eval_stride: int = option(1, "evaluation anchors at every eval_stride-th response position", flag=None)
    save_every: int = option(1000, "steps between checkpoints (the last step always)")
    preset: str = "paper"         # the preset this config started from (for the reproducing command)

    def __post_init__(self):
        ints = ("num_layers", "anchors_per_seq", "seqs_per_step", "steps", "eval_every", "eval_seqs",
                "eval_stride", "save_every")
        problems = [f"{k} must be >= 1, got {getattr(self, k)}" for k in ints if getattr(self, k) < 1]
        problems += [f"draft_vocab must be >= 0, got {self.draft_vocab}"] if self.draft_vocab < 0 else []
        problems += [msg for bad, msg in [
            (self.loss not in ("kl", "ce"), f"loss must be kl or ce, got {self.loss!r}"),
            (self.taps not in ("online", "cached"), f"taps must be online or cached, got {self.taps!r}"),
            (self.precision not in PRECISIONS, f"precision must be one of {PRECISIONS}, got {self.precision!r}"),
            (self.attention not in ATTENTIONS, f"attention must be one of {ATTENTIONS}, got {self.attention!r}"),
            (self.taps == "cached" and self.loss == "kl", "cached taps hold no teacher distribution: "
             "train with --loss ce, or with --taps online for kl"),
            (self.parts < 0, f"parts must be >= 0 (0: all), got {self.parts}"),
            (self.holdout < 0, f"holdout must be >= 0, got {self.holdout}"),
            (self.init not in BUILTIN_INITS and not (Path(self.init) / "config.json").is_file(),
             f"init must be target, random or a head directory holding config.json, got {self.init!r}"),
            (self.dtype not in DTYPES, f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}"),
            (self.block_size < 2 or self.max_len < 3, "block_size must be >= 2 and max_len >= 3"),
            (self.gamma < 0 or self.lr <= 0 or self.grad_clip <= 0, "need gamma >= 0, lr > 0, grad_clip > 0"),
            (self.gamma_start is not None and self.gamma_start < 0, "gamma_start must be >= 0"),
            (not 0 < self.curriculum <= 1, f"curriculum must lie in (0, 1], got {self.curriculum}"),
            (not 0 <= self.warmup < 1, f"warmup must lie in [0, 1), got {self.warmup}")] if bad]
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_name(cls, name: str, **overrides) -> "TrainConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)


PRESETS = {
    "paper": TrainConfig(),
    # 2 CPU cores, SmolLM2: ~4 s a step (1 thread, busy machine); a higher lr and gamma > 0 so the
    # shallow depths are not swamped by the deep ones early on (docs/field-notes.md)
    "cpu": TrainConfig(anchors_per_seq=32, seqs_per_step=4, steps=3000, lr=1e-3, gamma=4.0, max_len=512,
                       eval_every=100, eval_seqs=16, eval_stride=4, save_every=100, preset="cpu"),
    # seconds on a tiny model: tests and a first look at the pipeline
    "smoke": TrainConfig(anchors_per_seq=8, seqs_per_step=2, steps=4, lr=1e-3, max_len=128, eval_every=2,
                         eval_seqs=1, eval_stride=2, save_every=2, preset="smoke"),
}


# ----------------------------------------------------------------------------- what rebuilds and records a config
def command_for(cfg: TrainConfig) -> str:
    """The ``python -m jetflow train`` line that rebuilds ``cfg``: its preset plus each field that
    differs from it, written from the fields' flag metadata (``--set key=value`` where a field has none);
    paths through ``portable_path`` (no machine-local paths)."""
    prefix = ["python", "-m", "jetflow", "train", "--data", portable_path(cfg.data),
              "--out", portable_path(cfg.out), "--preset", cfg.preset]
    args = command_args(cfg, TrainConfig.from_name(cfg.preset), prefix, skip=("data", "out"))
    if cfg.init not in BUILTIN_INITS:
        args[args.index("--init") + 1] = portable_path(cfg.init)
    if cfg.taps_dir:
        args[args.index("--taps-dir") + 1] = portable_path(cfg.taps_dir)
    return shell_join(args)


def portable_config(cfg: TrainConfig) -> dict:
    """The config as provenance records it: its paths through ``portable_path`` (no machine-local paths)."""
    paths = {k: portable_path(getattr(cfg, k)) for k in ("data", "out", "taps_dir") if getattr(cfg, k)}
    return asdict(cfg) | paths | ({"init": portable_path(cfg.init)} if cfg.init not in BUILTIN_INITS else {})


def lineage(cfg: TrainConfig) -> list[str]:
    """Commands that rebuild a warm-started head's ancestors, oldest first (from their provenance)."""
    if cfg.init in BUILTIN_INITS:
        return []
    prov = Path(cfg.init) / "provenance.json"
    if not prov.is_file():
        return [f"# {cfg.init} has no provenance.json: its training command is unknown"]
    parent = json.loads(prov.read_text())
    return [*parent.get("lineage", []), parent["command"]]

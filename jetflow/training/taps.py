"""The taps cache: the target's tapped hidden states of every regenerated sequence, on disk, so that
training reads them instead of running the target (docs/scale.md).

    build(target, "regen.jsonl", layers=(1, 28), max_len=768, out="~/.cache/jetflow/taps/x")
    source = CachedTaps.open(target, ["regen.jsonl"], [out], layers=(1, 28), max_len=512)
    _, taps = source(row, ids, logits=False)        # (S, L, H) bf16, memory-mapped, no target forward
    cache_taps(TapsConfig(data="regen/"))          # ``python -m jetflow taps``: every file of the data

One cache folder per data file: ``taps.json`` (model, dtype, tap layers, max_len, hidden size, rows per
shard, the data file's sha256) and, per shard of ``shard_rows`` consecutive rows, ``shard-KKKKK.npy``
(T, L, H) (bf16 bits stored as int16: numpy has no bf16) and ``shard-KKKKK.offsets.npy`` (rows + 1,)
int64, the token offset of each row; a shard is whole once its offsets file exists (both are written
under temporary names and renamed), so a killed build resumes at its first missing shard. Sequences are
truncated to ``max_len`` and run one at a time through ``Target.sequence_taps`` (the function the online
path calls; padding a batch would change the numbers), so a bf16 target's cached taps equal the online
ones bit for bit. Bytes per token: 2 * L * H (2 taps of SmolLM2's 576: 2,304 B).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from jetflow.data.regenerate import data_files, data_sha256, load_regenerated
from jetflow.drafting.head import HeadConfig
from jetflow.engine.load import DEVICE_HELP, load_target
from jetflow.util import checks, jsonl
from jetflow.util.flags import option
from jetflow.util.paths import cache_dir

FORMAT = 1
HEADER = "taps.json"


def sequence_ids(row: dict, max_len: int) -> torch.Tensor:
    """(S,) prompt + response ids of a regenerated row, truncated to max_len (as training reads it)."""
    return torch.tensor(list(row["prompt_ids"]) + list(row["response_ids"]), dtype=torch.long)[:max_len]


def header_for(target, layers: tuple[int, ...], max_len: int, data: Path, rows: int, shard_rows: int) -> dict:
    """What a cache's taps depend on (compared when it is resumed or read)."""
    return {"format": FORMAT, "model": target.name, "dtype": str(target.dtype).removeprefix("torch."),
            "tap_layers": list(layers), "hidden": target.config.hidden_size, "max_len": max_len,
            "shard_rows": shard_rows, "rows": rows, "data": data.name, "data_sha256": data_sha256(data)}


def _shard(out: Path, k: int) -> tuple[Path, Path]:
    return out / f"shard-{k:05d}.npy", out / f"shard-{k:05d}.offsets.npy"


def _check_header(out: Path, header: dict) -> None:
    """Write the header of a new cache; refuse one built under other settings."""
    path = out / HEADER
    if not path.is_file():
        path.write_text(json.dumps(header, indent=1) + "\n")
        return
    old = json.loads(path.read_text())
    changed = [f"{k}: {old.get(k)!r} -> {header[k]!r}" for k in header if old.get(k) != header[k]]
    if changed:
        raise ValueError(f"{out} holds taps built under other settings ({'; '.join(changed)}); choose "
                         "another --out or remove it")


def _write_shard(out: Path, k: int, taps: list[torch.Tensor]) -> None:
    """Save one shard's taps (each (S, L, H) bf16) and their offsets, each renamed into place whole."""
    path, offsets = _shard(out, k)
    lengths = [t.shape[0] for t in taps]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, torch.cat(taps).view(torch.int16).numpy())
    tmp.replace(path)
    tmp = offsets.with_name(offsets.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    tmp.replace(offsets)  # written last: marks the shard whole


def build(target, data: str | Path, *, layers: tuple[int, ...], max_len: int, out: str | Path,
          shard_rows: int = 128, progress: bool = True, bar: tqdm | None = None, wait: bool = False) -> Path:
    """Cache the taps (layers ``layers``) of every row of the regenerated file ``data`` in ``out``;
    rerunning skips the whole shards. A second builder of the same cache is refused (``jsonl.Busy``), or
    with ``wait`` waits for the first and then finds its shards whole; a whole cache is only checked,
    without its lock, so any number of readers may start at once. -> out."""
    if max_len < 3 or shard_rows < 1:
        raise ValueError(f"max_len must be >= 3 and shard_rows >= 1, got {max_len}, {shard_rows}")
    data, out = Path(data), Path(out)
    rows = load_regenerated(data)
    header = header_for(target, tuple(layers), max_len, data, len(rows), shard_rows)
    missing = lambda: [k for k in range(-(-len(rows) // shard_rows)) if not _shard(out, k)[1].is_file()]
    if (out / HEADER).is_file() and not missing():
        _check_header(out, header)  # the header exists: this only reads it
        return out
    out.mkdir(parents=True, exist_ok=True)
    with jsonl.locked(out, wait=wait):
        _check_header(out, header)
        todo = missing()
        own = bar is None
        if own:
            bar = tqdm(total=sum(len(rows[k * shard_rows:(k + 1) * shard_rows]) for k in todo), unit="seq",
                       desc=f"taps {data.name}", disable=not progress)
        for k in todo:
            taps = []
            for row in rows[k * shard_rows:(k + 1) * shard_rows]:
                ids = sequence_ids(row, max_len).to(target.device)
                taps.append(target.sequence_taps(ids, tuple(layers), logits=False)[1].to(torch.bfloat16).cpu())
                bar.update(1)                                                           # (S, L, H) each
            _write_shard(out, k, taps)
        if own:
            bar.close()
    return out


def missing_rows(data: str | Path, out: str | Path, shard_rows: int) -> int:
    """Rows of ``data`` not yet in whole shards of ``out`` (one progress bar over several files)."""
    n = len(load_regenerated(data))
    return sum(len(range(n)[k * shard_rows:(k + 1) * shard_rows])
               for k in range(-(-n // shard_rows)) if not _shard(Path(out), k)[1].is_file())


def build_all(target, files: list[Path], caches: list[Path], *, progress: bool = True, share: bool = False,
              **kw) -> list[Path]:
    """``build`` for each data file into its cache folder, under one progress bar (with ETA); ``kw`` as
    ``build``'s (``wait``: wait for another builder of a cache instead of failing). With ``share``, several
    processes running the same files split them: a file that another process is caching is passed over
    and waited for at the end, so N processes cache N files at a time."""
    todo = [missing_rows(f, c, kw.get("shard_rows", 128)) for f, c in zip(files, caches)]
    with tqdm(total=sum(todo), unit="seq", desc="taps", disable=not progress) as bar:
        if not share:
            return [build(target, f, out=c, bar=bar, **kw) for f, c in zip(files, caches)]
        kw.pop("wait", None)
        later = []
        for f, c, n in zip(files, caches, todo):
            try:
                build(target, f, out=c, bar=bar, wait=False, **kw)
            except jsonl.Busy:
                later.append((f, c, n))  # another process holds it: the next file first
        for f, c, n in later:
            build(target, f, out=c, bar=bar, wait=True, **kw)  # finds it whole once the other process is done
            bar.update(n)
        return list(caches)


# ----------------------------------------------------------------------------- reading
@dataclass
class Shard:
    taps: np.ndarray              # (T, L, H) int16 (bf16 bits), memory-mapped
    offsets: np.ndarray           # (rows + 1,) int64


class CachedTaps:
    """Taps of the rows of several data files (rows numbered across them in order), read from their
    caches. Called like the online source: ``(row, ids, logits) -> (None, taps (S, L, H) bf16)``."""

    def __init__(self, shards: list[list[Shard]], shard_rows: list[int], first_rows: list[int]):
        self.shards, self.shard_rows, self.first_rows = shards, shard_rows, first_rows

    @classmethod
    def open(cls, target, data: list[Path], caches: list[Path], *, layers: tuple[int, ...], max_len: int
             ) -> "CachedTaps":
        """Open the caches of ``data`` (one folder each), refusing one that is incomplete or was built
        under other settings than this target, these layers, the data's bytes and max_len >= max_len."""
        shards, shard_rows, first, n = [], [], [], 0
        for path, out in zip(data, caches):
            header = _read_header(Path(out), Path(path))
            want = header_for(target, tuple(layers), header["max_len"], Path(path), header["rows"],
                              header["shard_rows"])
            changed = [f"{k}: {header.get(k)!r} (cache) vs {want[k]!r}" for k in want if header.get(k) != want[k]]
            if header["max_len"] < max_len:
                changed.append(f"max_len: {header['max_len']} (cache) < {max_len}")
            if changed:
                raise ValueError(f"the taps in {out} do not fit this run ({'; '.join(changed)}); rebuild them "
                                 f"with `python -m jetflow taps --data {path} --out NEW` or train with --taps online")
            k_max = -(-header["rows"] // header["shard_rows"])
            missing = [k for k in range(k_max) if not _shard(Path(out), k)[1].is_file()]
            if missing:
                raise ValueError(f"the taps in {out} are incomplete ({len(missing)} of {k_max} shards missing); "
                                 f"finish them with `python -m jetflow taps --data {path}` (it resumes)")
            shards.append([Shard(np.load(_shard(Path(out), k)[0], mmap_mode="r"), np.load(_shard(Path(out), k)[1]))
                           for k in range(k_max)])
            shard_rows.append(header["shard_rows"])
            first.append(n)
            n += header["rows"]
        return cls(shards, shard_rows, first)

    def taps(self, row: int) -> torch.Tensor:
        """(S, L, H) bf16 taps of a row (global number), S its cached length."""
        f = max(i for i, start in enumerate(self.first_rows) if start <= row)
        k, i = divmod(row - self.first_rows[f], self.shard_rows[f])
        shard = self.shards[f][k]
        return torch.from_numpy(np.array(shard.taps[shard.offsets[i]:shard.offsets[i + 1]])).view(torch.bfloat16)

    def __call__(self, row: int, ids: torch.Tensor, logits: bool = False) -> tuple[None, torch.Tensor]:
        if logits:
            raise ValueError("cached taps hold no teacher logits: the kl loss needs --taps online")
        taps = self.taps(row)
        if taps.shape[0] < ids.numel():
            raise ValueError(f"row {row}: {taps.shape[0]} cached positions, {ids.numel()} needed")
        return None, taps[:ids.numel()].to(ids.device)


class OnlineTaps:
    """The target's forward over each sequence as it is trained on (GPU users with large targets)."""

    def __init__(self, target, layers: tuple[int, ...]):
        self.target, self.layers = target, tuple(layers)

    def __call__(self, row: int, ids: torch.Tensor, logits: bool = False):
        return self.target.sequence_taps(ids, self.layers, logits=logits)


def _read_header(out: Path, data: Path) -> dict:
    path = out / HEADER
    if not path.is_file():
        raise FileNotFoundError(f"no taps cache in {out}; build it with `python -m jetflow taps --data {data}` "
                                "or train with --taps online")
    return json.loads(path.read_text())


def default_dir(data: str | Path, model: str, layers: tuple[int, ...]) -> Path:
    """The cache folder of a data file or chunked folder: named by the data, the model and the layers
    (a chunked folder's parts get one subfolder each, ``cache_for``)."""
    name = Path(data).name.removesuffix(".jsonl")
    return cache_dir() / "taps" / f"{name}-{model.rstrip('/').replace('/', '--')}-L{'-'.join(map(str, layers))}"


def cache_for(root: Path, data: Path, chunked: bool) -> Path:
    """The cache folder of one data file: ``root`` itself, or its subfolder for a part of a chunked folder."""
    return root / data.name.removesuffix(".jsonl") if chunked else root


# ----------------------------------------------------------------------------- the command
@dataclass(frozen=True)
class TapsConfig:
    """``python -m jetflow taps``: cache the target's taps of regenerated data (resumable per shard)."""
    data: str = option("", "regenerated JSONL or a chunked folder (python -m jetflow regenerate)", required=True)
    parts: int = option(0, "with a chunked folder: its first K parts only (0: all)")
    out: str | None = option(None, "cache folder (default: the jetflow cache's taps/DATA-MODEL-LAYERS, where "
                             "train --taps cached looks)")
    num_layers: int = option(2, "the head's draft layers: one tap each, the layers train picks for it")
    max_len: int = option(768, "truncate prompt + response to this many tokens (train's max_len must not "
                          "exceed it)")
    shard_rows: int = option(128, "sequences per shard (the unit a killed build resumes from)")
    model: str | None = option(None, "target hub id or local dir (default: the embedded SmolLM2)")
    dtype: str = option("bfloat16", "the target's dtype (train's --set dtype must match)")
    device: str | None = option(None, DEVICE_HELP)
    share: bool = option(False, "several processes of the same command split the files: one that another process "
                         "is caching is passed over, then waited for at the end (one thread each: "
                         "OMP_NUM_THREADS=1)", negate=("--alone", "fail on a file another process is caching "
                                                       "(the default)"))


def cache_taps(cfg: TapsConfig) -> Path:
    """``python -m jetflow taps``: the taps of every file of ``cfg.data`` in its cache folder, for the
    layers train picks for a head of ``num_layers`` draft layers. -> the cache folder."""
    checks.positive(num_layers=cfg.num_layers, shard_rows=cfg.shard_rows)
    if cfg.max_len < 3:
        raise ValueError(f"--max-len must be >= 3, got {cfg.max_len}")
    files = data_files(cfg.data, cfg.parts)
    target = load_target(cfg.model, dtype=cfg.dtype, device=cfg.device)
    layers = HeadConfig.for_target(target.config, num_layers=cfg.num_layers).target_layer_ids
    root = checks.writable_dir(Path(cfg.out) if cfg.out else default_dir(cfg.data, target.name, layers), "--out")
    build_all(target, files, [cache_for(root, f, Path(cfg.data).is_dir()) for f in files], layers=layers,
              max_len=cfg.max_len, shard_rows=cfg.shard_rows, share=cfg.share)
    return root

"""Regeneration: the target's own answers to training prompts (self-distillation), resumable, in one file or
a chunked folder of parts; reading them back, and the data files by content (sha256).

    regenerate(target, prompts, out) -> JSONL, one {"id", "prompt_ids", "response_ids"} per prompt, resumable
    load_regenerated(out)            -> those rows (lists, or 1-D long tensors with tensors=True)
    data_files("regen/", parts=2)    -> [regen/part-00-of-08.jsonl, regen/part-01-of-08.jsonl]
    regenerate_files(RegenerateConfig(n=0, chunks=8))   # ``python -m jetflow regenerate``: every part in turn

A regenerated file's first line is its settings header (``regen_settings``); a chunked folder holds
``part-KK-of-NN.jsonl`` files, each with a ``.meta.json`` (the reproducing command) once it is whole.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import torch
from tqdm.auto import tqdm

from jetflow.engine.load import DEVICE_HELP, EMBEDDED, NO_THINKING, THINKING_HELP, load_target
from jetflow.util import checks, jsonl
from jetflow.util.flags import command_line, option
from jetflow.util.paths import cache_dir
from .prompts import training_pool, training_prompts

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- the command's config and files
@dataclass(frozen=True)
class RegenerateConfig:
    """``python -m jetflow regenerate``: the target answers training prompts (resumable)."""
    n: int = option(3000, "training prompts to answer (0: the whole pool, every source in full)")
    chunks: int = option(1, "answer the prompts as this many files, one after another (each a random part; "
                            "the first k of them are the first k/chunks of the data); processes started side "
                            "by side share them, each skipping a part another one is writing")
    out: str | None = option(None, "the JSONL to append to (default: the jetflow cache's regen-N.jsonl)")
    batch_size: int = option(16, "prompts per left-padded batch")
    max_new_tokens: int = option(192, "new tokens per answer")
    max_prompt_tokens: int = option(512, "longer prompts are skipped")
    seed: int = option(0, "seed of the prompt draw")
    model: str | None = option(None, "target hub id or local dir (default: the embedded SmolLM2)")
    dtype: str = option("bfloat16", "the target's dtype")
    device: str | None = option(None, DEVICE_HELP)
    thinking: bool | None = option(None, THINKING_HELP, negate=NO_THINKING)
    data_dir: str | None = option(None, "offline data folder (default: $JETFLOW_DATA_DIR, else the hub)")


def default_regen_out(cfg: RegenerateConfig) -> Path:
    """The default output names the model, dtype and n: answers of another target never share a file."""
    model = (cfg.model or EMBEDDED).rstrip("/").replace("/", "--")
    size = cfg.n or "all"
    if cfg.chunks > 1:
        return cache_dir() / f"regen-{model}-{cfg.dtype}-{size}-{cfg.max_new_tokens}"
    return cache_dir() / f"regen-{model}-{cfg.dtype}-{size}.jsonl"


def chunk_files(out: Path, chunks: int) -> list[Path]:
    """The files of a regeneration split into ``chunks`` parts (``out`` is then a folder)."""
    return [out] if chunks == 1 else [out / f"part-{i:02d}-of-{chunks:02d}.jsonl" for i in range(chunks)]


def regenerate_command(cfg: RegenerateConfig, out: Path) -> str:
    """The ``python -m jetflow regenerate`` line that (re)makes ``out`` with these settings."""
    return command_line(replace(cfg, out=out.name), RegenerateConfig(), ["python", "-m", "jetflow", "regenerate"],
                        skip=("data_dir",), always=("n", "chunks", "out", "batch_size", "max_new_tokens", "max_prompt_tokens", "seed"))


def chunk(prompts: list, index: int, count: int) -> list:
    """Part ``index`` of ``count`` near-equal contiguous parts of ``prompts``. Of a shuffled list each
    part is a random subset, and parts 0..k-1 together are the first k/count of it (nested sizes)."""
    if not 0 <= index < count:
        raise ValueError(f"chunk index must be in 0..{count - 1}, got {index}")
    bounds = [len(prompts) * i // count for i in range(count + 1)]
    return prompts[bounds[index]:bounds[index + 1]]


# ---------------------------------------------------------------- answering
def trim_response(ids: list[int], eos_ids: set[int]) -> list[int]:
    """Cut generated ids after the first EOS (kept). Generate pads only finished rows, so this also
    drops the padding."""
    for i, tok in enumerate(ids):
        if tok in eos_ids:
            return ids[: i + 1]
    return ids


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids and (B, T) attention mask, shorter prompts padded on the left."""
    T = max(len(s) for s in seqs)
    ids = torch.tensor([[pad_id] * (T - len(s)) + s for s in seqs], dtype=torch.long)
    mask = torch.tensor([[0] * (T - len(s)) + [1] * len(s) for s in seqs], dtype=torch.long)
    return ids, mask


def _pad_id(target) -> int:
    pad = target.tokenizer.pad_token_id
    return pad if pad is not None else min(target.eos_ids)


def generate_batch(target, seqs: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy responses of the target to a batch of prompt ids, each trimmed after its first EOS."""
    ids, mask = left_pad(seqs, _pad_id(target))  # (B, T)
    eos = sorted(target.eos_ids)
    with torch.inference_mode():
        out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                    max_new_tokens=max_new_tokens, do_sample=False, top_p=None, top_k=None,
                                    temperature=None, pad_token_id=_pad_id(target), eos_token_id=eos)
    new = out[:, ids.shape[1]:].tolist()  # (B, <= max_new_tokens)
    return [trim_response(row, target.eos_ids) for row in new]


REGEN_RECORDED = ("batch_size",)  # header keys kept as a record, not compared on resume


def regen_settings(target, prompts: list[dict], max_new_tokens: int, max_prompt_tokens: int,
                   extra: dict | None = None) -> dict:
    """The header of a regeneration file: what its rows depend on (model, dtype, token limits, the
    prompt set's ids and text by hash, the chat template's switches when there are any, e.g. thinking off, and
    ``extra``, e.g. the seed and n that drew the prompts)."""
    digest = hashlib.sha256(json.dumps([[str(p["id"]), p["prompt"]] for p in prompts]).encode("utf-8"))
    return {"model": target.name, "dtype": str(target.dtype).removeprefix("torch."),
            "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
            "prompts": len(prompts), "prompts_sha256": digest.hexdigest(),
            **({"chat_kwargs": dict(chat)} if (chat := getattr(target, "chat_kwargs", None)) else {}), **(extra or {})}


def split_settings_header(path: Path, rows: list[dict]) -> tuple[dict | None, list[dict]]:
    """(settings header or None for a file written before headers, answer rows)."""
    if rows and "settings" in rows[0]:
        return rows[0]["settings"], rows[1:]
    bad = next((i for i, r in enumerate(rows) if "settings" in r or "id" not in r), None)
    if bad is not None:
        raise ValueError(f"{path}, row {bad + 1}: not a regenerated answer; move the file away to start over")
    return None, rows


def _done_ids(path: Path, settings: dict) -> set[str]:
    """Ids already answered in ``path`` under the same settings (a torn last line is cut off the file);
    the header is written when the file is new. Other settings are refused: resuming would mix data."""
    header, rows = split_settings_header(path, jsonl.read(path))
    if header is None and not rows:
        jsonl.append(path, [{"settings": settings}])
        return set()
    if header is None:
        raise ValueError(f"{path} holds answers without a settings header (an older jetflow wrote it), so "
                         "resuming could mix settings; move it away or choose another --out")
    keys = sorted((header.keys() | settings.keys()) - set(REGEN_RECORDED))
    changed = [f"{k}: {header.get(k)!r} -> {settings.get(k)!r}" for k in keys if header.get(k) != settings.get(k)]
    if changed:
        raise ValueError(f"{path} was regenerated with other settings ({'; '.join(changed)}); resume with the "
                         "same settings, or choose another --out")
    return {str(row["id"]) for row in rows}


def _encode_todo(target, prompts: list[dict], done: set[str], max_prompt_tokens: int) -> list[tuple[str, list[int]]]:
    """(id, prompt ids) of the prompts still to answer, longest first; too-long prompts skipped."""
    ids = [str(p["id"]) for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt ids must be unique")
    todo, too_long = [], 0
    for pid, p in zip(ids, prompts):
        if pid in done:
            continue
        enc = target.encode(p["prompt"]).tolist()
        if len(enc) > max_prompt_tokens:
            too_long += 1
        else:
            todo.append((pid, enc))
    if too_long:
        log.warning("skipped %d prompts longer than max_prompt_tokens=%d", too_long, max_prompt_tokens)
    return sorted(todo, key=lambda item: -len(item[1]))  # stable: ties keep prompt order


def regenerate(target, prompts: list[dict], out_path: str | os.PathLike, *, batch_size: int = 16,
               max_new_tokens: int = 192, max_prompt_tokens: int = 512, progress: bool = True,
               settings: dict | None = None) -> Path:
    """Answer every prompt greedily with the target (through its chat template) and append one line
    ``{"id", "prompt_ids", "response_ids"}`` per prompt to ``out_path``, fsynced after each batch.

    The first line is a settings header (``regen_settings``; ``settings`` adds e.g. the seed). Rerunning
    resumes: ids already in the file are skipped; other settings, or a second writer, are refused.
    Prompts are sorted by length (longest first) so each left-padded batch wastes little; response_ids
    end at the first EOS (included)."""
    if batch_size < 1 or max_new_tokens < 1 or max_prompt_tokens < 1:
        raise ValueError(f"batch_size, max_new_tokens and max_prompt_tokens must be >= 1, "
                         f"got {batch_size}, {max_new_tokens}, {max_prompt_tokens}")
    out_path = Path(out_path)
    header = regen_settings(target, prompts, max_new_tokens, max_prompt_tokens, settings) | {"batch_size": batch_size}
    with jsonl.locked(out_path):
        todo = _encode_todo(target, prompts, _done_ids(out_path, header), max_prompt_tokens)
        bar = tqdm(total=len(todo), unit="prompt", desc="regenerate", disable=not progress)
        tokens, start = 0, time.perf_counter()
        for b in range(0, len(todo), batch_size):
            batch = todo[b:b + batch_size]
            responses = generate_batch(target, [enc for _, enc in batch], max_new_tokens)
            jsonl.append(out_path, [{"id": pid, "prompt_ids": enc, "response_ids": resp}
                                    for (pid, enc), resp in zip(batch, responses)])
            tokens += sum(len(r) for r in responses)
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.1f}")
        bar.close()
    return out_path


def regenerate_files(cfg: RegenerateConfig) -> None:
    """``python -m jetflow regenerate``: draw the prompts, then answer them into each file of the
    regeneration in turn (a part another process is writing is left to it), each followed by its
    ``.meta.json`` (the command that remakes it, read by training provenance)."""
    checks.positive(batch_size=cfg.batch_size, max_new_tokens=cfg.max_new_tokens,
                    max_prompt_tokens=cfg.max_prompt_tokens, chunks=cfg.chunks)
    if cfg.n < 0:
        raise SystemExit(f"--n must be >= 0 (0: the whole pool), got {cfg.n}")
    out = Path(cfg.out) if cfg.out else default_regen_out(cfg)
    files = chunk_files(out, cfg.chunks)
    if cfg.chunks > 1:
        checks.writable_dir(out, "--out")
    checks.writable_file(files[0], "--out")
    checks.data_source(cfg.data_dir)
    draw = (lambda: training_pool(seed=cfg.seed, data_dir=cfg.data_dir)) if cfg.n == 0 else \
        (lambda: training_prompts(cfg.n, seed=cfg.seed, data_dir=cfg.data_dir))
    prompts = checks.prompt_source(draw)
    target = load_target(cfg.model, dtype=cfg.dtype, device=cfg.device, thinking=cfg.thinking)
    busy = []
    for index, path in enumerate(files):
        part = {"chunk": index, "chunks": cfg.chunks} if cfg.chunks > 1 else {}
        try:
            regenerate(target, chunk(prompts, index, cfg.chunks), path, batch_size=cfg.batch_size,
                       max_new_tokens=cfg.max_new_tokens, max_prompt_tokens=cfg.max_prompt_tokens,
                       settings={"seed": cfg.seed, "n": cfg.n} | part)
        except jsonl.Busy:
            if cfg.chunks == 1:
                raise
            busy.append(path.name)  # several processes share the parts: each takes the next free one
            print(f"{path.name} is being written by another process: on to the next part", flush=True)
            continue
        meta = path.with_name(path.name + ".meta.json")  # read by training provenance
        meta.write_text(json.dumps({"command": regenerate_command(cfg, out)}) + "\n")
        print(path, flush=True)
    if busy:
        print(f"left to the other process(es): {', '.join(busy)}; rerun this command once they are done to check "
              "every part is complete", flush=True)


# ---------------------------------------------------------------- reading answers back
def load_regenerated(path: str | os.PathLike, *, tensors: bool = False) -> list[dict]:
    """Rows written by ``regenerate``, its settings header left out (an unterminated last line is
    ignored, the file is not changed); with ``tensors`` the id lists become 1-D long tensors."""
    _, rows = split_settings_header(Path(path), jsonl.read(path, repair=False))
    if tensors:
        for row in rows:
            row["prompt_ids"] = torch.tensor(row["prompt_ids"], dtype=torch.long)
            row["response_ids"] = torch.tensor(row["response_ids"], dtype=torch.long)
    return rows


def part_of(path: str | os.PathLike) -> tuple[int, int] | None:
    """(K, N) of a chunked regeneration's ``part-KK-of-NN.jsonl``; None for a file that is not a part."""
    m = re.fullmatch(r"part-(\d+)-of-(\d+)\.jsonl", Path(path).name)
    return None if m is None else (int(m[1]), int(m[2]))


def is_last_part(path: str | os.PathLike) -> bool:
    """Whether a data file is the last part of its regeneration (K = N - 1), whatever parts exist beside it
    yet; a file that is not a part is its own last part."""
    part = part_of(path)
    return part is None or part[0] == part[1] - 1


def data_files(data: str | os.PathLike, parts: int = 0) -> list[Path]:
    """The regenerated files behind ``data``: the file itself, or of a chunked folder (``regenerate
    --chunks K``) its first ``parts`` part files in order (0: all). Parts 0..k-1 hold the first k/K of
    the prompts, so ``parts`` picks a nested data size."""
    data = Path(data)
    if parts < 0:
        raise ValueError(f"parts must be >= 0 (0: all), got {parts}")
    if data.is_file():
        if parts > 1:
            raise ValueError(f"{data} is one file; --parts {parts} needs a chunked folder (regenerate --chunks K)")
        return [data]
    if not data.is_dir():
        raise FileNotFoundError(f"data {str(data)!r} does not exist; make it with `python -m jetflow regenerate`")
    files = sorted(data.glob("part-*-of-*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{data} holds no part-KK-of-NN.jsonl files (python -m jetflow regenerate --chunks K)")
    if parts > len(files):
        raise ValueError(f"{data} holds {len(files)} part files, --parts {parts} asked for more")
    return files[:parts or len(files)]


# ---------------------------------------------------------------- the data by content
def files_sha256(files: list[Path]) -> str:
    """The data by content: one file's sha256, or of several files the sha256 of their sha256s."""
    if len(files) == 1:
        return data_sha256(files[0])
    return hashlib.sha256("\n".join(data_sha256(f) for f in files).encode()).hexdigest()


def data_sha256(path: str | Path) -> str:
    """sha256 of a data file (resume and provenance identify the data by content, not by path)."""
    path = Path(path)
    stat = path.stat()
    return _sha256_of(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

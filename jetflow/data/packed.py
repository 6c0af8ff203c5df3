"""Regenerated token ids in a compact form to publish, and back (docs/scale.md).

    pack("~/.cache/jetflow/regen-.../", "ids/")     # one compressed .npz per part + provenance.json
    unpack("ids/", "regen/")                        # the JSONL files again, byte for byte (sha256 checked)

Each ``.npz`` holds ``tokens`` (every row's prompt then response ids, concatenated; uint16 when the
vocabulary fits, else uint32), ``prompt_len`` and ``response_len`` (int32 per row), ``ids`` (the prompt
ids, unicode) and ``header`` (the settings header as JSON text). ``provenance.json`` names the command
that regenerated the data, each file's sha256 before packing and after, its rows per prompt source, and
where each source comes from and under which licence. Each packed file must stay at most ``MAX_BYTES``.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np

from jetflow.util import jsonl
from .regenerate import data_files, split_settings_header

MAX_BYTES = 25 * 1024 * 1024
MODEL_NOTE = ("The answers were written by the target model (SmolLM2-135M-Instruct by Hugging Face, Apache-2.0, "
              "for the embedded default), greedily, through its chat template; see each file's settings header.")
# The prompt sets behind each id prefix: what they are, where they come from and their licence, after the
# offline data folder's README (which records the exact commits and files).
SOURCES = {
    "gsm8k-train": ("GSM8K training questions (Cobbe et al., 2021)", "openai/grade-school-math", "MIT"),
    "hh-rlhf-helpful-base-test": ("first human turns of Anthropic's hh-rlhf helpful-base test split",
                                  "anthropics/hh-rlhf (a verified copy)", "MIT"),
    "arena-hard-v2.0": ("Arena-Hard v2.0 questions, used as training prompts", "lmarena/arena-hard-auto", "Apache-2.0"),
    "arena-hard-v0.1": ("Arena-Hard v0.1 questions, used as training prompts", "lmarena/arena-hard-auto", "Apache-2.0"),
    "self-instruct-user-oriented": ("Self-Instruct's user-oriented instructions", "yizhongw/self-instruct",
                                    "Apache-2.0"),
    "self-instruct-seed": ("Self-Instruct's seed tasks", "yizhongw/self-instruct", "Apache-2.0"),
    "vicuna-bench": ("Vicuna-Bench questions (first turn)", "lm-sys/FastChat", "Apache-2.0"),
    "gpteacher-codegen": ("GPTeacher code instructions (written by GPT-4)", "teknium1/GPTeacher", "MIT"),
    "mbpp-train": ("MBPP training tasks 601-974 in the Austin et al. prompt format",
                   "google-research mbpp (via an OpenCompass mirror)", "CC-BY-4.0"),
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_of(prompt_id: str) -> str:
    """The prompt set of a regenerated row's id (``gsm8k-train:12`` -> ``gsm8k-train``)."""
    return str(prompt_id).split(":")[0]


def pack_file(path: Path, out: Path) -> dict:
    """One regenerated JSONL -> ``out`` (.npz); -> its provenance entry."""
    header, rows = _header_and_rows(path)
    seqs = [list(r["prompt_ids"]) + list(r["response_ids"]) for r in rows]
    top = max((max(s) for s in seqs if s), default=0)
    tokens = np.fromiter((t for s in seqs for t in s), dtype=np.uint16 if top < 2 ** 16 else np.uint32)
    np.savez_compressed(out, tokens=tokens, prompt_len=np.array([len(r["prompt_ids"]) for r in rows], np.int32),
                        response_len=np.array([len(r["response_ids"]) for r in rows], np.int32),
                        ids=np.array([str(r["id"]) for r in rows]), header=np.array(json.dumps(header)))
    size = out.stat().st_size
    if size > MAX_BYTES:
        out.unlink()
        raise ValueError(f"{path.name} packs to {size} bytes, over {MAX_BYTES}; regenerate in more --chunks")
    return {"file": path.name, "packed": out.name, "sha256": _sha256(path), "packed_sha256": _sha256(out),
            "bytes": path.stat().st_size, "packed_bytes": size, "rows": len(rows), "tokens": int(tokens.size),
            "settings": header, "sources": dict(Counter(source_of(r["id"]) for r in rows).most_common())}


def _header_and_rows(path: Path) -> tuple[dict | None, list[dict]]:
    return split_settings_header(path, jsonl.read(path, repair=False))


def pack(data: str | Path, out: str | Path, parts: int = 0) -> Path:
    """Pack a regenerated file or the first ``parts`` files of a chunked folder into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = data_files(data, parts)
    entries = [pack_file(f, out / f"{f.name.removesuffix('.jsonl')}.npz") for f in files]
    meta = files[0].with_name(files[0].name + ".meta.json")
    used = sorted({s for e in entries for s in e["sources"]})
    prov = {"command": json.loads(meta.read_text()).get("command") if meta.is_file() else None,
            "model": MODEL_NOTE, "files": entries,
            "sources": {s: dict(zip(("what", "origin", "licence"), SOURCES.get(s, ("unknown", "unknown", "unknown"))))
                        for s in used},
            "unpack": "python -m jetflow unpack --packed DIR --out DIR"}
    (out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    return out


def unpack(packed: str | Path, out: str | Path) -> list[Path]:
    """Write the JSONL files of a packed folder into ``out`` (and their ``.meta.json``), each checked
    against the sha256 it had before packing; a file already there with that sha256 is left as it is (so
    unpacking into a live regeneration folder rewrites nothing that a training run may be reading)."""
    packed, out = Path(packed), Path(out)
    prov_path = packed / "provenance.json"
    if not prov_path.is_file():
        raise FileNotFoundError(f"{packed} holds no provenance.json: not a folder written by `jetflow pack`")
    prov = json.loads(prov_path.read_text())
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for entry in prov["files"]:
        path = out / entry["file"]
        meta = path.with_name(path.name + ".meta.json")
        if path.is_file() and (meta.is_file() or not prov.get("command")) and _sha256(path) == entry["sha256"]:
            written.append(path)
            continue
        with np.load(packed / entry["packed"]) as z:
            header, ids = json.loads(str(z["header"])), z["ids"].tolist()
            tokens, plen, rlen = z["tokens"].tolist(), z["prompt_len"].tolist(), z["response_len"].tolist()
        ends = np.cumsum([p + r for p, r in zip(plen, rlen)]).tolist()
        rows = [{"id": i, "prompt_ids": tokens[e - p - r:e - r], "response_ids": tokens[e - r:e]}
                for i, p, r, e in zip(ids, plen, rlen, ends)]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in ([{"settings": header}] if header else []) + rows))
        if _sha256(tmp) != entry["sha256"]:
            tmp.unlink()
            raise ValueError(f"{entry['packed']} does not unpack to the file it was packed from (sha256 differs)")
        tmp.replace(path)
        if prov.get("command"):
            meta.write_text(json.dumps({"command": prov["command"]}) + "\n")
        written.append(path)
    return written

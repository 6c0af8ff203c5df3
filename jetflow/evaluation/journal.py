"""The resume journal of a bench: every finished prompt's runs appended to a JSON-lines file
(``jetflow.util.jsonl``), so that rerunning an interrupted bench decodes only what is missing.

It stores ``PromptRun``s (``jetflow.engine.metrics``: what one prompt decoded by one variant leaves, tokens,
decode tokens and seconds, prefill, ``RoundStat`` per round). The header line holds the settings a resumed
run must share (``RESUME_KEYS``) and a record of the rest; a head's weights are identified by
``head_fingerprint``, a prompt's text by ``text_sha``.
"""
from __future__ import annotations

import hashlib
import os
import platform
from collections.abc import Mapping
from pathlib import Path

import torch
import transformers

from jetflow.util import jsonl
from jetflow.engine.metrics import PromptRun
from jetflow.engine.target import Target


def head_fingerprint(proposer) -> str | None:
    """sha256 (first 16 hex digits) of a head proposer's weights; None for proposers without a head."""
    head = getattr(proposer, "head", None)
    if head is None:
        return None
    digest = hashlib.sha256()
    for name, tensor in sorted(head.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


RESUME_KEYS = ("model", "dtype", "device", "max_new_tokens", "temperature", "chat_kwargs")


class Journal:
    """The measured runs of a bench, appended prompt by prompt to a JSON-lines file, so that rerunning an
    interrupted bench resumes instead of starting over.

    Line 1 holds the settings that must not change between the parts of one run (new tokens, temperature,
    dtype, device, model); each further line one run: dataset, prompt index and id, configuration
    (``method@budget``), head fingerprint and the run. A prompt's runs are written together once all its
    configurations are done, so a prompt is either skipped whole or decoded again whole: AR and the
    other methods of one prompt always come from the same stretch of time. Adding methods or budgets
    later reruns every prompt that lacks one of them."""

    def __init__(self, path: str | os.PathLike, settings: Mapping):
        self.path, self.settings = Path(path), dict(settings)
        self.runs: dict[tuple[str, int], dict[str, dict]] = {}
        try:
            lines = jsonl.read(self.path)  # a line torn by a kill is cut off the file here, with a warning
        except ValueError as err:
            raise ValueError(f"{err} (it is not a bench journal; move it away or choose another --out)") from None
        if not lines:
            return
        header = lines[0].get("settings")
        if not isinstance(header, dict):
            raise ValueError(f"{self.path} is not a bench journal; move it away or choose another --out")
        self._check_header(header)
        for n, entry in enumerate(lines[1:], start=2):
            if not {"dataset", "index", "config", "id", "head", "run"} <= entry.keys():
                raise ValueError(f"{self.path}, line {n}: not a journaled run; move the file away to start over")
            self.runs.setdefault((entry["dataset"], entry["index"]), {})[entry["config"]] = entry

    def _check_header(self, header: Mapping) -> None:
        """Refuse to resume under settings that change results (``RESUME_KEYS``); the other header keys
        (versions, hardware, threads, prompt hashes) are a record, not a condition."""
        keys = [k for k in RESUME_KEYS if k in self.settings]
        missing = [k for k in keys if k not in header]
        if missing:
            raise ValueError(f"{self.path} was written by an older jetflow that did not record {', '.join(missing)}; "
                             "delete it to measure afresh or choose another --out")
        changed = {k: (header[k], self.settings[k]) for k in keys if header[k] != self.settings[k]}
        if changed:
            diff = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
            raise ValueError(f"{self.path} was measured with other settings ({diff}); delete it to start over "
                             f"or choose another --out")

    def done(self, dataset: str, index: int, prompt_id, needed: Mapping[str, str | None],
             sha: str | None = None) -> dict[str, PromptRun] | None:
        """The journaled runs of one prompt, keyed by configuration, if ``needed`` (configuration -> head
        fingerprint) are all there; None if the prompt must be decoded (again). ``sha``: the prompt
        text's hash (``text_sha``), checked against the journaled one."""
        have = self.runs.get((dataset, index), {})
        if any(e["id"] != prompt_id or (sha and e.get("sha", sha) != sha) for e in have.values()):
            raise ValueError(f"{self.path}: prompt {index} of {dataset!r} was {next(iter(have.values()))['id']!r}, "
                             f"now {prompt_id!r} (or its text changed); the prompts changed, so delete the journal "
                             "or choose another --out")
        stale = [c for c, fp in needed.items() if c in have and have[c]["head"] != fp]
        if stale:
            raise ValueError(f"{self.path}: {', '.join(stale)} on {dataset!r} was measured with another head; "
                             f"delete the journal to measure the new head, or choose another --out")
        if not all(c in have for c in needed):
            return None
        return {c: PromptRun.from_json(have[c]["run"]) for c in needed}

    def record(self, dataset: str, index: int, prompt_id, runs: Mapping[str, tuple[str | None, PromptRun]],
               sha: str | None = None) -> None:
        """Append one prompt's runs (configuration -> (head fingerprint, run)) in one write, fsynced."""
        new = not self.path.exists() or self.path.stat().st_size == 0
        lines = [{"settings": self.settings}] if new else []
        for config, (fp, run_) in runs.items():
            entry = {"dataset": dataset, "index": index, "id": prompt_id, "config": config, "head": fp,
                     "run": run_.to_json(), **({"sha": sha} if sha else {})}
            lines.append(entry)
            self.runs.setdefault((dataset, index), {})[config] = entry
        jsonl.append(self.path, lines)


def text_sha(text: str) -> str:
    """First 16 hex digits of the sha256 of a prompt's text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def journal_settings(target: Target, max_new_tokens: int, temperature: float, prompts_by_dataset) -> dict:
    """A journal's header: what changes results (``RESUME_KEYS``: compared on resume), then a record of
    the prompt texts' hashes, versions, hardware and threads (kept, not compared)."""
    from jetflow.util import hardware as hw
    return {"model": target.name, "dtype": str(target.dtype).removeprefix("torch."), "device": target.device.type,
            "max_new_tokens": max_new_tokens, "temperature": temperature, "chat_kwargs": dict(target.chat_kwargs),
            "prompt_sha": {ds: [text_sha(p["prompt"]) for p in ps] for ds, ps in prompts_by_dataset.items()},
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "python": platform.python_version()},
            "hardware": hw.describe(), "threads": torch.get_num_threads()}

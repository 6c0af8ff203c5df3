"""Benchmarks: every method on the same prompts, interleaved, returned as rows of plain dicts.

    rows = run(target, ["ar", "lookup"], {"gsm8k": load_prompts("gsm8k", limit=4)}, [16, 64])
    print(to_markdown(rows)); write(rows, "data/results/cpu")

One row per method x dataset x budget; the budget-free methods (``ar``, ``hf``, ``hf-lookup``) get
one row with budget None. AR always runs: it is the reference. Prompts are interleaved: every
configuration decodes prompt i back to back, AR first, before prompt i+1 starts, so machine drift
hits all configurations alike. A configuration's decode speed is its total decode tokens over its
total decode seconds, and its speedup that speed over AR's on the same prompts in the same run;
prefill is excluded and reported apart. ``hf`` and ``hf-lookup`` time transformers' own
``generate`` (plain greedy or sampling; ``prompt_lookup_num_tokens=10``), where prefill cannot be
separated: their decode_s is the total time and their tokens/s counts every new token.

A proposer whose trees stop growing at ``max_drafts`` nodes (a ``dflash`` chain: N-1; ``lookup``: its
matches x length) runs once for all budgets past that size; those rows share the runs (and say so in
``note``) instead of decoding identical trees again.

Long benches resume: with ``journal=FILE`` (the CLI's ``--out DIR`` uses ``DIR/runs.jsonl``) every
finished prompt is appended to FILE, and a rerun of the same command decodes only the prompts that are
not there yet (``Journal``).

``run_auto`` picks each tree method's budget with ``budget.py`` first. ``PRESETS`` name whole setups
(``cpu``, ``qwen3-8b``); ``resolve_preset`` -> ``prompt_sets`` -> ``run_settings`` is the CLI path.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, field
from pathlib import Path

import torch
import transformers
from tqdm.auto import tqdm

from . import data, jsonl
from .decode import Round, check_temperature, generate
from .proposers import HEAD_METHODS, LOOKUP_MERGED, METHODS, make_proposer
from .target import DTYPES, Target

CONVENTIONS = ("tau = mean tokens committed per round including the bonus token; budget = draft nodes "
               "excluding the root; speedup = decode tokens/s over AR in the same run, prefill excluded")
HF_METHODS = {"hf": {}, "hf-lookup": {"prompt_lookup_num_tokens": 10}}  # method -> extra generate kwargs
HF_NOTE = "transformers generate: prefill not separable, decode_s is the total time"
CHAIN_NOTE = "its trees stop growing below this budget: the same runs as budget {}"
BUDGET_FREE = ("ar", *HF_METHODS)
ALL_METHODS = ("ar", *HF_METHODS, *(m for m in METHODS if m != "ar"))


# ----------------------------------------------------------------------------- aggregation (pure)
@dataclass(frozen=True)
class RoundStat:
    """What the row statistics need of one round: a ``Round`` without its tree (small enough to journal)."""
    committed: int   # tokens committed, bonus included
    accepted: int    # draft tokens accepted
    verified: int    # tree nodes the target verified, root included
    deepest: int     # deepest drafted depth (0 for the root alone)
    chances: int     # leading accepted nodes, root first, that had a drafted child

    @classmethod
    def of(cls, r: Round | RoundStat) -> RoundStat:
        if isinstance(r, RoundStat):
            return r
        parents = set(r.tree.parents.tolist())
        chances = next((i for i, node in enumerate(r.path) if node not in parents), len(r.path))
        return cls(len(r.committed), r.accepted, len(r.tree), int(r.tree.depth.max()), chances)


def tau(rounds: Sequence[Round | RoundStat]) -> float | None:
    """Mean tokens committed per round, bonus included; None without rounds (hf)."""
    return sum(RoundStat.of(r).committed for r in rounds) / len(rounds) if rounds else None


def tau_hist(rounds: Sequence[Round | RoundStat]) -> dict[int, int]:
    """Tokens committed in a round -> number of such rounds, ascending."""
    return dict(sorted(Counter(RoundStat.of(r).committed for r in rounds).items()))


def depth_accept(rounds: Sequence[Round | RoundStat]) -> list[float | None]:
    """Entry d-1: of the rounds that accepted depth d-1 and drafted a child of that accepted node,
    the fraction that accepted depth d (None where no round had that chance)."""
    stats = [RoundStat.of(r) for r in rounds]
    deepest = max((s.deepest for s in stats), default=0)
    tried, hit = [0] * deepest, [0] * deepest
    for s in stats:
        for d in range(1, min(s.chances, deepest) + 1):
            tried[d - 1] += 1
            hit[d - 1] += s.accepted >= d
    return [h / t if t else None for h, t in zip(hit, tried)]


def verify_tokens(rounds: Sequence[Round | RoundStat]) -> float | None:
    """Mean tokens the target verified per round (tree nodes including the root)."""
    return sum(RoundStat.of(r).verified for r in rounds) / len(rounds) if rounds else None


def throughput(tokens: int, seconds: float) -> float | None:
    """Tokens per second; None when nothing was timed (e.g. max_new_tokens=1 leaves no round)."""
    return tokens / seconds if seconds > 0 else None


def speedup(tokens: int, seconds: float, ar_tokens: int, ar_seconds: float) -> float | None:
    """(tokens / seconds) / (ar_tokens / ar_seconds): totals over the same prompts, then the ratio."""
    rate, ar_rate = throughput(tokens, seconds), throughput(ar_tokens, ar_seconds)
    return rate / ar_rate if rate is not None and ar_rate else None


@dataclass
class Run:
    """One prompt decoded by one configuration."""
    tokens: list[int]          # generated ids
    decode_tokens: int         # tokens produced inside the timed decode region
    decode_s: float
    prefill_s: float | None    # None where not separable (hf)
    rounds: list[RoundStat] = field(default_factory=list)  # empty for hf

    def to_json(self) -> dict:
        return {"tokens": self.tokens, "decode_tokens": self.decode_tokens, "decode_s": self.decode_s,
                "prefill_s": self.prefill_s, "rounds": [astuple(r) for r in self.rounds]}

    @classmethod
    def from_json(cls, d: Mapping) -> Run:
        return cls(list(d["tokens"]), d["decode_tokens"], d["decode_s"], d["prefill_s"],
                   [RoundStat(*r) for r in d["rounds"]])


def summarize(runs: Sequence[Run], ar_runs: Sequence[Run]) -> dict:
    """Row statistics of one configuration against the AR runs of the same prompts."""
    rounds = [r for run in runs for r in run.rounds]
    tokens, secs = sum(r.decode_tokens for r in runs), sum(r.decode_s for r in runs)
    ar_tokens, ar_secs = sum(r.decode_tokens for r in ar_runs), sum(r.decode_s for r in ar_runs)
    prefill = [r.prefill_s for r in runs]
    return {"n_prompts": len(runs), "new_tokens": sum(len(r.tokens) for r in runs), "tau": tau(rounds),
            "tau_hist": tau_hist(rounds), "depth_accept": depth_accept(rounds),
            "verify_tokens": verify_tokens(rounds),
            "prefill_s": None if None in prefill else sum(prefill), "decode_s": secs,
            "tokens_per_s": throughput(tokens, secs), "speedup": speedup(tokens, secs, ar_tokens, ar_secs),
            "identical_to_ar": sum(a.tokens == b.tokens for a, b in zip(runs, ar_runs))}


# ----------------------------------------------------------------------------- environment
def hardware() -> str:
    """CPU model and core count, plus the GPU name when CUDA is present."""
    cpu = platform.processor() or platform.machine()
    try:
        names = [l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                 if l.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    text = f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    if torch.cuda.is_available():
        text += f"; GPU {torch.cuda.get_device_name()}"
    return text


def environment(target: Target) -> dict:
    return {"dtype": str(target.dtype).removeprefix("torch."), "device": str(target.device),
            "torch": torch.__version__, "transformers": transformers.__version__, "hardware": hardware()}


# ----------------------------------------------------------------------------- running
@dataclass
class Config:
    method: str
    budget: int | None         # None for budget-free methods
    proposer: object = None    # None for ar and hf methods
    same_as: int | None = None  # index of an earlier config drafting the very same trees (not rerun)


def head_for(method: str, heads: Mapping[str, str] | None) -> str | None:
    """The head path of a head method: ``heads`` is keyed by head kind (ddtree uses the dflash head)."""
    method = LOOKUP_MERGED.get(method, method)
    return (heads or {}).get(HEAD_METHODS[method][0]) if method in HEAD_METHODS else None


def configs(target: Target, methods: Sequence[str], budgets, heads=None) -> list[Config]:
    """AR first, then each method in the given order; ``budgets`` is a list or method -> list."""
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(ALL_METHODS)}")
    out = [Config("ar", None)]
    for m in dict.fromkeys(methods):
        if m in HF_METHODS:
            out.append(Config(m, None))
        elif m != "ar":
            sizes = list(budgets.get(m, ()) if isinstance(budgets, Mapping) else budgets)
            if not sizes or any(not isinstance(b, int) or b < 1 for b in sizes):
                raise ValueError(f"method {m!r} needs budgets >= 1, got {sizes}")
            proposer = make_proposer(m, target, head=head_for(m, heads))
            first: dict[int, int] = {}  # effective budget -> index of its config
            for b in sizes:
                eff = _effective_budget(m, proposer, b)
                out.append(Config(m, b, proposer, first.get(eff)))
                first.setdefault(eff, len(out) - 1)
    return out


def _effective_budget(method: str, proposer, budget: int) -> int:
    """Budgets past the proposer's ``max_drafts`` (a chain: N-1; lookup: matches x length) draft the
    same trees."""
    cap = getattr(proposer, "max_drafts", None)
    return budget if cap is None else min(budget, cap)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_generate(target: Target, ids: torch.Tensor, max_new_tokens: int, temperature: float,
                seed: int | None, **extra) -> Run:
    """transformers ``generate`` on the same ids and stop tokens, timed end to end."""
    inp = ids[None].to(target.device)
    if temperature > 0:  # plain softmax sampling, as in our loop
        mode = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        mode = dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    if seed is not None:
        torch.manual_seed(seed)
    eos = sorted(target.eos_ids)
    _sync(target.device)
    t0 = time.perf_counter()
    out = target.model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=max_new_tokens,
                                eos_token_id=eos, pad_token_id=eos[0], **mode, **extra)
    _sync(target.device)
    seconds = time.perf_counter() - t0
    tokens = out[0, ids.numel():].tolist()
    return Run(tokens, len(tokens), seconds, None)


def run_config(target: Target, cfg: Config, ids: torch.Tensor, max_new_tokens: int, temperature: float,
               seed: int | None) -> Run:
    """Decode one prompt (1-D ids) with one configuration."""
    if cfg.method in HF_METHODS:
        return hf_generate(target, ids, max_new_tokens, temperature, seed, **HF_METHODS[cfg.method])
    res = generate(target, ids, cfg.proposer, budget=cfg.budget or 1, max_new_tokens=max_new_tokens,
                   temperature=temperature, seed=seed)
    return Run(res.tokens, sum(len(r.committed) for r in res.rounds), res.decode_s, res.prefill_s,
               [RoundStat.of(r) for r in res.rounds])


def _encode_all(target: Target, prompts_by_dataset, room: int) -> dict[str, list[torch.Tensor]]:
    """Token ids of every prompt; fails before any timing if one leaves no room for decoding."""
    out = {}
    for ds, prompts in prompts_by_dataset.items():
        if not prompts:
            raise ValueError(f"dataset {ds!r} has no prompts")
        out[ds] = [target.encode(p["prompt"]) for p in prompts]
        for p, ids in zip(prompts, out[ds]):
            if ids.numel() + room > target.max_context:
                raise ValueError(f"prompt {p.get('id', '?')!r} ({ids.numel()} tokens) + {room} tokens of "
                                 f"decoding exceeds the model's context of {target.max_context}")
    return out


# ----------------------------------------------------------------------------- resume
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
             sha: str | None = None) -> dict[str, Run] | None:
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
        return {c: Run.from_json(have[c]["run"]) for c in needed}

    def record(self, dataset: str, index: int, prompt_id, runs: Mapping[str, tuple[str | None, Run]],
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
    from . import hardware as hw
    return {"model": target.name, "dtype": str(target.dtype).removeprefix("torch."), "device": target.device.type,
            "max_new_tokens": max_new_tokens, "temperature": temperature, "chat_kwargs": dict(target.chat_kwargs),
            "prompt_sha": {ds: [text_sha(p["prompt"]) for p in ps] for ds, ps in prompts_by_dataset.items()},
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "python": platform.python_version()},
            "hardware": hw.describe(), "threads": torch.get_num_threads()}


def run(target: Target, methods: Sequence[str], prompts_by_dataset: Mapping[str, Sequence[dict]], budgets, *,
        max_new_tokens: int = 256, heads: Mapping[str, str] | None = None, temperature: float = 0.0,
        progress: bool = True, warmup: bool = True, journal: str | os.PathLike | None = None) -> list[dict]:
    """Benchmark rows, one per configuration x dataset (see the module docstring).

    ``prompts_by_dataset``: dataset -> [{"id", "prompt"}, ...]; ``budgets``: list of ints or
    method -> list; ``heads``: head kind (jetflow, dflash) -> directory or hub id; ``warmup`` decodes
    a few untimed tokens of the first prompt with every configuration first; ``journal``: a JSON-lines
    file that records every finished prompt and lets a rerun resume (see ``Journal``).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_temperature(temperature)
    cfgs = configs(target, methods, budgets, heads)
    encoded = _encode_all(target, prompts_by_dataset, max_new_tokens + max(c.budget or 1 for c in cfgs) + 1)
    ids_of = {ds: [p.get("id", i) for i, p in enumerate(ps)] for ds, ps in prompts_by_dataset.items()}
    todo = {k: cfg for k, cfg in enumerate(cfgs) if cfg.same_as is None}
    names = {k: cfg.method if cfg.budget is None else f"{cfg.method}@{cfg.budget}" for k, cfg in todo.items()}
    by_proposer = {id(cfg.proposer): head_fingerprint(cfg.proposer) for cfg in todo.values()}  # hash each head once
    prints = {k: by_proposer[id(cfg.proposer)] for k, cfg in todo.items()}
    with jsonl.locked(journal) if journal is not None else contextlib.nullcontext():
        book = None if journal is None else Journal(
            journal, journal_settings(target, max_new_tokens, temperature, prompts_by_dataset))
        shas = {ds: [text_sha(p["prompt"]) for p in ps] for ds, ps in prompts_by_dataset.items()}
        needed = {names[k]: prints[k] for k in todo}
        resumed = {(ds, i): got for ds in encoded for i in range(len(encoded[ds]))
                   if book and (got := book.done(ds, i, ids_of[ds][i], needed, shas[ds][i])) is not None}
        if warmup and len(resumed) < sum(map(len, encoded.values())):
            first = next(iter(encoded.values()))[0]
            for cfg in todo.values():
                run_config(target, cfg, first, min(4, max_new_tokens), temperature, 0)
        runs: dict[tuple[str, int], list[Run]] = {(ds, k): [] for ds in encoded for k in range(len(cfgs))}
        bar = tqdm(total=sum(map(len, encoded.values())) * len(todo), disable=not progress, unit="gen")
        if resumed:
            tqdm.write(f"resuming from {journal}: {len(resumed)} prompt(s) already measured", file=sys.stderr)
        for ds, prompts in encoded.items():
            for i, ids in enumerate(prompts):
                done = resumed.get((ds, i))
                for k, cfg in todo.items():
                    if done is None:
                        bar.set_description(f"{names[k]} {ds} prompt {i + 1}/{len(prompts)}")
                        runs[ds, k].append(run_config(target, cfg, ids, max_new_tokens, temperature, i))
                    else:
                        runs[ds, k].append(done[names[k]])
                    bar.update()
                if book and done is None:
                    book.record(ds, i, ids_of[ds][i], {names[k]: (prints[k], runs[ds, k][-1]) for k in todo},
                                shas[ds][i])
    bar.close()
    env = environment(target)
    return [{"method": cfg.method, "dataset": ds, "budget": cfg.budget,
             **summarize(runs[ds, k if cfg.same_as is None else cfg.same_as], runs[ds, 0]), **env,
             "prompt_source": data.prompt_source(prompts_by_dataset[ds]),
             **({"note": HF_NOTE} if cfg.method in HF_METHODS else {}),
             **({"note": CHAIN_NOTE.format(cfgs[cfg.same_as].budget)} if cfg.same_as is not None else {})}
            for ds in encoded for k, cfg in enumerate(cfgs)]


def run_auto(target: Target, methods: Sequence[str], prompts_by_dataset, budgets: Sequence[int], *,
             heads=None, temperature: float = 0.0, calib_prompts: int = 3, calib_new_tokens: int = 64,
             cost_by_size: Mapping[int, float] | None = None, compare: bool = False, **kwargs) -> list[dict]:
    """``--budgets auto``: time the verify step at every candidate size once (unless ``cost_by_size``
    is given); then, dataset by dataset, calibrate tau(budget) of each tree method on the dataset's
    first ``calib_prompts`` prompts, run each method at its predicted best budget, and put the
    prediction beside the measurement (``predicted_tokens_per_s``, ``predicted_speedup``,
    ``auto_budget``: True on the picked row, ``auto_table``). Each dataset gets its own pick: tau(budget)
    is a property of the text as much as of the head. With ``compare`` every candidate budget runs too,
    in the same interleaved run, so the pick can be checked against the best fixed budget. Other
    keyword arguments go to ``run``."""
    from . import budget as bud
    cost = cost_by_size
    if cost is None:
        sizes = sorted({1, *(b + 1 for b in budgets)})
        cost = bud.measure_verify_cost(target, sizes, past_len=min(256, target.max_context - sizes[-1]))
    rows, ar_table = [], [{"budget": None, "predicted_tokens_per_s": 1 / bud.interp_cost(cost, 1)}]
    for ds, prompts in prompts_by_dataset.items():
        sample = list(prompts)[:calib_prompts]
        picked, tables = {}, {"ar": ar_table}
        for m in (m for m in dict.fromkeys(methods) if m not in BUDGET_FREE):
            cal = bud.calibrate(target, m, sample, budgets, max_new_tokens=calib_new_tokens,
                                temperature=temperature, head=head_for(m, heads))
            best, tables[m] = bud.pick_budget(cal.tau, cost, draft_s=cal.draft_s)
            picked[m] = [best]
        ds_rows = run(target, methods, {ds: prompts}, budgets if compare else picked, heads=heads,
                      temperature=temperature, **kwargs)
        for row in ds_rows:
            table = tables.get(row["method"])
            pred = next((t["predicted_tokens_per_s"] for t in table or [] if t["budget"] == row["budget"]), None)
            row.update(predicted_tokens_per_s=pred, auto_budget=row["budget"] in picked.get(row["method"], ()),
                       auto_table=table)
        rows += ds_rows
    for row, ratio in zip(rows, predicted_speedups(rows)):
        row["predicted_speedup"] = ratio
    return rows


def predicted_speedups(rows: Sequence[dict]) -> list[float | None]:
    """Each row's predicted tokens/s over the predicted AR tokens/s of its dataset (None where either is
    missing). Both predictions come from one cost table timed in one go, so machine load, which shifts
    predicted and measured tokens/s alike, cancels: this is the number to hold against ``speedup``."""
    ar = {r["dataset"]: r.get("predicted_tokens_per_s") for r in rows if r["method"] == "ar"}
    return [r["predicted_tokens_per_s"] / ar[r["dataset"]]
            if r.get("predicted_tokens_per_s") and ar.get(r["dataset"]) else None for r in rows]


# ----------------------------------------------------------------------------- presets
BENCHMARKS = ("gsm8k", "math500", "humaneval", "mbpp", "mt_bench")
PRESETS = {
    "cpu": {  # the embedded SmolLM2-135M on this kind of machine (docs/field-notes.md)
        "model": None, "dtype": "float32", "device": None,  # fp32: greedy output must equal AR exactly
        "methods": ("ar", "hf", "hf-lookup", "lookup", "jetflow", "dflash", "ddtree"),
        "datasets": BENCHMARKS, "limit": 5, "max_new_tokens": 128, "budgets": (16, 32, 64), "auto": False,
        "heads": {},  # empty: the heads shipped under data/heads
        "temperature": 0.0, "chat_template_kwargs": {}, "prompts_file": None, "data_dir": None,
    },
    "qwen3-8b": {  # the paper's headline setting (docs/method.md, The paper's setting)
        "model": "Qwen/Qwen3-8B", "dtype": "bfloat16", "device": "cuda",
        "methods": ("ar", "dflash", "ddtree", "jetflow"),
        "datasets": BENCHMARKS, "limit": None, "max_new_tokens": 3072, "budgets": (16, 32, 64, 128, 255),
        "auto": False, "heads": {"jetflow": "JetSpec/jetspec-qwen3-8b", "dflash": "z-lab/Qwen3-8B-DFlash-b16"},
        "temperature": 0.0, "chat_template_kwargs": {"enable_thinking": False}, "prompts_file": None,
        "data_dir": None,
    },
}


def _as_tuple(value) -> tuple:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if isinstance(value, str) else tuple(value)


def resolve_preset(name: str, overrides: Mapping | None = None) -> dict:
    """A preset's settings with ``overrides`` applied (None values are skipped), checked.

    ``budgets`` may be a list, a comma string ("16,32"), "auto" (auto=True, candidates = the
    preset's budgets) or "auto" among budgets ("8,16,32,auto": auto="compare", these candidates, each
    also run as a fixed budget); ``heads`` overrides merge into the preset's heads.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    cfg = copy.deepcopy(PRESETS[name])
    for key, value in (overrides or {}).items():
        if key not in cfg:
            raise ValueError(f"unknown setting {key!r}; settings are {', '.join(cfg)}")
        if value is None:
            continue
        if key == "budgets" and "auto" in _as_tuple(value):
            fixed = [b for b in _as_tuple(value) if b != "auto"]
            cfg["auto"] = "compare" if fixed else True
            cfg["budgets"] = fixed or cfg["budgets"]
        elif key == "heads":
            cfg["heads"] = {**cfg["heads"], **value}
        else:
            cfg[key] = value
    cfg["methods"], cfg["datasets"] = _as_tuple(cfg["methods"]), _as_tuple(cfg["datasets"])
    cfg["budgets"] = tuple(int(b) for b in _as_tuple(cfg["budgets"]))
    _check_settings(cfg)
    return cfg


def _check_settings(cfg: dict) -> None:
    bad = [m for m in cfg["methods"] if m not in ALL_METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {bad}; choose from {', '.join(ALL_METHODS)}")
    if cfg["dtype"] not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {cfg['dtype']!r}")
    if not cfg["budgets"] or min(cfg["budgets"]) < 1:
        raise ValueError(f"budgets must be >= 1, got {cfg['budgets']}")
    if cfg["max_new_tokens"] < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {cfg['max_new_tokens']}")
    if cfg["limit"] is not None and cfg["limit"] < 1:
        raise ValueError(f"limit must be >= 1, got {cfg['limit']}")
    check_temperature(cfg["temperature"])
    if cfg["prompts_file"] is None:
        from .data import DATASETS
        bad = [d for d in cfg["datasets"] if d not in DATASETS]
        if bad:
            raise ValueError(f"unknown dataset(s) {bad}; choose from {', '.join(DATASETS)}")


def prompt_sets(cfg: Mapping) -> dict[str, list[dict]]:
    """dataset -> prompts for resolved settings: the prompts file (named by its stem) or the datasets."""
    from . import data
    if cfg["prompts_file"] is not None:
        return {Path(cfg["prompts_file"]).stem: data.load_prompts_file(cfg["prompts_file"])[:cfg["limit"]]}
    return {d: data.load_prompts(d, limit=cfg["limit"], data_dir=cfg["data_dir"]) for d in cfg["datasets"]}


def run_settings(target: Target, cfg: Mapping, prompts_by_dataset, *, progress: bool = True,
                 journal: str | os.PathLike | None = None) -> list[dict]:
    """``run`` (or ``run_auto`` when ``cfg["auto"]``) with resolved settings."""
    kwargs = dict(max_new_tokens=cfg["max_new_tokens"], heads=cfg["heads"], temperature=cfg["temperature"],
                  progress=progress, journal=journal)
    if cfg["auto"]:
        return run_auto(target, cfg["methods"], prompts_by_dataset, cfg["budgets"], compare=cfg["auto"] == "compare",
                        **kwargs)
    return run(target, cfg["methods"], prompts_by_dataset, cfg["budgets"], **kwargs)


# ----------------------------------------------------------------------------- rendering
def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def to_markdown(rows: Sequence[dict]) -> str:
    """A markdown table of the rows, the tau/budget/speedup conventions above it, the setup below."""
    predicted = any("predicted_tokens_per_s" in r for r in rows)
    head = ["method", "dataset", "budget", "n", "new tokens", "tau", "verify tokens", "prefill s", "decode s",
            "tokens/s", *(["predicted tokens/s"] if predicted else []), "speedup",
            *(["predicted speedup"] if predicted else []), "identical to AR"]
    lines = [CONVENTIONS + ".", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, ratio in zip(rows, predicted_speedups(rows)):
        cells = [r["method"], r["dataset"], _fmt(r["budget"]), _fmt(r["n_prompts"]), _fmt(r["new_tokens"]),
                 _fmt(r["tau"]), _fmt(r["verify_tokens"], 1), _fmt(r["prefill_s"]), _fmt(r["decode_s"]),
                 _fmt(r["tokens_per_s"], 1), *([_fmt(r.get("predicted_tokens_per_s"), 1)] if predicted else []),
                 _fmt(r["speedup"]) + ("x" if r["speedup"] is not None else ""),
                 *([_fmt(ratio) + ("x" if ratio is not None else "")] if predicted else []),
                 f"{r['identical_to_ar']}/{r['n_prompts']}"]
        lines.append("| " + " | ".join(cells) + " |")
    if rows:
        r = rows[0]
        lines += ["", f"{r['dtype']} on {r['device']} ({r['hardware']}); torch {r['torch']}, "
                      f"transformers {r['transformers']}."]
    notes = sorted({f"{r['method']}: {r['note']}" for r in rows if r.get("note")})
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def write(rows: Sequence[dict], out_dir: str | os.PathLike, markdown=None) -> Path:
    """Write ``rows.json`` (the list of rows) and ``table.md`` (``markdown(rows)``, default ``to_markdown``)
    under ``out_dir``; returns the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows.json").write_text(json.dumps(list(rows), indent=2) + "\n")
    (out / "table.md").write_text((markdown or to_markdown)(rows))
    return out

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

A proposer whose trees stop growing at ``max_drafts`` nodes (a ``dflash`` chain: D = Q-1; ``lookup``: its
matches x length) runs once for all budgets past that size; those rows share the runs (and say so in
``note``) instead of decoding identical trees again.

Long benches resume: with ``journal=FILE`` (the CLI's ``--out DIR`` uses ``DIR/runs.jsonl``) every
finished prompt is appended to FILE, and a rerun of the same command decodes only the prompts that are
not there yet (``jetflow.evaluation.journal``).

``run_auto`` picks each tree method's budget with ``budget.py`` first. A ``BenchConfig`` is one whole
setup and ``PRESETS`` name some (``cpu``, ``qwen3-8b``): ``BenchConfig.from_name`` -> ``prompt_sets`` ->
``run_settings`` is the CLI path (``resolve_preset`` gives the same config as a dict). Which methods take a
budget or run transformers' own generate comes from the method registry (``jetflow.drafting.methods``); the row
statistics are ``jetflow.engine.metrics`` and the result folder's format ``jetflow.evaluation.rows``.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from jetflow.util import jsonl
from jetflow.data import prompts as data
from jetflow.drafting import methods as registry
from jetflow.drafting.cost import interp_cost
from jetflow.data.prompts import DATASETS
from jetflow.engine.decode import check_temperature, generate
from jetflow.util.flags import comma_list, option
from jetflow.engine.metrics import PromptRun, RoundStat, predicted_speedups, summarize
from jetflow.util.hardware import environment
from jetflow.util.paths import shipped_head_dir
from .rows import CHAIN_NOTE, HF_NOTE
from .rows import bench_markdown as to_markdown  # bench.to_markdown / bench.write: the notebooks' names
from .rows import write_rows as write
from .journal import Journal, head_fingerprint, journal_settings, text_sha
from jetflow.drafting.methods import make_proposer
from jetflow.engine.target import Target
from jetflow.engine.load import DEVICE_HELP, DTYPES, NO_THINKING, THINKING_HELP



# ----------------------------------------------------------------------------- running
@dataclass
class Variant:
    """One method at one budget, as a bench decodes it (with its proposer, built once)."""
    method: str
    budget: int | None         # None for budget-free methods
    proposer: object = None    # None for ar and hf methods
    same_as: int | None = None  # index of an earlier variant drafting the very same trees (not rerun)
    head: str | None = None     # the head it drafts with: hub id or folder (a shipped one by its name)


def variants(target: Target, methods: Sequence[str], budgets, heads=None) -> list[Variant]:
    """AR first, then each method in the given order; ``budgets`` is a list or method -> list."""
    registry.check(methods)
    out, loaded = [Variant("ar", None)], {}  # loaded: one copy of each head, shared by its methods
    for m in dict.fromkeys(methods):
        if registry.method(m).budget_free and m != "ar":
            out.append(Variant(m, None))
        elif m != "ar":
            sizes = list(budgets.get(m, ()) if isinstance(budgets, Mapping) else budgets)
            if not sizes or any(not isinstance(b, int) or b < 1 for b in sizes):
                raise ValueError(f"method {m!r} needs budgets >= 1, got {sizes}")
            path = registry.head_path(m, heads)
            proposer = make_proposer(m, target, head=path, loaded=loaded)
            kind = registry.method(m).head
            head = None if kind is None else str(path or shipped_head_dir(kind).name)  # shipped: its folder's name
            first: dict[int, int] = {}  # effective budget -> index of its config
            for b in sizes:
                eff = _effective_budget(m, proposer, b)
                out.append(Variant(m, b, proposer, first.get(eff), head))
                first.setdefault(eff, len(out) - 1)
    return out


def _effective_budget(method: str, proposer, budget: int) -> int:
    """Budgets past the proposer's ``max_drafts`` (a chain: D = Q-1; lookup: matches x length) draft the
    same trees."""
    cap = getattr(proposer, "max_drafts", None)
    return budget if cap is None else min(budget, cap)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_generate(target: Target, ids: torch.Tensor, max_new_tokens: int, temperature: float,
                seed: int | None, **extra) -> PromptRun:
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
    return PromptRun(tokens, len(tokens), seconds, None)


def run_config(target: Target, cfg: Variant, ids: torch.Tensor, max_new_tokens: int, temperature: float,
               seed: int | None) -> PromptRun:
    """Decode one prompt (1-D ids) with one configuration."""
    hf_kwargs = registry.method(cfg.method).hf_kwargs
    if hf_kwargs is not None:
        return hf_generate(target, ids, max_new_tokens, temperature, seed, **dict(hf_kwargs))
    res = generate(target, ids, cfg.proposer, budget=cfg.budget or 1, max_new_tokens=max_new_tokens,
                   temperature=temperature, seed=seed)
    return PromptRun(res.tokens, sum(len(r.committed) for r in res.rounds), res.decode_s, res.prefill_s,
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
                                 f"decoding exceeds {target.context_limit}")
    return out


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
    cfgs = variants(target, methods, budgets, heads)
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
            if hasattr(target, "warm"):  # compiled: every graph the run reaches, compiled untimed (CompiledTarget.warm)
                got = target.warm([c.proposer for c in todo.values()], tree=sorted({(c.budget or 0) + 1 for c in cfgs}),
                                  rows=max(n := [ids.numel() for ps in encoded.values() for ids in ps]) + max_new_tokens,
                                  shortest=min(n))
                tqdm.write(f"compiled {len(got)} graph(s) in {sum(r['seconds'] for r in got):.1f} s, untimed", file=sys.stderr)
            first = next(iter(encoded.values()))[0]
            for cfg in todo.values():
                run_config(target, cfg, first, min(4, max_new_tokens), temperature, 0)
        runs: dict[tuple[str, int], list[PromptRun]] = {(ds, k): [] for ds in encoded for k in range(len(cfgs))}
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
    rows = _rows(target, cfgs, prompts_by_dataset, runs)
    if temperature > 0:  # what the sampled tokens depend on: prompt i of every dataset sampled with seed i
        for row in rows:
            row.update(temperature=temperature, seeds=list(range(row["n_prompts"])))
    return rows


def _rows(target: Target, cfgs: Sequence[Variant], prompts_by_dataset: Mapping[str, Sequence[dict]],
          runs: Mapping[tuple[str, int], list[PromptRun]]) -> list[dict]:
    """One row per variant x dataset against AR (variant 0); a variant drafting another's very trees
    reads that one's runs and names its budget (``same_as_budget``)."""
    env = environment(target)
    return [{"method": cfg.method, "dataset": ds, "budget": cfg.budget,
             **({"paper_budget": cfg.budget + 1} if cfg.budget is not None else {}),
             **({"head": cfg.head} if cfg.head is not None else {}),
             **summarize(runs[ds, k if cfg.same_as is None else cfg.same_as], runs[ds, 0]), **env,
             "prompt_source": data.prompt_source(prompts_by_dataset[ds]),
             **({"note": HF_NOTE} if not registry.method(cfg.method).decodes else {}),
             **({"note": CHAIN_NOTE.format(cfgs[cfg.same_as].budget), "same_as_budget": cfgs[cfg.same_as].budget}
                if cfg.same_as is not None else {})}
            for ds in prompts_by_dataset for k, cfg in enumerate(cfgs)]


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
    from jetflow.evaluation import budget as bud
    cost = cost_by_size
    if cost is None:
        sizes = sorted({1, *(b + 1 for b in budgets)})
        cost = bud.measure_verify_cost(target, sizes, past_len=min(256, target.max_context - sizes[-1]))
    rows, ar_table = [], [{"budget": None, "predicted_tokens_per_s": 1 / interp_cost(cost, 1)}]
    for ds, prompts in prompts_by_dataset.items():
        sample = list(prompts)[:calib_prompts]
        picked, tables = {}, {"ar": ar_table}
        for m in (m for m in dict.fromkeys(methods) if not registry.method(m).budget_free):
            cal = bud.calibrate(target, m, sample, budgets, max_new_tokens=calib_new_tokens,
                                temperature=temperature, head=registry.head_path(m, heads))
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


# ----------------------------------------------------------------------------- settings
BENCHMARKS = ("gsm8k", "math500", "humaneval", "mbpp", "mt_bench")


@dataclass(frozen=True)
class BenchConfig:
    """One bench: which methods, prompts and budgets on which target. Fields with ``option`` metadata are
    the ``bench`` subcommand's flags; ``BenchConfig.from_name(preset, **overrides)`` starts from a preset.
    Comma strings ("ar,lookup", "16,32") are accepted for the list fields."""
    model: str | None = option(None, "target hub id or local dir (default: the embedded SmolLM2)")
    dtype: str = option("float32", "the target's dtype (fp32: greedy output must equal AR exactly)",
                        choices=tuple(DTYPES))
    device: str | None = option(None, DEVICE_HELP)
    thinking: bool | None = option(None, THINKING_HELP, negate=NO_THINKING)
    methods: tuple[str, ...] = option(("ar", "hf", "hf-lookup", "lookup", "jetflow", "dflash", "ddtree"),
                                      "comma list: " + ",".join(registry.names()))
    datasets: tuple[str, ...] = option(BENCHMARKS, "comma list: " + ",".join(DATASETS))
    limit: int | None = option(5, "first N prompts of each dataset")
    max_new_tokens: int = option(128, "new tokens per answer")
    budgets: tuple[int, ...] = option((16, 32, 64), "comma list, e.g. 16,32,64,128,255; 'auto' (pick among the "
                                      "preset's budgets) or '8,16,32,auto' (pick among these, and run each of "
                                      "them too for comparison)", parse=comma_list)
    auto: bool | str = False      # True: each tree method at its predicted best budget; "compare": and every budget
    heads: dict = field(default_factory=dict)  # head kind -> directory or hub id; empty: the shipped heads
    temperature: float = option(0.0, "sampling temperature, 0 = greedy; above 0 sample-and-match, prompt i "
                                "sampled with seed i (rows record both)")
    chat_template_kwargs: dict = field(default_factory=dict)  # e.g. {"enable_thinking": False} for Qwen3
    prompts_file: str | None = option(None, 'JSONL of {"id", "prompt"} per line (instead of --datasets)')
    data_dir: str | None = option(None, "offline data folder (default: $JETFLOW_DATA_DIR, else the hub)")

    def __post_init__(self):
        for name in ("methods", "datasets", "budgets"):
            value = getattr(self, name)
            object.__setattr__(self, name, comma_list(value) if isinstance(value, str) else tuple(value))
        object.__setattr__(self, "budgets", tuple(int(b) for b in self.budgets))
        _check_settings(self)

    @classmethod
    def from_name(cls, name: str, **overrides) -> BenchConfig:
        """A preset with ``overrides`` applied (None values skipped). ``budgets`` may hold "auto" (auto=True,
        candidates = the preset's budgets; with fixed budgets beside it auto="compare", these candidates, each
        also run as a fixed budget); ``heads`` merge into the preset's heads."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        base, changes = PRESETS[name], {}
        known = [f.name for f in fields(cls)]
        for key, value in overrides.items():
            if key not in known:
                raise ValueError(f"unknown setting {key!r}; settings are {', '.join(known)}")
            if value is None:
                continue
            budgets = comma_list(value) if key == "budgets" and isinstance(value, str) else value
            if key == "budgets" and "auto" in budgets:
                fixed = tuple(b for b in budgets if b != "auto")
                changes.update(auto="compare" if fixed else True, budgets=fixed or base.budgets)
            elif key == "heads":
                changes["heads"] = {**base.heads, **value}
            else:
                changes[key] = value
        return replace(base, **changes)


def resolve_preset(name: str, overrides: Mapping | None = None) -> dict:
    """``BenchConfig.from_name(name, **overrides)`` as a plain dict (notebooks print it)."""
    return asdict(BenchConfig.from_name(name, **(overrides or {})))


def _config(cfg: BenchConfig | Mapping) -> BenchConfig:
    return cfg if isinstance(cfg, BenchConfig) else BenchConfig(**cfg)


def _check_settings(cfg: BenchConfig) -> None:
    registry.check(cfg.methods)
    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {cfg.dtype!r}")
    if not cfg.budgets or min(cfg.budgets) < 1:
        raise ValueError(f"budgets must be >= 1, got {cfg.budgets}")
    if cfg.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {cfg.max_new_tokens}")
    if cfg.limit is not None and cfg.limit < 1:
        raise ValueError(f"limit must be >= 1, got {cfg.limit}")
    check_temperature(cfg.temperature)
    if cfg.prompts_file is None:
        bad = [d for d in cfg.datasets if d not in DATASETS]
        if bad:
            raise ValueError(f"unknown dataset(s) {bad}; choose from {', '.join(DATASETS)}")


# the paper's budgets count the root (16/32/64/128/256 verified nodes); this kit's budget counts drafts only
PAPER_BUDGETS = (15, 31, 63, 127, 255)

# the paper's headline setting (docs/method.md, The paper's setting); dflash and ddtree draft with z-lab's head
QWEN3_8B = BenchConfig(model="Qwen/Qwen3-8B", dtype="bfloat16", device="cuda", methods=("ar", "dflash", "ddtree", "jetflow"),
                       limit=None, max_new_tokens=3072, budgets=PAPER_BUDGETS,
                       heads={"jetflow": "JetSpec/jetspec-qwen3-8b", "dflash": "z-lab/Qwen3-8B-DFlash-b16"},
                       chat_template_kwargs={"enable_thinking": False})

PRESETS = {
    # the embedded SmolLM2-135M on this kind of machine (docs/field-notes.md); fp32: greedy output must equal AR
    "cpu": BenchConfig(),
    "qwen3-8b": QWEN3_8B,
    # a bounded look at it (`make gpu-quick`, docs/gpu.md): 5 GSM8K + 5 MATH-500 prompts, 256 new tokens, the
    # paper's 256 and 16 (kit 255 and 15); `bench --preset qwen3-8b-quick --plan` gives its time
    "qwen3-8b-quick": replace(QWEN3_8B, datasets=("gsm8k", "math500"), limit=5, max_new_tokens=256, budgets=(15, 255)),
}


def prompt_sets(cfg) -> dict[str, list[dict]]:
    """dataset -> prompts of a config (a ``BenchConfig``, its dict, or anything with ``prompts_file``,
    ``limit``, ``datasets`` and ``data_dir``, and optionally ``skip``): the prompts file (named by its stem)
    or the datasets, the first ``skip`` prompts of each left out."""
    from jetflow.data import prompts as data
    cfg = _config(cfg) if isinstance(cfg, Mapping) else cfg
    skip = getattr(cfg, "skip", 0) or 0
    stop = None if cfg.limit is None else skip + cfg.limit
    if cfg.prompts_file is not None:
        return {Path(cfg.prompts_file).stem: data.load_prompts_file(cfg.prompts_file)[skip:stop]}
    return {d: data.load_prompts(d, limit=stop, data_dir=cfg.data_dir)[skip:] for d in cfg.datasets}


def run_settings(target: Target, cfg: BenchConfig | Mapping, prompts_by_dataset, *, progress: bool = True,
                 journal: str | os.PathLike | None = None) -> list[dict]:
    """``run`` (or ``run_auto`` when ``cfg.auto``) with a config's settings."""
    cfg = _config(cfg)
    kwargs = dict(max_new_tokens=cfg.max_new_tokens, heads=cfg.heads, temperature=cfg.temperature,
                  progress=progress, journal=journal)
    if cfg.auto:
        return run_auto(target, cfg.methods, prompts_by_dataset, cfg.budgets, compare=cfg.auto == "compare",
                        **kwargs)
    return run(target, cfg.methods, prompts_by_dataset, cfg.budgets, **kwargs)

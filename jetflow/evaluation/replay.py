"""Replay: greedy tau of any head method at any budget, without decoding again.

Greedy speculative decoding commits exactly the target's greedy continuation (that is what
lossless means), so the outcome of a round depends only on the tree drafted at its anchor and on
that continuation. Replay therefore

1. decodes every prompt once autoregressively (``ar_traces``; cache them with ``cache=``),
2. runs the head once over every anchor of each output (``draft_tables``: all blocks of a sequence
   in one pass, with the training mask; the target's taps come from one teacher-forced forward),
3. walks the rounds for any builder and budget (``walk``): build the tree at the anchor, accept the
   longest path that matches the continuation, move the anchor past the committed tokens.

The walk reproduces ``generate``'s rounds; the draft log-probs differ only by float reduction order
(taps from one forward over the whole sequence instead of tree verifies, blocks batched instead of
one by one), so tau matches a real decode to about a hundredth (``tests/test_replay.py`` checks the
rounds themselves on the embedded target). Speed is not replayed: for tokens/s run ``bench``.

    traces = ar_traces(target, load_prompts("gsm8k", limit=20), 256, cache="ar-gsm8k.jsonl")
    rows = replay(target, ["jetflow", "ddtree", "dflash"], {"gsm8k": traces}, [16, 64, 255])
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from jetflow.util import jsonl
from jetflow.drafting import methods as registry
from .bench import BENCHMARKS
from jetflow.data.prompts import DATASETS
from jetflow.engine.decode import Round, generate
from jetflow.util.flags import comma_list, option
from jetflow.engine.metrics import round_stats
from jetflow.drafting.cost import CostCurve, load_cost
from jetflow.drafting.proposers import HeadProposer, LookupMerged
from jetflow.drafting.methods import make_proposer
from jetflow.util.paths import shipped_head_dir
from jetflow.util.hardware import environment
from .rows import REPLAY_NOTE, write_rows
from .rows import replay_markdown as to_markdown  # replay.to_markdown: the CLI's and notebooks' name
from jetflow.engine.load import DEVICE_HELP, NO_THINKING, THINKING_HELP
from jetflow.engine.tree import Tree
from jetflow.drafting.builders import BUILDERS, tree_builder
from jetflow.engine.verify import greedy_accept



@dataclass(frozen=True)
class ReplayConfig:
    """One replay: head methods x budgets (x widths) over the AR answers of these prompts. Fields with
    ``option`` metadata are the ``replay`` subcommand's flags."""
    methods: tuple[str, ...] = option(("jetflow", "ddtree", "dflash", "jetflow-bp"), "head methods, comma list: "
                                      + ",".join(registry.names(lambda m: m.head is not None)))
    datasets: tuple[str, ...] = option(BENCHMARKS, "comma list: " + ",".join(DATASETS))
    budgets: tuple[int, ...] = option((16, 32, 64, 128, 255), "comma list")
    widths: tuple[int, ...] = option((7,), "widths W to try for the builders that take one (accum_logp, top2gap), "
                                     "comma list")
    limit: int | None = option(5, "first N prompts of each dataset")
    skip: int = option(0, "skip the first N prompts of each dataset, then take --limit (a held-out slice)")
    max_new_tokens: int = option(128, "new tokens of each AR answer")
    prompts_file: str | None = option(None, 'JSONL of {"id", "prompt"} per line (instead of --datasets)')
    model: str | None = option(None, "target hub id or local dir (default: the embedded SmolLM2)")
    device: str | None = option(None, DEVICE_HELP)
    thinking: bool | None = option(None, THINKING_HELP, negate=NO_THINKING)
    data_dir: str | None = option(None, "offline data folder (default: $JETFLOW_DATA_DIR, else the hub)")
    cache: str | None = option(None, "folder for the AR answers (resumable; default: the jetflow cache)")
    heads: dict = field(default_factory=dict)  # head kind -> directory or hub id; empty: the shipped heads

    def __post_init__(self):
        for name in ("methods", "datasets", "budgets", "widths"):
            value = getattr(self, name)
            object.__setattr__(self, name, comma_list(value) if isinstance(value, str) else tuple(value))
        for name in ("budgets", "widths"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        if self.prompts_file is None and any(d not in DATASETS for d in self.datasets):
            raise ValueError(f"unknown dataset(s) {[d for d in self.datasets if d not in DATASETS]}; "
                             f"choose from {', '.join(DATASETS)}")
        if self.limit is not None and self.limit < 1 or self.max_new_tokens < 1:
            raise ValueError(f"limit and max_new_tokens must be >= 1, got {self.limit} and {self.max_new_tokens}")
        if self.skip < 0:
            raise ValueError(f"skip must be >= 0, got {self.skip}")


@dataclass
class Trace:
    """One prompt and the target's greedy answer to it (EOS included when hit)."""
    dataset: str
    id: str
    prompt_ids: list[int]
    tokens: list[int]
    max_new_tokens: int


def trace_cache(target, dataset: str, folder: str | Path | None = None) -> Path:
    """The JSONL that caches ``target``'s AR traces of ``dataset`` (default folder: the jetflow cache's replay/);
    a target with chat switches (e.g. enable_thinking) gets its own file."""
    from jetflow.util.paths import cache_dir
    folder = Path(folder) if folder is not None else cache_dir() / "replay"
    chat = "".join(f"-{k}={v}" for k, v in sorted(getattr(target, "chat_kwargs", {}).items()))  # thinking or not
    return folder / f"ar-{target.name.replace('/', '--')}{chat}-{dataset}.jsonl"


def ar_traces(target, prompts: Sequence[Mapping], max_new_tokens: int, *, dataset: str = "",
              cache: str | Path | None = None, progress: bool = True) -> list[Trace]:
    """Greedy AR answers of ``prompts`` ({"id", "prompt"} rows). With ``cache`` (a JSONL file), answers
    already there for the same prompt ids and length are reused and new ones appended as they finish,
    so an interrupted run resumes."""
    path = Path(cache) if cache else None
    with jsonl.locked(path) if path else contextlib.nullcontext():
        done = {_trace_key(t): t for t in _cached_traces(path)} if path else {}
        out = []
        for p in tqdm(prompts, desc=f"AR {dataset}".strip(), disable=not progress, leave=False):
            ids = target.encode(p["prompt"])
            key = (dataset, str(p.get("id", "")), tuple(ids.tolist()), max_new_tokens)
            if key not in done:
                res = generate(target, ids, None, max_new_tokens=max_new_tokens)
                done[key] = Trace(dataset, key[1], list(key[2]), res.tokens, max_new_tokens)
                if path:
                    jsonl.append(path, [asdict(done[key])])
            out.append(done[key])
    return out


def _trace_key(t: Trace) -> tuple:
    return (t.dataset, t.id, tuple(t.prompt_ids), t.max_new_tokens)


def _cached_traces(path: Path) -> list[Trace]:
    """The traces of an AR cache file (a line torn by a kill is cut off the file, with a warning)."""
    rows = jsonl.read(path)
    try:
        return [Trace(**row) for row in rows]
    except TypeError as err:
        raise ValueError(f"{path} is not an AR cache of replay ({err}); move it away or pass another --cache") from None


@dataclass
class DraftTable:
    """Per anchor (output index i = 0 .. len(tokens) - 2): the top-K draft log-probs per depth,
    descending, (A, D, K) float32, and their token ids (A, D, K); with a path correction, its tables per
    anchor, C' -> (A, D-1, C', C') over logp's top-C' (``HeadProposer.paths``), for ``path_prefix``."""
    logp: torch.Tensor
    ids: torch.Tensor
    paths: dict[int, torch.Tensor] | None = None


@torch.no_grad()
def draft_table(proposer: HeadProposer, trace: Trace, k: int = 256, chunk: int = 32,
                paths: bool | Sequence[int] = False) -> DraftTable:
    """The head's drafts at every anchor of ``trace`` (``k`` best tokens per depth), in the head's dtype
    and with the same embedding and lm_head rows as ``HeadProposer.depth_logp``; ``paths``: the path
    correction's tables too, for the budgets listed (each round's C' = ``correction.table_size(budget)``;
    True: the full C only)."""
    head, target = proposer.head, proposer.target
    ids = torch.tensor(trace.prompt_ids + trace.tokens)
    _, taps = target.sequence_taps(ids.to(target.device), proposer.taps, logits=False)
    taps = taps.to(head.fc.weight.device)
    anchors = torch.arange(len(trace.prompt_ids), ids.numel() - 1)
    budgets = ([None] if paths is True else list(paths or ())) if proposer.correction is not None else []
    sizes = sorted({proposer.correction.table_size(b) for b in budgets}) if budgets else []
    logps, cols, tables, depths = [], [], {c: [] for c in sizes}, head.config.block_size - 1
    for part in anchors.split(chunk):
        hidden = head.sequence_blocks(taps, head.block_inputs(ids[part], proposer.embed), part)  # (a, D, H)
        logp = proposer.logp(hidden)                                                    # (a, D, K)
        top, col = logp.topk(min(k, logp.shape[-1]), dim=-1)
        logps.append(top.cpu())
        cols.append(col.cpu())
        for c in sizes:
            tables[c].append(proposer.paths(hidden, top[..., :c], col[..., :c]).cpu())
    col = torch.cat(cols) if cols else torch.zeros(0, depths, k, dtype=torch.long)
    logp = torch.cat(logps) if logps else torch.zeros(0, depths, k)
    return DraftTable(logp, col if proposer.vocab is None else proposer.vocab[col],
                      {c: torch.cat(t) for c, t in tables.items()} if sizes and cols else None)


def walk(table: DraftTable, trace: Trace, build: Callable, budget: int, eos_ids,
         lookup: LookupMerged | None = None, paths: int | None = None) -> list[Round]:
    """The rounds ``generate`` runs on ``trace``'s prompt with these drafts (greedy): each round builds
    the tree at the anchor, accepts the longest path matching the continuation, commits it plus the
    bonus token (truncated at EOS and ``max_new_tokens`` like ``generate``). With ``lookup`` (a
    ``LookupMerged``) its prompt-lookup branches are merged in first, as it does when decoding; with
    ``paths`` (a C') the builder gets the anchor's path table of that size (``path_prefix``)."""
    tokens, rounds, i = trace.tokens, [], 0
    while i + 1 < len(tokens) and tokens[i] not in eos_ids:
        tree = build(table.logp[i], budget, tokens[i], **({"paths": table.paths[paths][i]} if paths else {}))
        ids = tree.tokens.clone()
        ids[1:] = table.ids[i][tree.depth[1:] - 1, tree.tokens[1:]]   # columns of the top-K -> token ids
        tree = Tree(ids, tree.parents, tree.depth, tree.score)
        if lookup is not None:
            tree = lookup.merged(trace.prompt_ids + tokens[:i + 1], tree, budget)
        cont = tokens[i + 1:]
        choice = [cont[d] if d < len(cont) else -1 for d in tree.depth.tolist()]  # the target's argmax
        path, _ = greedy_accept(tree, None, choice)
        committed = cont[:len(path)]
        rounds.append(Round(tree, path, committed, choice, 0.0, 0.0))
        i += len(committed)
    return rounds


def replay(target, methods: Sequence[str], traces_by_dataset: Mapping[str, Sequence[Trace]],
           budgets: Sequence[int], *, heads: Mapping[str, str] | None = None, widths: Sequence[int] = (7,),
           draft_dtype: torch.dtype = torch.float32, progress: bool = True) -> list[dict]:
    """Rows (the ``bench`` schema without timing) for every head method x dataset x budget; ``widths``
    are tried for ``accum_logp`` (JetFlow). ``heads`` maps a head kind to its path (default: shipped).
    The head runs in ``draft_dtype``: fp32 by default, where replayed rounds equal decoded ones
    exactly (a bf16 head, as ``generate`` uses on this CPU, moves tau by about a hundredth)."""
    registry.check(methods, lambda m: m.head is not None, "head method")
    if not widths or any(w < 1 for w in widths):
        raise ValueError(f"widths must be >= 1, got {list(widths)}")
    if not budgets or any(b < 1 for b in budgets):
        raise ValueError(f"budgets must be >= 1, got {list(budgets)}")
    rows, env = [], environment(target)
    cost = load_cost((heads or {}).get("jetflow") or shipped_head_dir("jetflow"))  # the target's, on this CPU
    setup = {"draft_dtype": str(draft_dtype).removeprefix("torch."), "note": REPLAY_NOTE, **env}
    k = max(max(budgets), max(widths))
    for kind, own in dict.fromkeys((registry.method(m).head, registry.method(m).correction) for m in methods):
        mine = [m for m in methods if (registry.method(m).head, registry.method(m).correction) == (kind, own)]
        proposer = make_proposer(mine[0], target, head=(heads or {}).get(kind), draft_dtype=draft_dtype)
        proposer = getattr(proposer, "inner", proposer)  # the head's own proposer, lookup merged or not
        for ds, traces in traces_by_dataset.items():
            with_paths = any("paths" in BUILDERS[registry.method(m).builder].options for m in mine)
            wide = max(k, proposer.correction.config.candidates) if with_paths and proposer.correction else k
            tables = [draft_table(proposer, t, wide, paths=budgets if with_paths else False) for t in
                      tqdm(traces, desc=f"draft {kind} {ds}", disable=not progress, leave=False)]
            rows += [row | setup for m in mine
                     for row in method_rows(m, ds, traces, tables, budgets, widths, target.eos_ids, proposer,
                                                   cost)]
    return rows


def method_rows(method: str, dataset: str, traces: Sequence[Trace], tables: Sequence[DraftTable],
                budgets: Sequence[int], widths: Sequence[int], eos_ids, proposer: HeadProposer,
                cost: CostCurve | None = None) -> list[dict]:
    """One head method's rows on one dataset: every width its builder takes x every budget (no timing).
    With a round-cost ``cost`` curve, each row also predicts its decode speed over AR from its rounds'
    sizes (``predicted_speedup``); ``nodes`` is the mean draft nodes per round, ``tau_per_node`` tau over it."""
    entry = registry.method(method)
    lookup = LookupMerged(proposer) if entry.lookup_merged else None
    paths = "paths" in BUILDERS[entry.builder].options
    if paths and any(t.paths is None for t in tables):
        raise ValueError(f"{method} needs the path correction beside the head (correction.safetensors; "
                         "train one with python -m jetflow train-correction)")
    rows = []
    for w in (widths if "width" in BUILDERS[entry.builder].options else (None,)):
        build = tree_builder(entry.builder, width=w, profile=proposer.profile, cost=proposer.cost)
        for b in budgets:
            size = proposer.correction.table_size(b) if paths else None
            rounds = [r for t, tab in zip(traces, tables) for r in walk(tab, t, build, b, eos_ids, lookup, size)]
            stats = round_stats(rounds)
            nodes = stats["verify_tokens"] - 1 if stats["verify_tokens"] else None
            pred = cost.predicted_speedup([len(r.tree) for r in rounds], [len(r.committed) for r in rounds]) \
                if cost is not None else None
            rows.append({"method": method, "dataset": dataset, "budget": b, "width": w, "builder": entry.builder,
                         "n_prompts": len(traces), "new_tokens": sum(len(t.tokens) for t in traces), **stats,
                         "nodes": nodes, "tau_per_node": stats["tau"] / nodes if nodes else None,
                         "predicted_speedup": pred})
    return rows


def write(rows: Sequence[dict], out_dir: str | Path) -> Path:
    """``rows.json`` and the tau table (``table.md``) under ``out_dir``."""
    return write_rows(rows, out_dir, to_markdown)

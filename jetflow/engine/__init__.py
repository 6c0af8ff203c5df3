"""The lossless core: the frozen target, its loading and its one forward seam, the typed ``Tree`` with its masks
and positions, verification (greedy and sample-and-match), the decode loop (prefill, then draft -> verify ->
accept -> commit; AR through the same loop) and pure statistics of its rounds.

May import: ``util``.
Never: ``drafting``, ``data``, ``training``, ``evaluation``, ``views``, ``results``, the top. The engine knows
no proposer class: a proposer is anything with ``taps``, ``start`` and ``propose``.
"""

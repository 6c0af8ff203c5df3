"""Rows: what was measured. ``bench`` (every method on the same prompts, interleaved),
``replay`` (greedy tau from one AR decode), the verify-cost timing behind the budget, the result folder format
and the bench's resume journal.

May import: ``drafting``, ``data``, ``engine``, ``util``.
Never: ``training``, ``views``, ``results``, the top.
"""

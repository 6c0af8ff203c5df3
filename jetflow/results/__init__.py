"""The kit's own studies, one per kind of folder under ``data/results``, and the checked tables of
README.md and docs/: the results manifest, the report, the tau-vs-data curve, training throughput, speed
against llama.cpp and the acceptance diagnosis.

May import: every other folder.
Never: the top.
"""

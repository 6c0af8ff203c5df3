"""Fitting draft heads and their corrections: the config and presets, the objective, the taps
cache, one step, one run's state, the loop, recipes and the provenance written beside a head.

May import: ``drafting``, ``data``, ``engine``, ``util``.
Never: ``evaluation``, ``views``, ``results``, the top.
"""

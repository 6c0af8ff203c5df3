"""Prompts and the target's own answers: benchmark and training prompts (a local folder, the
bundled fixtures or the hub), resumable regeneration, which prompts a head never saw, and regenerated ids
packed to publish.

May import: ``engine``, ``util``.
Never: ``drafting``, ``training``, ``evaluation``, ``views``, ``results``, the top.
"""

"""Small helpers that know nothing of models: CLI flags as metadata on config dataclasses, resumable
JSON-lines files, the CPU and the dtype to decode in, one-line checks of input, and every path the kit computes
from where its own files lie (``paths``).

May import: the standard library and third-party packages only.
Never: any other folder of jetflow, or the top (``jetflow/__init__``, ``cli``, ``commands``, ``demo``, ``gpu_check``).
"""

"""One colour per decoding method in every figure: ``method_colour(name)``.

The colours follow the method registry (``jetflow.drafting.methods``): the headline methods have fixed
colours (``FIXED``), every other registered method takes the next colour of ``SPARE`` in registry order,
so a method keeps its colour whichever figure draws it and whichever methods sit beside it. A name the
registry does not know (a head's label, a variant such as ``jetflow-pc (pool1)``) takes its base method's
colour when the part before a space or ``/`` is registered, else a stable colour from its characters.
"""
from __future__ import annotations

import zlib

from jetflow.drafting.methods import names

FIXED = {
    "ar": "#7f7f7f", "hf": "#b0b0b0", "hf-lookup": "#8c8c8c",
    "lookup": "#bcbd22", "random": "#c7c7c7",
    "dflash": "#ff7f0e", "ddtree": "#2ca02c",
    "jetflow": "#1f77b4", "jetflow-pc": "#d62728", "jetflow-bp": "#9467bd",
    "jetflow+lookup": "#17becf", "jetflow-pc+lookup": "#e377c2", "ddtree+lookup": "#98df8a",
}
SPARE = ("#8c564b", "#aec7e8", "#ffbb78", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d",
         "#9edae5", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d")


def method_colours() -> dict[str, str]:
    """Every registered method's colour, in registry order."""
    spare = iter(SPARE * 4)
    return {name: FIXED[name] if name in FIXED else next(spare) for name in names()}


COLOURS = method_colours()


def method_colour(name: str) -> str:
    """The colour of method ``name`` in every figure of the kit."""
    if name in COLOURS:
        return COLOURS[name]
    base = name.replace("/", " ").split(" ")[0]
    if base in COLOURS:
        return COLOURS[base]
    return SPARE[zlib.crc32(name.encode()) % len(SPARE)]

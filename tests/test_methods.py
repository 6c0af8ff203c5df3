"""Tests for jetflow/drafting/methods.py: the method registry and what derives from it (proposers, CLI, docstring),
and the tree-builder registry of jetflow/drafting/builders.py."""
import pytest
import torch

import jetflow
from jetflow.drafting import methods
from jetflow.results import tables
from jetflow.cli import build_parser
from jetflow.drafting.proposers import HeadProposer, LookupMerged, LookupProposer, RandomProposer
from jetflow.drafting.methods import make_proposer
from jetflow.training.train import build_head
from jetflow.training.config import TrainConfig
from jetflow.drafting.builders import BUILDERS, accum_logp, chain, tree_builder


@pytest.fixture(scope="module")
def head_dirs(tiny_target, tmp_path_factory):
    """A tiny causal and a tiny bidirectional head for ``tiny_target``, saved like shipped heads."""
    out = {}
    for kind, causal in (("jetflow", True), ("dflash", False)):
        path = tmp_path_factory.mktemp(kind)
        build_head(TrainConfig(block_size=4, causal=causal), tiny_target).save_pretrained(path)
        out[kind] = str(path)
    return out


@pytest.mark.parametrize("name", methods.names())
def test_make_proposer_follows_the_registry_entry(name, tiny_target, head_dirs):
    m = methods.method(name)
    if not m.decodes:
        with pytest.raises(ValueError, match="transformers' own generate"):
            make_proposer(name, tiny_target)
        return
    proposer = make_proposer(name, tiny_target, head=head_dirs.get(m.head), width=3)
    if name == "ar":
        assert proposer is None
    elif m.head is None:
        assert isinstance(proposer, (LookupProposer, RandomProposer))
    else:
        inner = proposer.inner if m.lookup_merged else proposer
        assert isinstance(proposer, LookupMerged) == m.lookup_merged and isinstance(inner, HeadProposer)
        assert inner.builder == m.builder and inner.width == 3
        assert inner.head.config.causal == (m.head == "jetflow")


def test_unknown_methods_are_named():
    with pytest.raises(ValueError, match="unknown method 'medusa'; choose from ar, hf"):
        methods.method("medusa")
    with pytest.raises(ValueError, match=r"unknown head method\(s\) \['lookup'\]"):
        methods.check(["jetflow", "lookup"], lambda m: m.head is not None, "head method")
    methods.check(["ar", "jetflow+lookup"])


@pytest.mark.parametrize("bad, match", [(dict(head="jetflow"), "both a head kind"),
                                        (dict(head="jetflow", builder="beam"), "unknown tree builder"),
                                        (dict(lookup_merged=True), "only a head method")])
def test_inconsistent_entries_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        methods.Method("x", "a method", **bad)


def test_everything_that_lists_methods_derives_from_the_registry():
    assert tables.METHOD_ORDER == methods.names()
    assert all(f"``{name}``" in jetflow.__doc__ for name in methods.names())
    sub = build_parser()._subparsers._group_actions[0].choices
    generate = next(a for a in sub["generate"]._actions if a.dest == "method")
    assert generate.help == methods.help_text(lambda m: m.decodes) and "hf," not in generate.help
    bench = next(a for a in sub["bench"]._actions if a.dest == "methods")
    assert bench.help.endswith(",".join(methods.names()))
    assert {a.dest for a in sub["bench"]._actions} >= {f"{kind}_head" for kind in methods.HEAD_KINDS}


def test_reported_methods_cover_the_readme_and_feed_the_explorer():
    """REPORTED (what notebook 03's explorer offers) holds every method of the README's headline table and every
    method the README's text names in backticks; notebook 03 reads it instead of its own list."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    named = {m for m in re.findall(r"`([a-z0-9+-]+)`", readme) if m in methods.METHODS}
    assert {m for m, _ in tables.HEADLINE} | named <= set(methods.REPORTED)
    explorer = (root / "notebooks" / "03_tree_explorer.ipynb").read_text(encoding="utf-8")
    assert "REPORTED" in explorer and "jetflow-pc" in methods.REPORTED


def test_head_path_reads_the_head_kind():
    heads = {"dflash": "/d", "jetflow": "/j"}
    assert [methods.head_path(m, heads) for m in ("ddtree", "jetflow+lookup", "lookup")] == ["/d", "/j", None]


def test_builders_take_width_as_an_ordinary_keyword():
    logp = torch.log_softmax(torch.randn(4, 11, generator=torch.Generator().manual_seed(0)), -1)
    wide = tree_builder("accum_logp", width=3)(logp, 9, 5)
    assert torch.equal(wide.tokens, accum_logp(logp, 9, 5, width=3).tokens)
    assert not torch.equal(wide.tokens, accum_logp(logp, 9, 5, width=1).tokens)
    assert torch.equal(tree_builder("chain", width=3)(logp, 9, 5).tokens, chain(logp, 9, 5).tokens)  # no width
    assert BUILDERS["accum_logp"].options == ("width",) and BUILDERS["chain"].options == ()
    with pytest.raises(ValueError, match="unknown tree builder 'beam'"):
        tree_builder("beam")

"""The tree player (``python -m jetflow trace``): the trace it embeds is the decode ``generate`` does, with every
field the page reads, and the page is one self-contained file (no http(s) source or link, the JSON escaped)."""
import re

import pytest

from fakes import GlyphTokenizer, tiny_model
from jetflow import commands
from jetflow.cli import main
from jetflow.drafting.methods import make_proposer
from jetflow.engine.decode import generate
from jetflow.engine.target import Target
from jetflow.views import trace as trace_mod
from jetflow.views.player import player_html, read_trace, write_player
from jetflow.views.viz_rounds import branch_acceptance

V = 64
PROMPT = "abc abc abc abc"
ARGS = ["--prompt", PROMPT, "--method", "lookup", "--budget", "8", "--max-new-tokens", "40", "--dtype", "float32"]


@pytest.fixture
def glyph_target(monkeypatch):
    """A random Llama whose tokens decode to punctuation and whitespace; the CLI loads it for any --model."""
    target = Target(tiny_model("llama", V, seed=3, eos=2), GlyphTokenizer(V), "tiny-glyph")
    monkeypatch.setattr(commands, "load_for_run", lambda *a, **k: target)
    return target


def test_trace_text_equals_generates_and_the_page_embeds_it(glyph_target, tmp_path, capsys):
    import json
    assert main(["generate", *ARGS, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert main(["trace", *ARGS, "--out", str(tmp_path / "t.html")]) == 0
    trace = read_trace(tmp_path / "t.html")
    assert trace["text"] == row["text"] and trace["tokens"] == row["tokens"]
    assert {"method", "budget", "prompt", "text", "rounds"} <= set(trace)
    assert (trace["method"], trace["budget"], trace["prompt"]) == ("lookup", 8, PROMPT)
    assert len(trace["rounds"]) == row["rounds"] and any(len(r["nodes"]) > 1 for r in trace["rounds"])


def test_every_round_is_consistent_with_the_decode(glyph_target):
    res = generate(glyph_target, PROMPT, make_proposer("lookup", glyph_target), budget=8, max_new_tokens=40)
    trace = trace_mod.record(res, glyph_target.decode, method="lookup", budget=8, prompt=PROMPT)
    committed = [t["token"] for r in trace["rounds"] for t in r["committed"]]
    assert [trace["first"]["token"]] + committed == res.tokens
    for rnd, raw in zip(trace["rounds"], res.rounds):
        nodes, path = rnd["nodes"], rnd["accepted"]
        assert [n["token"] for n in nodes] == raw.tree.tokens.tolist() and path[0] == 0
        assert all(nodes[b]["parent"] == a for a, b in zip(path, path[1:]))
        assert all(set(n) >= {"id", "parent", "depth", "rank", "token", "text"} for n in nodes)
        # greedy: the target's token after each accepted node is the next accepted one's, then the bonus
        assert [t["token"] for t in rnd["target"][:-1]] == [nodes[i]["token"] for i in path[1:]]
        assert rnd["bonus"]["token"] == rnd["target"][-1]["token"]
        for x in rnd["rejected"]:
            assert nodes[x["id"]]["parent"] in path and x["id"] not in path
            assert x["target"]["token"] != nodes[x["id"]]["token"]
    attempts, accepts = branch_acceptance(res.rounds)
    assert trace["acceptance"] == {"attempts": attempts.tolist(), "accepts": accepts.tolist()}
    assert trace_mod.depth1_branches(trace) == [(r, a, n) for r, (a, n) in
                                                enumerate(zip(accepts[0].tolist(), attempts[0].tolist()))]


def test_the_page_is_self_contained_and_its_json_escaped(glyph_target, tmp_path):
    res = generate(glyph_target, PROMPT, make_proposer("lookup", glyph_target), budget=8, max_new_tokens=24)
    trace = trace_mod.record(res, glyph_target.decode, method="lookup", budget=8,
                             prompt="</script><script>alert(1)</script> <!--")
    page = player_html(trace)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*https?:""", page, re.I)
    assert page.count("</script>") == 2 and "<!--" not in page.split('id="jetflow-trace">')[1]
    for element in ('id="round-label"', 'id="prev"', 'id="next"', 'id="round-slider"'):
        assert element in page
    assert read_trace(write_player(trace, tmp_path / "sub" / "p.html")) == trace


def test_a_trace_without_its_fields_is_refused():
    with pytest.raises(ValueError, match="trace lacks"):
        player_html({"method": "jetflow", "budget": 16})


@pytest.mark.parametrize("argv", [["trace", *ARGS, "--out", "tree.json"], ["trace", *ARGS[:2], "--out", "t.html",
                                                                            "--budget", "0"]])
def test_bad_trace_input_is_one_error_line(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err


def test_trace_text_equals_generates_on_the_embedded_target(smol, tmp_path, capsys):
    import json
    args = ["--prompt", "What is 7 times 8? Answer briefly.", "--method", "jetflow", "--budget", "8",
            "--max-new-tokens", "24", "--dtype", "float32"]
    assert main(["generate", *args, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert main(["trace", *args, "--out", str(tmp_path / "t.html")]) == 0
    trace = read_trace(tmp_path / "t.html")
    assert trace["text"] == row["text"] and trace["tokens"] == row["tokens"]
    assert max(len(r["accepted"]) for r in trace["rounds"]) > 1  # the shipped head gets drafts accepted

"""Tests for jetflow/evaluation/bench.py: aggregation helpers on hand-made rounds, a small interleaved run on a
tiny random Llama with a character tokenizer, rendering, and preset wiring (nothing downloaded)."""
import json

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from jetflow.evaluation import bench
from jetflow.evaluation.rows import CONVENTIONS
from jetflow.engine import metrics
from metrics_cases import HAND_ROUNDS
from jetflow.drafting.proposers import LookupProposer
from jetflow.engine.target import Target

PROMPTS = {"math": [{"id": "m0", "prompt": "one two one two one"}, {"id": "m1", "prompt": "abc abc abc"}],
           "chat": [{"id": "c0", "prompt": "hello there"}]}
ROW_KEYS = {"method", "dataset", "budget", "n_prompts", "new_tokens", "tau", "tau_hist", "depth_accept",
            "verify_tokens", "prefill_s", "decode_s", "tokens_per_s", "speedup", "identical_to_ar", "dtype",
            "device", "torch", "transformers", "hardware"}


def char_tokenizer():
    """Offline character-level tokenizer: ids 0-2 special, then printable ASCII and newline."""
    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(".|\n"), "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def tiny_target(arch="llama", seed=0) -> Target:
    tok = char_tokenizer()
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=256, bos_token_id=1,
                 eos_token_id=2)
    torch.manual_seed(seed)
    model = (LlamaForCausalLM(LlamaConfig(**sizes)) if arch == "llama"
             else Qwen3ForCausalLM(Qwen3Config(head_dim=8, **sizes)))
    return Target(model.eval().requires_grad_(False), tok, f"tiny-{arch}")


@pytest.fixture(scope="module")
def target():
    return tiny_target()


# ----------------------------------------------------------------------------- running
def test_run_rows_on_tiny_model(target, tmp_path):
    rows = bench.run(target, ["ar", "lookup", "hf", "hf-lookup"], PROMPTS, [2, 4], max_new_tokens=8,
                     progress=False)
    assert [(r["dataset"], r["method"], r["budget"]) for r in rows] == [
        (ds, m, b) for ds in PROMPTS for m, b in [("ar", None), ("lookup", 2), ("lookup", 4), ("hf", None),
                                                   ("hf-lookup", None)]]
    for row in rows:
        assert ROW_KEYS <= set(row)
        assert row["n_prompts"] == len(PROMPTS[row["dataset"]])
        assert row["identical_to_ar"] == row["n_prompts"]  # greedy fp32: lossless, HF included
        assert row["dtype"] == "float32" and row["device"] == "cpu"
        assert row["new_tokens"] == 8 * row["n_prompts"]  # random model: no EOS within 8 tokens
        assert row["decode_s"] > 0 and row["tokens_per_s"] > 0
    ar, lookup, hf = rows[0], rows[1], rows[3]
    assert ar["speedup"] == 1.0 and ar["tau"] == 1.0 and ar["verify_tokens"] == 1.0
    assert ar["tau_hist"] == {1: 7 * 2} and ar["depth_accept"] == []
    assert lookup["tau"] >= 1.0 and 1.0 <= lookup["verify_tokens"] <= 3.0
    for row in rows:  # every decode token counted once; the first new token comes from prefill
        if row["tau"] is not None:
            assert sum(k * v for k, v in row["tau_hist"].items()) == 7 * row["n_prompts"]
    assert hf["tau"] is None and hf["prefill_s"] is None and "note" in hf

    md = bench.to_markdown(rows)
    assert md.startswith(CONVENTIONS) and md.count("| lookup |") == 4 and "hf: " in md
    out = bench.write(rows, tmp_path / "res")
    assert json.loads((out / "rows.json").read_text())[1]["budget"] == 2
    assert (out / "table.md").read_text() == md


def test_run_interleaves_prompt_by_prompt_ar_first(target, monkeypatch):
    calls, real = [], bench.run_config

    def record(tgt, cfg, ids, max_new_tokens, temperature, seed):
        calls.append((cfg.method, cfg.budget, tuple(ids.tolist()), max_new_tokens))
        return real(tgt, cfg, ids, max_new_tokens, temperature, seed)

    monkeypatch.setattr(bench, "run_config", record)
    bench.run(target, ["hf", "lookup", "ar"], PROMPTS, [3, 2], max_new_tokens=5, progress=False)
    order = [("ar", None), ("hf", None), ("lookup", 3), ("lookup", 2)]
    prompts = [tuple(target.encode(p["prompt"]).tolist()) for ps in PROMPTS.values() for p in ps]
    warm = [(m, b, prompts[0], 4) for m, b in order]
    assert calls == warm + [(m, b, p, 5) for p in prompts for m, b in order]


def test_runs_round_trip_through_json():
    run = metrics.PromptRun([1, 2], 2, 0.5, 0.1, [metrics.RoundStat.of(r) for r in HAND_ROUNDS])
    assert metrics.PromptRun.from_json(json.loads(json.dumps(run.to_json()))) == run


REAL_RUN_CONFIG = bench.run_config


class Killed(Exception):
    """Stands for the kill that interrupts a long bench."""


def counting(monkeypatch, fail_after=None):
    """Count run_config calls (the timed decodes); raise ``Killed`` at call ``fail_after``."""
    calls, real = [], REAL_RUN_CONFIG

    def wrapped(*args):
        if fail_after is not None and len(calls) == fail_after:
            raise Killed
        calls.append(args[1].method)
        return real(*args)

    monkeypatch.setattr(bench, "run_config", wrapped)
    return calls


def strip_timing(rows):
    return [{k: v for k, v in r.items() if k != "hardware"} for r in rows]


def test_journal_resumes_an_interrupted_run(target, tmp_path, monkeypatch):
    book = tmp_path / "runs.jsonl"
    args = (target, ["ar", "lookup"], PROMPTS, [2, 4])
    kw = dict(max_new_tokens=6, progress=False, warmup=False, journal=book)
    # 3 configurations per prompt: stop in the middle of the second prompt (call 5 of 9)
    counting(monkeypatch, fail_after=4)
    with pytest.raises(Killed):
        bench.run(*args, **kw)
    lines = book.read_text().splitlines()
    assert json.loads(lines[0])["settings"]["max_new_tokens"] == 6
    assert [(e["dataset"], e["index"], e["config"]) for e in map(json.loads, lines[1:])] == [
        ("math", 0, "ar"), ("math", 0, "lookup@2"), ("math", 0, "lookup@4")]  # prompt 2 not half-written
    calls = counting(monkeypatch)
    rows = bench.run(*args, **kw)
    assert len(calls) == 6  # prompt 2 of math again, whole, and the chat prompt
    assert all(r["n_prompts"] == len(PROMPTS[r["dataset"]]) and r["identical_to_ar"] == r["n_prompts"]
               for r in rows)
    calls.clear()
    again = bench.run(*args, **kw)  # everything journaled: no decoding at all, the same rows
    assert calls == [] and strip_timing(again) == strip_timing(rows)
    # a new budget needs every prompt again (AR beside it, in the same stretch of time)
    bench.run(target, ["ar", "lookup"], PROMPTS, [2, 4, 3], **kw)
    assert len(calls) == 4 * 3


def test_journal_refuses_other_settings_and_tolerates_a_cut_last_line(target, tmp_path, monkeypatch):
    book = tmp_path / "runs.jsonl"
    kw = dict(progress=False, warmup=False, journal=book)
    bench.run(target, ["ar"], PROMPTS, [2], max_new_tokens=4, **kw)
    with pytest.raises(ValueError, match=r"other settings \(max_new_tokens: 4 -> 5\)"):
        bench.run(target, ["ar"], PROMPTS, [2], max_new_tokens=5, **kw)
    with pytest.raises(ValueError, match="the prompts changed"):
        bench.run(target, ["ar"], {"math": PROMPTS["chat"]}, [2], max_new_tokens=4, **kw)
    whole = bench.run(target, ["ar"], PROMPTS, [2], max_new_tokens=4, **kw)
    for cut in (1, 2):  # twice: a torn line must be cut off the file, not skipped and then appended onto
        book.write_text(book.read_text()[:-20])  # the last record cut short, as by a kill mid-write
        calls = counting(monkeypatch)
        rows = bench.run(target, ["ar"], PROMPTS, [2], max_new_tokens=4, **kw)
        assert calls == ["ar"] and strip_timing(rows)[-1]["tau"] == strip_timing(whole)[-1]["tau"]
        assert [r["identical_to_ar"] for r in rows] == [r["identical_to_ar"] for r in whole]
    assert len(book.read_text().splitlines()) == 1 + sum(map(len, PROMPTS.values()))
    (tmp_path / "other.jsonl").write_text("not a journal\n")
    with pytest.raises(ValueError, match="not a bench journal"):
        bench.Journal(tmp_path / "other.jsonl", {})


def test_journal_refuses_runs_of_another_head(tmp_path):
    book = bench.Journal(tmp_path / "runs.jsonl", {"model": "m"})
    book.record("gsm8k", 0, "p0", {"ar": (None, metrics.PromptRun([1], 1, 0.1, 0.0)),
                                   "jetflow@16": ("aaaa", metrics.PromptRun([1], 1, 0.1, 0.0))})
    reread = bench.Journal(tmp_path / "runs.jsonl", {"model": "m"})
    assert reread.done("gsm8k", 0, "p0", {"ar": None, "jetflow@16": "aaaa"})["ar"].tokens == [1]
    assert reread.done("gsm8k", 1, "p1", {"ar": None}) is None
    with pytest.raises(ValueError, match="jetflow@16 on 'gsm8k' was measured with another head"):
        reread.done("gsm8k", 0, "p0", {"ar": None, "jetflow@16": "bbbb"})


def test_head_fingerprint_follows_the_weights():
    from jetflow.drafting.head import DraftHead, HeadConfig
    head = DraftHead(HeadConfig.for_target(tiny_target().config, num_layers=1, causal=True, block_size=4))
    proposer = type("P", (), {"head": head})()
    before = bench.head_fingerprint(proposer)
    assert before == bench.head_fingerprint(proposer) and bench.head_fingerprint(object()) is None
    with torch.no_grad():
        next(head.parameters()).add_(1.0)
    assert bench.head_fingerprint(proposer) != before


def test_one_token_leaves_nothing_to_time(target):
    rows = bench.run(target, ["ar", "lookup"], PROMPTS, [2], max_new_tokens=1, progress=False, warmup=False)
    assert all(r["tokens_per_s"] is None and r["speedup"] is None and r["tau"] is None for r in rows)
    assert "| - | 1/1 |" in bench.to_markdown(rows)


@pytest.mark.parametrize("methods, budgets, match", [
    (["ar", "nope"], [4], "unknown method"),
    (["lookup"], [], "needs budgets"),
    (["lookup"], [0], "needs budgets"),
])
def test_run_rejects_bad_input_before_decoding(target, methods, budgets, match):
    with pytest.raises(ValueError, match=match):
        bench.run(target, methods, PROMPTS, budgets, max_new_tokens=4, progress=False)


def test_run_rejects_prompts_too_long_before_decoding(target):
    with pytest.raises(ValueError, match="exceeds the model's context"):
        bench.run(target, ["ar"], {"x": [{"id": "long", "prompt": "a" * 250}]}, [4], max_new_tokens=8,
                  progress=False)


@pytest.mark.parametrize("cost", [{1: 0.01, 3: 0.012, 5: 0.03}, None])  # hand-made seconds, or measured
def test_run_auto_runs_the_predicted_best_budget(target, cost):
    rows = bench.run_auto(target, ["ar", "lookup"], PROMPTS, [2, 4], calib_prompts=2, calib_new_tokens=6,
                          cost_by_size=cost, max_new_tokens=6, progress=False)
    ar, *lookup = [r for r in rows if r["dataset"] == "math"]
    assert ar["auto_budget"] is False and ar["predicted_tokens_per_s"] > 0
    if cost:
        assert ar["predicted_tokens_per_s"] == 100.0  # 1 / cost[1]: AR commits one token per round
    (row,) = lookup
    best = max(row["auto_table"], key=lambda t: (t["predicted_tokens_per_s"], -t["budget"]))
    assert row["auto_budget"] is True and row["budget"] == best["budget"]
    assert row["predicted_tokens_per_s"] == best["predicted_tokens_per_s"]
    assert ar["predicted_speedup"] == 1.0
    assert row["predicted_speedup"] == pytest.approx(row["predicted_tokens_per_s"] / ar["predicted_tokens_per_s"])
    table = bench.to_markdown(rows)
    assert "predicted tokens/s" in table and "predicted speedup" in table
    assert f"| {row['predicted_speedup']:.2f}x |" in table


def test_predicted_speedup_is_per_dataset_and_missing_without_an_ar_prediction():
    rows = [{"method": "ar", "dataset": "a", "predicted_tokens_per_s": 10.0},
            {"method": "lookup", "dataset": "a", "predicted_tokens_per_s": 15.0},
            {"method": "ar", "dataset": "b", "predicted_tokens_per_s": 20.0},
            {"method": "lookup", "dataset": "b", "predicted_tokens_per_s": 15.0},
            {"method": "lookup", "dataset": "c", "predicted_tokens_per_s": 15.0},
            {"method": "ar", "dataset": "d"}]
    assert metrics.predicted_speedups(rows) == [1.0, 1.5, 1.0, 0.75, None, None]


def test_run_auto_compare_runs_every_candidate_and_flags_the_pick(target):
    cost = {1: 0.01, 3: 0.012, 5: 0.03}
    rows = bench.run_auto(target, ["ar", "lookup"], PROMPTS, [2, 4], calib_prompts=2, calib_new_tokens=6,
                          cost_by_size=cost, max_new_tokens=6, progress=False, compare=True)
    lookup = [r for r in rows if r["dataset"] == "math" and r["method"] == "lookup"]
    assert [r["budget"] for r in lookup] == [2, 4]
    best = max(lookup[0]["auto_table"], key=lambda t: (t["predicted_tokens_per_s"], -t["budget"]))
    assert [r["auto_budget"] for r in lookup] == [r["budget"] == best["budget"] for r in lookup]
    assert all(r["predicted_tokens_per_s"] > 0 for r in lookup)


def test_run_auto_calibrates_each_dataset_on_its_own_prompts(target, monkeypatch):
    from jetflow.evaluation import budget as bud
    seen, real = [], bud.calibrate

    def spy(target, method, prompts, *args, **kwargs):
        seen.append((method, [p["id"] for p in prompts]))
        return real(target, method, prompts, *args, **kwargs)
    monkeypatch.setattr(bud, "calibrate", spy)
    rows = bench.run_auto(target, ["ar", "lookup"], PROMPTS, [2, 4], calib_prompts=1, calib_new_tokens=6,
                          cost_by_size={1: 0.01, 3: 0.012, 5: 0.03}, max_new_tokens=6, progress=False)
    assert seen == [("lookup", [PROMPTS[ds][0]["id"]]) for ds in PROMPTS]
    assert [(r["dataset"], r["method"]) for r in rows] == [(ds, m) for ds in PROMPTS for m in ("ar", "lookup")]
    assert all(r["predicted_speedup"] == 1.0 for r in rows if r["method"] == "ar")


# ----------------------------------------------------------------------------- presets
def test_qwen3_preset_values():
    cfg = bench.resolve_preset("qwen3-8b", {})
    assert cfg["model"] == "Qwen/Qwen3-8B" and cfg["dtype"] == "bfloat16" and cfg["max_new_tokens"] == 3072
    assert cfg["budgets"] == (15, 31, 63, 127, 255) and cfg["auto"] is False
    # the paper counts the root: its 16/32/64/128/256 verified nodes (docs/gpu.md)
    assert tuple(b + 1 for b in cfg["budgets"]) == (16, 32, 64, 128, 256)
    assert cfg["datasets"] == ("gsm8k", "math500", "humaneval", "mbpp", "mt_bench")
    assert cfg["chat_template_kwargs"] == {"enable_thinking": False}
    assert bench.PRESETS["qwen3-8b"].heads["jetflow"] == "JetSpec/jetspec-qwen3-8b"


@pytest.mark.parametrize("overrides, key, want", [
    ({"budgets": "16,32"}, "budgets", (16, 32)),
    ({"budgets": [8]}, "budgets", (8,)),
    ({"budgets": "auto"}, "auto", True),
    ({"budgets": "auto"}, "budgets", (15, 31, 63, 127, 255)),
    ({"budgets": "8,16,auto"}, "auto", "compare"),
    ({"budgets": "8,16,auto"}, "budgets", (8, 16)),
    ({"methods": "ar,lookup", "limit": None}, "methods", ("ar", "lookup")),
    ({"limit": 3, "dtype": "float32"}, "limit", 3),
    ({"heads": {"dflash": "/x"}}, "heads", {"jetflow": "JetSpec/jetspec-qwen3-8b", "dflash": "/x"}),
])
def test_resolve_preset_overrides(overrides, key, want):
    assert bench.resolve_preset("qwen3-8b", overrides)[key] == want


@pytest.mark.parametrize("name, overrides, match", [
    ("nope", {}, "unknown preset"),
    ("cpu", {"colour": 1}, "unknown setting"),
    ("cpu", {"methods": "ar,medusa"}, "unknown method"),
    ("cpu", {"datasets": "gsm8k,imdb"}, "unknown dataset"),
    ("cpu", {"dtype": "int8"}, "dtype"),
    ("cpu", {"budgets": "0,16"}, "budgets"),
    ("cpu", {"max_new_tokens": 0}, "max_new_tokens"),
])
def test_resolve_preset_rejects(name, overrides, match):
    with pytest.raises(ValueError, match=match):
        bench.resolve_preset(name, overrides)


def test_qwen3_preset_wires_heads_into_proposers(monkeypatch):
    """The preset's heads reach make_proposer by head kind (ddtree reads the dflash head)."""
    seen = []

    def fake_make_proposer(method, target, *, head=None, **kwargs):
        seen.append((method, head))
        return LookupProposer()

    monkeypatch.setattr(bench, "make_proposer", fake_make_proposer)
    cfg = bench.resolve_preset("qwen3-8b", {"methods": "ar,jetflow,dflash,ddtree", "budgets": "2",
                                            "max_new_tokens": 3})
    rows = bench.run_settings(tiny_target("qwen3"), cfg, {"x": PROMPTS["chat"]}, progress=False)
    assert seen == [("jetflow", "JetSpec/jetspec-qwen3-8b"), ("dflash", "z-lab/Qwen3-8B-DFlash-b16"),
                    ("ddtree", "z-lab/Qwen3-8B-DFlash-b16")]
    assert [(r["method"], r["budget"]) for r in rows] == [("ar", None), ("jetflow", 2), ("dflash", 2),
                                                          ("ddtree", 2)]
    assert all(r["identical_to_ar"] == 1 and r["speedup"] > 0 for r in rows)


def test_prompt_sets_from_a_prompts_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS["math"]))
    cfg = bench.resolve_preset("cpu", {"prompts_file": str(path), "datasets": "anything", "limit": 1})
    assert bench.prompt_sets(cfg) == {"mine": PROMPTS["math"][:1]}


def test_budgets_past_max_drafts_share_one_set_of_runs(target, monkeypatch):
    from jetflow.drafting.proposers import LookupProposer

    capped = LookupProposer(max_len=3, max_matches=1)  # stands in for the dflash chain: at most 3 drafts
    monkeypatch.setattr(bench, "make_proposer", lambda m, t, head=None, **kw: capped)
    calls, real = [], bench.run_config
    monkeypatch.setattr(bench, "run_config", lambda *a: calls.append(a[1].budget) or real(*a))
    rows = bench.run(target, ["dflash"], PROMPTS, [2, 3, 16, 64], max_new_tokens=6, progress=False,
                     warmup=False)
    assert set(calls) == {None, 2, 3}  # budgets 16 and 64 are not decoded again
    by_budget = {r["budget"]: r for r in rows if r["dataset"] == "math" and r["method"] == "dflash"}
    for b in (16, 64):
        assert {k: v for k, v in by_budget[b].items() if k not in ("budget", "paper_budget", "note", "same_as_budget")} \
               == {k: v for k, v in by_budget[3].items() if k not in ("budget", "paper_budget")}
        assert "same runs as budget 3" in by_budget[b]["note"] and by_budget[b]["same_as_budget"] == 3
    assert "note" not in by_budget[2] and "same runs as budget 3" in bench.to_markdown(rows)

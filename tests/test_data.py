"""Tests for jetflow/data/prompts.py and jetflow/data/regenerate.py: small hand-written JSONL in the offline layout, a tiny random Llama."""
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from jetflow.data import prompts as data
from jetflow.data import regenerate as regeneration
from jetflow.data.prompts import DATASETS, MATH_SUFFIX, load_prompts, load_prompts_file, training_prompts
from jetflow.data.regenerate import left_pad, load_regenerated, regenerate, trim_response
from jetflow.util import paths
from jetflow.util.paths import cache_dir, data_dir


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture
def root(tmp_path):
    """A miniature data folder with the same layout and fields as the offline one."""
    write_jsonl(tmp_path / "gsm8k/test.jsonl", [{"question": f"Test question {i}?", "answer": "#### 1"}
                                                for i in range(3)])
    write_jsonl(tmp_path / "gsm8k/train.jsonl", [{"question": f"Train question {i}?", "answer": "#### 2"}
                                                 for i in range(40)])
    write_jsonl(tmp_path / "math500/test.jsonl", [{"problem": "What is $1+1$?", "solution": "2", "answer": "2",
                                                   "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"}])
    write_jsonl(tmp_path / "humaneval/test.jsonl", [{"task_id": "HumanEval/7", "entry_point": "f",
                                                     "prompt": "def f(x):\n    \"\"\"Double.\"\"\"\n",
                                                     "canonical_solution": "", "test": ""}])
    write_jsonl(tmp_path / "mbpp/mbpp.jsonl", [{"task_id": t, "text": f"Task {t}.", "code": "",
                                                "test_list": ["assert a()", "assert b()"], "test_setup_code": "",
                                                "challenge_test_list": []} for t in (5, 11, 510, 511, 700)])
    for name in ("mt_bench", "spec_bench"):
        write_jsonl(tmp_path / f"{name}/question.jsonl", [{"question_id": 81 + i, "category": "writing",
                                                           "turns": [f"First turn {i}.", "Second."]} for i in range(2)])
    for name in ("chat", "code"):
        write_jsonl(tmp_path / f"{name}_prompts/train.jsonl",
                    [{"id": f"{name}:{i}", "prompt": f"{name} {i}", "source": "x"} for i in range(20)])
    return tmp_path


# ---------------------------------------------------------------- locations


@pytest.mark.parametrize("arg, env, smoke, expected", [
    (None, None, None, None),                  # nothing set: the hub
    (None, "", "0", None),                     # an empty variable counts as unset
    (None, None, "1", "fixtures"),             # smoke mode never needs the network
    ("fixtures", None, None, "fixtures"),
    (None, "fixtures", None, "fixtures"),
    ("tmp", None, "1", "tmp"),                 # a folder beats smoke mode's fixtures
    (None, "tmp", "1", "tmp"),
    ("tmp", "fixtures", None, "tmp"),          # the argument beats the variable
])
def test_data_dir_precedence(tmp_path, monkeypatch, arg, env, smoke, expected):
    for name, value in (("JETFLOW_DATA_DIR", env), ("JETFLOW_SMOKE", smoke)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(tmp_path) if value == "tmp" else value)
    got = data_dir(tmp_path if arg == "tmp" else arg)
    assert got == {None: None, "fixtures": paths.FIXTURES, "tmp": tmp_path}[expected]
    assert paths.source_name(got) == {None: "hub", "fixtures": "fixtures", "tmp": "data_dir"}[expected]


def test_data_dir_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data_dir(tmp_path / "missing")


def test_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("JETFLOW_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("JETFLOW_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "jetflow"


@pytest.mark.parametrize("call", [lambda: load_prompts("gsm8k"), lambda: training_prompts(4, mix=(("chat", 1.0),)),
                                  lambda: training_prompts(4, mix=(("code", 1.0),))])
def test_hub_failure_says_how_to_get_the_data_in_one_line(monkeypatch, call):
    import datasets

    def offline(**kwargs):
        raise ConnectionError("Couldn't reach the Hub\nmore detail")

    for name in ("JETFLOW_DATA_DIR", "JETFLOW_SMOKE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="JETFLOW_DATA_DIR=fixtures") as err:
        call()
    assert "\n" not in str(err.value) and "Couldn't reach the Hub" in str(err.value)


def test_training_sources_have_hub_sources(monkeypatch):
    """chat and code come from the hub with the offline folder's ids, formats and filters."""
    import datasets
    calls = []
    chosen = ["\n\nHuman: How do I bake bread?\n\nAssistant: Knead.\n\nHuman: More?\n\nAssistant: No.",
              "\n\nHuman: how do i BAKE bread\n\nAssistant: Same question, normalized.",   # duplicate
              "\n\nHuman: ok\n\nAssistant: too short to keep.",                             # under 3 characters
              "\n\nHuman: " + "x" * 2001 + "\n\nAssistant: too long."]
    fake = {"Anthropic/hh-rlhf": [{"chosen": c, "rejected": ""} for c in chosen],
            "json": [{"instruction": "Write a function to reverse a string.", "input": "'abc'", "response": ""},
                     {"instruction": "Write a python function to find the first repeated character in a string.",
                      "input": "", "response": ""}],                                         # ~ MBPP task 1-600
            "mbpp:train": [{"task_id": 601, "text": "Find the longest chain of pairs.", "test_list": ["assert f()"]}],
            "mbpp:prompt": [], "mbpp:validation": [],
            "mbpp:test": [{"task_id": 11, "text": "Write a python function to find the first repeated character "
                                                  "in a given string.", "test_list": []}]}

    def load_dataset(**kwargs):
        calls.append(kwargs)
        key = kwargs["path"] if "mbpp" not in kwargs["path"] else f"mbpp:{kwargs['split']}"
        return fake[key]

    for name in ("JETFLOW_DATA_DIR", "JETFLOW_SMOKE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    chat = training_prompts(1, mix=(("chat", 1.0),))
    assert chat == [{"id": "hh-rlhf-helpful-base-test:0", "prompt": "How do I bake bread?"}]
    assert data.hh_rlhf_prompts([{"chosen": c} for c in chosen]) == chat     # the rest filtered out
    code = sorted(training_prompts(2, mix=(("code", 1.0),)), key=lambda p: p["id"])
    assert [p["id"] for p in code] == ["gpteacher-codegen:0", "mbpp-train:601"]   # the near-MBPP one dropped
    assert code[0]["prompt"] == "Write a function to reverse a string.\n\n'abc'"
    assert code[1]["prompt"] == data.mbpp_train_prompt("Find the longest chain of pairs.", ["assert f()"])
    assert calls[0] == data.HUB["chat"] and data.HUB["code"] in calls
    with pytest.raises(ValueError, match="'code' has 2 prompts, 3 requested"):
        training_prompts(3, mix=(("code", 1.0),))


@pytest.mark.parametrize("a, b, expected", [("a b c", "A, b; c!", 1.0), ("a b", "c d", 0.0), ("a b c d", "a b", 0.5),
                                            ("", "", 0.0)])
def test_word_jaccard(a, b, expected):
    assert data.word_jaccard(a, b) == expected


# ---------------------------------------------------------------- the bundled fixtures


@pytest.mark.parametrize("dataset", DATASETS)
def test_fixtures_serve_every_benchmark(dataset):
    prompts = load_prompts(dataset, data_dir="fixtures")
    assert len(prompts) == 24 and len({p["id"] for p in prompts}) == 24
    assert {p["source"] for p in prompts} == {"fixtures"} and data.prompt_source(prompts) == "fixtures"


def test_fixtures_serve_every_training_source():
    prompts = training_prompts(48, data_dir="fixtures")
    assert len({p["id"] for p in prompts}) == 48
    assert {p["id"].split(":")[0] for p in prompts} >= {"gsm8k-train", "gpteacher-codegen", "hh-rlhf-helpful-base-test"}
    with pytest.raises(ValueError, match="'gsm8k_train' has 24 prompts"):
        training_prompts(200, data_dir="fixtures")


def test_fixtures_ship_with_the_package():
    import tomllib
    patterns = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["jetflow"]
    shipped = {p for pattern in patterns for p in paths.FIXTURES.parent.glob(pattern)}
    assert {paths.FIXTURES / f for f in data.LOCAL_FILES.values()} | {paths.FIXTURES / "README.md"} <= shipped


@pytest.mark.skipif(not os.environ.get("JETFLOW_DATA_DIR") or os.environ["JETFLOW_DATA_DIR"] == "fixtures",
                    reason="JETFLOW_DATA_DIR does not name the full offline folder")
@pytest.mark.parametrize("dataset", DATASETS)
def test_fixtures_are_the_first_prompts_of_the_full_sets(dataset):
    full = load_prompts(dataset, limit=24)
    assert [{k: v for k, v in p.items() if k != "source"} for p in full] == \
        [{k: v for k, v in p.items() if k != "source"} for p in load_prompts(dataset, data_dir="fixtures")]


def test_prompt_source():
    assert data.prompt_source([{"source": "hub"}, {"source": "fixtures"}]) == "fixtures,hub"
    assert data.prompt_source([{"id": "a", "prompt": "x"}]) is None


# ---------------------------------------------------------------- benchmark prompts


@pytest.mark.parametrize("dataset, ids, first", [
    ("gsm8k", ["gsm8k:0", "gsm8k:1", "gsm8k:2"], "Test question 0?" + MATH_SUFFIX),
    ("math500", ["math500:test/algebra/1.json"], "What is $1+1$?" + MATH_SUFFIX),
    ("humaneval", ["humaneval:7"],
     "Write a solution to the following problem and make sure that it passes the tests:\n"
     "```python\ndef f(x):\n    \"\"\"Double.\"\"\"\n\n```"),
    ("mbpp", ["mbpp:11", "mbpp:510"], "You are an expert Python programmer. Write a solution to the following "
                                      "task and make sure it passes the tests:\nTask 11.\nYour code should pass "
                                      "these tests:\nassert a()\nassert b()"),
    ("mt_bench", ["mt_bench:81", "mt_bench:82"], "First turn 0."),
    ("spec_bench", ["spec_bench:81", "spec_bench:82"], "First turn 0."),
])
def test_load_prompts_formats(root, dataset, ids, first):
    prompts = load_prompts(dataset, data_dir=root)
    assert [p["id"] for p in prompts] == ids
    assert prompts[0]["prompt"] == first and {p["source"] for p in prompts} == {"data_dir"}
    assert load_prompts(dataset, data_dir=root, limit=1) == prompts[:1]


def test_load_prompts_reads_env_dir(root, monkeypatch):
    monkeypatch.setenv("JETFLOW_DATA_DIR", str(root))
    assert len(load_prompts("gsm8k")) == 3


@pytest.mark.parametrize("bad, match", [("gsm9k", "valid names: gsm8k, math500"), ("gsm8k_train", "valid names")])
def test_unknown_dataset(root, bad, match):
    with pytest.raises(ValueError, match=match):
        load_prompts(bad, data_dir=root)


def test_missing_file_and_malformed_row(root):
    (root / "math500/test.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="math500/test.jsonl"):
        load_prompts("math500", data_dir=root)
    write_jsonl(root / "gsm8k/test.jsonl", [{"question": "ok"}, {"prompt": "no question field"}])
    with pytest.raises(ValueError, match="gsm8k row 1"):
        load_prompts("gsm8k", data_dir=root)


def test_load_prompts_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "Hi"}\n\n{"id": 3, "prompt": "Yo", "extra": 1}\n', encoding="utf-8")
    assert load_prompts_file(path) == [{"id": "a", "prompt": "Hi"}, {"id": "3", "prompt": "Yo"}]


@pytest.mark.parametrize("line, match", [
    ('{"id": "b", "prompt": ', "not valid JSON"),
    ('["b", "x"]', "expected a JSON object"),
    ('{"id": "b"}', "'prompt' must be"),
    ('{"id": "b", "prompt": "   "}', "'prompt' must be"),
    ('{"prompt": "x"}', "'id' must be"),
    ('{"id": "a", "prompt": "again"}', "duplicate id"),
])
def test_load_prompts_file_bad_row_names_the_line(tmp_path, line, match):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "Hi"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"p\.jsonl:2: {match}"):
        load_prompts_file(path)


# ---------------------------------------------------------------- training prompts


@pytest.mark.parametrize("n, weights", [(10, [0.5, 0.25, 0.25]), (7, [1, 1, 1]), (1, [0.2, 0.8]), (100, [3, 1])])
def test_split_counts(n, weights):
    counts = data._split_counts(n, weights)
    exact = [n * w / sum(weights) for w in weights]
    assert sum(counts) == n
    assert all(abs(c - e) < 1 for c, e in zip(counts, exact))


def test_training_prompts_mix_and_determinism(root):
    prompts = training_prompts(20, seed=1, data_dir=root)
    sources = [p["id"].split(":")[0] for p in prompts]
    assert (sources.count("gsm8k-train"), sources.count("code"), sources.count("chat")) == (10, 5, 5)
    assert len({p["id"] for p in prompts}) == 20
    assert all(p["prompt"].endswith(MATH_SUFFIX) for p in prompts if p["id"].startswith("gsm8k-train:"))
    assert training_prompts(20, seed=1, data_dir=root) == prompts
    assert training_prompts(20, seed=2, data_dir=root) != prompts
    # a larger n keeps the smaller draw per source, so regeneration can resume into it
    assert {p["id"] for p in prompts} <= {p["id"] for p in training_prompts(30, seed=1, data_dir=root)}


def test_training_prompts_ids_are_stable(root):
    by_id = {p["id"]: p["prompt"] for p in training_prompts(40, mix=(("gsm8k_train", 1.0),), data_dir=root)}
    assert by_id["gsm8k-train:7"] == "Train question 7?" + MATH_SUFFIX


@pytest.mark.parametrize("kwargs, match", [
    (dict(n=0), "n must be >= 1"),
    (dict(n=30, mix=(("chat", 1.0),)), "has 20 prompts, 30 requested"),
    (dict(n=5, mix=(("gsm8k", 1.0),)), "valid names: gsm8k_train, code, chat"),
    (dict(n=5, mix=(("chat", 0.0),)), "must be > 0"),
    (dict(n=5, mix=(("chat", 0.5), ("chat", 0.5))), "twice"),
])
def test_training_prompts_bad_input(root, kwargs, match):
    with pytest.raises(ValueError, match=match):
        training_prompts(data_dir=root, **kwargs)


# ---------------------------------------------------------------- regeneration helpers


@pytest.mark.parametrize("ids, expected", [
    ([5, 6, 2, 2, 2], [5, 6, 2]),
    ([5, 6, 7], [5, 6, 7]),
    ([2], [2]),
    ([5, 0, 9, 0], [5, 0]),
])
def test_trim_response(ids, expected):
    assert trim_response(ids, {0, 2}) == expected


def test_left_pad():
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


# ---------------------------------------------------------------- regeneration with a tiny target


@pytest.fixture(scope="module")
def tiny_target():
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from jetflow.engine.target import Target
    from jetflow.engine.load import embedded_gguf

    gguf = embedded_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval().requires_grad_(False)
    return Target(model, tokenizer, "tiny-llama")


PROMPTS = [{"id": f"p{i}", "prompt": "word " * (3 * i + 1)} for i in range(5)]


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_regenerate_rows(tiny_target, tmp_path):
    out = regenerate(tiny_target, PROMPTS, tmp_path / "sub" / "r.jsonl", batch_size=2, max_new_tokens=4, progress=False)
    rows = load_regenerated(out)
    assert sorted(r["id"] for r in rows) == [p["id"] for p in PROMPTS]
    for row in rows:
        prompt = next(p["prompt"] for p in PROMPTS if p["id"] == row["id"])
        assert row["prompt_ids"] == tiny_target.encode(prompt).tolist()
        assert 1 <= len(row["response_ids"]) <= 4
        assert not set(row["response_ids"][:-1]) & tiny_target.eos_ids  # EOS, if any, only last
    lengths = [len(r["prompt_ids"]) for r in rows]
    assert lengths == sorted(lengths, reverse=True)  # longest first
    tensors = load_regenerated(out, tensors=True)
    assert tensors[0]["response_ids"].dtype == torch.long
    assert tensors[0]["response_ids"].tolist() == rows[0]["response_ids"]


def test_regenerate_resumes_after_interruption(tiny_target, tmp_path, monkeypatch):
    kwargs = dict(batch_size=2, max_new_tokens=4, progress=False)
    full = read_lines(regenerate(tiny_target, PROMPTS, tmp_path / "full.jsonl", **kwargs))

    real, calls = regeneration.generate_batch, []

    def crash_after_first_batch(*args, **kw):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*args, **kw)

    path = tmp_path / "resumed.jsonl"
    monkeypatch.setattr(regeneration, "generate_batch", crash_after_first_batch)
    with pytest.raises(KeyboardInterrupt):
        regenerate(tiny_target, PROMPTS, path, **kwargs)
    assert read_lines(path) == full[:3]  # the settings header and the first batch were flushed

    monkeypatch.setattr(regeneration, "generate_batch", real)
    regenerate(tiny_target, PROMPTS, path, **kwargs)
    assert read_lines(path) == full  # each id once, rows identical to an uninterrupted run


def test_regenerate_repairs_partial_last_line(tiny_target, tmp_path, monkeypatch, caplog):
    path = tmp_path / "r.jsonl"
    kwargs = dict(batch_size=1, max_new_tokens=3, progress=False)  # same batches when the torn row is redone
    regenerate(tiny_target, PROMPTS, path, **kwargs)
    full = read_lines(path)
    path.write_text("\n".join(full[:-1]) + "\n" + full[-1][:15], encoding="utf-8")  # killed mid-write
    assert len(load_regenerated(path)) == len(full) - 2  # header and torn line are left out when reading
    with caplog.at_level(logging.WARNING, logger="jetflow.util.jsonl"):
        regenerate(tiny_target, PROMPTS, path, **kwargs)
    assert "cut short by an interruption" in caplog.text
    assert read_lines(path) == full
    monkeypatch.setattr(regeneration, "generate_batch", lambda *a, **k: pytest.fail("nothing left to generate"))
    regenerate(tiny_target, PROMPTS, path, **(kwargs | {"batch_size": 4}))  # batch size: recorded, not compared
    assert read_lines(path) == full
    with pytest.raises(ValueError, match=r"other settings \(max_new_tokens: 3 -> 192\)"):
        regenerate(tiny_target, PROMPTS, path, progress=False)  # would mix 3-token and 192-token answers
    assert read_lines(path) == full


def test_regenerate_skips_long_prompts(tiny_target, tmp_path, caplog):
    limit = len(tiny_target.encode(PROMPTS[2]["prompt"]))
    with caplog.at_level(logging.WARNING, logger="jetflow.data.regenerate"):
        out = regenerate(tiny_target, PROMPTS, tmp_path / "r.jsonl", max_new_tokens=2, max_prompt_tokens=limit,
                         progress=False)
    assert sorted(r["id"] for r in load_regenerated(out)) == ["p0", "p1", "p2"]
    assert "skipped 2 prompts" in caplog.text


@pytest.mark.parametrize("kwargs, match", [(dict(batch_size=0), "batch_size"), (dict(max_new_tokens=0), "max_new_tokens")])
def test_regenerate_bad_input(tiny_target, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        regenerate(tiny_target, PROMPTS, tmp_path / "r.jsonl", progress=False, **kwargs)
    with pytest.raises(ValueError, match="unique"):
        regenerate(tiny_target, PROMPTS + PROMPTS[:1], tmp_path / "r.jsonl", progress=False)


# ---------------------------------------------------------------- the real offline folder


@pytest.mark.skipif(not os.environ.get("JETFLOW_DATA_DIR"), reason="JETFLOW_DATA_DIR is not set")
def test_real_data_folder():
    counts = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 500, "mt_bench": 80, "spec_bench": 480}
    assert set(counts) == set(DATASETS)
    benchmark_texts = set()
    for dataset, count in counts.items():
        prompts = load_prompts(dataset)
        assert len(prompts) == len({p["id"] for p in prompts}) == count
        benchmark_texts |= {normalized(p["prompt"]) for p in prompts}
    assert all(p["prompt"].endswith(MATH_SUFFIX) for p in load_prompts("gsm8k") + load_prompts("math500"))
    assert load_prompts("mbpp")[0]["id"] == "mbpp:11" and load_prompts("mbpp")[-1]["id"] == "mbpp:510"
    train = training_prompts(400, seed=0)
    assert len({p["id"] for p in train}) == 400
    # leakage is about text: ids of different sources never collide, so comparing them could not fail
    assert not benchmark_texts & {normalized(p["prompt"]) for p in train}


def normalized(text: str) -> str:
    """A prompt's words, lowercased, the math instruction removed: equal texts up to formatting."""
    return " ".join(text.replace(MATH_SUFFIX, "").lower().split())



# ---------------------------------------------------------------- portable paths (provenance)


@pytest.mark.parametrize("path, env_cache, expected", [
    (paths.REPO / "data" / "heads" / "x", None, "data/heads/x"),
    ("~/.cache/jetflow/heads/regen.jsonl", None, "~/.cache/jetflow/heads/regen.jsonl"),
    ("CACHE/heads/jetflow", "CACHE", "$JETFLOW_CACHE/heads/jetflow"),
    ("CACHE", "CACHE", "$JETFLOW_CACHE"),
    ("~/runs/a", None, "~/runs/a"),
    ("/opt/elsewhere/a", None, "/opt/elsewhere/a"),
])
def test_portable_path(tmp_path, monkeypatch, path, env_cache, expected):
    if env_cache:
        monkeypatch.setenv("JETFLOW_CACHE", str(tmp_path / env_cache))
    else:
        monkeypatch.delenv("JETFLOW_CACHE", raising=False)
    path = str(path).replace("CACHE", str(tmp_path / "CACHE")) if env_cache else path
    assert paths.portable_path(path) == expected


def test_shell_join_leaves_home_and_cache_for_the_shell_to_expand(tmp_path):
    import subprocess
    args = ["~/a b", "$JETFLOW_CACHE/x y", "it's", "$HOME", "~"]
    line = paths.shell_join(args)
    out = subprocess.run(["bash", "-c", "printf '%s\\n' " + line], capture_output=True, text=True, check=True,
                         env={"HOME": str(tmp_path), "JETFLOW_CACHE": "/c", "PATH": os.environ["PATH"]}).stdout
    assert out.splitlines() == [f"{tmp_path}/a b", "/c/x y", "it's", "$HOME", "~"]

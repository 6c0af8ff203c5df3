"""The embedded SmolLM2-135M-Instruct target (fp32): losslessness and the CLI contract."""
import json

import pytest
import torch

from jetflow.cli import main
from jetflow.engine.decode import generate
from jetflow.drafting.proposers import OracleProposer
from jetflow.drafting.methods import make_proposer

PROMPTS = [
    "Write a Python function that reverses a list, and show an example call.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "List three colours, then list them again in the same order.",
]
NEW = 40


@pytest.fixture(scope="module")
def references(smol):
    refs = []
    for prompt in PROMPTS:
        ids = smol.encode(prompt)
        out = smol.model.generate(ids[None], max_new_tokens=NEW, do_sample=False)
        refs.append(out[0, ids.numel():].tolist())
    return refs


@pytest.mark.parametrize("method", ["ar", "lookup", "jetflow", "dflash", "ddtree", "jetflow-bp",
                                    "jetflow+lookup", "ddtree+lookup", "jetflow-t2g", "jetflow-cal",
                                    "jetflow-profile", "jetflow-cal+lookup"])
def test_greedy_equals_hf_generate(smol, references, method):
    proposer = make_proposer(method, smol)
    for prompt, ref in zip(PROMPTS, references):
        assert generate(smol, prompt, proposer, budget=32, max_new_tokens=NEW).tokens == ref


def test_oracle_and_wrong_oracle(smol, references):
    v = smol.config.vocab_size
    full = generate(smol, PROMPTS[0], OracleProposer(references[0], v), budget=8, max_new_tokens=NEW)
    assert full.tokens == references[0] and all(len(r.committed) == 9 for r in full.rounds[:-1])
    part = generate(smol, PROMPTS[0], OracleProposer(references[0], v, wrong_at=2, siblings=3),
                    budget=16, max_new_tokens=NEW)
    assert part.tokens == references[0] and all(r.accepted == 1 for r in part.rounds[:-1])


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_lookup_json_equals_ar(smol, capsys):
    prompt = "Repeat this line three times: the quick brown fox jumps over the lazy dog."
    rows = {}
    for method in ("ar", "lookup"):
        code, out, _ = run_cli(capsys, "generate", "--prompt", prompt, "--method", method,
                               "--max-new-tokens", "48", "--dtype", "float32", "--json")
        assert code == 0
        rows[method] = json.loads(out)
    assert rows["lookup"]["tokens"] == rows["ar"]["tokens"]
    assert rows["lookup"]["tau"] > 1.0 and rows["ar"]["tau"] == 1.0
    assert set(rows["ar"]) >= {"method", "budget", "prompt", "tokens", "text", "new_tokens", "rounds",
                               "tau", "prefill_s", "decode_s", "tokens_per_s"}


@pytest.mark.parametrize("argv,needle", [
    (["--prompt", "  "], "--prompt must not be empty"),
    (["--prompt", "hi", "--budget", "0"], "--budget must be >= 1"),
    (["--prompt", "hi", "--budget", "many"], "--budget must be an integer"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--prompt", "hi", "--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--prompt", "hi", "--method", "medusa"], "unknown method 'medusa'"),
    (["--prompt", "hi", "--model", "/nonexistent/model-dir"], "cannot load target model"),
    (["--prompt", "word " * 9000, "--dtype", "float32"], "exceeds the model's context"),  # the fixture's load
])
def test_cli_bad_input(smol, capsys, argv, needle):
    code, out, err = run_cli(capsys, "generate", *argv)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1


def test_prefill_taps_shape(smol):
    cache = smol.new_cache()
    step = smol.forward(torch.tensor([1, 2, 3]), cache, taps=(1, 27))
    assert step.logits.shape == (3, 49152) and step.taps.shape == (3, 2, 576)


@pytest.mark.parametrize("methods", ["jetflow,ddtree", "jetflow-t2g,jetflow-cal,jetflow-profile"])
def test_cli_replay_equals_decoding(smol, capsys, tmp_path, methods):
    """`python -m jetflow replay` on the shipped heads: its tau is the tau of really decoding (fp32 drafts),
    the builders that read the acceptance profile shipped beside the causal head included."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "clips", "prompt": PROMPTS[1]}) + "\n")
    code, out, _ = run_cli(capsys, "replay", "--prompts-file", str(prompts), "--methods", methods,
                           "--budgets", "4,32", "--max-new-tokens", str(NEW), "--cache", str(tmp_path), "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["method"], r["budget"]) for r in rows] == [(m, b) for m in methods.split(",") for b in (4, 32)]
    for r in rows:
        proposer = make_proposer(r["method"], smol, draft_dtype=torch.float32)
        res = generate(smol, PROMPTS[1], proposer, budget=r["budget"], max_new_tokens=NEW)
        assert r["tau"] == pytest.approx(res.tau) and r["new_tokens"] == NEW
    code, out, err = run_cli(capsys, "replay", "--prompts-file", str(prompts), "--methods", "lookup",
                             "--cache", str(tmp_path))
    assert code == 2 and "unknown head method" in err


def test_cli_bench_out_resumes(smol, capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "clips", "prompt": PROMPTS[1]}) + "\n")
    argv = ("bench", "--prompts-file", str(prompts), "--methods", "lookup", "--budgets", "4",
            "--max-new-tokens", "8", "--out", str(tmp_path / "res"), "--json")
    code, out, err = run_cli(capsys, *argv)
    assert code == 0 and "resuming" not in err and (tmp_path / "res" / "runs.jsonl").exists()
    first = [json.loads(line) for line in out.splitlines()]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0 and "1 prompt(s) already measured" in err
    again = [json.loads(line) for line in out.splitlines()]
    assert [r["decode_s"] for r in again] == [r["decode_s"] for r in first]  # read back, not decoded again
    assert again[1]["identical_to_ar"] == 1 and json.loads((tmp_path / "res" / "rows.json").read_text()) == again

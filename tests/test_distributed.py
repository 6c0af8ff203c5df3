"""Training across processes: ``accelerate launch --multi_gpu --num_processes 2`` with
ACCELERATE_USE_CPU=1 (two CPU processes, DDP over gloo; ``--cpu --num_processes 2`` would start one
process, see docs/distributed.md) runs ``python -m jetflow train`` on a tiny random target saved to
disk. Two processes give the weights of one process with the same global batch (the target online,
or cached taps that each process reads its sequences' rows of); a two-process run
SIGKILLed with its launcher after a checkpoint resumes to the weights of an uninterrupted one, on two
processes or on one. The example configs of configs/accelerate load and select the launcher they say.

Tolerances: one and two processes run the same per-sequence computation; only the order in which the
per-sequence gradients are summed differs (each process sums its share, then the all-reduce averages
the two halves), a float32 rounding difference of an ulp or so (observed: at most 1.2e-7 on weights of
scale 1 after 24 AdamW steps at lr 1e-3). ``ATOL`` = 1e-5 leaves room for that drift to grow over more
steps while staying far below what a real difference makes: halving the global batch moves the weights
by more than 100 x ATOL (asserted below, so the comparison can fail). A resumed run repeats the
uninterrupted one's computation on the same processes (observed: bitwise equal) and is held to
``test_faults.py``'s 1e-6.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil  # a dependency of accelerate
import pytest
import torch
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType
from accelerate.utils.launch import prepare_multi_gpu_env
from safetensors.torch import load_file

from fakes import tiny_model
from jetflow.training import train as train_mod  # check_launch, is_main_process and their variables
from jetflow.engine.load import load_target
from jetflow.training.taps import build
from jetflow.training.train import build_head, train
from jetflow.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "accelerate"
V = 211
ATOL = 1e-5         # one vs two processes (module docstring)
RESUME_ATOL = 1e-6  # resumed vs uninterrupted, same processes
STEPS = 24
# fp32 everywhere: the test is about how the processes split and average the work, so bf16 rounding (which
# differs between one batch of 4 and two of 2) must not enter the comparison
SETTINGS = dict(seqs_per_step=4, steps=STEPS, save_every=2, eval_every=8, block_size=5, dtype="float32",
                precision="float32")

ON_CPU = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU processes: on a GPU machine accelerate "
                            "would pair the processes with GPUs")


# ----------------------------------------------------------------------------- a target on disk, data, launches
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """A tiny random Llama with a word-level tokenizer saved as a model directory (what ``--model``
    loads in a fresh process), and a regenerated-data file."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    root = tmp_path_factory.mktemp("dist")
    tok = Tokenizer(models.WordLevel({str(i): i for i in range(V)}, unk_token="0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="0", eos_token="2").save_pretrained(root / "target")
    tiny_model("llama", V, seed=3, eos=2).save_pretrained(root / "target")
    g = torch.Generator().manual_seed(0)
    rows = [{"id": f"src{i % 2}:{i}", "prompt_ids": torch.randint(3, V, (6 + i % 4,), generator=g).tolist(),
             "response_ids": torch.randint(3, V, (14 + 3 * (i % 5),), generator=g).tolist()} for i in range(9)]
    (root / "regen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"model": str(root / "target"), "data": str(root / "regen.jsonl")}


def config(files: dict, out: Path, **kw) -> TrainConfig:
    return TrainConfig.from_name("smoke", data=files["data"], out=str(out), model=files["model"],
                                 **(SETTINGS | kw))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg: TrainConfig, *extra: str) -> subprocess.Popen:
    """``accelerate launch`` of ``python -m jetflow train ... EXTRA`` as two CPU processes, in a session of
    its own, its output in OUT.log beside the run's folder."""
    argv = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port()), "-m", "jetflow", "train", "--preset", "smoke",
            "--data", cfg.data, "--out", cfg.out, "--model", cfg.model,
            "--seqs-per-step", str(cfg.seqs_per_step), "--steps", str(cfg.steps),
            "--save-every", str(cfg.save_every), "--eval-every", str(cfg.eval_every),
            "--set", f"block_size={cfg.block_size}", "--set", f"dtype={cfg.dtype}", "--precision", cfg.precision,
            *extra]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "ACCELERATE_USE_CPU": "1"}
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    with open(Path(cfg.out).with_suffix(".log"), "w") as log:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def finish(proc: subprocess.Popen, cfg: TrainConfig) -> None:
    """Wait for a launch to end; fail with its output unless it exited 0."""
    rc = proc.wait(timeout=3600)  # generous: a shared machine may pause or starve the two processes for a while
    assert rc == 0, Path(cfg.out).with_suffix(".log").read_text()[-3000:]


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every process under it (torchrun starts the workers in sessions of
    their own, so killing the launcher's process group alone would leave them training)."""
    parent = psutil.Process(proc.pid)
    procs = [parent, *parent.children(recursive=True)]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass  # ended meanwhile
    _, alive = psutil.wait_procs(procs, timeout=30)
    assert not alive, alive
    proc.wait()


def weights(out) -> dict:
    """The fp32 head of the last checkpoint (the shipped model.safetensors is bf16)."""
    return load_file(str(Path(out) / "checkpoint" / "model.safetensors"))


def history(out) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
            for line in (Path(out) / "history.jsonl").read_text().splitlines()]


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def assert_history_close(a: list[dict], b: list[dict], atol: float) -> None:
    assert [h["step"] for h in a] == [h["step"] for h in b] == list(range(STEPS + 1))
    for x, y in zip(a, b):
        assert x["lr"] == pytest.approx(y["lr"], rel=1e-12) and x["acc"] == y["acc"], (x, y)
        assert (x["loss"] is None) == (y["loss"] is None) and (x["loss"] is None
                                                              or x["loss"] == pytest.approx(y["loss"], abs=atol))


def taps_source(files: dict, taps: str, folder: Path) -> tuple[dict, list[str]]:
    """(config fields, train flags) of the taps source: the target online, or a taps cache built in folder."""
    if taps == "online":
        return {}, []
    cfg = config(files, folder / "unused")
    target = load_target(cfg.model, dtype=cfg.dtype)
    build(target, cfg.data, layers=build_head(cfg, target).config.target_layer_ids, max_len=cfg.max_len,
          out=folder, progress=False)
    return dict(taps="cached", loss="ce", taps_dir=str(folder)), ["--taps", "cached", "--loss", "ce",
                                                                  "--taps-dir", str(folder)]


@pytest.fixture(scope="module")
def two(files, tmp_path_factory) -> Path:
    """An uninterrupted two-process run."""
    cfg = config(files, tmp_path_factory.mktemp("two") / "run")
    finish(launch(cfg), cfg)
    return Path(cfg.out)


# ----------------------------------------------------------------------------- the tests
@pytest.mark.slow
@ON_CPU
@pytest.mark.parametrize("taps", ["online", "cached"])
def test_two_processes_train_the_weights_of_one(files, two, taps, tmp_path):
    fields, flags = taps_source(files, taps, tmp_path / "taps")
    if taps == "cached":  # the online run is the module's
        cfg = config(files, tmp_path / "two", **fields)
        finish(launch(cfg, *flags), cfg)
        two = Path(cfg.out)
    assert sorted(p.name for p in (two / "checkpoint").glob("random_states_*.pkl")) == \
        ["random_states_0.pkl", "random_states_1.pkl"]  # two processes took part
    train(config(files, tmp_path / "one", **fields), progress=False)
    assert max_diff(weights(two), weights(tmp_path / "one")) <= ATOL
    assert_history_close(history(two), history(tmp_path / "one"), ATOL)
    tokens = [json.loads((d / "provenance.json").read_text())["tokens"] for d in (two, tmp_path / "one")]
    assert tokens[0] == tokens[1] and tokens[0]["supervised_slots"] > 0  # the same sequences and anchors
    train(config(files, tmp_path / "half", seqs_per_step=2, **fields), progress=False)  # another global batch
    assert max_diff(weights(two), weights(tmp_path / "half")) > 100 * ATOL


@pytest.mark.slow
@ON_CPU
def test_a_killed_two_process_run_resumes_exactly(files, two, tmp_path):
    cfg = config(files, tmp_path / "killed")
    proc, state = launch(cfg), Path(cfg.out) / "checkpoint" / "train_state.json"
    while not state.is_file() and proc.poll() is None:
        time.sleep(0.01)
    kill_tree(proc)
    assert state.is_file(), Path(cfg.out).with_suffix(".log").read_text()[-3000:]
    step = json.loads(state.read_text())["step"]
    assert 2 <= step < STEPS and not (Path(cfg.out) / "model.safetensors").exists()  # killed mid-run
    shutil.copytree(cfg.out, tmp_path / "on-one")
    finish(launch(cfg), cfg)
    assert max_diff(weights(two), weights(cfg.out)) <= RESUME_ATOL
    assert_history_close(history(two), history(cfg.out), RESUME_ATOL)  # no step repeated or missing
    train(dataclasses.replace(cfg, out=str(tmp_path / "on-one")), progress=False)  # the rest on one process
    assert max_diff(weights(two), weights(tmp_path / "on-one")) <= ATOL
    assert_history_close(history(two), history(tmp_path / "on-one"), ATOL)


# ----------------------------------------------------------------------------- launches refused, configs
class FakeAccelerator:
    def __init__(self, num_processes: int, distributed_type: DistributedType):
        self.num_processes, self.distributed_type = num_processes, distributed_type


@pytest.mark.parametrize("env, main", [({}, True), ({"RANK": "0"}, True), ({"RANK": "1"}, False),
                                       ({"OMPI_COMM_WORLD_RANK": "1"}, False), ({"PMI_RANK": "0"}, True)])
def test_the_main_process_is_read_from_the_launcher(env, main, monkeypatch):
    for key in train_mod.RANK_VARS:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert train_mod.is_main_process() is main


@pytest.mark.parametrize("world, joined, kind, match", [
    ("2", 1, DistributedType.NO, "ACCELERATE_USE_CPU=1"),          # torchrun's workers, each alone
    ("2", 2, DistributedType.FSDP, "FSDP is not supported"),
    ("2", 2, DistributedType.DEEPSPEED, "DEEPSPEED is not supported"),
    ("2", 2, DistributedType.MULTI_CPU, None), ("2", 2, DistributedType.MULTI_GPU, None),
    (None, 1, DistributedType.NO, None)])
def test_launches_the_loop_cannot_train_are_refused(world, joined, kind, match, monkeypatch):
    for key in train_mod.WORLD_VARS:
        monkeypatch.delenv(key, raising=False)
    if world:
        monkeypatch.setenv("WORLD_SIZE", world)
    if match is None:
        train_mod.check_launch(FakeAccelerator(joined, kind))
    else:
        with pytest.raises(ValueError, match=match):
            train_mod.check_launch(FakeAccelerator(joined, kind))


def test_processes_that_do_not_form_a_group_write_nothing(files, tmp_path, monkeypatch):
    """What each of two torchrun workers sees without ACCELERATE_USE_CPU on a CPU machine."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="launched as 2 processes but accelerate joined 1"):
        train(config(files, tmp_path / "run"), progress=False)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock"]


def launcher_args(name: str, *extra: str):
    """What ``accelerate launch --config_file configs/accelerate/NAME.yaml EXTRA -m jetflow train``
    decides, starting nothing: (its arguments, the environment torchrun would give the workers)."""
    args = launch_command_parser().parse_args(["--config_file", str(CONFIGS / f"{name}.yaml"), *extra,
                                               "--main_process_port", str(free_port()), "-m", "jetflow", "train"])
    args, _, _ = _validate_launch_command(args)
    return args, prepare_multi_gpu_env(args)


def test_every_example_config_is_tested():
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == ["fsdp", "multi_gpu", "multi_node"]


def test_the_multi_gpu_config_starts_data_parallel_processes():
    assert load_config_from_file(str(CONFIGS / "multi_gpu.yaml")).distributed_type == DistributedType.MULTI_GPU
    args, env = launcher_args("multi_gpu")
    assert args.multi_gpu and not args.use_fsdp and args.nproc_per_node == "8" and args.num_machines == 1
    assert env.get("ACCELERATE_USE_FSDP", "false") == "false"
    args, _ = launcher_args("multi_gpu", "--num_processes", "4")  # the flag overrides the file
    assert args.nproc_per_node == "4"


@pytest.mark.parametrize("rank", ["0", "1"])
def test_the_multi_node_config_splits_the_processes_over_the_machines(rank):
    cfg = load_config_from_file(str(CONFIGS / "multi_node.yaml"))
    args, _ = launcher_args("multi_node", "--machine_rank", rank)
    assert args.multi_gpu and args.nnodes == "2" and args.nproc_per_node == "8" and args.node_rank == int(rank)
    assert args.rdzv_endpoint.rsplit(":", 1)[0] == cfg.main_process_ip and cfg.num_processes == 16


def test_the_fsdp_config_selects_fsdp_which_train_refuses(monkeypatch):
    cfg = load_config_from_file(str(CONFIGS / "fsdp.yaml"))
    args, env = launcher_args("fsdp")
    assert args.use_fsdp and env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "DecoderLayer"  # the head's layer class (jetflow.drafting.head)
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(ValueError, match="not supported"):  # as the config's header and docs/distributed.md say
        train_mod.check_launch(FakeAccelerator(8, cfg.distributed_type))

"""Tests for ``regenerate --n 0 --chunks K`` (jetflow/data/regenerate.py, jetflow/data/prompts.py) on a tiny random target and
the bundled fixtures: the pool is every training source, the parts partition it and nest, each header
names its part, each part resumes on its own, and the ``.meta.json`` holds the command that remakes it."""
import json
import shlex
from dataclasses import replace

import pytest

import jetflow.data.regenerate as regeneration
from jetflow.util import jsonl
from jetflow.cli import build_parser, main
from jetflow.data.prompts import TRAINING_SOURCES, _training_pool, training_pool
from jetflow.data.regenerate import RegenerateConfig, chunk, chunk_files, load_regenerated, regenerate_command
from jetflow.util.paths import data_dir
from jetflow.util.flags import given
from jetflow.engine.target import Target
from fakes import CharTokenizer, tiny_model


@pytest.fixture
def tiny(monkeypatch):
    target = Target(tiny_model("llama", 61, seed=2), CharTokenizer(61), "tiny-char")
    # where regenerate_files looks the loader up (its module imported the name; patching
    # jetflow.engine.load alone left the embedded SmolLM2 answering every prompt)
    monkeypatch.setattr(regeneration, "load_target", lambda *a, **k: target)
    monkeypatch.setenv("JETFLOW_DATA_DIR", "fixtures")
    return target


def regen(out, *extra):
    return main(["regenerate", "--n", "0", "--chunks", "3", "--out", str(out), "--max-new-tokens", "2",
                 "--batch-size", "8", "--max-prompt-tokens", "100000", *extra])


def test_the_pool_is_every_training_prompt_of_every_source():
    pool = training_pool(data_dir="fixtures")
    every = [p for s in TRAINING_SOURCES for p in _training_pool(s, data_dir("fixtures"))]
    assert sorted(p["id"] for p in pool) == sorted(p["id"] for p in every) and len(pool) == len(every) == 72
    assert [p["id"] for p in pool] != [p["id"] for p in every]  # shuffled with the seed
    assert pool == training_pool(data_dir="fixtures") and pool != training_pool(seed=1, data_dir="fixtures")


@pytest.mark.parametrize("n, count", [(72, 8), (10, 3), (5, 5), (3, 1)])
def test_chunks_partition_the_list_and_their_prefixes_nest(n, count):
    items = list(range(n))
    parts = [chunk(items, i, count) for i in range(count)]
    assert [x for p in parts for x in p] == items
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    for k in range(1, count + 1):  # the first k parts are the first k/count of the list
        assert [x for p in parts[:k] for x in p] == items[: n * k // count]
    with pytest.raises(ValueError, match="chunk index"):
        chunk(items, count, count)


def test_regenerate_all_in_chunks_writes_nested_parts_with_headers_and_commands(tiny, tmp_path):
    out = tmp_path / "all"
    assert regen(out) == 0
    files = chunk_files(out, 3)
    assert [f.name for f in files] == ["part-00-of-03.jsonl", "part-01-of-03.jsonl", "part-02-of-03.jsonl"]
    pool = training_pool(data_dir="fixtures")
    for k, f in enumerate(files):
        header = jsonl.read(f)[0]["settings"]
        assert header["chunk"] == k and header["chunks"] == 3 and header["n"] == 0
        assert header["prompts"] == len(chunk(pool, k, 3))
        assert {r["id"] for r in load_regenerated(f)} == {p["id"] for p in chunk(pool, k, 3)}
        assert all(1 <= len(r["response_ids"]) <= 2 for r in load_regenerated(f))
        assert all(t < 61 for r in load_regenerated(f) for t in r["response_ids"])  # the tiny target answered
        meta = json.loads(f.with_name(f.name + ".meta.json").read_text())
        argv = shlex.split(meta["command"])
        assert argv[:6] == ["python", "-m", "jetflow", "regenerate", "--n", "0"] and "--chunks" in argv
        cfg = RegenerateConfig(**given(build_parser().parse_args(argv[3:]), RegenerateConfig))
        assert cfg == RegenerateConfig(n=0, chunks=3, out="all", max_new_tokens=2, batch_size=8,
                                       max_prompt_tokens=100000)
    assert len({r["id"] for f in files for r in load_regenerated(f)}) == 72


def test_each_part_resumes_on_its_own(tiny, tmp_path, monkeypatch):
    out = tmp_path / "all"
    assert regen(out) == 0
    files = chunk_files(out, 3)
    whole = [f.read_bytes() for f in files]
    lines = whole[1].decode().splitlines(keepends=True)
    files[1].write_text("".join(lines[:-3]) + lines[-3][:7])  # killed mid-write: 2 rows lost, 1 torn
    files[2].unlink()                                          # never started
    answered = []
    real = regeneration.generate_batch
    monkeypatch.setattr(regeneration, "generate_batch", lambda t, seqs, m: answered.extend(seqs) or real(t, seqs, m))
    assert regen(out) == 0
    assert len(answered) == 3 + len(chunk(training_pool(data_dir="fixtures"), 2, 3))
    assert files[0].read_bytes() == whole[0]                   # a finished part is left alone
    assert sorted(load_regenerated(files[1]), key=lambda r: r["id"]) == \
        sorted((json.loads(x) for x in whole[1].decode().splitlines()[1:]), key=lambda r: r["id"])
    assert {r["id"] for r in load_regenerated(files[2])} == {p["id"] for p in chunk(training_pool(data_dir="fixtures"), 2, 3)}


def test_a_part_refuses_other_settings(tiny, tmp_path):
    out = tmp_path / "all"
    assert regen(out) == 0
    assert regen(out, "--seed", "1") == 2                      # another draw: refused, nothing mixed
    assert regen(out, "--chunks", "3") == 0


def test_the_command_names_the_chunks():
    cmd = regenerate_command(replace(RegenerateConfig(), n=0, chunks=8, max_new_tokens=256), regeneration.Path("/x/all"))
    assert cmd.startswith("python -m jetflow regenerate --n 0 --chunks 8 --out all ")


def test_side_by_side_processes_share_the_parts(tiny, tmp_path, capsys):
    """A part another process holds is skipped, not refused: the run does the others and says which it left."""
    out = tmp_path / "all"
    files = chunk_files(out, 3)
    out.mkdir()
    with jsonl.locked(files[1]):  # another regenerate is writing part 1
        assert regen(out) == 0
    assert files[0].is_file() and files[2].is_file() and not files[1].exists()
    assert not files[1].with_name(files[1].name + ".meta.json").exists()
    assert "left to the other process(es): part-01-of-03.jsonl" in capsys.readouterr().out
    assert regen(out) == 0  # the lock is free again: the rerun fills in part 1 and leaves the rest alone
    assert {r["id"] for r in load_regenerated(files[1])} == {p["id"] for p in chunk(training_pool(data_dir="fixtures"), 1, 3)}


def test_one_file_held_by_another_process_is_refused(tiny, tmp_path):
    out = tmp_path / "one.jsonl"
    with jsonl.locked(out):
        assert main(["regenerate", "--n", "4", "--out", str(out), "--max-new-tokens", "2"]) == 2
    assert not out.exists()

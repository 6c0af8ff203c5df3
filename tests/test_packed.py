"""Tests for jetflow/data/packed.py: packing regenerated ids and unpacking them gives the same files byte for
byte (so training and the taps cache, which identify data by sha256, accept them), with provenance."""
import json

import numpy as np
import pytest

from jetflow.data import packed
from jetflow.cli import main
from jetflow.data.regenerate import load_regenerated


def rows(k, n=6, vocab=49152):
    rng = np.random.default_rng(k)
    prefixes = ["gsm8k-train", "gpteacher-codegen", "hh-rlhf-helpful-base-test", "arena-hard-v2.0"]
    return [{"id": f"{prefixes[i % 4]}:{k}-{i}", "prompt_ids": rng.integers(0, vocab, 3 + i).tolist(),
             "response_ids": rng.integers(0, vocab, 1 + 2 * i).tolist()} for i in range(n)]


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "regen"
    root.mkdir()
    for k in range(2):
        header = {"settings": {"model": "smollm2-135m", "chunk": k, "chunks": 2, "n": 0}}
        path = root / f"part-{k:02d}-of-02.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in [header, *rows(k)]))
        path.with_name(path.name + ".meta.json").write_text(json.dumps({"command": "python -m jetflow regenerate --n 0 --chunks 2"}))
    return root


def test_pack_then_unpack_gives_the_same_files(folder, tmp_path):
    out = packed.pack(folder, tmp_path / "ids")
    assert sorted(p.name for p in out.iterdir()) == ["part-00-of-02.npz", "part-01-of-02.npz", "provenance.json"]
    back = packed.unpack(out, tmp_path / "back")
    for path in back:
        assert path.read_bytes() == (folder / path.name).read_bytes()
        assert json.loads(path.with_name(path.name + ".meta.json").read_text())["command"].endswith("--chunks 2")
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["command"] == "python -m jetflow regenerate --n 0 --chunks 2" and "Apache-2.0" in prov["model"]
    assert [f["rows"] for f in prov["files"]] == [6, 6] and prov["files"][1]["settings"]["chunk"] == 1
    assert prov["files"][0]["sources"]["gsm8k-train"] == 2 and prov["sources"]["gsm8k-train"]["licence"] == "MIT"
    with np.load(out / "part-00-of-02.npz") as z:
        assert z["tokens"].dtype == np.uint16 and z["tokens"].size == sum(3 + i + 1 + 2 * i for i in range(6))


def test_unpack_leaves_the_files_already_there_and_rewrites_a_changed_one(folder, tmp_path):
    out = packed.pack(folder, tmp_path / "ids")
    back = packed.unpack(out, tmp_path / "back")
    stamp = {p.name: p.stat().st_mtime_ns for p in back}
    back[1].write_text(back[1].read_text()[:-20])  # a damaged copy
    again = packed.unpack(out, tmp_path / "back")
    assert again == back and back[0].stat().st_mtime_ns == stamp[back[0].name]  # untouched
    assert back[1].read_bytes() == (folder / back[1].name).read_bytes()          # restored


def test_a_wide_vocabulary_packs_in_uint32_and_a_file_without_header_round_trips(tmp_path):
    path = tmp_path / "regen.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(3, vocab=150_000)))
    out = packed.pack(path, tmp_path / "ids")
    with np.load(out / "regen.npz") as z:
        assert z["tokens"].dtype == np.uint32
    [back] = packed.unpack(out, tmp_path / "back")
    assert back.read_bytes() == path.read_bytes() and load_regenerated(back) == rows(3, vocab=150_000)


def test_unpack_refuses_a_damaged_pack_and_pack_refuses_a_too_large_file(folder, tmp_path, monkeypatch):
    out = packed.pack(folder, tmp_path / "ids")
    prov = json.loads((out / "provenance.json").read_text())
    prov["files"][0]["sha256"] = "0" * 64
    (out / "provenance.json").write_text(json.dumps(prov))
    with pytest.raises(ValueError, match="sha256 differs"):
        packed.unpack(out, tmp_path / "back")
    assert not (tmp_path / "back" / "part-00-of-02.jsonl").exists()
    monkeypatch.setattr(packed, "MAX_BYTES", 100)
    with pytest.raises(ValueError, match="more --chunks"):
        packed.pack(folder, tmp_path / "small")


def test_cli_round_trip_and_clear_errors(folder, tmp_path, capsys):
    assert main(["pack", "--data", str(folder), "--parts", "1", "--out", str(tmp_path / "ids")]) == 0
    assert main(["unpack", "--packed", str(tmp_path / "ids"), "--out", str(tmp_path / "back")]) == 0
    assert sorted(p.name for p in (tmp_path / "back").glob("*.jsonl")) == ["part-00-of-02.jsonl"]
    assert main(["unpack", "--packed", str(tmp_path / "nothing"), "--out", str(tmp_path / "b2")]) == 2
    assert "no provenance.json" in capsys.readouterr().err

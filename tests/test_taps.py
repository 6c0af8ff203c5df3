"""Tests for jetflow/training/taps.py and cached-taps training on a tiny random bf16 Llama target: the cache holds
exactly the online taps, resumes per shard, refuses other settings; training on it gives the online
path's loss and weights, resumes, and reads the first K parts of a chunked folder."""
import dataclasses
import json

import pytest
import torch

from jetflow.cli import main
from jetflow.data.regenerate import data_files
from jetflow.drafting.head import DraftHead
from jetflow.engine.target import Target
from jetflow.training.taps import CachedTaps, OnlineTaps, build, build_all, cache_for, sequence_ids
from jetflow.training.train import build_head, train
from jetflow.training.step import BlockForward, sequence_loss
from jetflow.training.config import TrainConfig
from fakes import ByteTokenizer, tiny_model

V = 211
LAYERS = (0, 3)


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama", V, seed=3).to(torch.bfloat16), ByteTokenizer(), "tiny-llama-211")


def fake_rows(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"id": f"src{i % 2}:{seed}-{i}", "prompt_ids": torch.randint(0, V - 1, (5 + i % 4,), generator=g).tolist(),
             "response_ids": torch.randint(0, V - 1, (12 + 3 * (i % 5),), generator=g).tolist()} for i in range(n)]


def write(path, rows, header=None):
    lines = ([{"settings": header}] if header else []) + rows
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


@pytest.fixture
def data(tmp_path):
    return write(tmp_path / "regen.jsonl", fake_rows(7))


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "chunked"
    root.mkdir()
    for k in range(3):
        write(root / f"part-{k:02d}-of-03.jsonl", fake_rows(5, seed=k), {"chunk": k, "chunks": 3})
    return root


def cached_cfg(data, out, **kw) -> TrainConfig:
    return TrainConfig.from_name("smoke", data=str(data), out=str(out), block_size=5, loss="ce", **kw)


def layers_of(cfg, target):
    return build_head(cfg, target).config.target_layer_ids


# ----------------------------------------------------------------------------- the cache
def test_cache_holds_the_online_taps_bit_for_bit(target, data, tmp_path):
    out = build(target, data, layers=LAYERS, max_len=20, out=tmp_path / "taps", shard_rows=3, progress=False)
    assert sorted(p.name for p in out.glob("*.offsets.npy")) == [f"shard-0000{k}.offsets.npy" for k in range(3)]
    header = json.loads((out / "taps.json").read_text())
    assert header["tap_layers"] == list(LAYERS) and header["rows"] == 7 and header["dtype"] == "bfloat16"
    cache = CachedTaps.open(target, [data], [out], layers=LAYERS, max_len=20)
    for i, row in enumerate(json.loads(x) for x in data.read_text().splitlines()):
        ids = sequence_ids(row, 20)
        _, online = OnlineTaps(target, LAYERS)(i, ids)
        _, cached = cache(i, ids)
        assert cached.dtype == torch.bfloat16 and cached.shape == (ids.numel(), len(LAYERS), 32)
        assert torch.equal(cached, online), i
    with pytest.raises(ValueError, match="kl loss needs --taps online"):
        cache(0, sequence_ids(row, 20), logits=True)


def test_a_killed_build_resumes_at_its_first_missing_shard(target, data, tmp_path, monkeypatch):
    out = build(target, data, layers=LAYERS, max_len=20, out=tmp_path / "taps", shard_rows=3, progress=False)
    whole = {p.name: p.read_bytes() for p in out.glob("*.npy")}
    (out / "shard-00001.offsets.npy").unlink()  # killed between the two files of shard 1
    (out / "shard-00002.npy").write_bytes(b"torn")
    (out / "shard-00002.offsets.npy").unlink()
    calls = []
    real = target.sequence_taps
    monkeypatch.setattr(target, "sequence_taps", lambda *a, **k: calls.append(1) or real(*a, **k))
    build(target, data, layers=LAYERS, max_len=20, out=out, shard_rows=3, progress=False)
    assert len(calls) == 3 + 1  # shards 1 (rows 3-5) and 2 (row 6) only
    assert {p.name: p.read_bytes() for p in out.glob("*.npy")} == whole


def test_a_second_builder_of_the_same_cache_is_refused(target, data, tmp_path):
    from jetflow.util import jsonl
    (tmp_path / "taps").mkdir()
    with jsonl.locked(tmp_path / "taps"):
        with pytest.raises(ValueError, match="being written by another process"):
            build(target, data, layers=LAYERS, max_len=20, out=tmp_path / "taps", progress=False)


def test_a_whole_cache_is_read_while_another_process_holds_its_lock(target, data, tmp_path):
    from jetflow.util import jsonl
    out = build(target, data, layers=LAYERS, max_len=20, out=tmp_path / "taps", progress=False)
    whole = {p.name: p.stat().st_mtime_ns for p in out.glob("*.npy")}
    with jsonl.locked(out):  # e.g. a second curve process: nothing to build, so no lock is needed
        assert build(target, data, layers=LAYERS, max_len=20, out=out, progress=False) == out
        with pytest.raises(ValueError, match="other settings"):  # but the settings are still checked
            build(target, data, layers=LAYERS, max_len=30, out=out, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.npy")} == whole


def _hold_then_let_go(path, ready):
    import time
    from jetflow.util import jsonl
    with jsonl.locked(path):
        ready.set()
        time.sleep(0.5)


def test_a_waiting_builder_builds_once_the_other_lets_go(target, data, tmp_path, capsys):
    import multiprocessing as mp
    out = tmp_path / "taps"
    out.mkdir()
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_then_let_go, args=(out, ready))
    holder.start()
    assert ready.wait(30)
    build(target, data, layers=LAYERS, max_len=20, out=out, progress=False, wait=True)
    holder.join(30)
    assert "waiting for another process" in capsys.readouterr().out
    reference = build(target, data, layers=LAYERS, max_len=20, out=tmp_path / "ref", progress=False)
    assert {p.name: p.read_bytes() for p in out.glob("*.npy")} == {p.name: p.read_bytes() for p in reference.glob("*.npy")}


def test_shared_builders_split_the_files_and_wait_for_the_one_held(target, folder, tmp_path, monkeypatch):
    # `taps --share` in two processes: a file another process holds is passed over, then waited for at the end
    import multiprocessing as mp
    files = data_files(folder, 0)
    caches = [cache_for(tmp_path / "taps", f, True) for f in files]
    caches[0].mkdir(parents=True)
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_then_let_go, args=(caches[0], ready))  # holds part 0 for half a second
    holder.start()
    assert ready.wait(30)
    order, real_build = [], build
    monkeypatch.setattr("jetflow.training.taps.build", lambda t, f, **kw: order.append((f.name, kw["wait"])) or real_build(t, f, **kw))
    assert build_all(target, files, caches, layers=LAYERS, max_len=20, shard_rows=2, progress=False, share=True,
                     wait=True) == caches
    holder.join(30)
    names = [f.name for f in files]
    assert order == [(names[0], False), (names[1], False), (names[2], False), (names[0], True)]
    for f, c in zip(files, caches):  # every file whole, each as one builder alone makes it
        ref = real_build(target, f, layers=LAYERS, max_len=20, shard_rows=2, out=tmp_path / "ref" / f.stem, progress=False)
        assert {p.name: p.read_bytes() for p in c.glob("*.npy")} == {p.name: p.read_bytes() for p in ref.glob("*.npy")}


@pytest.mark.parametrize("change", [dict(max_len=30), dict(layers=(1, 3)), dict(shard_rows=2)])
def test_build_refuses_a_cache_of_other_settings(target, data, tmp_path, change):
    kw = dict(layers=LAYERS, max_len=20, out=tmp_path / "taps", shard_rows=3, progress=False)
    build(target, data, **kw)
    with pytest.raises(ValueError, match="other settings"):
        build(target, data, **(kw | change))


def test_reading_refuses_a_cache_that_does_not_fit(target, data, tmp_path):
    out = build(target, data, layers=LAYERS, max_len=20, out=tmp_path / "taps", shard_rows=3, progress=False)
    with pytest.raises(ValueError, match="tap_layers"):
        CachedTaps.open(target, [data], [out], layers=(1, 3), max_len=20)
    with pytest.raises(ValueError, match="max_len: 20 .cache. < 40"):
        CachedTaps.open(target, [data], [out], layers=LAYERS, max_len=40)
    assert CachedTaps.open(target, [data], [out], layers=LAYERS, max_len=10)  # a shorter max_len reads a prefix
    (out / "shard-00001.offsets.npy").unlink()
    with pytest.raises(ValueError, match="incomplete .1 of 3 shards missing"):
        CachedTaps.open(target, [data], [out], layers=LAYERS, max_len=20)
    write(data, fake_rows(7, seed=9))  # the data changed under the cache
    with pytest.raises(ValueError, match="data_sha256"):
        CachedTaps.open(target, [data], [out], layers=LAYERS, max_len=20)
    with pytest.raises(FileNotFoundError, match="python -m jetflow taps"):
        CachedTaps.open(target, [data], [tmp_path / "none"], layers=LAYERS, max_len=20)


# ----------------------------------------------------------------------------- cached-taps training
def test_online_and_cached_give_the_same_loss_on_the_same_batch(target, data, tmp_path):
    cfg = cached_cfg(data, tmp_path / "run", max_len=32)
    head = build_head(cfg, target)
    out = build(target, data, layers=head.config.target_layer_ids, max_len=32, out=tmp_path / "taps", progress=False)
    cache, online = CachedTaps.open(target, [data], [out], layers=head.config.target_layer_ids, max_len=32), \
        OnlineTaps(target, head.config.target_layer_ids)
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    for i in (0, 4, 6):
        ids, p = sequence_ids(rows[i], 32), len(rows[i]["prompt_ids"])
        anchors = torch.arange(p, ids.numel() - 1, 2)
        a = sequence_loss(BlockForward(head), target, ids, anchors, cfg, features=online(i, ids))
        b = sequence_loss(BlockForward(head), target, ids, anchors, cfg, features=cache(i, ids))
        assert a[1] == b[1] > 0 and torch.equal(a[0], b[0]), i
        assert torch.equal(a[0], sequence_loss(BlockForward(head), target, ids, anchors, cfg)[0])


def test_cached_training_matches_online_weights_and_resumes(target, data, tmp_path):
    cfg = cached_cfg(data, tmp_path / "online", max_len=32, eval_seqs=2)
    build(target, data, layers=layers_of(cfg, target), max_len=32, out=tmp_path / "taps", progress=False)
    cached = dataclasses.replace(cfg, taps="cached", taps_dir=str(tmp_path / "taps"))
    online, h_online = train(cfg, target, progress=False)
    straight, h_cached = train(dataclasses.replace(cached, out=str(tmp_path / "cached")), target, progress=False)
    for (name, a), b in zip(online.state_dict().items(), straight.state_dict().values()):
        assert torch.equal(a, b), name
    assert [h["loss"] for h in h_online] == [h["loss"] for h in h_cached]
    resumed_cfg = dataclasses.replace(cached, out=str(tmp_path / "resumed"))
    train(resumed_cfg, target, stop_at=2, progress=False)
    resumed, history = train(resumed_cfg, target, progress=False)
    assert [h["step"] for h in history] == [0, 1, 2, 3, 4]
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)
    with pytest.raises(ValueError, match="differs in .'taps'"):  # a checkpoint remembers its taps source
        train(dataclasses.replace(resumed_cfg, taps="online", taps_dir=None), target, progress=False)


def test_cached_taps_refuse_the_kl_loss_in_one_line():
    with pytest.raises(ValueError, match="cached taps hold no teacher distribution: train with --loss ce"):
        TrainConfig(taps="cached", loss="kl")


def test_cached_training_without_a_cache_says_how_to_build_it(target, data, tmp_path):
    cfg = dataclasses.replace(cached_cfg(data, tmp_path / "run"), taps="cached", taps_dir=str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError, match="python -m jetflow taps --data"):
        train(cfg, target, progress=False)


# ----------------------------------------------------------------------------- chunked folders
def test_data_files_pick_the_first_parts(folder, data):
    assert [f.name for f in data_files(folder, 2)] == ["part-00-of-03.jsonl", "part-01-of-03.jsonl"]
    assert len(data_files(folder)) == 3 and data_files(data) == [data]
    for bad, match in [((folder, 4), "holds 3 part files"), ((data, 2), "one file"), ((folder, -1), ">= 0")]:
        with pytest.raises(ValueError, match=match):
            data_files(*bad)
    (folder.parent / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no part-KK-of-NN"):
        data_files(folder.parent / "empty")


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_training_on_the_first_parts_of_a_chunked_folder(target, folder, tmp_path, parts):
    cfg = cached_cfg(folder, tmp_path / "run", max_len=32, eval_seqs=2, parts=parts, taps="cached",
                     taps_dir=str(tmp_path / "taps"))
    files = data_files(folder, parts)
    build_all(target, files, [cache_for(tmp_path / "taps", f, True) for f in files], layers=layers_of(cfg, target),
              max_len=32, shard_rows=2, progress=False)
    head, history = train(cfg, target, progress=False)
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert prov["data"]["parts"] == [f.name for f in files] and prov["data"]["sequences"] == 5 * parts
    assert prov["data"]["train_sequences"] == 5 * parts - 2 and prov["data"]["eval_sequences"] == 2
    assert f"--parts {parts}" in prov["command"] and "--taps cached" in prov["command"]
    assert DraftHead.from_pretrained(str(tmp_path / "run")).config == head.config


def test_cli_taps_missing_data_is_a_clear_error(tmp_path, capsys):
    assert main(["taps", "--data", str(tmp_path / "nope.jsonl")]) == 2
    assert "error:" in capsys.readouterr().err


def test_cli_taps_on_the_embedded_target_holds_its_taps(smol, tmp_path):
    """slow: `python -m jetflow taps` on SmolLM2 (fp32 here) stores the bf16 rounding of its taps."""
    from jetflow.drafting.head import HeadConfig
    ids = [smol.encode(text).tolist() for text in ("What is 2 + 3?", "Name a colour.")]
    rows = [{"id": f"chat:{i}", "prompt_ids": p, "response_ids": p[-5:]} for i, p in enumerate(ids)]
    data = write(tmp_path / "regen.jsonl", rows, {"model": smol.name})
    assert main(["taps", "--data", str(data), "--out", str(tmp_path / "taps"), "--max-len", "24",
                 "--dtype", "float32"]) == 0
    layers = HeadConfig.for_target(smol.config).target_layer_ids
    cache = CachedTaps.open(smol, [data], [tmp_path / "taps"], layers=layers, max_len=24)
    for i, row in enumerate(rows):
        seq = sequence_ids(row, 24)
        _, online = smol.sequence_taps(seq, layers, logits=False)
        assert torch.equal(cache(i, seq)[1], online.to(torch.bfloat16)) and online.shape[1:] == (2, 576)


# ----------------------------------------------------------------------------- --holdout
def whole(folder):
    for part in folder.glob("part-*.jsonl"):
        part.with_name(part.name + ".meta.json").write_text("{}")
    return folder


def test_holdout_keeps_evenly_spaced_rows_of_the_last_part_out_of_training(target, folder, tmp_path):
    from jetflow.data.holdout import holdout_rows
    from jetflow.training.train import split_data
    cfg = cached_cfg(whole(folder), tmp_path / "run", max_len=32, eval_seqs=2, parts=3, holdout=2)
    split = split_data(cfg)
    assert split.holdout == {10, 12}                           # part 2 holds rows 10..14: its rows 0 and 2
    assert not split.holdout & {i for i, _ in split.indexed} and len(split.indexed) == 15 - 2 - 2
    assert split_data(dataclasses.replace(cfg, parts=2)).holdout == frozenset()  # part 2 not reached: all kept
    for part in folder.glob("part-02-of-03.jsonl*"):  # before part 2 exists, part 1 is still not the last one
        part.rename(tmp_path / part.name)
    assert split_data(dataclasses.replace(cfg, parts=0)).holdout == frozenset()
    for part in tmp_path.glob("part-02-of-03.jsonl*"):
        part.rename(folder / part.name)
    assert holdout_rows(fake_rows(10), 4) == [0, 2, 5, 7]
    head, _ = train(dataclasses.replace(cfg, taps="online"), target, progress=False)
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert prov["data"]["holdout_ids"] == [fake_rows(5, seed=2)[i]["id"] for i in (0, 2)]
    assert prov["data"]["train_sequences"] == 11 and "--holdout 2" in prov["command"]


def test_holdout_refuses_a_part_still_growing_or_too_short(folder, tmp_path):
    from jetflow.training.train import split_data
    cfg = cached_cfg(folder, tmp_path / "run", max_len=32, eval_seqs=2, parts=3, holdout=2)
    with pytest.raises(ValueError, match="still being regenerated"):
        split_data(cfg)
    with pytest.raises(ValueError, match="cannot hold out 5 of the 5 rows"):
        split_data(dataclasses.replace(cfg, data=str(whole(folder)), holdout=5))
    with pytest.raises(ValueError, match="holdout must be >= 0"):
        dataclasses.replace(cfg, holdout=-1)


# ----------------------------------------------------------------------------- the correction's features
def test_the_correction_trains_the_same_from_the_cache_as_from_the_target(target, folder, tmp_path, monkeypatch):
    """``train-correction --taps cached`` reads each row's taps by its number across the parts (one row of
    part 1 left out shifts the rest) and gives the online path's features and weights; a missing cache is
    refused with the command that builds it."""
    import jetflow.data.holdout
    import jetflow.drafting.methods
    import jetflow.engine.load
    from jetflow.drafting.correction import load_correction
    from jetflow.training.correction_train import CorrectionTrainConfig, train_correction
    from jetflow.drafting.proposers import HeadProposer
    head_dir = tmp_path / "head"
    head = build_head(cached_cfg(folder, head_dir), target).eval()
    head_dir.mkdir()
    proposer = HeadProposer(head, target, "best_prefix")
    monkeypatch.setenv("JETFLOW_CACHE", str(tmp_path))  # the data lies in the cache folder
    monkeypatch.setattr(jetflow.data.holdout, "heldout_prompts", lambda n, **kw: [{"id": "src1:1-1"}])
    monkeypatch.setattr(jetflow.engine.load, "load_target", lambda *a, **kw: target)
    monkeypatch.setattr(jetflow.drafting.methods, "make_proposer", lambda *a, **kw: proposer)
    files = data_files(folder)
    build_all(target, files, [cache_for(tmp_path / "taps", f, True) for f in files], layers=proposer.taps,
              max_len=64, progress=False)
    cfg = CorrectionTrainConfig(data=str(folder), max_seqs=0, anchors=4, candidates=8, rank=4, epochs=1,
                                batch_size=16, out=str(head_dir), taps_dir=str(tmp_path / "taps"))
    feats, weights = {}, {}
    for taps in ("online", "cached"):
        train_correction(dataclasses.replace(cfg, taps=taps, cache=str(tmp_path / taps)), progress=False)
        shards = sorted((tmp_path / taps / "features").glob("shard-*.pt"))
        feats[taps] = [torch.load(s) for s in shards]
        weights[taps] = load_correction(head_dir).state_dict()
    assert len(feats["online"][0]["ids"]) == 14 and "src1:1-1" not in feats["online"][0]["ids"]
    for a, b in zip(feats["online"], feats["cached"], strict=True):
        assert a["ids"] == b["ids"] and all(torch.equal(a[k], b[k]) for k in a if k != "ids")
    assert all(torch.equal(weights["online"][k], weights["cached"][k]) for k in weights["online"])
    command = json.loads((head_dir / "correction.json").read_text())
    command = command.get("provenance", command)["command"]  # the data as the cache folder names it, no local path
    assert "--data $JETFLOW_CACHE/chunked" in command and str(tmp_path) not in command
    with pytest.raises(FileNotFoundError, match="jetflow taps --data"):
        train_correction(dataclasses.replace(cfg, taps="cached", taps_dir=str(tmp_path / "none"),
                                             cache=str(tmp_path / "x")), progress=False)

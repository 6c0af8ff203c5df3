import contextlib
import json
import multiprocessing as mp
import threading

import pytest

from jetflow.util import jsonl


def test_append_then_read_round_trips(tmp_path):
    path = tmp_path / "a.jsonl"
    jsonl.append(path, [{"i": 0}, {"i": 1, "s": "x\u2028y"}])
    jsonl.append(path, [{"i": 2}])
    assert jsonl.read(path) == [{"i": 0}, {"i": 1, "s": "x\u2028y"}, {"i": 2}]
    assert jsonl.read(tmp_path / "missing.jsonl") == []


def test_torn_last_line_is_truncated_on_disk_and_appending_continues(tmp_path, caplog):
    path = tmp_path / "a.jsonl"
    jsonl.append(path, [{"i": 0}, {"i": 1}])
    with open(path, "a") as f:
        f.write('{"i": 2, "half')  # a kill mid-write
    assert jsonl.read(path) == [{"i": 0}, {"i": 1}]
    assert "cut short" in caplog.text
    assert path.read_bytes().endswith(b"}\n")
    jsonl.append(path, [{"i": 3}])
    assert [r["i"] for r in jsonl.read(path)] == [0, 1, 3]  # twice: the repair holds
    assert [r["i"] for r in jsonl.read(path)] == [0, 1, 3]


def test_read_only_mode_leaves_the_file_alone(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"i": 0}\n{"i"')
    assert jsonl.read(path, repair=False) == [{"i": 0}]
    assert path.read_text() == '{"i": 0}\n{"i"'


@pytest.mark.parametrize("bad, what", [('{"i": 0}\nnot json\n{"i": 1}\n', "line 2: not valid JSON"),
                                       ('{"i": 0}\n[1, 2]\n', "line 2: expected a JSON object")])
def test_damage_inside_the_file_is_an_error_naming_the_line(tmp_path, bad, what):
    path = tmp_path / "a.jsonl"
    path.write_text(bad)
    with pytest.raises(ValueError, match=what):
        jsonl.read(path)
    assert path.read_text() == bad  # nothing lost


def _hold_lock(path, ready, release):
    with jsonl.locked(path):
        ready.set()
        release.wait(30)


@contextlib.contextmanager
def held(path):
    """Another process holds ``path``'s lock inside the block; -> the event that tells it to let go."""
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(path, ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        yield release
    finally:
        release.set()
        holder.join(30)


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path, kind):
    path = tmp_path / "out"
    if kind == "folder":
        path.mkdir()
    with held(path):
        with pytest.raises(ValueError, match="being written by another process"):
            with jsonl.locked(path):
                pass
    with jsonl.locked(path):  # free again once the holder is gone
        pass


def test_a_waiting_writer_gets_the_lock_once_the_first_lets_go(tmp_path, capsys):
    path = tmp_path / "out"
    path.mkdir()
    with held(path) as release:
        timer = threading.Timer(0.5, release.set)
        timer.start()
        with jsonl.locked(path, wait=True):
            assert release.is_set()  # had only once the holder was told to let go
        timer.join(30)
    assert "waiting for another process to finish writing" in capsys.readouterr().out


def test_lock_of_a_killed_holder_is_released(tmp_path):
    path = tmp_path / "a.jsonl"
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(path, ready, release))
    holder.start()
    assert ready.wait(30)
    holder.kill()
    holder.join(30)
    with jsonl.locked(path):
        pass

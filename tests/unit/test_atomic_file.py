"""Replacing a file atomically and durably (``logrouter.atomic_file``), and every state file
the router keeps written that way: the new content is fsync'd before the rename, the
directory after it."""

from __future__ import annotations

import os

import pytest

from logrouter import atomic_file, dedupe
from logrouter.filters.memory import FilterMemory
from logrouter.pravega.streams import StreamRegistry
from logrouter.retired import RetiredSources
from logrouter.sinks.state import SinkState


@pytest.fixture
def synced(monkeypatch):
    """What happens, in order: ("fsync", path the fd names) and ("replace", source, target)."""
    steps: list[tuple] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd: int) -> None:
        steps.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_replace(source, target) -> None:
        steps.append(("replace", str(source), str(target)))
        replace(source, target)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    return steps


def replaced_durably(steps: list[tuple], path: str) -> bool:
    """``path`` was replaced by its fsync'd temporary file, then its directory fsync'd."""
    path = os.path.realpath(path)
    temporary = path + ".tmp"
    try:
        rename = steps.index(("replace", temporary, path))
    except ValueError:
        return False
    before, after = steps[:rename], steps[rename + 1:]
    return ("fsync", temporary) in before and ("fsync", os.path.dirname(path)) in after


def test_replace_file_writes_syncs_renames_and_syncs_the_directory(tmp_path, synced):
    path = tmp_path / "state" / "cursor.json"  # the directory is made
    atomic_file.replace_file(str(path), b"one")
    assert path.read_bytes() == b"one"
    assert synced == [
        ("fsync", str(path) + ".tmp"),
        ("replace", str(path) + ".tmp", str(path)),
        ("fsync", str(path.parent)),
    ]
    atomic_file.replace_file(str(path), b"two")
    assert path.read_bytes() == b"two" and os.listdir(path.parent) == ["cursor.json"]


def test_a_crash_before_the_rename_leaves_the_old_content(tmp_path, monkeypatch):
    path = tmp_path / "cursor.json"
    atomic_file.replace_file(str(path), b"old")

    def crash(source, target):
        raise OSError("killed")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        atomic_file.replace_file(str(path), b"new")
    assert path.read_bytes() == b"old"


def test_fsync_directory_syncs_the_directory(tmp_path, synced):
    atomic_file.fsync_directory(str(tmp_path))
    assert synced == [("fsync", str(tmp_path))]


# -- every state file goes through it ---------------------------------------------------------


def test_the_dedupe_snapshot_is_replaced_durably(tmp_path, synced):
    path = str(tmp_path / "dedupe.msgpack")
    dedupe.save_snapshot(path, dedupe.batch_digest("in", b"c"), 10, [(("p", b"w"), 3)])
    assert replaced_durably(synced, path)
    assert dedupe.load_snapshot(path) == (10, dedupe.batch_digest("in", b"c"), [("p", b"w", 3)])


def test_the_filters_memory_is_replaced_durably(tmp_path, synced):
    memory = FilterMemory(str(tmp_path))
    memory.save([("unique", "dedupe", "fingerprint", 7, list, [])])
    assert replaced_durably(synced, memory.path)


def test_a_sinks_state_is_replaced_durably(tmp_path, synced):
    state = SinkState(str(tmp_path / "sinks" / "lake.json"))
    state.save({"cursor": 42})
    assert replaced_durably(synced, state.path) and state.load() == {"cursor": 42}


def test_the_saved_routes_are_replaced_durably(tmp_path, synced):
    from twisted.internet import defer

    from logrouter.config.load import load_string

    config = load_string(
        f'[spool]\npath = "{tmp_path}"\n[sources.in]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[sinks.out]\ntype = "blackhole"\ninputs = ["in"]\n'
    )
    retired = RetiredSources(str(tmp_path), errors=None, run_blocking=lambda f, *a: defer.maybeDeferred(f, *a))
    retired.save(config)
    assert replaced_durably(synced, retired.path)


def test_pravegas_stream_table_is_replaced_durably(tmp_path, synced):
    table = StreamRegistry(str(tmp_path / "pravega" / "streams.json"))
    table.create_scope("logs")
    assert replaced_durably(synced, table.path)

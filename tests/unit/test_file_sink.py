"""The file sink: JSON lines, rolling, and its commit protocol with a crash between steps.

Like tests/unit/test_parquet_sink_commit.py, the worker-thread code (``_recover``, ``_run``)
is called directly with an injected clock: no threads, no sleeps.
"""

from __future__ import annotations

import json
import math

import pytest
from twisted.internet import task

from logrouter.batch import Batch
from logrouter.sinks.file import _ROWS, _STOP, _TICK, FileSink, encode_lines, TimeText
from logrouter.sinks.state import SinkState

T0 = 1_700_000_000 * 10**9  # 2023-11-14T22:13:20Z


class Crash(Exception):
    pass


def make_sink(tmp_path, **options) -> FileSink:
    config = {
        "path": str(tmp_path / "out"),
        "prefix": "",
        "roll_bytes": 1 << 30,
        "roll_secs": 10.0,
        "max_queue_bytes": 1 << 20,
        "retry_initial_secs": 1.0,
        "retry_max_secs": 8.0,
    }
    config.update(options)
    errors = []
    sink = FileSink("dead", config, errors=lambda *a: errors.append(a), reactor=task.Clock())
    sink.state = SinkState(str(tmp_path / "spool" / "sinks" / "dead.json"))
    sink.refused = errors
    return sink


def record(position: int, ids: range, now: float = 0.0, tag: str = "t") -> tuple:
    """What the router hands the sink for one spool record starting at ``position``."""
    events = [(T0 + i, {"id": i}) for i in ids]
    return ((_ROWS, Batch(tag, events), position, 100), now, position, 0)


def tick(now: float, fed_end: int) -> tuple:
    return ((_TICK,), now, fed_end, 0)


def stop(now: float, fed_end: int) -> tuple:
    return ((_STOP,), now, fed_end, 0)


def published(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "out").glob("*.jsonl"))


def ids(tmp_path) -> list[int]:
    """Every id in the published files, sorted (files of one second sort by their run token)."""
    out = []
    for name in published(tmp_path):
        for line in (tmp_path / "out" / name).read_text().splitlines():
            out.append(json.loads(line)["record"]["id"])
    return sorted(out)


def staged(tmp_path) -> list:
    return list((tmp_path / "out" / "_staging").rglob("*.jsonl"))


def test_lines_carry_time_tag_and_record():
    data, count, refused = encode_lines(
        "app.web",
        [(T0 + 250_000_000, {"msg": "héllo", "n": 1, "b": b"\xffok", "x": math.nan, "nested": {"a": [1, None]}}),
         (T0, {"loop": None})],
        TimeText(),
    )
    assert count == 2 and refused == []
    first, second = [json.loads(line) for line in data.decode().splitlines()]
    assert first == {
        "time": "2023-11-14T22:13:20.250000000Z",
        "tag": "app.web",
        "record": {"msg": "héllo", "n": 1, "b": "\\xffok", "x": "nan", "nested": {"a": [1, None]}},
    }
    assert second["time"] == "2023-11-14T22:13:20.000000000Z"


def test_a_record_json_cannot_take_is_refused_alone():
    loop: dict = {}
    loop["self"] = loop
    data, count, refused = encode_lines("t", [(T0, {"ok": 1}), (T0, loop), (T0, {"ok": 2})], TimeText())
    assert count == 2 and len(refused) == 1 and "cannot be written as JSON" in refused[0][1]


def test_files_roll_by_time_and_publish_atomically(tmp_path):
    sink = make_sink(tmp_path, roll_secs=10.0)
    assert sink._recover() == 0
    sink._run([record(0, range(0, 5)), record(100, range(5, 10), now=3.0), tick(5.0, 200)])
    assert published(tmp_path) == [] and len(staged(tmp_path)) == 1
    assert sink._saved_cursor == -1 or sink._saved_cursor == 0
    result = sink._run([tick(10.0, 200)])
    assert result[1] == 200 and sink.state.load() == {"cursor": 200, "files": [[str(staged_path(sink, 1)), str(final_path(sink, 1))]]}
    assert ids(tmp_path) == list(range(10)) and staged(tmp_path) == []
    name = published(tmp_path)[0]
    assert name.startswith("dead-19700101T000000Z-") and name.endswith("-000001.jsonl")
    assert sink.files_published == 1 and sink.lines_published == 10 and sink.commits == 1


def staged_path(sink, seq):
    return next(p for p in [sink._file and sink._file.staging] if p) if sink._file else _name(sink, seq, staging=True)


def final_path(sink, seq):
    return _name(sink, seq, staging=False)


def _name(sink, seq, staging):
    import os

    name = f"{sink.prefix}-19700101T000000Z-{sink.run}-{seq:06d}.jsonl"
    return os.path.join(sink.staging_dir if staging else sink.root, name)


def test_files_roll_by_size_at_record_boundaries_only(tmp_path):
    sink = make_sink(tmp_path, roll_bytes=200)
    sink._recover()
    # Two batches of one spool record (position 0): the file may not be sealed between them.
    first = record(0, range(0, 5))
    second = ((_ROWS, Batch("t", [(T0 + i, {"id": i}) for i in range(5, 10)]), 0, 0), 0.0, 0, 0)
    sink._run([first, second])
    assert published(tmp_path) == []
    sink._run([record(100, range(10, 12))])  # a new record: the full file is sealed first, cursor 100
    assert ids(tmp_path) == list(range(10)) and sink.state.load()["cursor"] == 100
    sink._run([stop(1.0, 200)])
    assert ids(tmp_path) == list(range(12)) and sink.state.load()["cursor"] == 200


def test_an_open_file_is_not_sealed_until_its_last_record_is_complete(tmp_path):
    sink = make_sink(tmp_path, roll_secs=1.0)
    sink._recover()
    sink._run([record(100, range(0, 3))])
    sink._run([tick(5.0, 100)])  # the router has not advanced past record 100 yet
    assert published(tmp_path) == []
    sink._run([tick(6.0, 200)])
    assert ids(tmp_path) == [0, 1, 2] and sink.state.load()["cursor"] == 200


def test_cursor_only_commits_when_nothing_is_open(tmp_path):
    sink = make_sink(tmp_path)
    sink._recover()
    assert sink._run([tick(5.0, 300)])[1] == 300  # records with nothing for this sink
    assert sink.state.load() == {"cursor": 300, "files": []}
    assert sink._run([tick(5.5, 400)])[1] == 300  # at most once a second
    assert sink._run([tick(6.5, 400)])[1] == 400


def test_commit_then_crash_before_rename_is_finished_by_recovery(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([record(0, range(0, 10)), record(100, range(10, 20))])

    def crash(*args, **kwargs):
        raise Crash()

    monkeypatch.setattr(sink, "_publish", crash)
    with pytest.raises(Crash):
        sink._run([tick(11.0, 200)])  # fsync'd, commit record written, dies before the rename
    assert published(tmp_path) == [] and sink.state.load()["cursor"] == 200

    again = make_sink(tmp_path)
    assert again._recover() == 200  # the commit is redone: the file renamed into place
    assert ids(tmp_path) == list(range(20)) and staged(tmp_path) == []
    again._run([record(200, range(20, 25)), stop(1.0, 300)])  # the replay starts after it
    assert ids(tmp_path) == list(range(25))


def test_crash_before_the_commit_record_discards_staging_and_replays(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([record(0, range(0, 10))])

    def crash(state):
        raise Crash()

    monkeypatch.setattr(sink.state, "save", crash)
    with pytest.raises(Crash):
        sink._run([tick(11.0, 100)])
    assert published(tmp_path) == []

    again = make_sink(tmp_path)
    assert again._recover() == 0  # nothing committed: replay all of it
    assert staged(tmp_path) == []
    again._run([record(0, range(0, 10)), stop(1.0, 100)])
    assert ids(tmp_path) == list(range(10))


def test_crash_while_writing_loses_nothing_and_duplicates_nothing(tmp_path):
    """A kill -9 with a half-written staged file and the state of an earlier commit."""
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([record(0, range(0, 10)), tick(11.0, 100)])
    sink._run([record(100, range(10, 20), now=12.0)])
    sink._file.handle.flush()  # lines on disk in staging; no commit for them
    again = make_sink(tmp_path)  # the crash: the old sink is simply forgotten
    assert again._recover() == 100
    again._run([record(100, range(10, 20), now=30.0), stop(31.0, 200)])
    assert ids(tmp_path) == list(range(20))


def test_crash_after_the_rename_before_anything_else_is_idempotent(tmp_path):
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([record(0, range(0, 10)), stop(1.0, 100)])
    again = make_sink(tmp_path)
    assert again._recover() == 100  # the commit record names a file already renamed: fine
    assert ids(tmp_path) == list(range(10))


def test_a_failure_drops_the_open_file_and_the_replay_rewrites_it(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([record(0, range(0, 10)), tick(11.0, 100)])
    sink._run([record(100, range(10, 15), now=12.0)])
    staging = sink._file.staging
    append = sink._append

    def disk_full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sink, "_append", disk_full)
    with pytest.raises(OSError):
        sink._work([record(200, [99], now=13.0)])
    assert sink._file is None and not (tmp_path / staging).exists()
    monkeypatch.setattr(sink, "_append", append)
    # the failure's backoff ends: reset, then the router replays the spool from the cursor
    sink._run([(("reset",), 20.0, 100, 0), record(100, range(10, 15), now=20.0), record(200, [99], now=20.0), stop(21.0, 300)])
    assert ids(tmp_path) == list(range(15)) + [99]


def test_renames_that_fail_after_the_commit_are_finished_before_the_replay(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    sink._recover()
    publish = sink._publish

    def rename_fails(files, missing_ok=False):
        raise OSError(5, "Input/output error")

    sink._run([record(0, range(0, 10))])
    monkeypatch.setattr(sink, "_publish", rename_fails)
    with pytest.raises(OSError):
        sink._work([tick(11.0, 100)])
    assert sink._saved_cursor == 100
    monkeypatch.setattr(sink, "_publish", publish)
    sink._run([((("reset",)), 20.0, 100, 0), record(100, range(10, 12), now=20.0), stop(21.0, 200)])
    assert ids(tmp_path) == list(range(12))


def test_refused_records_go_to_the_error_path_and_the_rest_is_written(tmp_path):
    sink = make_sink(tmp_path)
    sink.start = None
    sink._recover()
    loop: dict = {}
    loop["self"] = loop
    batch = Batch("t", [(T0, {"id": 1}), (T0, loop)])
    freed, cursor, refused, undecodable = sink._run([((_ROWS, batch, 0, 100), 0.0, 0, 0), stop(1.0, 100)])
    assert ids(tmp_path) == [1] and len(refused) == 1 and refused[0][0] == "t"
    assert undecodable == []
    sink._done((freed, cursor, refused, undecodable))
    assert len(sink.refused) == 1 and sink.refused[0][0] == "dead" and "JSON" in sink.refused[0][3]


def test_two_prefixes_share_a_directory_without_touching_each_others_staging(tmp_path):
    a = make_sink(tmp_path, prefix="a")
    b = make_sink(tmp_path, prefix="b")
    b.state = SinkState(str(tmp_path / "spool" / "sinks" / "b.json"))
    a._recover()
    b._recover()
    a._run([record(0, range(3))])
    b._recover()  # b's recovery must not delete a's open file
    a._run([stop(1.0, 100)])
    assert ids(tmp_path) == [0, 1, 2]


def test_option_checks():
    from logrouter.sinks.file import _check_prefix

    for bad in ("a/b", ".x", "_x"):
        with pytest.raises(ValueError):
            _check_prefix(bad)

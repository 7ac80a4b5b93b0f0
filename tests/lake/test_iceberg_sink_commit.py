"""The iceberg sink's commit protocol, step by step, with a crash injected between steps.

The sink's worker-thread code (``_recover``, ``_run``) is synchronous, so these tests call
it directly with an injected clock on a real SQLite catalog, and read the table back with
pyiceberg: no threads, no sleeps.
"""

from __future__ import annotations

import collections

import pytest
from twisted.internet import task

pytest.importorskip("pyiceberg")

from source_fakes import log_lines  # noqa: E402, F401  (a fixture)

from logrouter.batch import Batch  # noqa: E402
from logrouter.lake import iceberg_commit  # noqa: E402
from logrouter.lake.iceberg_catalog import open_catalog  # noqa: E402
from logrouter.sinks.iceberg import ADVANCED, IcebergSink  # noqa: E402
from logrouter.sinks.state import SinkState  # noqa: E402
from logrouter.sinks.worker_sink import RESET, ROWS, STOP, TICK  # noqa: E402

HOUR = 3600 * 10**9
T0 = 1_700_000_000 * 10**9


class Crash(Exception):
    pass


def make_sink(tmp_path, writer="w1", spool="spool", dead=None, **options) -> IcebergSink:
    config = {
        "warehouse": str(tmp_path / "warehouse"),
        "table": "logs.events",
        "catalog": "lake",
        "catalog_uri": "",
        "catalog_properties": {},
        "partition_by": ["day(time)", "identity(tag)"],
        "writer_id": writer,
        "roll_bytes": 1 << 30,
        "roll_secs": 10.0,
        "row_group_rows": 100,
        "roll_row_groups": 256,
        "compression": "zstd",
        "columns": {},
        "flatten": False,
        "max_queue_bytes": 1 << 20,
        "hold_sources_secs": 5.0,
        "retry_initial_secs": 1.0,
        "retry_max_secs": 8.0,
    }
    config.update(options)
    errors = (lambda *a: dead.append(a)) if dead is not None else (lambda *a: None)
    sink = IcebergSink("lake", config, errors=errors, reactor=task.Clock())
    sink.state = SinkState(str(tmp_path / spool / "sinks" / "lake.json"))
    return sink


def record(position: int, ids: range, hour: int = 0, tag: str = "t", **fields) -> list[tuple]:
    """What the router hands the sink for one spool record (100 bytes long): its rows, queued
    while the spool was handed over up to the record's start, then the record's end."""
    return [rows(position, ids, hour, tag, **fields), ((ADVANCED,), 0.0, position + 100, 0)]


def rows(position: int, ids: range, hour: int = 0, tag: str = "t", **fields) -> tuple:
    events = [(T0 + hour * HOUR + i, {"id": i, **fields}) for i in ids]
    return ((ROWS, Batch(tag, events), position, 100), 0.0, position, 0)


def tick(now: float, fed_end: int) -> tuple:
    return ((TICK,), now, fed_end, 0)


def stop(now: float, fed_end: int) -> tuple:
    return ((STOP,), now, fed_end, 0)


def table(tmp_path):
    catalog = open_catalog("lake", {"type": "sql", "uri": f"sqlite:///{tmp_path}/warehouse/catalog.db",
                                    "warehouse": f"file://{tmp_path}/warehouse"})
    return catalog.load_table("logs.events")


def table_ids(tmp_path) -> list[int]:
    return sorted(table(tmp_path).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


def data_files_on_disk(tmp_path) -> set[str]:
    return {p.name for p in (tmp_path / "warehouse" / "logs" / "events" / "data").rglob("*.parquet")}


def test_a_roll_commits_every_open_file_with_the_spool_range_in_the_summary(tmp_path):
    sink = make_sink(tmp_path)
    assert sink._recover() == 0
    sink._run([*record(0, range(0, 10)), *record(100, range(10, 20), hour=30, tag="u"), tick(5.0, 200)])
    assert table(tmp_path).current_snapshot() is None  # nothing due yet: nothing committed, cursor stays
    assert sink._saved_cursor == 0
    assert sink._run([tick(16.0, 200)])[1] == 200  # opened at 5.0, due at 15.0
    t = table(tmp_path)
    assert table_ids(tmp_path) == list(range(20))
    assert t.metadata.format_version == 2
    summary = t.current_snapshot().summary
    assert summary.operation.value == "append"
    assert (summary["logrouter.writer"], summary["logrouter.spool-start"], summary["logrouter.spool-end"]) == ("w1", "0", "200")
    assert summary["logrouter.spool-id"] == sink.spool_id == sink.state.load()["spool_id"]
    assert summary["added-data-files"] == "2"  # one per tag and day: hidden partitions day(time), identity(tag)
    assert [str(f.transform) for f in t.spec().fields] == ["day", "identity"]
    rows = t.scan(row_filter="tag == 'u'").to_arrow()
    assert rows.num_rows == 10 and set(rows.column("tag").to_pylist()) == {"u"}
    assert sink.state.load() == {"cursor": 200, "spool_id": sink.spool_id, "writer_id": "w1", "pending": None}


def test_a_new_field_adds_an_optional_column_and_the_tables_type_wins_a_conflict(tmp_path):
    sink = make_sink(tmp_path, flatten=True)
    sink._recover()
    sink._run([*record(0, range(0, 5), host={"name": "a"}), stop(1.0, 100)])
    # Another writer gives "status" a column first, as a string.
    other = make_sink(tmp_path, writer="w2", spool="spool2")
    other._recover()
    other._run([*record(0, range(100, 102), status="ok"), stop(1.0, 100)])
    again = make_sink(tmp_path, flatten=True)
    again._recover()
    again._run([*record(100, range(5, 8), status=500, size=3), stop(2.0, 200)])
    t = table(tmp_path)
    fields = {f.name: (str(f.field_type), f.required) for f in t.schema().fields}
    assert fields["host.name"] == ("string", False) and fields["size"] == ("long", False)
    assert fields["status"] == ("string", False)
    assert [f.name for f in t.schema().fields][-2:] == ["_extra", "tag"]  # data columns stay in front
    rows = {r["id"]: r for r in t.scan().to_arrow().to_pylist()}
    assert rows[0]["host.name"] == "a" and rows[0]["status"] is None
    assert rows[5]["status"] is None and rows[5]["_extra"] == '{"status":500}' and rows[5]["size"] == 3
    assert rows[100]["status"] == "ok"


def test_a_commit_covers_whole_records_only(tmp_path):
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([*record(0, range(0, 10))])  # files opened at 0.0, due at 10.0
    # Record 100's first batch went into the files in this run; its end is not handed over yet
    # (its next batch, or the router's advance, comes in the next run): no commit now.
    sink._run([rows(100, range(10, 15)), tick(11.0, 100)])
    assert table(tmp_path).current_snapshot() is None
    sink._run([rows(100, range(15, 20)), ((ADVANCED,), 12.0, 200, 0)])
    assert table(tmp_path).current_snapshot().summary["logrouter.spool-end"] == "200"
    assert make_sink(tmp_path)._recover() == 200
    assert table_ids(tmp_path) == list(range(20))


def test_crash_before_the_commit_deletes_its_files_and_replays(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([*record(0, range(0, 10))])

    def crash(*args, **kwargs):
        raise Crash()

    monkeypatch.setattr(iceberg_commit, "append", crash)
    with pytest.raises(Crash):
        sink._run([tick(11.0, 100)])  # files renamed into data/, the append never happened
    assert data_files_on_disk(tmp_path) and sink.state.load()["pending"]["end"] == 100
    monkeypatch.undo()

    again = make_sink(tmp_path)
    assert again._recover() == 0  # the table has nothing of ours: replay everything
    assert not data_files_on_disk(tmp_path)
    assert not list((tmp_path / "warehouse" / "logs" / "events" / "_staging").rglob("*.parquet"))
    again._run([*record(0, range(0, 10)), stop(1.0, 100)])
    assert table_ids(tmp_path) == list(range(10))


@pytest.mark.parametrize("when", ["answer lost", "cursor not saved"])
def test_a_commit_that_landed_is_found_in_the_table_and_not_written_again(tmp_path, monkeypatch, when):
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([*record(0, range(0, 10)), *record(100, range(10, 20))])  # files opened at 0.0
    sink._run([tick(11.0, 200)])
    sink._run([*record(200, range(20, 30))])
    if when == "answer lost":
        real = iceberg_commit.append

        def lost(*args, **kwargs):
            real(*args, **kwargs)
            raise OSError("connection reset while committing")

        monkeypatch.setattr(iceberg_commit, "append", lost)
    else:
        real_save = sink._save_state

        def crash_on_the_cursor(cursor, pending=None):
            if cursor == 300 and pending is None:
                raise Crash()
            real_save(cursor, pending)

        monkeypatch.setattr(sink, "_save_state", crash_on_the_cursor)
    with pytest.raises((OSError, Crash)):
        sink._run([tick(22.0, 300)])
    monkeypatch.undo()
    assert sink.state.load()["cursor"] == 200  # the sink's own state is behind the table

    again = make_sink(tmp_path)
    assert again._recover() == 300  # the table's history says the commit landed
    assert len(data_files_on_disk(tmp_path)) == 2  # and its files are kept
    # The router replays from wherever it likes: records the table has are skipped.
    again._run([*record(200, range(20, 30)), *record(300, range(30, 35)), stop(30.0, 400)])
    assert table_ids(tmp_path) == list(range(35))


def test_after_a_failure_the_reset_reads_the_table_before_the_replay(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    sink._recover()
    real = iceberg_commit.append

    def lost(*args, **kwargs):
        real(*args, **kwargs)
        raise OSError("the catalog's answer was lost")

    monkeypatch.setattr(iceberg_commit, "append", lost)
    sink._run([*record(0, range(0, 10))])
    with pytest.raises(OSError):
        sink._run([tick(11.0, 100)])
    monkeypatch.undo()
    sink.epoch += 1  # what SinkBase.fail does
    freed, cursor, _, _ = sink._run([((RESET,), 12.0, 0, sink.epoch)])
    assert cursor == 100 and sink.reset_problem() == ""
    # The router rewinds to the cursor it knew (0) and replays: nothing lands twice.
    sink._run([((ROWS, Batch("t", [(T0 + i, {"id": i}) for i in range(10)]), 0, 100), 13.0, 0, sink.epoch),
               ((STOP,), 14.0, 100, sink.epoch)])
    assert table_ids(tmp_path) == list(range(10))


def test_a_reset_that_cannot_reach_the_catalog_keeps_the_sink_failing(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    sink._recover()

    def down(*args, **kwargs):
        raise OSError("catalog unreachable")

    monkeypatch.setattr(sink.table, "refresh", down)
    with pytest.raises(OSError):
        sink._run([((RESET,), 1.0, 0, 0)])
    assert "catalog unreachable" in sink.reset_problem()


def test_the_lookup_walks_past_other_writers_and_rewrites_to_this_writers_last_append(tmp_path):
    one, two = make_sink(tmp_path, writer="w1"), make_sink(tmp_path, writer="w2", spool="spool2")
    one._recover()
    two._recover()
    one._run([*record(0, range(0, 5)), stop(1.0, 100)])
    two._run([*record(0, range(100, 105)), stop(1.0, 300)])
    t = table(tmp_path)
    t.overwrite(t.scan().to_arrow())  # a rewrite of every file, like compaction's: no logrouter keys
    assert t.current_snapshot().summary["logrouter.writer"] is None
    t.refresh()
    assert iceberg_commit.last_commit(t, "w1").end == 100
    assert iceberg_commit.last_commit(t, "w2").end == 300
    assert iceberg_commit.last_commit(t, "w3") is None
    assert make_sink(tmp_path, writer="w1")._recover() == 100
    (tmp_path / "spool2" / "sinks" / "lake.json").unlink()  # w2's state is lost: the table still knows
    again = make_sink(tmp_path, writer="w2", spool="spool2")
    assert again._recover() == 0  # a new spool (new spool id): the old positions mean nothing to it
    assert sorted(collections.Counter(table_ids(tmp_path)).values()) == [1] * 10


def test_a_conflict_beyond_pyicebergs_retries_is_retried_and_lands_once(tmp_path, monkeypatch):
    from pyiceberg.exceptions import CommitFailedException

    sink = make_sink(tmp_path)
    sink._recover()
    real = type(sink.table).transaction
    refused = []

    def refusing(self):
        if len(refused) < 2:
            refused.append(1)
            raise CommitFailedException("Table has been updated by another process")
        return real(self)

    monkeypatch.setattr(type(sink.table), "transaction", refusing)
    monkeypatch.setattr(iceberg_commit.time, "sleep", lambda s: None)
    sink._run([*record(0, range(0, 10)), stop(11.0, 100)])
    monkeypatch.undo()
    assert sink.commit_conflicts == 2 and sink.commits == 1
    assert table_ids(tmp_path) == list(range(10))


def test_a_tag_that_cannot_name_a_partition_is_a_dead_letter(tmp_path):
    dead: list = []
    sink = make_sink(tmp_path, dead=dead)
    sink._recover()
    _, _, refused, _ = sink._run([*record(0, range(0, 3), tag="x" * 300), *record(100, range(3, 5)), stop(1.0, 200)])
    sink._report_refused(refused)
    assert len(dead) == 3 and "partition" in dead[0][3]
    assert table_ids(tmp_path) == [3, 4]


def test_records_with_nothing_for_the_table_move_the_cursor_without_a_commit(tmp_path):
    sink = make_sink(tmp_path)
    sink._recover()
    assert sink._run([tick(1.0, 500)])[1] == 500  # nothing open: the cursor follows the spool
    assert table(tmp_path).current_snapshot() is None
    assert make_sink(tmp_path)._recover() == 500


def test_each_commit_adds_its_latency_to_commit_seconds_and_logs_it(tmp_path, log_lines):
    sink = make_sink(tmp_path)
    sink._recover()
    ticks = iter([100.0, 100.25, 200.0, 200.5])
    sink.clock = lambda: next(ticks)
    sink._run([*record(0, range(0, 10))])  # files opened at 0.0
    sink._run([tick(11.0, 100)])  # due at 10.0: a commit
    sink._run([*record(100, range(10, 20)), stop(12.0, 200)])  # the stop commits what is open
    assert sink.commits == 2 and sink.commit_seconds == 0.75
    samples = {name: value for name, _, _, value in sink.samples()}
    assert samples["logrouter_sink_commit_seconds_total"] == 0.75 and samples["logrouter_sink_commits_total"] == 2
    committed = [line for line in log_lines if "iceberg sink lake committed" in line]
    assert committed[0].endswith("in 0.250 s") and committed[1].endswith("in 0.500 s"), committed


def test_a_commit_whose_snapshot_expired_before_the_restart_is_still_known(tmp_path, monkeypatch):
    """Crash after the append landed but before the cursor was saved; while the router is
    down, other writers commit and ``expire_snapshots`` removes every snapshot but the
    newest, this writer's append among them. The restart must neither delete the files
    the table references nor append the records again."""
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([*record(0, range(0, 10))])
    sink._run([tick(11.0, 100)])
    real_save = sink._save_state

    def crash_on_the_cursor(cursor, pending=None):
        if cursor == 200 and pending is None:
            raise Crash()
        real_save(cursor, pending)

    monkeypatch.setattr(sink, "_save_state", crash_on_the_cursor)
    sink._run([*record(100, range(10, 20))])
    with pytest.raises(Crash):
        sink._run([tick(22.0, 200)])
    monkeypatch.undo()
    assert sink.state.load()["pending"]["end"] == 200  # the intent is still there
    other = make_sink(tmp_path, writer="w2", spool="spool2")
    other._recover()
    other._run([*record(0, range(100, 105)), stop(1.0, 100)])
    other._run([*record(100, range(105, 110)), stop(2.0, 200)])
    t = table(tmp_path)
    newest = t.current_snapshot().snapshot_id
    t.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in t.snapshots() if s.snapshot_id != newest]).commit()
    t.refresh()
    assert [s.summary["logrouter.writer"] for s in t.snapshots()] == ["w2"]  # w1's appends are out of the history

    again = make_sink(tmp_path)
    assert again._recover() == 200  # the table still says how far w1 got
    assert table_ids(tmp_path) == [*range(20), *range(100, 110)]  # its files were kept
    again._run([*record(100, range(10, 20)), *record(200, range(20, 25)), stop(30.0, 300)])
    assert table_ids(tmp_path) == [*range(25), *range(100, 110)]  # and not appended twice

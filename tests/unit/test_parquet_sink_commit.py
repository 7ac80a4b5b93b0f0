"""The parquet sink's commit protocol, step by step, with a crash injected between steps.

The sink's worker-thread code (``_recover``, ``_run``) is synchronous, so these tests
call it directly with an injected clock: no threads, no sleeps.
"""

from __future__ import annotations

import pytest
from twisted.internet import task

from logrouter.batch import Batch
from logrouter.lake.dataset import lake_dataset
from logrouter.sinks.parquet import _ROWS, _TICK, ParquetSink
from logrouter.sinks.state import SinkState

HOUR = 3600 * 10**9
T0 = 1_700_000_000 * 10**9


class Crash(Exception):
    pass


def make_sink(tmp_path, **options) -> ParquetSink:
    config = {
        "path": str(tmp_path / "lake"),
        "writer_id": "w1",
        "roll_bytes": 1 << 30,
        "roll_secs": 10.0,
        "row_group_rows": 100,
        "roll_row_groups": 256,
        "compression": "zstd",
        "columns": {},
        "max_queue_bytes": 1 << 20,
        "retry_initial_secs": 1.0,
        "retry_max_secs": 8.0,
    }
    config.update(options)
    sink = ParquetSink("lake", config, errors=lambda *a: None, reactor=task.Clock())
    sink.state = SinkState(str(tmp_path / "spool" / "sinks" / "lake.json"))
    return sink


def record(position: int, hour: int, ids: range) -> tuple:
    """What the router hands the sink for one spool record: rows of one partition."""
    events = [(T0 + hour * HOUR + i, {"id": i}) for i in ids]
    return ((_ROWS, Batch("t", events), position, 100), 0.0, position, 0)


def tick(now: float, fed_end: int) -> tuple:
    return ((_TICK,), now, fed_end, 0)


def lake_ids(tmp_path) -> list[int]:
    if not [p for p in (tmp_path / "lake").rglob("*.parquet") if "_staging" not in p.parts]:
        return []
    return sorted(lake_dataset(str(tmp_path / "lake")).to_table(columns=["id"]).column("id").to_pylist())


def test_commit_then_crash_before_rename_is_finished_by_recovery(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    assert sink._recover() == 0
    sink._run([record(0, 0, range(0, 10)), record(100, 0, range(10, 20))])

    def crash(*args, **kwargs):
        raise Crash()

    monkeypatch.setattr(sink.writer, "publish", crash)
    with pytest.raises(Crash):
        sink._run([tick(11.0, 200)])  # seals, writes the commit record, dies before renaming
    assert lake_ids(tmp_path) == []
    assert sink.state.load()["cursor"] == 200

    again = make_sink(tmp_path)
    assert again._recover() == 200  # the commit record is redone: files renamed into place
    assert lake_ids(tmp_path) == list(range(20))
    assert not list((tmp_path / "lake" / "_staging").rglob("*.parquet"))


def test_crash_before_the_commit_record_discards_staging_and_replays(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([record(0, 0, range(0, 10))])

    def crash(state):
        raise Crash()

    monkeypatch.setattr(sink.state, "save", crash)
    with pytest.raises(Crash):
        sink._run([tick(11.0, 100)])  # sealed in staging, no commit record
    assert list((tmp_path / "lake" / "_staging").rglob("*.parquet"))

    again = make_sink(tmp_path)
    assert again._recover() == 0  # nothing committed: replay everything
    assert not list((tmp_path / "lake" / "_staging").rglob("*.parquet"))
    again._run([record(0, 0, range(0, 10)), tick(0.0, 100)])
    again._run([tick(11.0, 100)])
    assert lake_ids(tmp_path) == list(range(10))


def test_replay_skips_partitions_already_published_but_rewrites_open_ones(tmp_path):
    sink = make_sink(tmp_path, roll_secs=10.0)
    sink._recover()
    # Record 0 opens hour 0's file; record 100 opens hour 1's file five seconds later.
    sink._run([record(0, 0, range(0, 5)), tick(0.0, 100)])
    sink._run([record(100, 1, range(100, 105)), tick(5.0, 200)])
    # At 11s hour 0's file is due and published; hour 1's is still open, so the cursor
    # cannot pass record 100.
    sink._run([record(200, 0, range(5, 10)), tick(11.0, 300)])
    state = sink.state.load()
    assert state["cursor"] == 100
    assert lake_ids(tmp_path) == list(range(10))
    # Crash now (hour 1's open file and record 200's rows for hour 0 are lost), then
    # replay from the cursor: record 200's hour 0 rows were published, so not again.
    again = make_sink(tmp_path)
    assert again._recover() == 100
    again._run([record(100, 1, range(100, 105)), record(200, 0, range(5, 10)), tick(30.0, 300)])
    again._run([((("stop",)), 31.0, 300, 0)])
    assert lake_ids(tmp_path) == list(range(10)) + list(range(100, 105))


def test_restart_keeps_column_types(tmp_path):
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([record(0, 0, range(3)), ((("stop",)), 1.0, 100, 0)])
    again = make_sink(tmp_path)
    again._recover()
    assert again.writer.column_types.get("id") is not None
    # A string id after the restart does not fight the int column: it goes to _extra.
    events = [(T0 + 5, {"id": "five"})]
    again._run([((_ROWS, Batch("t", events), 100, 10), 2.0, 100, 0), ((("stop",)), 3.0, 200, 0)])
    table = lake_dataset(str(tmp_path / "lake")).to_table()
    assert str(table.schema.field("id").type) == "int64"
    assert '"id": "five"' in "".join(x for x in table.column("_extra").to_pylist() if x).replace('":"', '": "')


def test_failure_backs_off_exponentially_on_the_injected_clock(tmp_path):
    sink = make_sink(tmp_path, retry_initial_secs=1.0, retry_max_secs=4.0)
    rewinds = []
    sink.on_rewind = lambda: rewinds.append(sink.reactor.seconds())
    sink.reset = lambda: None
    delays = []
    for _ in range(4):
        sink.fail(Crash("disk full"))
        delays.append(sink._retry_delay)
        sink.reactor.advance(sink._retry_delay)
    assert delays == [1.0, 2.0, 4.0, 4.0]
    assert rewinds == [1.0, 3.0, 7.0, 11.0]
    assert sink.epoch == 4 and sink.failures == 4
    sink.succeeded()
    sink.fail(Crash("again"))
    assert sink._retry_delay == 1.0


def test_damaged_state_file_never_stops_startup(tmp_path):
    sink = make_sink(tmp_path)
    path = tmp_path / "spool" / "sinks" / "lake.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"cursor": 12\x00garbage')
    assert sink._recover() == 0  # replays everything the spool still holds
    assert (tmp_path / "spool" / "sinks" / "lake.json.damaged").exists()


def test_a_sink_that_raises_sends_the_batch_to_the_error_path():
    from logrouter.batch import Routing
    from logrouter.errors import LoggedErrors
    from logrouter.routes import SinkNode

    class Broken:
        def write(self, batch, position, size):
            raise ValueError("cannot encode")

    errors = LoggedErrors()
    node = SinkNode("out", Broken(), errors)
    node.push(Batch("t", [(T0, {"a": 1}), (T0, {"a": 2})]), Routing(0, 20, 10, frozenset({"out"})))
    assert errors.counts == {"out": 2}


def reset(fed_end: int) -> tuple:
    from logrouter.sinks.parquet import _RESET

    return ((_RESET,), 0.0, fed_end, 0)


def test_a_commit_record_that_cannot_be_written_loses_nothing_on_the_retry(tmp_path, monkeypatch):
    """A full disk under the sink's state file: the commit fails; the retry replays the
    same records and every row lands. (Marks taken for the failed commit would make the
    replay skip rows of the file that was never published: here the file of hour 0 ends
    at position 200 while the open file of hour 1 holds the cursor at 100.)"""
    sink = make_sink(tmp_path)
    assert sink._recover() == 0

    def at(item: tuple, now: float) -> tuple:
        return (item[0], now, item[2], item[3])

    feed = [record(0, 0, range(0, 10)), at(record(100, 1, range(10, 20)), 5.0), at(record(200, 0, range(20, 30)), 5.0)]
    sink._run(feed[:1])
    sink._run(feed[1:])
    save = sink.state.save

    def disk_full(state):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sink.state, "save", disk_full)
    with pytest.raises(OSError):
        sink._work([tick(11.0, 300)])  # seals hour 0; the commit record cannot be written
    assert sink.published == {}
    monkeypatch.setattr(sink.state, "save", save)
    # the failure's backoff ends: reset, then the router replays the spool from the cursor
    sink._run([reset(0)] + [at(item, 20.0) for item in feed])
    sink._run([tick(40.0, 300)])
    assert lake_ids(tmp_path) == list(range(30))


def test_renames_that_fail_after_the_commit_are_finished_before_the_replay(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    assert sink._recover() == 0
    publish = sink.writer.publish

    def rename_fails(*args, **kwargs):
        raise OSError(5, "Input/output error")

    sink._run([record(0, 0, range(0, 10)), record(100, 0, range(10, 20))])
    monkeypatch.setattr(sink.writer, "publish", rename_fails)
    with pytest.raises(OSError):
        sink._work([tick(11.0, 200)])
    assert sink._saved_cursor == 200  # committed: the record says so
    monkeypatch.setattr(sink.writer, "publish", publish)
    sink._run([reset(200), record(200, 0, range(20, 25))])
    sink._run([tick(30.0, 300)])
    assert lake_ids(tmp_path) == list(range(25))


def test_renames_failing_again_at_the_reset_keep_the_committed_files(tmp_path, monkeypatch):
    """The reset after a failed rename fails too (the lake is still unreachable): the
    committed files stay to be published, reset() reports the failure, and the next reset
    publishes them; no row is lost or doubled."""
    sink = make_sink(tmp_path)
    assert sink._recover() == 0
    publish = sink.writer.publish

    def rename_fails(*args, **kwargs):
        raise OSError(5, "Input/output error")

    sink._run([record(0, 0, range(0, 10)), record(100, 0, range(10, 20))])
    monkeypatch.setattr(sink.writer, "publish", rename_fails)
    with pytest.raises(OSError):
        sink._work([tick(11.0, 200)])
    with pytest.raises(OSError):
        sink._work([reset(200)])  # the retry's reset: still failing
    assert len(sink._unpublished) == 1
    failures = []
    sink.worker.submit = lambda item: __import__("twisted.internet.defer", fromlist=["succeed"]).succeed(None)
    sink.reset().addErrback(failures.append)
    assert failures and "could not be published yet" in failures[0].getErrorMessage()
    monkeypatch.setattr(sink.writer, "publish", publish)
    sink._run([reset(200), record(200, 0, range(20, 25))])
    sink._run([tick(30.0, 300)])
    assert lake_ids(tmp_path) == list(range(25))


def test_a_reset_clears_staged_files_left_by_the_failure(tmp_path):
    sink = make_sink(tmp_path)
    assert sink._recover() == 0
    staging = tmp_path / "lake" / "_staging" / "w1"
    staging.mkdir(parents=True, exist_ok=True)
    left = staging / "part-w1-cut-by-an-outage.parquet"
    left.write_bytes(b"PAR1 half a file")
    sink._run([reset(0), record(0, 0, range(0, 5))])
    sink._run([tick(30.0, 100)])
    assert not left.exists()
    assert lake_ids(tmp_path) == list(range(5))


# -- a record reaching the sink as several batches (routes joining at the sink) -------------


def part(position: int, ids: range, now: float = 0.0) -> tuple:
    """One of a record's batches: ``fed_end`` stays at the record's start until the feed
    has handed all of them over (``advance``)."""
    events = [(T0 + i, {"id": i}) for i in ids]
    return ((_ROWS, Batch("t", events), position, 100), now, position, 0)


def crash_and_replay(tmp_path, feed: list) -> None:
    """A new sink recovers from the commit record; the router feeds it from its cursor."""
    again = make_sink(tmp_path)
    cursor = again._recover()
    again._run([item for item in feed if item[0][2] >= cursor] + [((("stop",)), 99.0, 200, 0)])


@pytest.mark.parametrize("roll", ["age", "size"])
def test_a_record_in_several_batches_is_never_split_across_files(tmp_path, roll):
    """Record 100 comes as two batches of one partition. A file due (by age, or full)
    between them stays open until the record is whole: sealed in between, the commit
    would publish mark 100 for the partition and the replay after a crash would skip the
    second batch's rows, which were only in the next, unsealed file (lost before)."""
    options = {"roll_secs": 10.0} if roll == "age" else {"row_group_rows": 10, "roll_row_groups": 2}
    sink = make_sink(tmp_path, **options)
    sink._recover()
    feed = [part(0, range(0, 10)), part(100, range(10, 20), now=11.0), part(100, range(20, 30), now=11.5)]
    sink._run(feed[:1] + [tick(0.0, 100)])
    sink._run(feed[1:2])  # the first file is due or full: record 100 is not whole yet
    sink._run(feed[2:])
    crash_and_replay(tmp_path, feed)  # what was staged only is gone
    assert lake_ids(tmp_path) == list(range(30))


def test_same_mark_writes_share_a_file_and_it_rolls_once_the_record_is_whole(tmp_path):
    from logrouter.lake.writer import LakeWriter

    writer = LakeWriter(str(tmp_path / "lake"), "w1", 1 << 30, 3600, row_group_rows=10, roll_row_groups=1)
    writer.write("t", [(T0 + i, {"id": i}) for i in range(15)], now=0, mark=5)
    writer.write("t", [(T0 + i, {"id": i}) for i in range(15, 20)], now=0, mark=5)
    assert writer.seal_due(now=0, complete_before=5) == []  # record 5 may go on
    (sealed,) = writer.seal_due(now=0, complete_before=6)
    assert (sealed.rows, sealed.first_mark, sealed.last_mark) == (20, 5, 5)


def test_a_commit_record_on_disk_whose_directory_fsync_failed_is_kept_by_the_reset(tmp_path, monkeypatch):
    """The record was replaced, then the directory's fsync failed: the commit is on disk
    though its save raised. The reset takes that record (publishes its files, its cursor)
    instead of discarding its sealed files as uncommitted staging; a crash then loses
    nothing (it lost the committed files' rows before)."""
    from logrouter import atomic_file

    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([record(0, 0, range(0, 10)), record(100, 0, range(10, 20))])

    def fsync_fails(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic_file, "fsync_directory", fsync_fails)
    with pytest.raises(OSError):
        sink._work([tick(11.0, 200)])  # sealed, the record replaced, its fsync failed
    monkeypatch.undo()
    sink._run([reset(0)])
    assert sink._saved_cursor == 200 and lake_ids(tmp_path) == list(range(20))
    crash_and_replay(tmp_path, [record(0, 0, range(0, 10)), record(100, 0, range(10, 20))])
    assert lake_ids(tmp_path) == list(range(20))

"""The iceberg sink under the failures the parquet sink's tests put it through
(``test_parquet_sink_commit.py``, ``test_deferred_catch_up.py``): a damaged state file, a
state file that cannot be written (a full disk), staged files left by an outage, a
restart that must keep the column types, and spool records read back undecoded, one of
which cannot be decoded.

As in ``test_iceberg_sink_commit.py``, the sink's worker-thread code is called directly
with an injected clock on a real SQLite catalog; no threads, no sleeps.
"""

from __future__ import annotations

import collections

import pytest

pytest.importorskip("pyiceberg")

from source_fakes import log_lines  # noqa: E402, F401  (a fixture)
from test_iceberg_sink_commit import T0, make_sink, record, stop, table, table_ids, tick  # noqa: E402

from logrouter.batch import Batch  # noqa: E402
from logrouter.sinks.iceberg import ADVANCED  # noqa: E402
from logrouter.sinks.worker_sink import RESET, ROWS  # noqa: E402
from logrouter.spool.record import decode_deferred, encode_batch  # noqa: E402


def test_a_damaged_state_file_never_stops_startup_and_loses_nothing(tmp_path):
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([*record(0, range(0, 10)), stop(1.0, 100)])
    path = tmp_path / "spool" / "sinks" / "lake.json"
    path.write_bytes(b'{"cursor": 100\x00garbage')
    again = make_sink(tmp_path)
    # The spool id went with the state: the table's commits are not taken for this spool's,
    # so the sink replays what the spool still holds (rows may land twice, none is lost),
    # as the parquet sink does.
    assert again._recover() == 0
    assert (tmp_path / "spool" / "sinks" / "lake.json.damaged").exists()
    again._run([*record(0, range(0, 10)), *record(100, range(10, 15)), stop(2.0, 200)])
    assert set(table_ids(tmp_path)) == set(range(15))
    assert make_sink(tmp_path)._recover() == 200  # and from now on the table is this spool's truth


def test_an_intent_that_cannot_be_saved_loses_nothing_on_the_retry(tmp_path, monkeypatch):
    """A full disk under the state file: the commit fails before its files are renamed;
    the reset and the replay write every row once."""
    sink = make_sink(tmp_path)
    assert sink._recover() == 0
    sink._run([*record(0, range(0, 10)), *record(100, range(10, 20), hour=1)])
    save = sink.state.save

    def disk_full(state):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sink.state, "save", disk_full)
    with pytest.raises(OSError):
        sink._work([tick(11.0, 200)])
    assert table(tmp_path).current_snapshot() is None
    monkeypatch.setattr(sink.state, "save", save)
    sink.epoch += 1  # what SinkBase.fail does
    feed = [((ROWS, Batch("t", [(T0 + i, {"id": i}) for i in range(0, 10)]), 0, 100), 20.0, 0, sink.epoch),
            ((ADVANCED,), 20.0, 100, sink.epoch),
            ((ROWS, Batch("t", [(T0 + 3600 * 10**9 + i, {"id": i}) for i in range(10, 20)]), 100, 100), 20.0, 100, sink.epoch),
            ((ADVANCED,), 20.0, 200, sink.epoch)]
    sink._run([((RESET,), 20.0, 0, sink.epoch), *feed])
    sink._run([((ADVANCED,), 40.0, 200, sink.epoch)])
    assert table_ids(tmp_path) == list(range(20))
    assert sink._saved_cursor == 200


def test_a_reset_clears_staged_files_left_by_the_failure(tmp_path):
    sink = make_sink(tmp_path)
    assert sink._recover() == 0
    staging = tmp_path / "warehouse" / "logs" / "events" / "_staging" / "w1"
    staging.mkdir(parents=True, exist_ok=True)
    left = staging / "part-w1-cut-by-an-outage.parquet"
    left.write_bytes(b"PAR1 half a file")
    sink._run([((RESET,), 0.0, 0, 0), *record(0, range(0, 5))])
    sink._run([tick(30.0, 100)])
    assert not left.exists()
    assert table_ids(tmp_path) == list(range(5))


def test_a_restart_keeps_the_column_types(tmp_path):
    sink = make_sink(tmp_path)
    sink._recover()
    sink._run([*record(0, range(3)), stop(1.0, 100)])
    again = make_sink(tmp_path)
    again._recover()
    assert again.writer.column_types.get("id") is not None
    # A string id after the restart does not fight the long column: it goes to _extra.
    again._run([((ROWS, Batch("t", [(T0 + 5, {"id": "five"})]), 100, 10), 2.0, 100, 0), ((ADVANCED,), 2.0, 200, 0),
                stop(3.0, 200)])
    t = table(tmp_path)
    assert str(t.schema().find_field("id").field_type) == "long"
    extras = [x for x in t.scan(selected_fields=("_extra",)).to_arrow().column("_extra").to_pylist() if x]
    assert extras == ['{"id":"five"}']


def deferred_record(position: int, ids: range) -> tuple:
    payload = encode_batch(Batch("t", [(T0 + i, {"id": i}) for i in ids], "in"))
    return ((ROWS, decode_deferred(payload), position, len(payload)), 0.0, position, 0)


def test_the_iceberg_sink_decodes_deferred_records_and_skips_one_that_cannot_be_decoded(tmp_path, log_lines):
    sink = make_sink(tmp_path)
    assert sink._recover() == 0

    def broken():
        raise ValueError("unknown packed events format 'nope' in a spool record")

    bad = ((ROWS, Batch.deferred("t", "in", broken), 100, 50), 0.0, 100, 0)
    items = [deferred_record(0, range(0, 5)), ((ADVANCED,), 0.0, 100, 0), bad, ((ADVANCED,), 0.0, 200, 0),
             deferred_record(200, range(5, 8)), ((ADVANCED,), 0.0, 300, 0), stop(1.0, 300)]
    result = sink._run(items)
    freed, cursor, refused, undecodable = result
    assert freed == sum(item[0][3] for item in items if item[0][0] == ROWS) and cursor == 300 and refused == []
    assert undecodable == [(100, "ValueError: unknown packed events format 'nope' in a spool record")]
    assert sink.events_in == 8
    assert table_ids(tmp_path) == list(range(8))  # the rest is committed, the cursor passes the bad record
    assert table(tmp_path).current_snapshot().summary["logrouter.spool-end"] == "300"
    sink._done(result)
    assert any("spool record at 100 cannot be decoded" in line and "sink lake skipped it" in line for line in log_lines)
    assert sink.cursor == 300 and not sink.failing
    assert sorted(collections.Counter(table_ids(tmp_path)).values()) == [1] * 8

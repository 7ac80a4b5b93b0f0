"""The stdout and blackhole sinks: what they write or count, and their cursors (at most once)."""

from __future__ import annotations

import json

from twisted.internet import defer, task
from twisted.python.failure import Failure

from logrouter.batch import Batch
from logrouter.sinks.blackhole import BlackholeSink
from logrouter.sinks.state import SinkState
from logrouter.sinks.stdout import StdoutSink

T0 = 1_700_000_000 * 10**9


def options(cls, **extra):
    out = {k: o.default for k, o in cls.OPTIONS.items()}
    out.update(extra)
    return out


def direct(f, *args):
    return defer.maybeDeferred(f, *args)


class SyncWorker:
    """The SerialWorker's contract, run at once on the caller's thread."""

    def __init__(self, job, on_result, on_failure):
        self.job, self.on_result, self.on_failure = job, on_result, on_failure

    def submit(self, item):
        try:
            result = self.job([item])
        except Exception as e:
            self.on_failure(Failure(e))
        else:
            self.on_result(result)
        return defer.succeed(None)

    def stop(self):
        return defer.succeed(None)


def make(cls, tmp_path, **extra):
    clock = task.Clock()
    errors = []
    sink = cls("dbg", options(cls, **extra), lambda *a: errors.append(a), clock)
    sink.state = SinkState(str(tmp_path / "dbg.json"))
    sink.run_blocking = direct
    sink.errors_seen = errors
    return sink, clock


def test_stdout_writes_json_lines_and_moves_the_cursor_on_hand_over(tmp_path):
    sink, clock = make(StdoutSink, tmp_path)
    written = []
    sink.output = written.append
    sink.worker = SyncWorker(sink._write, sink._written, sink._lost)
    progress = []
    sink.on_progress = lambda: progress.append(sink.cursor)
    assert sink.start().result == 0
    loop: dict = {}
    loop["me"] = loop
    sink.write(Batch("app", [(T0, {"a": 1}), (T0 + 5, loop), (T0 + 7, {"b": [True, None]})]), 0, 50)
    sink.advance(50)
    lines = [json.loads(line) for line in b"".join(written).decode().splitlines()]
    assert lines == [
        {"time": "2023-11-14T22:13:20.000000000Z", "tag": "app", "record": {"a": 1}},
        {"time": "2023-11-14T22:13:20.000000007Z", "tag": "app", "record": {"b": [True, None]}},
    ]
    assert len(sink.errors_seen) == 1 and sink.errors_seen[0][:2] == ("dbg", "app")
    assert sink.cursor == 50 and sink.queued_bytes == 0 and sink.lines_written == 2
    sink.stop()
    assert SinkState(str(tmp_path / "dbg.json")).load()["cursor"] == 50
    again, _ = make(StdoutSink, tmp_path)
    assert again.start().result == 50  # what was handed over is not written again


def test_stdout_write_failure_loses_lines_and_counts_it(tmp_path):
    sink, _ = make(StdoutSink, tmp_path)
    sink.worker = SyncWorker(sink._write, sink._written, sink._lost)

    def broken(data):
        raise BrokenPipeError(32, "Broken pipe")

    sink.output = broken
    sink.write(Batch("app", [(T0, {"a": 1})]), 0, 10)
    sink.advance(10)
    assert sink.failures == 1 and sink.queued_bytes == 0 and sink.cursor == 10 and sink.lines_written == 0


def test_blackhole_counts_and_never_holds_the_spool(tmp_path):
    sink, clock = make(BlackholeSink, tmp_path, log_secs=10)
    assert sink.start().result == 0
    for i in range(3):
        sink.write(Batch("t", [(T0, {"i": j}) for j in range(100)]), i * 1000, 1000)
        sink.advance((i + 1) * 1000)
    assert sink.events_in == 300 and sink.spool_bytes == 3000 and sink.cursor == 3000
    clock.advance(10)
    samples = {name: value for name, _, _, value in sink.samples()}
    assert samples["logrouter_sink_spool_bytes_total"] == 3000 and samples["logrouter_sink_events_in_total"] == 300
    sink.stop()
    again, _ = make(BlackholeSink, tmp_path)
    assert again.start().result == 3000

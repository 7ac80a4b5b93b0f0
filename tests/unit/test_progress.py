"""Long work logs its progress: the spool's replay of ids at start-up and a sink catching
up from the spool say every 5 s (on the injected clock) how many bytes of how many are
done, the rate and the time left, and close with a line once done; work shorter than
one interval logs nothing. Everything runs on ``task.Clock``; the router's reads, which
run in a thread in the daemon, are run in the test's own thread here.
"""

from __future__ import annotations

import pytest
from twisted.internet import defer, task

from helpers import spin
from source_fakes import log_lines  # noqa: F401  (a fixture)
from logrouter import registry
from logrouter.batch import Batch
from logrouter.catch_up import read_records
from logrouter.config.load import load_string
from logrouter.progress import INTERVAL_SECS, ProgressLog, progress_line
from logrouter.router import Router
from logrouter.sinks.base import SINK_OPTIONS, SinkBase
from logrouter.units import human_bytes, human_duration

MiB = 1 << 20


def test_the_line_says_done_of_total_rate_and_time_left():
    assert progress_line("w", 4 * MiB, 10 * MiB, MiB / 2, MiB / 2) == (
        "w: 4.0 MiB of 10.0 MiB (40%), 512.0 KiB/s, about 12 s left")
    # The total grows while the work goes on: time left from how fast the gap closes.
    assert progress_line("w", 4 * MiB, 10 * MiB, MiB, MiB / 4).endswith("1.0 MiB/s, about 24 s left")
    assert progress_line("w", 4 * MiB, 10 * MiB, MiB, 0).endswith(
        ", not closing in (new data arrives as fast as it is read)")
    assert progress_line("w", 0, 10 * MiB, 0, 0) == "w: 0 B of 10.0 MiB (0%), 0 B/s, nothing done yet"
    assert progress_line("w", 10 * MiB, 10 * MiB, MiB, MiB) == "w: 10.0 MiB of 10.0 MiB (100%), 1.0 MiB/s"
    assert [human_duration(s) for s in (0, 59.4, 61, 3599, 3600, 7325)] == [
        "0 s", "59 s", "1 min 01 s", "59 min 59 s", "1 h 00 min", "2 h 02 min"]


def test_a_line_every_interval_on_the_clock_then_a_closing_line():
    clock = task.Clock()
    lines: list[str] = []
    state = [0, 100 * MiB]
    progress = ProgressLog(clock, "job", lambda: tuple(state), emit=lines.append)
    clock.advance(INTERVAL_SECS - 0.001)
    assert lines == []
    clock.advance(0.001)
    assert lines == ["job: 0 B of 100.0 MiB (0%), 0 B/s, nothing done yet"]
    state[0] = 50 * MiB
    clock.advance(INTERVAL_SECS)
    assert lines[-1] == "job: 50.0 MiB of 100.0 MiB (50%), 5.0 MiB/s, about 10 s left"
    state[1] = 200 * MiB  # as much arrived as was done: the gap is where it began
    clock.advance(INTERVAL_SECS)
    assert lines[-1].endswith("(25%), 3.3 MiB/s, not closing in (new data arrives as fast as it is read)")
    state[0] = 200 * MiB
    progress.finish()
    assert lines[-1] == "job: done, 200.0 MiB in 15 s"
    assert len(lines) == 4 and clock.getDelayedCalls() == []


def test_work_shorter_than_an_interval_logs_nothing_and_abandoned_work_stops_quietly():
    clock = task.Clock()
    lines: list[str] = []
    short = ProgressLog(clock, "short", lambda: (1, 1), emit=lines.append)
    clock.advance(INTERVAL_SECS / 2)
    short.finish()
    gone = ProgressLog(clock, "gone", lambda: None, emit=lines.append)
    clock.advance(INTERVAL_SECS * 3)
    gone.finish()
    assert lines == [] and clock.getDelayedCalls() == []
    stopped = ProgressLog(clock, "stopped", lambda: (1, 2), emit=lines.append)
    clock.advance(INTERVAL_SECS)
    stopped.cancel()
    clock.advance(INTERVAL_SECS * 3)
    assert len(lines) == 1 and clock.getDelayedCalls() == []


def test_a_total_learned_late_counts_the_gap_from_the_start():
    """A thread may know its total only once it began: the first lines use it from then."""
    clock = task.Clock()
    lines: list[str] = []
    state = [0, 0]
    ProgressLog(clock, "replay", lambda: tuple(state), emit=lines.append)
    state[:] = [10 * MiB, 40 * MiB]
    clock.advance(INTERVAL_SECS)
    assert lines == ["replay: 10.0 MiB of 40.0 MiB (25%), 2.0 MiB/s, about 15 s left"]


# -- the router: the ids' replay at start, a sink catching up ---------------------------------


def progress_lines(lines: list[str], what: str) -> list[str]:
    return [line for line in lines if line.startswith(what + ":")]


def test_the_replay_of_the_spools_ids_at_start_logs_its_progress(tmp_path, monkeypatch, log_lines):  # noqa: F811
    from twisted.internet import reactor

    config = load_string(f'[spool]\npath = "{tmp_path}/spool"\n')
    writer = Router(config, reactor)
    writer.spool.open()
    for n in range(10):
        spin(reactor, writer.ingest(Batch("t", [(1, {"n": n, "pad": "x" * 1000})], source="in"), b"chunk-%d" % n))
    spin(reactor, writer.spool.close())
    record = writer.spool.end // 10
    assert writer.spool.end == 10 * record  # records of one size: the numbers below are exact

    clock = task.Clock()
    router = Router(config, clock, run_blocking=lambda f, *a: defer.maybeDeferred(f, *a))
    router.spool.open()
    monkeypatch.setattr("logrouter.snapshots.READ_CHUNK_BYTES", 1)  # one record per read
    read = router.spool.read

    def slow_read(*args):
        clock.advance(1)  # each read takes 2 s of the clock, passed in steps so that
        clock.advance(1)  # a line due at 5 s is written at 5 s
        return read(*args)

    monkeypatch.setattr(router.spool, "read", slow_read)
    done = router.snapshots.replay_ids()
    assert done.called and router.snapshots.loaded
    what = "spool replay at start (ids of stored batches)"
    total = human_bytes(10 * record)
    # Reads end at 2, 4, … 20 s; the line at 5 s sees two records, at 10 s four, at 15 s seven, at 20 s nine.
    assert progress_lines(log_lines, what) == [
        f"{what}: {human_bytes(2 * record)} of {total} (20%), {human_bytes(2 * record / 5)}/s, about 20 s left",
        f"{what}: {human_bytes(4 * record)} of {total} (40%), {human_bytes(4 * record / 10)}/s, about 15 s left",
        f"{what}: {human_bytes(7 * record)} of {total} (70%), {human_bytes(7 * record / 15)}/s, about 6 s left",
        f"{what}: {human_bytes(9 * record)} of {total} (90%), {human_bytes(9 * record / 20)}/s, about 2 s left",
        f"{what}: done, {total} in 20 s",
    ]
    assert clock.getDelayedCalls() == []
    assert router.dedupe.lookup(("in", b"chunk-9")) is not None


class SlowSink(SinkBase):
    """Takes whatever it is handed; the test decides when the router's reads complete."""

    TYPE = "progress_slow"
    OPTIONS = dict(SINK_OPTIONS)

    def start(self):
        return defer.succeed(0)

    def write(self, batch, position, size):
        pass

    def advance(self, end):
        pass

    def stop(self):
        return defer.succeed(None)


@pytest.fixture
def catching_up(tmp_path, monkeypatch):
    """(router, clock, feed, reads): a sink 10 MiB behind, whose spool reads the test completes."""
    registry.load_builtin()
    registry.sink("progress_slow")(SlowSink)
    clock = task.Clock()
    config = load_string(
        f'[spool]\npath = "{tmp_path}/spool"\n'
        '[sources.in]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[sinks.lake]\ntype = "progress_slow"\ninputs = ["in"]\n'
    )
    reads: list[defer.Deferred] = []

    def run_blocking(function, *args):
        if function is not read_records:
            return defer.maybeDeferred(function, *args)
        reads.append(defer.Deferred())  # a spool read: the test completes it
        return reads[-1]

    router = Router(config, clock, run_blocking=run_blocking)
    router.spool.open()
    feed = router.feeds["lake"]
    feed.start(0)
    router.routed_end = 10 * MiB
    yield router, clock, feed, reads
    del registry.SINKS["progress_slow"]


def test_a_sink_catching_up_logs_its_progress_until_it_is_live(catching_up, log_lines):  # noqa: F811
    router, clock, feed, reads = catching_up
    router.catch_up.step(feed)
    assert len(reads) == 1 and not feed.live
    clock.advance(INTERVAL_SECS)
    reads[0].callback(([], 4 * MiB))  # read up to 4 MiB (records skipped: none here)
    assert feed.delivered == 4 * MiB and len(reads) == 2
    router.routed_end = 12 * MiB  # new events meanwhile
    clock.advance(INTERVAL_SECS)
    reads[1].callback(([], 12 * MiB))
    assert feed.live
    clock.advance(INTERVAL_SECS * 3)
    what = "sink lake catching up from the spool"
    assert progress_lines(log_lines, what) == [
        f"{what}: 0 B of 10.0 MiB (0%), 0 B/s, nothing done yet",
        f"{what}: 4.0 MiB of 12.0 MiB (33%), 409.6 KiB/s, about 40 s left",
        f"{what}: caught up, live again, 12.0 MiB in 10 s",
    ]
    assert clock.getDelayedCalls() == []


def test_a_catch_up_that_ends_early_stops_its_lines(catching_up, log_lines):  # noqa: F811
    router, clock, feed, reads = catching_up
    router.catch_up.step(feed)
    clock.advance(INTERVAL_SECS)
    feed.sink.on_rewind()  # the sink failed: it starts again from its cursor, watched afresh
    reads[0].callback(([], 4 * MiB))  # a read from before the rewind: not applied
    assert len(reads) == 2 and feed.delivered == 0
    router.stopping = True  # a stop: the next line is not written
    clock.advance(INTERVAL_SECS * 3)
    assert len(progress_lines(log_lines, "sink lake catching up from the spool")) == 1
    assert clock.getDelayedCalls() == []

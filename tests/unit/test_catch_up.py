"""Catching up from the spool (``logrouter.catch_up``) without a daemon: a fake spool of
records, a fake host, a ``task.Clock`` and a thread runner the test completes by hand;
then a whole router on a ``task.Clock`` with a synchronous runner replaying its spool."""

from __future__ import annotations

import msgpack
import pytest
from twisted.internet import defer, task

from helpers import spin
from source_fakes import log_lines  # noqa: F401  (a fixture)
from logrouter import registry
from logrouter.batch import Batch
from logrouter.catch_up import READ_RETRY_SECS, CatchUp, read_records
from logrouter.config.load import load_string
from logrouter.feeds import BEHIND, LIVE, LOW_WATER, READING, REMOVED, SinkFeed
from logrouter.router import Router
from logrouter.sinks.base import SINK_OPTIONS, SinkBase
from logrouter.sources.base import SourceBase
from logrouter.spool.record import RecentBatches, encode_batch
from logrouter.spool.segment import Record

T0 = 1_700_000_000 * 10**9


class FakeSpool:
    """Records laid end to end; ``read`` returns at most ``per_read`` of them."""

    def __init__(self, payloads: list[bytes], per_read: int = 2) -> None:
        self.records = []
        position = 0
        for payload in payloads:
            self.records.append(Record(position, position + len(payload) + 8, payload))
            position += len(payload) + 8
        self.end = position
        self.per_read = per_read
        self.reads: list[tuple[int, int]] = []

    def read(self, start: int, end: int, max_bytes: int) -> tuple[list, int]:
        self.reads.append((start, end))
        got = [r for r in self.records if start <= r.offset < end][: self.per_read]
        return got, (got[-1].end if got else end)


class Host:
    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.routed: list[tuple[str, int, frozenset]] = []
        self.done = 0
        self.filtered: frozenset[str] = frozenset()

    def catch_up_limit(self, feed):
        return self.limit

    def filtered_sources(self, sink):
        return self.filtered

    def route(self, batch, routing):
        self.routed.append((batch.events[0][1]["n"], routing.position, routing.targets))

    def read_done(self, feed):
        self.done += 1


class Runner:
    """``run_blocking`` whose calls run when the test says (in order)."""

    def __init__(self) -> None:
        self.calls: list[tuple[defer.Deferred, object, tuple]] = []

    def __call__(self, function, *args):
        d: defer.Deferred = defer.Deferred()
        self.calls.append((d, function, args))
        return d

    def run(self) -> None:
        d, function, args = self.calls.pop(0)
        try:
            result = function(*args)
        except Exception as e:  # noqa: BLE001
            d.errback(e)
        else:
            d.callback(result)


class FakeSink:
    TYPE = "fake"

    def __init__(self) -> None:
        self.options = {"max_queue_bytes": 1000}
        self.queued_bytes = 0
        self.cursor = 0
        self.failing = False

    def advance(self, end: int) -> None:
        pass


def payload(n: int, source: str = "in") -> bytes:
    return encode_batch(Batch("t", [(T0, {"n": n})], source))


def setup(payloads: list[bytes], limit: int | None = -1):
    clock = task.Clock()
    spool = FakeSpool(payloads)
    host = Host(spool.end if limit == -1 else limit)
    runner = Runner()
    catch_up = CatchUp(spool, RecentBatches(), clock, runner, host)
    feed = SinkFeed("lake", FakeSink(), clock)
    feed.start(0)
    return catch_up, feed, spool, host, runner, clock


def test_a_feed_behind_reads_the_spool_in_a_thread_until_it_is_live():
    catch_up, feed, spool, host, runner, _ = setup([payload(n) for n in range(5)])
    catch_up.step(feed)
    assert feed.state is READING and len(runner.calls) == 1 and runner.calls[0][1] is read_records
    assert spool.reads == []  # nothing read on the reactor: the read runs in the runner
    runner.run()
    assert [n for n, _, _ in host.routed] == [0, 1] and feed.delivered == spool.records[1].end
    assert all(targets == frozenset({"lake"}) for _, _, targets in host.routed)  # for this sink only
    assert feed.state is READING and host.done == 1  # the next read began at once
    runner.run()
    runner.run()
    assert [n for n, _, _ in host.routed] == [0, 1, 2, 3, 4]
    assert feed.state is LIVE and feed.delivered == spool.end and runner.calls == []


@pytest.mark.parametrize("why", ["not behind", "failing", "no limit", "queue full"])
def test_no_read_starts_when_it_must_not(why):
    catch_up, feed, _, host, runner, _ = setup([payload(1)])
    if why == "not behind":
        feed.remove()
    elif why == "failing":
        feed.sink.failing = True
    elif why == "no limit":
        host.limit = None  # a stop, a feed taken off, the start's warm-up
    else:
        feed.sink.queued_bytes = int(feed.sink.options["max_queue_bytes"] * LOW_WATER) + 1
    catch_up.step(feed)
    assert runner.calls == [] and not feed.live


def test_a_read_started_before_the_feed_fell_behind_again_is_discarded():
    catch_up, feed, spool, host, runner, _ = setup([payload(n) for n in range(4)])
    catch_up.step(feed)
    feed.fall_behind()  # the sink failed while the read ran
    runner.run()
    assert host.routed == [] and feed.delivered == 0  # nothing applied
    assert feed.state is READING and runner.calls[0][2][2] == 0  # read again from its position


def test_a_feed_removed_during_a_read_is_handed_nothing():
    catch_up, feed, _, host, runner, _ = setup([payload(1)])
    catch_up.step(feed)
    feed.remove()
    runner.run()
    assert host.routed == [] and feed.state is REMOVED and feed.reading is None and runner.calls == []


def test_a_record_that_cannot_be_decoded_is_reported_and_passed(log_lines):  # noqa: F811
    bad = msgpack.packb([3, "in", "t", ["nope", 1], None])
    catch_up, feed, spool, host, runner, _ = setup([payload(0), bad, payload(2)], limit=None)
    host.limit = spool.end
    spool.per_read = 3
    catch_up.step(feed)
    runner.run()
    assert [n for n, _, _ in host.routed] == [0, 2] and feed.state is LIVE
    assert any(f"spool record at {spool.records[1].offset} cannot be decoded" in line for line in log_lines)


def test_a_read_past_damage_moves_the_feed_past_it():
    catch_up, feed, spool, host, runner, _ = setup([payload(0)])
    host.limit = spool.end + 100  # a quarantined stretch after the last good record
    spool.read = lambda start, end, max_bytes: ([], end)
    catch_up.step(feed)
    runner.run()
    assert feed.delivered == spool.end + 100 and feed.state is LIVE


def test_a_read_that_fails_is_tried_again_a_second_later(log_lines):  # noqa: F811
    catch_up, feed, spool, host, runner, clock = setup([payload(0)])

    def broken(start, end, max_bytes):
        raise OSError("EIO")

    read = spool.read
    spool.read = broken
    catch_up.step(feed)
    runner.run()
    assert feed.state is BEHIND and runner.calls == []
    assert any("reading the spool for sink lake failed; retrying" in line for line in log_lines)
    spool.read = read
    clock.advance(READ_RETRY_SECS)
    runner.run()
    assert feed.state is LIVE and [n for n, _, _ in host.routed] == [0]


def test_a_sink_that_decodes_in_its_thread_is_handed_deferred_batches_except_through_a_filter():
    spool = FakeSpool([payload(0, "direct"), payload(1, "filtered")])
    decoded, _ = read_records(spool.read, RecentBatches().decode, 0, spool.end, True, frozenset({"filtered"}))
    (_, direct), (_, filtered) = decoded
    assert direct.is_deferred and not filtered.is_deferred
    decoded, _ = read_records(spool.read, RecentBatches().decode, 0, spool.end, False, frozenset())
    assert not any(batch.is_deferred for _, batch in decoded)


# -- a whole router on a task.Clock ---------------------------------------------------------


class Collect(SinkBase):
    TYPE = "catch_up_collect"
    OPTIONS = dict(SINK_OPTIONS)
    got: list = []

    def start(self):
        return defer.succeed(0)

    def write(self, batch, position, size):
        Collect.got.extend(record["n"] for _, record in batch.events)

    def advance(self, end):
        self.cursor = end

    def stop(self):
        return defer.succeed(None)


class Quiet(SourceBase):
    """A source that takes nothing in (the test stores the batches itself)."""

    TYPE = "catch_up_quiet"

    def start(self):
        return defer.succeed(None)

    def stop(self):
        return defer.succeed(None)

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


def test_a_router_on_a_clock_replays_its_spool_into_a_sink_at_start(tmp_path):
    from twisted.internet import reactor

    registry.load_builtin()
    registry.sink("catch_up_collect")(Collect)
    registry.source("catch_up_quiet")(Quiet)
    Collect.got = []
    try:
        config = load_string(
            f'[spool]\npath = "{tmp_path}/spool"\n[sources.in]\ntype = "catch_up_quiet"\n'
            '[sinks.out]\ntype = "catch_up_collect"\ninputs = ["in"]\n'
        )
        writer = Router(config, reactor)  # a spool written as a source would
        writer.spool.open()
        for n in range(5):
            spin(reactor, writer.ingest(Batch("t", [(T0, {"n": n})], source="in")))
        spin(reactor, writer.spool.close())

        clock = task.Clock()
        router = Router(config, clock, run_blocking=lambda f, *args: defer.maybeDeferred(f, *args))
        started = router.start()
        assert started.called  # nothing waited for a thread or the reactor
        assert Collect.got == [0, 1, 2, 3, 4] and router.feeds["out"].state is LIVE
        assert spin(reactor, router.stop()) is None
    finally:
        del registry.SINKS["catch_up_collect"]
        del registry.SOURCES["catch_up_quiet"]

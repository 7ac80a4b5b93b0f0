"""Big forward messages are decoded off the reactor, in parts, at their sender's expense.

Unit tests drive the source with StringTransport and the real ``OffloadPool`` with a
runner that runs each call only when the test says so, so every step of a message decoded
in parts can be looked at: the connection is held while its message is worked on, other
connections go on, parts are stored as separate batches with their own dedupe keys, the
ack waits for every part, the router's backpressure and a part waiting for the disk hold
production back, connections take turns a step at a time, a bomb is refused, and a stop
lets the work finish within its drain and abandons it after. One test runs the real threads.
(The real daemon with big messages: tests/integration/test_e2e_forward_offload.py.)
"""

from __future__ import annotations

import gzip
import json
import queue
import threading

import msgpack
import pytest
from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.python.failure import Failure

from logrouter.native import NATIVE
from logrouter.sources.fluent_forward import FORWARD_ENTRIES, part_key
from logrouter.wire.forward_packed import decode_entries
from logrouter.sources.offload import IteratorRun, OffloadPool
from fixtures.forward_encode import encode_forward, encode_packed_forward
from source_fakes import T0, FakePort, log_lines  # noqa: F401  (log_lines is a fixture)
from test_forward_source_protocol import connect, make_source, take

NS = 1_000_000_000
OTHER = IPv4Address("TCP", "10.9.9.9", 50000)


class StepRunner:
    """An ``OffloadPool`` runner that runs a call only when ``step()`` is called, on the test's thread."""

    def __init__(self) -> None:
        self.calls: list = []
        self.ran: list = []  # the arguments of every call run, in order

    def __call__(self, function, *args):
        d = defer.Deferred()
        self.calls.append((function, args, d))
        return d

    def step(self) -> None:
        function, args, d = self.calls.pop(0)
        self.ran.append(args)
        try:
            result = function(*args)
        except Exception:
            d.errback(Failure())
        else:
            d.callback(result)


class StepPool(OffloadPool):
    """The real pool (queue, turns, cancelling) over a ``StepRunner``."""

    def __init__(self, reactor, size: int = 2) -> None:
        self.runner = StepRunner()
        super().__init__(reactor, size, "test-decode", runner=self.runner)
        self.stopped = False

    @property
    def calls(self) -> list:
        return self.runner.calls

    def step(self) -> None:
        self.runner.step()

    def stop(self):
        self.stopped = True
        return super().stop()


def offload_source(**overrides):
    settings = dict(offload_bytes=1000, offload_part_bytes=3000, stop_drain_secs=3)
    settings.update(overrides)
    source, router = make_source(**settings)
    source.offload_pool = StepPool(source.reactor)
    return source, router


def step_part(source, router) -> None:
    """Step the pool until the message being worked on hands out its next part (or waits)."""
    pool = source.offload_pool
    before = len(router.batches)
    for _ in range(10_000):
        if len(router.batches) > before or not pool.calls:
            return
        pool.step()
    raise AssertionError("no part after 10000 steps")


def events(count: int, start: int = 0) -> list:
    return [(T0 * NS + i, {"seq": i, "pad": "x" * 40}) for i in range(start, start + count)]


def connect_other(source):
    return connect(source, OTHER)


def seqs(batches) -> list[int]:
    return [record["seq"] for batch in batches for _, record in batch.events]


def finish_work(source, router) -> None:
    """Step the pool and make parts durable until the work is done."""
    pool = source.offload_pool
    while pool.calls or router.pending:
        while pool.calls:
            pool.step()
        router.fire_pending()


BIG = encode_packed_forward("app.big", events(200), {"chunk": "big1", "size": 200})  # ~11 KB of entries


def test_big_message_is_worked_on_in_parts_while_its_connection_waits():
    source, router = offload_source()
    proto, transport = connect(source)
    small_after = msgpack.packb(["app.after", T0, {"seq": 999}, {"chunk": "after1"}])
    proto.dataReceived(BIG + small_after)
    # Framed only: nothing stored yet, the connection no longer read, the work queued.
    assert router.batches == [] and transport.producerState == "paused"
    assert len(source.offload_pool.calls) == 1 and source.offloaded_messages == 1

    # Another connection is read and served meanwhile.
    other, other_transport = connect_other(source)
    other.dataReceived(msgpack.packb(["app.other", T0, {"seq": -1}, {"chunk": "o1"}]))
    router.fire_pending()
    assert take(other_transport) == [{"ack": "o1"}]
    router.calls.clear()  # all durable: only the big message's batches are looked at below

    pool = source.offload_pool
    step_part(source, router)
    step_part(source, router)
    # Two parts wait for the disk: the third is not built until the first is durable.
    assert len(router.batches) == 2 and pool.calls == []
    router.fire_pending()
    assert len(pool.calls) == 1 and transport.value() == b""  # no ack before every part
    finish_work(source, router)

    big_batches = [b for b in router.batches if b.tag == "app.big"]
    assert len(big_batches) >= 3 and seqs(big_batches) == list(range(200))
    assert router.keys[: len(big_batches)] == [part_key(b"big1", i) for i in range(len(big_batches))]
    assert len(set(router.keys)) == len(router.keys)
    # The message after the big one is handled after it, and acked after it.
    assert [b.tag for b in router.batches][-1] == "app.after"
    assert take(transport) == [{"ack": "big1"}, {"ack": "after1"}]
    assert transport.producerState == "producing" and proto.busy is None and not proto.pending
    assert source.size_mismatches == 0 and source.offloaded_parts == len(big_batches)
    # With the native extension the parts stay packed and are stored as their entries.
    if NATIVE is not None:
        for batch in big_batches:
            assert batch.packed is not None and batch.packed[0] == FORWARD_ENTRIES
            assert decode_entries(*batch.packed[1:])[0] == list(batch.events)
    else:
        assert all(batch.packed is None for batch in big_batches)


def test_part_keys():
    assert part_key(None, 3) is None
    assert part_key(b"c", 0) == b"c"
    assert part_key(b"c", 2) == b"c\0part 2"


@pytest.mark.parametrize(
    "data",
    [
        encode_forward("app.big", events(200), {"chunk": "big1"}),
        encode_packed_forward("app.big", events(200), {"chunk": "big1"}, compressed="gzip"),
        encode_packed_forward("app.big", events(200), {"chunk": "big1"}, compressed="zstd"),
        msgpack.packb(["app.big", [[t // NS, r] for t, r in events(200)], {"chunk": "big1"}]),
    ],
    ids=["forward", "gzip", "zstd", "forward-int-times"],
)
def test_every_big_carrier_is_offloaded_and_complete(data):
    source, router = offload_source()
    proto, transport = connect(source)
    proto.dataReceived(data)
    assert router.batches == [] and source.offload_pool.calls
    finish_work(source, router)
    assert seqs(router.batches) == list(range(200)) and len(router.batches) > 1
    assert take(transport) == [{"ack": "big1"}]


def test_json_big_message_is_offloaded_and_acked_in_json():
    source, router = offload_source()
    proto, transport = connect(source)
    entries = [[T0, {"seq": i, "pad": "x" * 40}] for i in range(200)]
    proto.dataReceived(json.dumps(["app.json", entries, {"chunk": "j1"}]).encode())
    assert router.batches == []
    finish_work(source, router)
    assert seqs(router.batches) == list(range(200))
    assert transport.value() == b'{"ack":"j1"}'


def test_small_messages_stay_on_the_reactor():
    source, router = offload_source(offload_bytes=1 << 20)
    proto, _ = connect(source)
    proto.dataReceived(BIG)
    assert len(router.batches) == 1 and source.offload_pool.calls == []


def test_offload_can_be_turned_off():
    source, router = offload_source(offload_bytes=0)
    proto, _ = connect(source)
    proto.dataReceived(BIG)
    assert len(router.batches) == 1 and source.offload_pool.calls == []


def test_invalid_events_in_parts_are_counted_once_and_the_rest_acked(log_lines):
    source, router = offload_source()
    proto, transport = connect(source)
    entries = [[T0, {"seq": i, "pad": "x" * 40}] for i in range(100)] + [[2**64 - 1, {"bad": 1}], [1e308, {"bad": 2}]]
    proto.dataReceived(msgpack.packb(["app.big", entries, {"chunk": "c", "size": 102}]))
    finish_work(source, router)
    assert seqs(router.batches) == list(range(100))
    assert source.invalid_events == 2 and source.size_mismatches == 0
    assert take(transport) == [{"ack": "c"}]
    assert [line for line in log_lines if "invalid event" in line] == [
        "fluent_forward 10.1.2.3:40000: skipped 2 invalid event(s) in tag app.big"
    ]


def test_a_bomb_found_in_the_worker_closes_only_that_connection(log_lines):
    source, router = offload_source(max_decompressed_bytes=50_000)
    proto, transport = connect(source)
    bomb = gzip.compress(msgpack.packb([T0, {"pad": "x" * 200_000}]))
    proto.dataReceived(msgpack.packb(["app.bomb", bomb, {"compressed": "gzip", "chunk": "b"}], use_bin_type=True))
    other, other_transport = connect_other(source)
    finish_work(source, router)
    assert router.batches == [] and source.decode_errors == 1  # nothing of it was stored
    assert transport.disconnecting and not other_transport.disconnecting
    assert any("max_decompressed_bytes (50000)" in line and "closing connection" in line for line in log_lines)
    assert proto.busy is None


def test_a_client_that_leaves_mid_message_stops_the_work():
    source, router = offload_source()
    proto, transport = connect(source)
    proto.dataReceived(BIG)
    step_part(source, router)
    assert len(router.batches) == 1 and len(source.offload_pool.calls) == 1
    proto.connectionLost(Failure(Exception("gone")))
    finish_work(source, router)  # the step running is finished, and what it built thrown away
    assert len(router.batches) == 1 and proto.offload is None and proto.busy is None


def test_router_backpressure_holds_the_parts_back():
    source, router = offload_source(offload_part_bytes=1000)
    proto, _ = connect(source)
    proto.dataReceived(BIG)
    pool = source.offload_pool
    step_part(source, router)
    assert len(router.batches) == 1 and len(pool.calls) == 1
    source.pause_reading()
    step_part(source, router)
    router.fire_pending()
    assert len(router.batches) == 2 and pool.calls == []  # paused: nothing more is built
    source.resume_reading()
    assert len(pool.calls) == 1
    assert proto.holds == {"offload"}
    finish_work(source, router)
    assert seqs(router.batches) == list(range(200)) and proto.holds == set()


def test_a_stop_lets_a_message_finished_within_its_drain_be_acked():
    source, router = offload_source()
    proto, transport = connect(source)
    proto.dataReceived(BIG)
    source.port = FakePort(None)
    stopped: list = []
    source.stop().addBoth(stopped.append)
    source.reactor.advance(1)  # quiet, but its message is being worked on: the drain waits
    assert not stopped and not transport.disconnecting
    finish_work(source, router)
    assert take(transport) == [{"ack": "big1"}]
    source.reactor.advance(1)
    assert transport.disconnecting and stopped == [None]
    assert source.offload_pool.stopped


def test_a_stop_abandons_a_message_not_finished_when_its_drain_ends(log_lines):
    source, router = offload_source()
    proto, transport = connect(source)
    proto.dataReceived(BIG)
    step_part(source, router)
    router.fire_pending()  # the first part is durable
    pool = source.offload_pool
    assert pool.running == 1  # the next step is running (in a thread) when the drain ends
    source.port = FakePort(None)
    stopped: list = []
    source.stop().addBoth(stopped.append)
    source.reactor.advance(3)  # stop_drain_secs
    # Closed without an ack and without waiting for the message: the client resends it.
    assert transport.disconnecting and transport.value() == b""
    assert proto.offload is None and proto.busy is None
    assert any("abandoned after 1 part(s), not acked" in line for line in log_lines)
    # The stop waits for the step running (a thread cannot be interrupted), and no more.
    assert stopped == [] and pool.stopped
    pool.step()
    assert stopped == [None] and pool.calls == [] and pool.running == 0 and len(router.batches) == 1


def test_a_message_abandoned_before_its_first_part_is_logged_with_its_tag(log_lines):
    source, router = offload_source()
    proto, transport = connect(source)
    proto.dataReceived(BIG)
    source.offload_pool.step()  # the message is being checked: no part yet
    source.port = FakePort(None)
    source.stop()
    source.reactor.advance(3)  # stop_drain_secs
    assert router.batches == []
    assert any("message of tag app.big was decoded in parts: abandoned after 0 part(s)" in line for line in log_lines)


def test_a_store_failure_mid_message_closes_the_connection():
    source, router = offload_source()
    proto, transport = connect(source)
    proto.dataReceived(BIG)
    step_part(source, router)
    router.pending[0].errback(Failure(OSError("disk full")))
    finish_work(source, router)
    assert transport.disconnected or transport.disconnecting
    assert transport.value() == b"" and proto.offload is None


# -- the real worker threads -------------------------------------------------------------


class ThreadReactor:
    """Just enough reactor for deferToThreadPool: calls from threads queue up for ``pump``."""

    def __init__(self) -> None:
        self.calls: queue.Queue = queue.Queue()
        self.triggers: list = []

    def callFromThread(self, function, *args, **kwargs):
        self.calls.put((function, args, kwargs))

    def addSystemEventTrigger(self, phase, event, function):
        self.triggers.append(function)
        return len(self.triggers)

    def removeSystemEventTrigger(self, trigger_id):
        self.triggers[trigger_id - 1] = None

    def pump_until(self, d: defer.Deferred, timeout: float = 30) -> None:
        while not d.called:
            function, args, kwargs = self.calls.get(timeout=timeout)
            function(*args, **kwargs)


def test_offload_pool_runs_parts_in_its_own_threads():
    reactor = ThreadReactor()
    pool = OffloadPool(reactor, 2, "test-decode")
    seen: list = []

    def parts():
        for i in range(5):
            yield i, threading.current_thread().name

    run = IteratorRun(pool, parts(), seen.append)
    done = run.start()
    reactor.pump_until(done)
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    assert all(name.startswith("PoolThread-test-decode") for _, name in seen)
    assert reactor.triggers[0] is not None  # a reactor shutdown stops the threads too
    stopped = pool.stop()
    reactor.pump_until(stopped)
    assert reactor.triggers == [None] and pool.running == 0


def test_offload_run_reports_what_the_iterator_raised():
    reactor = ThreadReactor()
    pool = OffloadPool(reactor, 1, "test-decode")

    def parts():
        yield 1
        raise ValueError("broken part")

    seen: list = []
    done = IteratorRun(pool, parts(), seen.append).start()
    failures: list = []
    done.addErrback(failures.append)
    reactor.pump_until(done)
    assert seen == [1] and failures[0].check(ValueError)
    reactor.pump_until(pool.stop())

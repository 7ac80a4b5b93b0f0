"""The offload pool takes turns between connections a step at a time, withdraws what a
stop or a close cancels, and a bomb is refused in the source like any bad input.

The pool runs on a ``StepRunner`` (calls run only when the test steps them), so the order
in which steps run is what the test looks at, never time.
"""

from __future__ import annotations

import gzip

import msgpack
from twisted.internet import defer
from twisted.internet.task import Clock

from logrouter.sources.offload import IteratorRun, OffloadPool
from fixtures.forward_encode import encode_packed_forward
from source_fakes import T0, log_lines  # noqa: F401  (log_lines is a fixture)
from test_forward_source_offload import OTHER, StepPool, events, finish_work, offload_source, seqs
from test_forward_source_protocol import connect, take


def runs(pool, *names, steps: int = 4):
    """An ``IteratorRun`` per name, each yielding ``steps`` items; ``seen`` gets them in order."""
    seen: list = []
    done = []
    for name in names:
        items = iter([(name, i) for i in range(steps)])
        done.append(IteratorRun(pool, items, seen.append).start())
    return seen, done


def step_all(pool, limit: int = 1000) -> None:
    for _ in range(limit):
        if not pool.calls:
            return
        pool.step()
    raise AssertionError("the pool did not run dry")


def test_runs_take_turns_a_step_at_a_time():
    pool = StepPool(Clock(), size=1)
    seen, done = runs(pool, "a", "b", "c")
    assert len(pool.calls) == 1 and pool.queued == 2  # one thread: the others wait in turn
    step_all(pool)
    assert [name for name, _ in seen] == ["a", "b", "c"] * 4
    assert all(d.called for d in done)


def test_a_long_run_never_holds_more_than_one_thread():
    pool = StepPool(Clock(), size=2)
    seen, _ = runs(pool, "long", steps=50)
    assert len(pool.calls) == 1 and pool.queued == 0  # the second thread stays free
    pool.step()
    later, _ = runs(pool, "short", steps=2)
    assert len(pool.calls) == 2  # served at once, not behind the long run's next steps
    step_all(pool)
    assert [item for item in seen + later if item[0] == "short"] == [("short", 0), ("short", 1)]


def test_none_items_are_turns_without_a_result():
    pool = StepPool(Clock(), size=1)
    seen: list = []
    IteratorRun(pool, iter([None, None, "x", None]), seen.append).start()
    other, _ = runs(pool, "o", steps=3)
    step_all(pool)
    assert seen == ["x"]
    order = [args[0] for args in pool.runner.ran]
    first = order[0]
    assert order[:4] == [first, order[1], first, order[1]] and order[0] is not order[1]


def test_cancelling_withdraws_a_queued_call():
    pool = StepPool(Clock(), size=1)
    first = IteratorRun(pool, iter(range(3)), lambda item: None)
    first.start()
    second_items = iter(range(3))
    second = IteratorRun(pool, second_items, lambda item: None)
    second.start()
    assert pool.queued == 1
    second.cancel()
    assert pool.queued == 0
    step_all(pool)
    assert next(second_items) == 0  # never pulled


def test_a_stop_withdraws_queued_calls_and_waits_for_the_running_ones():
    pool = StepPool(Clock(), size=1)
    failures: list = []
    for _ in range(2):
        IteratorRun(pool, iter(range(10)), lambda item: None).start().addErrback(failures.append)
    stopped: list = []
    pool.stop().addCallback(stopped.append)
    assert pool.queued == 0 and stopped == []  # the running call is waited for
    pool.step()
    # The withdrawn run failed, and so did the running one's next call, made while stopping.
    assert stopped == [None] and pool.calls == [] and len(failures) == 2


def test_a_cancelled_running_call_has_its_result_thrown_away():
    pool = OffloadPool(Clock(), 1, "t", runner=lambda function, *args: held)
    held: defer.Deferred = defer.Deferred()
    d = pool.run(lambda: 1)
    d.addErrback(lambda failure: None)
    d.cancel()
    assert pool.running == 1
    held.callback(2)  # arrives after the cancel: dropped, the pool's thread is free again
    assert pool.running == 0


# -- in the source -----------------------------------------------------------------------


def big_message(chunk: str, start: int) -> bytes:
    return encode_packed_forward("app.big", events(200, start), {"chunk": chunk}, compressed="gzip")


def test_two_connections_messages_take_turns_on_one_thread():
    source, router = offload_source()
    source.offload_pool = pool = StepPool(source.reactor, size=1)
    first, first_transport = connect(source)
    second, second_transport = connect(source, OTHER)
    first.dataReceived(big_message("one", 0))
    second.dataReceived(big_message("two", 1000))
    mine = {id(first.offload.run.items): "one", id(second.offload.run.items): "two"}
    order: list = []
    for _ in range(1000):
        if not pool.calls:
            break
        order.append(mine[id(pool.calls[0][1][0])])
        pool.step()
        router.fire_pending()  # parts durable at once: both stay ready
    assert take(first_transport) == [{"ack": "one"}] and take(second_transport) == [{"ack": "two"}]
    both = order[: min(order.count("one"), order.count("two")) * 2]
    assert len(both) >= 6 and all(a != b for a, b in zip(both, both[1:]))  # strictly alternating
    assert sorted(seqs(router.batches)) == list(range(200)) + list(range(1000, 1200))


def test_a_bomb_is_refused_in_the_worker_and_counted(log_lines):
    source, router = offload_source()
    proto, transport = connect(source)
    other, other_transport = connect(source, OTHER)
    bomb = gzip.compress(b"\0" * (4 << 20), 9)
    proto.dataReceived(msgpack.packb(["app.bomb", bomb, {"compressed": "gzip", "chunk": "b"}], use_bin_type=True))
    other.dataReceived(msgpack.packb(["app.ok", T0, {"seq": 1}, {"chunk": "ok"}]))
    finish_work(source, router)
    assert source.offload_pool.runner.ran and len(source.offload_pool.runner.ran) <= 2
    assert transport.disconnecting and transport.value() == b""  # closed, nothing acked
    assert take(other_transport) == [{"ack": "ok"}] and not other_transport.disconnecting
    assert [b.tag for b in router.batches] == ["app.ok"]
    assert source.bombs_refused == 1 and source.decode_errors == 1
    assert any(
        line.startswith("fluent_forward 10.1.2.3:40000: message refused as a bomb") and "closing connection" in line
        for line in log_lines
    )


def test_a_bomb_decoded_on_the_reactor_is_refused_and_counted(log_lines):
    source, router = offload_source(offload_bytes=1 << 20)
    proto, transport = connect(source)
    bomb = gzip.compress(b"\0" * 100_000, 9)
    proto.dataReceived(msgpack.packb(["app.bomb", bomb, {"compressed": "gzip", "chunk": "b"}], use_bin_type=True))
    assert transport.disconnecting and transport.value() == b"" and router.batches == []
    assert source.bombs_refused == 1 and source.decode_errors == 1
    assert source.offload_pool.runner.ran == []
    assert any("message refused as a bomb" in line for line in log_lines)

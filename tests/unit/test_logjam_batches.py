"""How the logjam source cuts what arrives together into spool records (issue 28).

Messages that arrive in one chunk are stored per tag in batches of at most
``BATCH_BYTES`` of body JSON (a spool record past ``MAX_PAYLOAD`` is refused whole);
a batch the spool refuses anyway is stored again in halves, so only the message that
cannot be stored gets ``400 Bad Request``. The reactor side is driven directly: messages
decoded by ``LogjamSource.decode`` as the receiver thread would, handed to ``received``.
"""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import defer, task

from logrouter.failures import UnstorableBatch
from logrouter.sources import logjam as logjam_source
from logrouter.sources.logjam import LogjamSource
from logrouter.sources.zmq_receiver import ROUTER, Received
from logrouter.spool.segment import MAX_PAYLOAD
from logrouter.wire import logjam as wire
from source_fakes import T0, FakeRouter, fake_context

MIB = 1 << 20


class FakeReceiver:
    """What the source asks of its receiver on the reactor side: replies and ``done``."""

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []
        self.done_calls = 0

    def send(self, index: int, frames: list[bytes]) -> None:
        self.sent.append(frames)

    def done(self) -> None:
        self.done_calls += 1


class RefusingRouter(FakeRouter):
    """Refuses, as the router does, a batch holding a record it cannot store (here: one
    with ``poison``); the others are durable at once."""

    def __init__(self) -> None:
        super().__init__()
        self.stored: list[dict] = []

    def ingest(self, batch: Any, key: Any = None, *, writer: Any = None) -> defer.Deferred:
        d = super().ingest(batch, key, writer=writer)
        if any("poison" in record for _, record in batch.events):
            d.errback(UnstorableBatch("batch cannot be stored: OverflowError: Integer value out of range"))
        else:
            self.stored.extend(record for _, record in batch.events)
            d.callback(None)
        return d


def make(router: Any) -> tuple[LogjamSource, FakeReceiver]:
    options = {key: option.default for key, option in LogjamSource.OPTIONS.items()}
    options["listen_router"] = "tcp://127.0.0.1:*"
    clock = task.Clock()
    clock.advance(T0)
    source = LogjamSource("lj", options, fake_context(router, clock))
    source.receiver = FakeReceiver()  # type: ignore[assignment]
    return source, source.receiver  # type: ignore[return-value]


def request(source: LogjamSource, n: int, body: dict[str, Any]) -> Received:
    frames = wire.encode_message("shop", "prod", "logs", body, wire.Meta(wire.ZLIB_COMPRESSION, 0, 0, n))
    return Received(source.router_socket, f"agent-{n}".encode(), source.decode(ROUTER, [b"", *frames]), sum(map(len, frames)))


# --- split_by_size --------------------------------------------------------------------------


@pytest.mark.parametrize("sizes,budget,ranges", [
    ([], 10, []),
    ([3, 3, 3], 10, [(0, 3)]),
    ([3, 3, 3, 3], 10, [(0, 3), (3, 4)]),
    ([5, 5, 5], 10, [(0, 2), (2, 3)]),
    ([30, 30, 30], 32, [(0, 1), (1, 2), (2, 3)]),
    ([50, 1, 1, 50], 10, [(0, 1), (1, 3), (3, 4)]),  # one too big: alone, the rest still packed
    ([1, 50], 10, [(0, 1), (1, 2)]),
    ([0, 0, 10, 0], 10, [(0, 4)]),
])
def test_split_by_size(sizes, budget, ranges):
    assert logjam_source.split_by_size(sizes, budget) == ranges
    covered = [i for start, end in ranges for i in range(start, end)]
    assert covered == list(range(len(sizes)))
    assert all(sum(sizes[start:end]) <= budget or end - start == 1 for start, end in ranges)


def test_the_budget_leaves_room_under_the_spool_record_limit():
    assert logjam_source.BATCH_BYTES * 2.5 < MAX_PAYLOAD


# --- the source -------------------------------------------------------------------------------


def test_messages_received_together_are_stored_in_batches_under_the_budget():
    router = FakeRouter()
    source, receiver = make(router)
    blob = "x" * (4 * MIB)  # a 4 MiB field: eight of them are over the 32 MiB budget
    chunk = [request(source, n, {"n": n, "blob": blob}) for n in range(10)]
    source.received(chunk)
    assert receiver.done_calls == 1
    assert [len(b.events) for b in router.batches] == [7, 3]
    assert [r["n"] for b in router.batches for _, r in b.events] == list(range(10))
    router.fire_all()
    assert receiver.sent == [[f"agent-{n}".encode(), b"shop-prod", b"202 Accepted"] for n in range(10)]
    assert source.replies_accepted == 10 and source.store_failures == 0


def test_a_message_the_spool_refuses_is_the_only_one_refused():
    router = RefusingRouter()
    source, receiver = make(router)
    chunk = [request(source, n, {"n": n, **({"poison": 10**30} if n == 6 else {})}) for n in range(10)]
    source.received(chunk)
    assert sorted(r["n"] for r in router.stored) == [n for n in range(10) if n != 6]
    replies = {frames[0]: frames[2] for frames in receiver.sent}
    assert replies == {f"agent-{n}".encode(): b"400 Bad Request" if n == 6 else b"202 Accepted" for n in range(10)}
    assert len(receiver.sent) == 10
    assert source.replies_accepted == 9 and source.replies_bad_request == 1 and source.store_failures == 1
    assert not source.pending


def test_stop_waits_for_the_halves_of_a_batch_refused_later():
    router = FakeRouter()
    source, receiver = make(router)
    source.received([request(source, n, {"n": n}) for n in range(4)])
    (first,) = router.calls
    first.deferred.errback(UnstorableBatch("too big"))  # refused after a while, not at once
    assert [len(call.batch.events) for call in router.calls[1:]] == [2, 2]
    assert len(source.pending) == 3  # the refused batch waits for its halves
    router.fire_all()
    assert not source.pending
    assert sorted(frames[0] for frames in receiver.sent) == [f"agent-{n}".encode() for n in range(4)]
    assert {frames[2] for frames in receiver.sent} == {b"202 Accepted"}


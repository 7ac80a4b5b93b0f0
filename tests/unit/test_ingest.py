"""Taking batches in (``logrouter.ingest``), without a spool on disk or a reactor: a fake
spool whose appends the test completes, and a ``task.Clock`` for the retry after a
refused write."""

from __future__ import annotations

import pytest
from twisted.internet import defer, task
from twisted.python.failure import Failure

from source_fakes import log_lines  # noqa: F401  (a fixture)
from logrouter.batch import Batch
from logrouter.dedupe import DedupeWindow
from logrouter.failures import UnstorableBatch
from logrouter.flow import Flow
from logrouter.ingest import SPOOL_RETRY_SECS, Ingest


class FakeSpool:
    """Takes appends; the test says when each is written (or refused)."""

    durability = "fsync"

    def __init__(self) -> None:
        self.appends: list[tuple[bytes, str, defer.Deferred]] = []
        self.end = 0

    def append(self, payload: bytes, durability: str) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.appends.append((payload, durability, d))
        return d

    def write(self, index: int = -1) -> None:
        payload, _, d = self.appends[index]
        position, self.end = self.end, self.end + len(payload) + 8
        d.callback((position, self.end))

    def refuse(self, index: int = -1) -> None:
        self.appends[index][2].errback(OSError(28, "No space left on device"))


class Harness:
    def __init__(self, durability: dict[str, str] | None = None) -> None:
        self.clock = task.Clock()
        self.spool = FakeSpool()
        self.stored: list[tuple[Batch, int, int, int]] = []
        self.pressure = 0
        self.settled = 0
        self.ingest = Ingest(
            self.spool, DedupeWindow(100), Flow(), self.clock, durability or {},
            on_stored=lambda *args: self.stored.append(args), on_pressure=self.press, on_settled=self.settle,
        )

    def press(self) -> None:
        self.pressure += 1

    def settle(self) -> None:
        self.settled += 1


def batch(n: int = 1, source: str = "in") -> Batch:
    return Batch("t", [(1, {"n": i}) for i in range(n)], source)


def outcome(d: defer.Deferred) -> list:
    got: list = []
    d.addBoth(got.append)
    return got


def test_a_batch_is_acked_once_durable_after_it_was_routed():
    h = Harness()
    b = batch(3)
    acked = outcome(h.ingest.ingest(b, b"chunk-1"))
    assert len(h.spool.appends) == 1 and acked == [] and h.stored == []
    assert h.ingest.busy and h.pressure == 1  # the sources are told whether to read on every batch
    h.spool.write()
    payload = h.spool.appends[0][0]
    assert h.stored == [(b, 0, h.spool.end, len(payload))]
    assert acked == [None] and not h.ingest.busy and h.settled == 1
    assert (h.ingest.batches_in, h.ingest.events_in, h.ingest.duplicates) == (1, 3, 0)


def test_a_resend_while_the_first_copy_is_stored_waits_for_it_and_is_stored_once():
    h = Harness()
    first = outcome(h.ingest.ingest(batch(), b"chunk-1"))
    again = outcome(h.ingest.ingest(batch(), b"chunk-1"))
    assert len(h.spool.appends) == 1 and again == [] and h.ingest.duplicates == 1
    h.spool.write()
    assert first == [None] and again == [None] and len(h.stored) == 1
    late = outcome(h.ingest.ingest(batch(), b"chunk-1"))
    assert late == [None] and len(h.spool.appends) == 1 and h.ingest.duplicates == 2  # acked at once


def test_a_writers_numbers_not_above_what_it_stored_are_acked_without_storing():
    h = Harness()
    outcome(h.ingest.ingest(batch(), writer=(b"w", 10)))
    h.spool.write()
    assert outcome(h.ingest.ingest(batch(), writer=(b"w", 9))) == [None]
    outcome(h.ingest.ingest(batch(), writer=(b"w", 11)))
    assert len(h.spool.appends) == 2 and h.ingest.window.last_event_number("in", b"w") == 10


def test_a_refused_write_acks_nothing_pauses_the_sources_and_retries_later(log_lines):  # noqa: F811
    h = Harness()
    first = outcome(h.ingest.ingest(batch(), b"chunk-1"))
    waiting = outcome(h.ingest.ingest(batch(), b"chunk-1"))  # a resend waiting for the first copy
    pressure = h.pressure
    h.spool.refuse()
    assert isinstance(first[0], Failure) and first[0].check(OSError)
    assert isinstance(waiting[0], Failure)  # the resend's ack fails with it
    assert h.stored == [] and h.ingest.failing and h.ingest.write_failures == 1 and h.pressure == pressure + 1
    assert any("spool write failed" in line and "try again in 1s" in line for line in log_lines)
    h.clock.advance(SPOOL_RETRY_SECS[0])
    assert not h.ingest.failing and h.pressure == pressure + 2
    # The id can be sent again: nothing of it was stored.
    again = outcome(h.ingest.ingest(batch(), b"chunk-1"))
    h.spool.refuse()  # the disk is still full: the pause doubles
    assert isinstance(again[0], Failure) and h.clock.getDelayedCalls()[0].getTime() == SPOOL_RETRY_SECS[0] + 2
    h.clock.advance(2)
    outcome(h.ingest.ingest(batch(), b"chunk-2"))
    h.spool.write()
    assert any("spool writes succeed again" in line for line in log_lines)


def test_a_stop_cancels_the_retry():
    h = Harness()
    outcome(h.ingest.ingest(batch()))
    h.spool.refuse()
    h.ingest.stop()
    assert h.clock.getDelayedCalls() == []


def test_a_source_with_durability_none_is_acked_at_once(log_lines):  # noqa: F811
    h = Harness({"fast": "none"})
    acked = outcome(h.ingest.ingest(batch(source="fast")))
    assert acked == [None] and h.spool.appends[0][1] == "none"
    outcome(h.ingest.ingest(batch(source="other")))
    assert h.spool.appends[1][1] == "fsync"  # the spool's own
    h.spool.refuse(0)  # logged, never an unhandled failure
    assert any("spool write failed" in line for line in log_lines)


def test_idle_fires_once_every_append_is_stored_or_refused():
    h = Harness()
    outcome(h.ingest.ingest(batch()))
    outcome(h.ingest.ingest(batch()))
    idle = outcome(h.ingest.idle())
    h.spool.write(0)
    assert idle == []
    h.spool.refuse(1)
    assert len(idle) == 1 and not h.ingest.busy


def test_a_batch_too_big_for_a_spool_record_is_refused_before_the_spool(monkeypatch):
    monkeypatch.setattr("logrouter.ingest.MAX_PAYLOAD", 100)
    h = Harness()
    refused = outcome(h.ingest.ingest(Batch("t", [(1, {"blob": "x" * 200})], "in"), b"big"))
    assert refused[0].check(UnstorableBatch) and h.spool.appends == [] and h.ingest.unstorable_batches == 1
    assert h.ingest.window.lookup(("in", b"big")) is None  # its id is not held


@pytest.mark.parametrize("failing", [False, True])
def test_the_ack_of_a_stored_batch_waits_for_the_routing(failing):
    # on_stored runs before the source's ack: a batch is handed to the live sinks first.
    order: list[str] = []
    h = Harness()
    h.ingest.on_stored = lambda *args: order.append("routed")
    d = h.ingest.ingest(batch())
    d.addBoth(lambda result: order.append("acked"))
    if failing:
        h.spool.refuse()
        assert order == ["acked"]
    else:
        h.spool.write()
        assert order == ["routed", "acked"]

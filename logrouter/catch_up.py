"""Catching up: feeding a sink that is behind (``logrouter.feeds``: BEHIND) by reading the
spool from where it was last handed records, until it reaches the live end.

A sink falls behind when it starts (recovery is this same catch-up from the cursor it
saved), when its queue overflowed, when it failed or rewound. ``CatchUp.step`` starts its
next read once its queue is under the low-water mark: ``read_records`` runs through the
injected thread runner (a worker thread in the daemon), reads up to ``READ_CHUNK_BYTES``
of records and decodes them there, off the reactor (the batches still kept in
``RecentBatches`` are taken as they are). Back on the reactor, ``apply`` pushes each
record down the routes for this sink only (``Routing.targets``), then ``step`` reads on;
once the sink was handed everything routed so far it goes live.

A sink that reads events in its own thread (``DEFERRED_EVENTS``) is handed the records of
sources routed straight to it still encoded (``Batch.deferred``): its queue holds them at
their spool size and it decodes them itself. Every other batch counts in the sink's queue
as ``Batch.charge`` says: what it holds in memory where its stored format knows that (a
record stored compressed), else its spool size. Through a filter the events are read on the
reactor, so those are decoded in the read thread.

A read started before the sink fell behind again (its ``epoch`` moved) is discarded when
it returns. A record that cannot be decoded is reported and skipped; a read that fails is
retried a second later (on the injected clock).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from twisted.logger import Logger

from logrouter.batch import Batch, Routing
from logrouter.feeds import BEHIND, LOW_WATER, SinkFeed
from logrouter.wire.errors import detached

READ_CHUNK_BYTES = 4 << 20  # of spool records read at a time
READ_RETRY_SECS = 1.0


class CatchUpHost(Protocol):
    """What catching up uses of the router."""

    def catch_up_limit(self, feed: SinkFeed) -> int | None:
        """The spool position up to which ``feed`` is to be fed now (the end of what was
        routed live); None while it may not be (a stop, a feed taken off, the start's
        warm-up under way)."""

    def filtered_sources(self, sink: str) -> frozenset[str]:
        """The batch sources with a route through a filter to ``sink``."""

    def route(self, batch: Batch, routing: Routing) -> None:
        """Push one spool record's batch down its routes."""

    def read_done(self, feed: SinkFeed) -> None:
        """A read for ``feed`` was applied or discarded (recent batches, a stop's drain)."""


def read_records(
    read: Callable[[int, int, int], tuple[list, int]],
    decode: Callable[[int, bytes, bool], Batch],
    start: int,
    end: int,
    deferred: bool,
    filtered: frozenset[str],
) -> tuple[list, int]:
    """In a thread: the records from ``start`` (up to ``end``) with their batches, decoded
    unless ``deferred`` (and not from a source in ``filtered``), or the error their decode
    raised; and the position after them."""
    records, next_position = read(start, end, READ_CHUNK_BYTES)
    decoded: list = []
    for record in records:
        try:
            batch = decode(record.offset, record.payload, deferred)
            if batch.is_deferred and batch.source in filtered:
                batch = decode(record.offset, record.payload, False)  # with what it holds (Batch.held_bytes)
            decoded.append((record, batch))
        except Exception as e:  # noqa: BLE001 - reported and skipped by apply
            decoded.append((record, detached(e)))  # no traceback holding the whole read
    return decoded, next_position


class CatchUp:
    """Reads the spool for the feeds that are behind and hands them what it read."""

    log = Logger(namespace="logrouter.router")

    def __init__(self, spool: Any, recent: Any, clock: Any, run_blocking: Callable[..., Any], host: CatchUpHost) -> None:
        """``spool.read(start, end, max_bytes)``; ``recent``: the ``RecentBatches``;
        ``run_blocking(function, *args)``: a Deferred of a call run off the reactor."""
        self.spool = spool
        self.recent = recent
        self.clock = clock
        self.run_blocking = run_blocking
        self.host = host

    def step(self, feed: SinkFeed) -> None:
        """Start ``feed``'s next read, or make it live if it has been handed everything;
        nothing unless it is BEHIND, working, and its queue is under the low-water mark
        (its progress calls again as it drains)."""
        sink = feed.sink
        if feed.state is not BEHIND or sink.failing:
            return
        limit = self.host.catch_up_limit(feed)
        if limit is None:
            return
        if sink.queued_bytes > sink.options["max_queue_bytes"] * LOW_WATER:
            return
        if feed.delivered >= limit:
            feed.go_live()
            return
        feed.watch_catch_up(self.clock, lambda: self.host.catch_up_limit(feed))
        deferred = bool(getattr(sink, "DEFERRED_EVENTS", False))
        filtered = self.host.filtered_sources(feed.name) if deferred else frozenset()
        d = self.run_blocking(read_records, self.spool.read, self.recent.decode, feed.delivered, limit, deferred, filtered)
        epoch = feed.begin_read(d)
        d.addCallback(self.apply, feed, epoch)
        d.addErrback(self._failed, feed, d)

    def apply(self, result: tuple[list, int], feed: SinkFeed, epoch: int) -> None:
        """Back on the reactor: hand ``feed`` the records read, unless it fell behind since."""
        # The feed stays READING while the records are pushed: a sink that reports progress
        # from inside write() must not start a second read from a half-fed position.
        if epoch == feed.epoch:
            records, next_position = result
            for record, batch in records:
                if epoch != feed.epoch:
                    break  # the sink failed on the way: it is fed again from its cursor
                if isinstance(batch, Exception):
                    self.log.error("spool record at {position} cannot be decoded ({error}); skipped",
                                   position=record.offset, error=batch)
                else:
                    size = batch.charge(len(record.payload))  # memory, for a record stored compressed
                    self.host.route(batch, Routing(record.offset, record.end, size, feed.targets))
                feed.moved(record.end)
            else:
                if next_position > feed.delivered:
                    feed.moved(next_position)  # past damage that was quarantined
        feed.end_read()
        self.step(feed)
        self.host.read_done(feed)

    def _failed(self, failure: Any, feed: SinkFeed, reading: Any) -> None:
        if feed.reading is reading:  # not ended by apply
            feed.end_read()
        self.log.failure("reading the spool for sink {name} failed; retrying", failure, name=feed.name)
        self.clock.callLater(READ_RETRY_SECS, self.step, feed)

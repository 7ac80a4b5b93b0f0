"""The router: builds the configured graph and moves spool records to sinks.

A source hands a batch to ``ingest``. The batch is appended to the spool; once it is
written (and fsync'd, by default) the returned Deferred fires, the source acks, and
the batch is pushed down the precomputed routes to every sink that is *live*.

Each sink has a feed: the spool position up to which it was handed records. When a
live sink's queue passes ``max_queue_bytes``, the sources that can push back and feed
it stop reading until it drains (for at most the sink's ``hold_sources_secs``): the senders
wait, the sink stays live, and nothing is read back and decoded a second time. A sink
still full after that, that failed, or that just started is not live: it catches up by
reading the spool from its position in a thread, through the
same filters, until it reaches the live end, and then goes live again. A sink that reads
events in its own thread (``DEFERRED_EVENTS``) is handed what it reads straight from a
source still encoded (``Batch.deferred``) and decodes it there. Startup recovery
is that same catch-up from the cursor each sink saved. So a slow sink costs spool space,
never memory; when the spool's backlog (from the slowest sink's cursor to the end) passes
``spool.max_bytes`` every source stops reading until it falls under the low-water mark.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

from twisted.internet import defer, threads
from twisted.logger import Logger
from twisted.python.failure import Failure

from logrouter import dedupe, routes
from logrouter.batch import Batch, Routing
from logrouter.config.load import Config
from logrouter.errors import RoutedErrors
from logrouter.failures import UnstorableBatch
from logrouter.filters.memory import FilterMemory
from logrouter.feeds import SinkFeed
from logrouter.flow import Flow
from logrouter.progress import ProgressLog
from logrouter.retired import RetiredSources
from logrouter.routes import FilterNode, filter_reach
from logrouter.serial import defer_to_thread
from logrouter.sinks.state import SinkState
from logrouter.sources.base import Source, SourceContext, build_source
from logrouter.spool.ages import StoreTimes
from logrouter.spool.log import SpoolLog
from logrouter.spool.segment import MAX_PAYLOAD
from logrouter.spool.record import RecentBatches, decode_key, encode_batch
from logrouter.wire.errors import detached

READ_CHUNK_BYTES = 4 << 20
LOW_WATER = 0.8  # resume sources / feed a sink again below this share of its bound
# A sink holding the sources still takes what sources that cannot push back send up to
# this share of its bound; past it, it reads from the spool. What the held sources had
# read before they stopped is taken besides (bounded: they read nothing more).
HOLD_SLACK = 1.5
MAX_UNWRITTEN_BYTES = 64 << 20  # appended but not yet written by the spool's worker
DRAIN_SHARE = 0.8  # of shutdown_timeout_secs, for sinks to catch up before they commit
DEDUPE_SNAPSHOT_SECS = 10.0
SPOOL_RETRY_SECS = (1.0, 30.0)  # first and longest pause after the spool's disk refused a write


def _all(deferreds: list[defer.Deferred]) -> defer.Deferred:
    """Fires once every one of ``deferreds`` has, with None, or with the first failure."""
    if len(deferreds) == 1:
        return deferreds[0]
    if not deferreds:
        return defer.succeed(None)
    d = defer.DeferredList(deferreds, fireOnOneErrback=True, consumeErrors=True)
    d.addCallbacks(lambda _: None, lambda f: f.value.subFailure)
    return d


class Router:
    log = Logger(namespace="logrouter.router")

    def __init__(
        self, config: Config, reactor: Any, *, worker: int = 0, passed: Any = None, run_blocking: Any = defer_to_thread
    ) -> None:
        """``worker`` and ``passed``: see ``SourceContext`` (set in a worker process).
        ``run_blocking(function, *args)``: a Deferred of a blocking call run off the
        reactor, for the saved routes (``logrouter.retired``); tests pass a synchronous one."""
        self.config = config
        self.reactor = reactor
        self.errors = RoutedErrors(self, reactor)
        self.errors.on_flushed = self._check_drained
        spool = config.spool
        self.spool = SpoolLog(reactor, spool["path"], spool["durability"], spool["segment_bytes"])
        self.max_spool_bytes = spool["max_bytes"]
        self.dedupe = dedupe.DedupeWindow(spool["dedupe_window"], lambda source: dedupe.event_limits(self.config, source))
        self.dedupe_path = os.path.join(spool["path"], "dedupe.msgpack")
        self.filter_memory = FilterMemory(spool["path"])  # what dedupe filters remember, across restarts
        # Batches a sink behind has still to read, so that _catch_up need not decode them again.
        self.recent_batches = RecentBatches()
        self.flow = Flow()
        self.store_times = StoreTimes(reactor.seconds())
        self.replay_progress = (0, 0)  # (bytes done, of) of the ids' replay at start, set by its thread
        self.sinks = {name: c.cls(name, c.options, self.errors, reactor) for name, c in config.sinks.items()}
        self.filters = {name: c.cls(name, c.options, self.errors) for name, c in config.filters.items()}
        self.source_context = SourceContext(
            router=self, reactor=reactor, errors=self.errors, state_dir=os.path.join(spool["path"], "sources"),
            worker=worker, passed=passed,
        )
        # Sources are used only through the contract of logrouter.sources.base.Source.
        self.sources: dict[str, Source] = {
            name: build_source(c.cls, name, c.options, self.source_context) for name, c in config.sources.items()
        }
        # A source's own `durability` overrides the spool's for its batches.
        self.durability = {name: c.options.get("durability", "") for name, c in config.sources.items()}
        self.retired = RetiredSources(spool["path"], self.errors, run_blocking)
        self.routes = self._build_routes()
        self.feeds = {name: self._new_feed(name, sink) for name, sink in self.sinks.items()}
        self.routed_end = 0
        self.batches_in = 0
        self.events_in = 0
        self.duplicates = 0
        self.duplicate_events = 0
        self.unstorable_batches = 0
        self.paused = False
        self.paused_secs = 0.0
        self.pauses = 0
        self._paused_at = 0.0
        self._not_reading: set[Source] = set()  # told to pause (spool backlog or a full sink)
        self.stopping = False
        self.stop_requested = False
        self._starting: defer.Deferred | None = None
        self.spool_failing = False  # the last spool write failed; sources wait and try again
        self.spool_write_failures = 0
        self._spool_retry_delay = 0.0
        self._spool_retry_call: Any = None
        self._drain_waiter: defer.Deferred | None = None
        self._storing: set[defer.Deferred] = set()  # fire once each batch in the spool's queue is routed
        self.metrics_port: Any = None
        self._snapshot_position = 0
        self._snapshot_loaded = False  # the id window was read back whole (a stop can cut that short)
        self._snapshot_saved_at = float("-inf")
        self._snapshot: defer.Deferred | None = None
        self._reloading = False
        self._reload_done: defer.Deferred | None = None
        self.left_out: list[str] = []  # components the last reload could not start (/health names them)

    def _build_routes(self) -> dict[str, list[Any]]:
        """Per batch source (a source's name, ``<component>.errors`` for dead letters, or a
        removed source whose stored batches a sink has still to pass), the nodes its
        batches are pushed to."""
        built, self.errors.routed = routes.build(self.config, self.filters, self.sinks, self.errors, self.flow)
        return {**self.retired.routes(self.sinks, self.config), **built}

    # -- taking batches in --------------------------------------------------------------

    def ingest(
        self,
        batch: Batch,
        key: bytes | None = None,
        *,
        writer: tuple[bytes, int] | None = None,
        events: list[dedupe.EventKey | None] | None = None,
    ) -> defer.Deferred:
        """Store ``batch``; the Deferred fires once it is durable (then it is routed).

        Idempotency: ``key`` is the client's id for this batch (a forward ``chunk``, a Log
        Courier nonce): a batch whose id is already stored, or being stored, is acked
        without being stored again. ``writer`` is ``(writer id, number of the batch's last
        event)`` for senders that number their events (Pravega): a batch not numbered
        above what its writer already stored is acked without being stored again.
        ``events`` is one key per event of the batch (Beats events,
        ``logrouter.sources.event_keys``; None for an event without one): the events
        already stored are left out, and so are those another batch is storing, whose
        durability the Deferred then waits for too.
        """
        if events is not None:
            return self._ingest_events(batch, events)
        dedupe_key: tuple | None = None
        if writer is not None:
            dedupe_key = (batch.source, writer[0], writer[1])
        elif key is not None:
            dedupe_key = (batch.source, key)
        if dedupe_key is None:
            return self._store(batch, None, None)
        again = self.dedupe.lookup(dedupe_key)
        if again is not None:
            self.duplicates += 1
            return again
        return self._store(batch, dedupe_key, dedupe.KeyClaim(self.dedupe, dedupe_key))

    def _ingest_events(self, batch: Batch, keys: list[dedupe.EventKey | None]) -> defer.Deferred:
        claim = self.dedupe.events.claim(batch.source, keys)
        if claim.dropped:
            self.duplicate_events += claim.dropped
            if not claim.keep:
                self.duplicates += 1
                return _all(claim.waiting)
            events = batch.events
            batch = Batch(batch.tag, [events[i] for i in claim.keep], batch.source, json_values=batch.json_values)
        return _all([self._store(batch, claim.record_key(), claim), *claim.waiting])

    def _store(self, batch: Batch, dedupe_key: tuple | None, claim: Any) -> defer.Deferred:
        """Append ``batch`` with its idempotency key; ``claim`` (``finish(position)``,
        ``abandon(failure)``) hears whether it was stored."""
        try:
            payload = encode_batch(batch, dedupe_key)
            if len(payload) > MAX_PAYLOAD and batch.packed is not None:
                batch.packed = None  # what arrived is bigger than the records encoded: try those
                payload = encode_batch(batch, dedupe_key)
        except Exception as e:  # noqa: BLE001 - e.g. a record nested deeper than msgpack packs
            return self._unstorable(UnstorableBatch(f"batch cannot be stored: {type(e).__name__}: {e}"), claim)
        batch.packed = None  # in the payload now; the rest of the way reads the events
        if len(payload) > MAX_PAYLOAD:
            # A bigger record could not be read back: refuse it (this sender only) rather
            # than ack what the spool would later set aside as damage.
            return self._unstorable(
                UnstorableBatch(f"batch of {len(payload)} bytes exceeds the spool's record limit ({MAX_PAYLOAD})"), claim
            )
        if claim is not None:
            claim.begin()
        self.batches_in += 1
        self.events_in += len(batch.events)
        self.flow.stored(batch.source, len(batch.events), len(payload))
        durability = self.durability.get(batch.source) or self.spool.durability
        d = self.spool.append(payload, durability)
        d.addCallback(self._remember, batch, len(payload))
        d.addCallbacks(self._route_live, self._spool_failed, (batch, len(payload), claim))
        routed: defer.Deferred = defer.Deferred()
        self._storing.add(routed)
        d.addBoth(self._stored, routed)
        if claim is not None:
            d.addErrback(self._not_stored, claim)
        self._check_backpressure()
        if durability == "none":
            d.addErrback(lambda f: self.log.failure("spool write failed", f))
            return defer.succeed(None)
        return d

    def _unstorable(self, error: UnstorableBatch, claim: Any) -> defer.Deferred:
        self.unstorable_batches += 1
        failure = Failure(error)
        if claim is not None:
            claim.abandon(failure)  # what waits for these events is refused too
        return defer.fail(failure)

    def _stored(self, result: Any, routed: defer.Deferred) -> Any:
        # An append's outcome (routed, or refused) is known: a stop or drain waiting on it goes on.
        self._storing.discard(routed)
        routed.callback(None)
        self._check_drained()
        return result

    def _remember(self, written: tuple[int, int], batch: Batch, size: int) -> tuple[int, int]:
        self.recent_batches.add(written[0], batch, size)
        return written

    def last_event_number(self, source: str, writer: bytes) -> int | None:
        """The number of the last event stored for ``writer`` of ``source`` (survives restarts)."""
        return self.dedupe.last_event_number(source, writer)

    def _not_stored(self, failure: Any, claim: Any) -> Any:
        claim.abandon(failure)
        return failure

    def _spool_failed(self, failure: Any) -> Any:
        """The disk refused a write: nothing of the batch is stored, so it is not acked.

        Sources stop reading for a while (doubling up to a limit) rather than have every
        client resend into a full disk; then they try again, by themselves, so the router
        recovers as soon as space is back. The failed batch's sender sees its connection
        closed without an ack and resends.
        """
        self.spool_write_failures += 1
        if not self.spool_failing:
            self.spool_failing = True
            first, longest = SPOOL_RETRY_SECS
            self._spool_retry_delay = min(longest, self._spool_retry_delay * 2 or first)
            self.log.error(
                "spool write failed ({error}); nothing of the batch was stored or acked. Sources "
                "pause and try again in {delay:.0f}s",
                error=failure.getErrorMessage(),
                delay=self._spool_retry_delay,
            )
            self._spool_retry_call = self.reactor.callLater(self._spool_retry_delay, self._retry_spool)
            self._check_backpressure()
        return failure

    def _retry_spool(self) -> None:
        self._spool_retry_call = None
        self.spool_failing = False
        self._check_backpressure()

    def _route_live(self, written: tuple[int, int], batch: Batch, size: int, claim: Any) -> None:
        position, end = written
        self.routed_end = end
        self.store_times.stored(position, self.reactor.seconds(), self.min_cursor)
        if self._spool_retry_delay and not self.spool_failing:
            self._spool_retry_delay = 0.0
            self.log.info("spool writes succeed again")
        if self.paused:
            self._check_backpressure()
        if claim is not None:
            claim.finish(position)
        if self.stopping:
            return  # the sinks are stopping or stopped: it is in the spool for the next start
        targets = frozenset(name for name, feed in self.feeds.items() if feed.live and not feed.sink.failing)
        if targets:
            # A held source still hands over what it had read before it stopped: what a
            # held sink takes of that is allowed besides its slack (_sink_full).
            held: list[tuple[SinkFeed, int]] = []
            if self.sources.get(batch.source) in self._not_reading:
                held = [(f, f.sink.queued_bytes) for f in map(self.feeds.__getitem__, targets) if f.held_since is not None]
            try:
                self._route(batch, Routing(position, end, size, targets))
            except Exception:
                # Filter and sink nodes catch their own errors, so this is a bug: log it
                # loudly, and still ack, since the batch is durable in the spool.
                self.log.failure("routing the batch at spool position {position} failed", position=position)
            for feed, before in held:
                feed.held_inflow += max(feed.sink.queued_bytes - before, 0)
            for name in targets:
                self._handed(self.feeds[name], end)
        self._release_recent()

    def _route(self, batch: Batch, routing: Routing) -> None:
        """Push one spool record's batch down its routes."""
        self.errors.pass_number += 1
        for node in self.routes.get(batch.source, ()):
            node.push(batch, routing)

    def _release_recent(self) -> None:
        """The recent batches every sink has been handed are no longer needed."""
        self.recent_batches.release(min((f.delivered for f in self.feeds.values()), default=self.routed_end))

    def _handed(self, feed: SinkFeed, end: int) -> None:
        feed.delivered = end
        feed.sink.advance(end)
        if feed.sink.cursor > feed.committed_cursor:  # a sink that commits as it is handed records
            feed.note_commit(self.reactor.seconds())
        if feed.live and feed.sink.queued_bytes > feed.sink.options["max_queue_bytes"]:
            self._sink_full(feed)

    # -- a full sink holds the sources ----------------------------------------------------

    def _sink_full(self, feed: SinkFeed) -> None:
        """A live sink's queue passed its bound.

        The sources that can push back and feed it stop reading until it drains under
        the low-water mark, for at most its ``hold_sources_secs``: a sink slower than its senders then
        sets their pace (TCP and the protocols' windows push back) and stays live. Left
        to read from the spool instead, it would decode every record a second time, and
        in one process that second decode takes the very CPU it is short of. A sink that
        does not drain in time (a stalled lake) reads from the spool, and the sources
        read again: the spool absorbs what it cannot take.
        """
        if feed.held_since is None:
            hold = feed.sink.options.get("hold_sources_secs", 0)
            if hold and not self.stop_requested:
                feed.held_since = self.reactor.seconds()
                feed.holds += 1
                feed.hold_call = self.reactor.callLater(hold, self._hold_expired, feed)
                self._apply_reading()
                return
        elif feed.sink.queued_bytes <= feed.sink.options["max_queue_bytes"] * HOLD_SLACK + feed.held_inflow:
            return  # in flight when the sources stopped, or a little from those that cannot stop reading
        self._overflow(feed)

    def _overflow(self, feed: SinkFeed) -> None:
        """Over its memory bound, or held too long: it reads the rest from the spool."""
        feed.live = False
        feed.overflows += 1
        self._release_hold(feed)

    def _hold_expired(self, feed: SinkFeed) -> None:
        feed.hold_call = None
        if feed.held_since is None:
            return
        self.log.info(
            "sink {name}: its queue stayed over max_queue_bytes for {secs:.1f}s (hold_sources_secs): "
            "the sources read again and it catches up from the spool",
            name=feed.name,
            secs=self.reactor.seconds() - feed.held_since,
        )
        self._overflow(feed)
        self._catch_up(feed)

    def _release_hold(self, feed: SinkFeed) -> None:
        if feed.held_since is None:
            return
        feed.held_secs += self.reactor.seconds() - feed.held_since
        feed.held_since = None
        feed.held_inflow = 0
        if feed.hold_call is not None and feed.hold_call.active():
            feed.hold_call.cancel()
        feed.hold_call = None
        self._apply_reading()

    def _apply_reading(self) -> None:
        """Tell each source whether to read: none while the spool's backlog is over its
        bound, none that can push back and feeds a full sink while that holds them."""
        held = {name for name, feed in self.feeds.items() if feed.held_since is not None}
        for name, source in self.sources.items():
            wait = self.paused or (
                bool(held)
                and getattr(source, "PUSHES_BACK", False)
                and any(not held.isdisjoint(node.reach) for node in self.routes.get(name, ()))
            )
            if wait and source not in self._not_reading:
                self._not_reading.add(source)
                source.pause_reading()
            elif not wait and source in self._not_reading:
                self._not_reading.discard(source)
                source.resume_reading()

    # -- catching up from the spool -------------------------------------------------------

    def _catch_up(self, feed: SinkFeed) -> None:
        sink = feed.sink
        if not feed.started or feed.live or feed.reading is not None or sink.failing or self.stopping:
            return
        if not self.filter_memory.ready:
            return  # the start's warm-up first (logrouter.filters.memory); it feeds every sink then
        if sink.queued_bytes > sink.options["max_queue_bytes"] * LOW_WATER:
            return  # _progress calls again as the sink drains
        limit = self.routed_end
        if feed.delivered >= limit:
            feed.live = True
            feed.caught_up()
            return
        feed.watch_catch_up(self.reactor, lambda: None if self.stopping or self.feeds.get(feed.name) is not feed else self.routed_end)
        epoch = feed.epoch
        read = self.spool.read
        decode = self.recent_batches.decode
        # A sink that reads events in its own thread takes the batches of sources routed
        # straight to it deferred: its queue then holds records at their spool size, not
        # decoded (several times that), and it decodes them itself. Through a filter the
        # events are read on the reactor, so those are decoded here, off it.
        deferred = getattr(sink, "DEFERRED_EVENTS", False)
        filtered = self._filtered_sources(feed.name) if deferred else frozenset()

        def read_batches(start: int, end: int) -> tuple[list, int]:
            # Read, and decoded unless deferred, in this thread, off the reactor: [(record, batch or error)].
            records, next_position = read(start, end, READ_CHUNK_BYTES)
            decoded: list = []
            for record in records:
                try:
                    batch = decode(record.offset, record.payload, deferred)
                    if batch.is_deferred and batch.source in filtered:
                        batch = batch.materialized()
                    decoded.append((record, batch))
                except Exception as e:  # noqa: BLE001 - reported and skipped by _caught_up
                    decoded.append((record, detached(e)))  # no traceback holding the whole read
            return decoded, next_position

        feed.reading = defer_to_thread(read_batches, feed.delivered, limit)
        feed.reading.addCallback(self._caught_up, feed, epoch)
        feed.reading.addErrback(self._read_failed, feed)

    def _filtered_sources(self, sink: str) -> frozenset[str]:
        """The batch sources with a route through a filter to ``sink``."""
        return frozenset(
            source
            for source, nodes in self.routes.items()
            if any(isinstance(node, FilterNode) and sink in node.reach for node in nodes)
        )

    def _caught_up(self, result: tuple[list, int], feed: SinkFeed, epoch: int) -> None:
        # feed.reading stays set while the records are pushed: a sink that reports progress
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
                    self._route(batch, Routing(record.offset, record.end, len(record.payload), feed.targets))
                self._handed(feed, record.end)
            else:
                if next_position > feed.delivered:
                    self._handed(feed, next_position)  # past damage that was quarantined
            self._release_recent()
        feed.reading = None
        self._catch_up(feed)
        self._check_drained()

    def _read_failed(self, failure: Any, feed: SinkFeed) -> None:
        feed.reading = None
        self.log.failure("reading the spool for sink {name} failed; retrying", failure, name=feed.name)
        self.reactor.callLater(1.0, self._catch_up, feed)

    def _progress(self, feed: SinkFeed) -> None:
        feed.note_commit(self.reactor.seconds())
        if feed.sink.failing and (feed.live or feed.reading is not None):
            # It dropped what it held; it asks to be fed from its cursor once it retries.
            feed.live = False
            feed.epoch += 1
        if feed.held_since is not None and (
            not feed.live or feed.sink.queued_bytes < feed.sink.options["max_queue_bytes"] * LOW_WATER
        ):
            self._release_hold(feed)
        self._check_backpressure()
        if self.retired.entries:
            self._release_retired()
        self._trim()
        if not feed.live:
            self._catch_up(feed)
        self._check_drained()

    def _rewind(self, feed: SinkFeed) -> None:
        """The sink dropped what it held: feed it again from its cursor."""
        feed.epoch += 1
        feed.live = False
        self._release_hold(feed)
        feed.stop_watching()  # it starts again from its cursor
        feed.delivered = feed.sink.cursor
        feed.sink.advance(feed.sink.cursor)
        self._catch_up(feed)

    # -- bounds -------------------------------------------------------------------------

    def min_cursor(self) -> int:
        return min((feed.sink.cursor for feed in self.feeds.values()), default=self.routed_end)

    def backlog_bytes(self) -> int:
        return self.spool.end - min(self.min_cursor(), self.spool.end)

    def _check_backpressure(self) -> None:
        backlog = self.backlog_bytes()
        unwritten = self.spool.pending_bytes
        if not self.paused and (
            backlog > self.max_spool_bytes or unwritten > MAX_UNWRITTEN_BYTES or self.spool_failing
        ):
            self.paused = True
            self.pauses += 1
            self._paused_at = self.reactor.seconds()
            self.log.warn(
                "spool backlog {backlog} bytes (limit spool.max_bytes = {limit}), {unwritten} bytes "
                "waiting for the disk{failing}: sources paused",
                backlog=backlog,
                limit=self.max_spool_bytes,
                unwritten=unwritten,
                failing=", the disk refused the last write" if self.spool_failing else "",
            )
            self._apply_reading()
        elif (
            self.paused
            and not self.spool_failing
            and backlog < self.max_spool_bytes * LOW_WATER
            and unwritten < MAX_UNWRITTEN_BYTES * LOW_WATER
        ):
            self.paused = False
            self.paused_secs += self.reactor.seconds() - self._paused_at
            self.log.info("spool backlog {backlog} bytes: sources resumed", backlog=backlog)
            self._apply_reading()

    def _trim(self) -> None:
        """Delete spool segments every sink is done with and the snapshots (the id window,
        the filters' memory) cover."""
        if self._reloading:
            return  # a sink being replaced has no feed for a moment; its cursor still counts
        if not self.filter_memory.ready:
            return  # the filters' memory is being read back (the start's warm-up) from the spool
        cursor = self.min_cursor()
        self.filter_memory.release(self.filters, cursor)
        first_end = self.spool.first_segment_end
        if first_end is not None and first_end <= cursor:
            if self._snapshot_position < cursor:
                self._save_snapshot()
                return  # trimmed once the snapshot is on disk
            self.spool.delete_before(min(cursor, self._snapshot_position))
        elif self.reactor.seconds() - self._snapshot_saved_at > DEDUPE_SNAPSHOT_SECS and (
            self.dedupe.done or self.dedupe.writers or self.dedupe.events or self.filter_memory.changed(self.filters)
        ):
            self._save_snapshot()

    def _save_snapshot(self) -> defer.Deferred:
        if self._snapshot is not None:
            return self._snapshot
        position = self.routed_end
        # The spool from where the filters' memory saved (or restored) ends is kept for a
        # warm-up at the next start (logrouter.filters.memory).
        covered = self.filter_memory.covered(self.filters)
        if covered is not None:
            position = min(position, covered)
        entries, writers, events = self.dedupe.snapshot()
        memory = self.filter_memory.capture(self.filters)
        self._snapshot_saved_at = self.reactor.seconds()

        def save() -> None:
            dedupe.save_snapshot(self.dedupe_path, entries, position, writers, events)
            self.filter_memory.save(memory)

        d = threads.deferToThread(save)

        def saved(_: Any) -> None:
            self._snapshot = None
            self._snapshot_position = max(self._snapshot_position, position)
            self._trim()

        def failed(failure: Any) -> None:
            self._snapshot = None
            self.log.failure("saving the dedupe snapshot failed", failure)

        self._snapshot = d
        d.addCallbacks(saved, failed)
        return d

    # -- metrics ------------------------------------------------------------------------

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        """The router's own metric samples, its spool's, and how far it fed each sink.

        Sources, sinks, the error path and compaction yield their own (``logrouter.metrics``).
        """
        yield "logrouter_batches_in_total", "counter", {}, self.batches_in
        yield "logrouter_events_in_total", "counter", {}, self.events_in
        yield from self.spool.samples()
        yield "logrouter_spool_backlog_bytes", "gauge", {}, self.backlog_bytes()
        yield "logrouter_spool_failing", "gauge", {}, int(self.spool_failing)
        yield "logrouter_duplicates_total", "counter", {}, self.duplicates
        yield "logrouter_duplicate_events_total", "counter", {}, self.duplicate_events
        yield "logrouter_unstorable_batches_total", "counter", {}, self.unstorable_batches
        yield "logrouter_sources_paused", "gauge", {}, int(self.paused)
        yield "logrouter_sources_pauses_total", "counter", {}, self.pauses
        paused = self.paused_secs + (self.reactor.seconds() - self._paused_at if self.paused else 0)
        yield "logrouter_sources_paused_seconds_total", "counter", {}, round(paused, 3)
        yield from self.flow.samples(self.config)

    def feed_samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        """Per sink: how far behind the spool's end it is (bytes, seconds), whether it is fed
        live, its holds, its last commit (``logrouter.feeds``)."""
        now = self.reactor.seconds()
        for feed in self.feeds.values():
            yield from feed.samples(self.spool.end, now, self.store_times)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> defer.Deferred:
        """Recover the spool and every sink, then listen. A stop asked for meanwhile ends it
        early at a safe point (no source listens, no sink is fed before it recovered)."""
        self._starting = self._start()
        return self._starting

    @defer.inlineCallbacks
    def _start(self) -> Any:
        self.spool.open()
        self.routed_end = self.spool.end
        yield self._replay_ids()
        yield defer_to_thread(self.filter_memory.load)
        self.filter_memory.restore(self.filters)
        # The spool after what the restored memory covers is needed for the warm-up.
        self._snapshot_position = min([self._snapshot_position, *self.filter_memory.starts.values()])
        saved = yield defer_to_thread(self.retired.load)
        self.retired.start(saved, self.config, self.spool.end)
        self.routes = self._build_routes()
        yield self.retired.save(self.config)  # before a source stores anything under this graph
        for feed in self.feeds.values():
            if self.stop_requested:
                break
            cursor = yield feed.sink.start()
            feed.started = True
            feed.started_at(cursor)
            feed.delivered = max(cursor, self.spool.start)
            feed.sink.advance(feed.delivered)
            if cursor < self.spool.end:
                self.log.info(
                    "sink {name}: resuming from spool position {cursor} ({backlog} bytes to replay)",
                    name=feed.name,
                    cursor=cursor,
                    backlog=self.spool.end - cursor,
                )
        # Before any sink replays through them, the filters with a memory decide again what
        # their saved memory lacks (even when stopping: the stop's drain feeds the sinks).
        delivered = {name: feed.delivered for name, feed in self.feeds.items() if feed.started}
        span = self.filter_memory.warm_up_range(filter_reach(self.routes), delivered, self.spool.start)
        yield self.filter_memory.warm_up(span, self.spool.read, self._route)
        for feed in self.feeds.values():
            self._catch_up(feed)
        if self.stop_requested:
            return
        self._release_retired()
        self._log_retired()
        for source in self.sources.values():
            if self.stop_requested:
                return
            yield source.start()
        self._check_backpressure()
        if self.config.router["metrics_listen"] and not self.stop_requested:
            from twisted.internet import endpoints

            from logrouter import http_endpoint

            endpoint = endpoints.serverFromString(self.reactor, self.config.router["metrics_listen"])
            self.metrics_port = yield endpoint.listen(http_endpoint.site(http_endpoint.RouterPages(self)))
            address = self.metrics_port.getHost()
            self.log.info("metrics listening on {host} port {port}", host=address.host, port=address.port)

    # -- reload -----------------------------------------------------------------------

    def reconfigure(self, new: Config) -> defer.Deferred:
        """Apply a validated config to the running graph; fires with the ``ReloadPlan``.

        Sources and sinks whose type and options did not change keep running (a kept
        source keeps its socket and connections; a kept filter its state). Sources that
        go stop gracefully first, so every batch they stored is acked (a removed one's
        batches keep its route until the sinks it named passed them: ``logrouter.retired``);
        sinks that go are taken off the routes, get no more batches and commit what they
        were handed; then filters and routes are built again (and saved with the retired
        sources), new sinks recover their cursors and catch up, and new sources start.
        The spool is not trimmed while this runs (a sink being replaced has no feed for a
        moment, and its cursor must still hold the spool).
        A component that cannot start is left out of the running config, so the next
        reload tries it again. A stop waits for a reload under way. See ``logrouter.reload``.
        """
        if self.stop_requested or self.stopping:
            return defer.fail(RuntimeError("the router is stopping"))
        if self._starting is not None and not self._starting.called:
            return defer.fail(RuntimeError("the router is still starting"))
        if self._reloading:
            return defer.fail(RuntimeError("a reload is already under way"))
        self._reloading = True
        d = self._reconfigure(new)
        self._reload_done = d

        def done(result: Any) -> Any:
            self._reloading = False
            self._reload_done = None
            self._trim()
            return result

        return d.addBoth(done)

    @defer.inlineCallbacks
    def _reconfigure(self, new: Config) -> Any:
        from logrouter import reload as reloading

        old = self.config
        plan = reloading.plan(old, new)
        # 1. Sources that go stop taking input; their stored batches get their replies.
        leaving = [self.sources.pop(name) for name in plan.stop_sources if name in self.sources]
        for source in leaving:
            if source in self._not_reading:
                self._not_reading.discard(source)
                if not self.paused:  # held for a sink only: let it read what its senders sent while it drains
                    source.resume_reading()
        yield defer.DeferredList([defer.maybeDeferred(s.stop) for s in leaving], consumeErrors=True)
        # What a removed source stored keeps its route until every sink it named passed it.
        self.retired.retire(old, new, self.spool.end)
        # 2. Sinks that go get nothing more, finish a spool read under way, and commit.
        for name in plan.stop_sinks:
            feed = self.feeds.pop(name, None)
            sink = self.sinks.pop(name, None)
            if feed is not None:
                feed.live = False
                self._release_hold(feed)
                feed.started = False  # _catch_up no longer feeds it
                feed.epoch += 1
                if feed.reading is not None:
                    yield defer.DeferredList([feed.reading], consumeErrors=True)
            if sink is not None:
                try:
                    yield defer.maybeDeferred(sink.stop)
                except Exception:  # noqa: BLE001 - uncommitted work is replayed from its cursor next time
                    self.log.failure("reload: sink {name} did not stop cleanly", name=name)
        # 3. The new graph: filters (unchanged ones kept, with their state), new sinks
        #    and sources built, routes rebuilt.
        config = plan.effective
        self.config = config
        filters = {}
        for name, component in config.filters.items():
            previous = old.filters.get(name)
            if previous is not None and name in self.filters and reloading.same_component(previous, component):
                filters[name] = self.filters[name]
            else:
                filters[name] = component.cls(name, component.options, self.errors)
        self.filters = filters
        new_feeds = []
        for name in plan.start_sinks:
            component = config.sinks[name]
            sink = component.cls(name, component.options, self.errors, self.reactor)
            self.sinks[name] = sink
            new_feeds.append(self._new_feed(name, sink))
        for name in plan.start_sources:
            component = config.sources[name]
            self.sources[name] = build_source(component.cls, name, component.options, self.source_context)
            self.durability[name] = component.options.get("durability", "")
        self.routes = self._build_routes()
        # 4. New sinks recover their state and catch up from their cursors.
        for feed in new_feeds:
            try:
                cursor = yield feed.sink.start()
            except Exception:  # noqa: BLE001 - e.g. a lake path it cannot write
                self.log.failure("reload: sink {name} could not start; it is left out", name=feed.name)
                plan.failed.append(f"sinks.{feed.name}")
                self.sinks.pop(feed.name, None)
                del config.sinks[feed.name]
                plan.start_sinks.remove(feed.name)
                self.routes = self._build_routes()
                continue
            feed.started = True
            feed.started_at(cursor)
            feed.delivered = max(cursor, self.spool.start)
            feed.sink.advance(feed.delivered)
            self.feeds[feed.name] = feed
            self._catch_up(feed)
        yield self.retired.save(config)
        # 5. New sources start last, once everything downstream of them is in place.
        for name in list(plan.start_sources):
            source = self.sources[name]
            try:
                yield source.start()
            except Exception:  # noqa: BLE001 - e.g. a port in use
                self.log.failure("reload: source {name} could not start; it is left out", name=name)
                plan.failed.append(f"sources.{name}")
                self._not_reading.discard(self.sources.pop(name))
                del config.sources[name]
                plan.start_sources.remove(name)
                self.routes = self._build_routes()
                continue
        self.left_out = list(plan.failed)
        self._apply_reading()
        self._check_backpressure()
        self._release_retired()
        self._log_retired()
        plan.retired = self.retired.describe()
        return plan

    def _log_retired(self) -> None:
        for line in self.retired.describe():
            self.log.info("removed source {route}: its stored batches keep their route until these sinks pass them",
                          route=line)

    def _release_retired(self) -> None:
        """Drop the routes of removed sources every sink they named has passed."""
        cursors = {name: feed.sink.cursor for name, feed in self.feeds.items() if feed.started}
        released = self.retired.release(cursors)
        if released:
            self.log.info("removed sources {names}: every sink passed their stored batches; their routes are dropped",
                          names=", ".join(released))
            self.routes = self._build_routes()
            self.retired.save(self.config)

    def _new_feed(self, name: str, sink: Any) -> SinkFeed:
        feed = SinkFeed(name, sink)
        sink.state = SinkState(os.path.join(self.config.spool["path"], "sinks", f"{name}.json"))
        sink.on_progress = lambda feed=feed: self._progress(feed)
        sink.on_rewind = lambda feed=feed: self._rewind(feed)
        return feed

    def _drained(self) -> bool:
        """Every working sink has been handed everything the spool holds and is done with
        it, and no dead letter is on its way into the spool."""
        if self._storing or self.errors.pending:
            return False
        return all(
            not feed.started or feed.sink.failing or (feed.delivered >= self.routed_end and feed.sink.settled())
            for feed in self.feeds.values()
        )

    def _drain(self, timeout: float) -> defer.Deferred:
        """Fires once sinks behind the spool have caught up, or after ``timeout`` seconds
        (0 = no limit): what is still behind then stays in the spool for the next start."""
        if self._drained():
            return defer.succeed(None)
        behind = {
            f.name: self.routed_end - f.delivered for f in self.feeds.values() if f.started and f.delivered < self.routed_end
        }
        if behind:
            self.log.info("stopping: sinks catching up with the spool first: {behind} bytes behind", behind=behind)
        self._drain_waiter = defer.Deferred()
        for feed in self.feeds.values():
            self._catch_up(feed)
        if timeout:

            def give_up() -> None:
                if self._drain_waiter is not None:
                    self.log.warn(
                        "stopping: sinks did not catch up within {timeout:.0f}s; the rest stays in the spool "
                        "and is delivered at the next start",
                        timeout=timeout,
                    )
                    waiter, self._drain_waiter = self._drain_waiter, None
                    waiter.callback(None)

            call = self.reactor.callLater(timeout, give_up)
            self._drain_waiter.addBoth(lambda result: (call.active() and call.cancel(), result)[1])
        return self._drain_waiter

    def _check_drained(self) -> None:
        if self._drain_waiter is not None and self._drained():
            waiter, self._drain_waiter = self._drain_waiter, None
            waiter.callback(None)

    def _replay_ids(self) -> defer.Deferred:
        """``_load_dedupe`` in a thread, its progress logged (``logrouter.progress``)."""
        replay = ProgressLog(self.reactor, "spool replay at start (ids of stored batches)", lambda: self.replay_progress)

        def done(result: Any) -> Any:
            replay.finish("done" if self._snapshot_loaded else "stopped")
            return result

        return threads.deferToThread(self._load_dedupe).addBoth(done)

    def _load_dedupe(self) -> None:
        """The id window as it was: the snapshot, then the ids of the records after it."""
        entries, position = dedupe.load_snapshot(self.dedupe_path)
        self.dedupe.add_all(entries)
        self._snapshot_position = position
        position = begin = max(position, self.spool.start)
        end = self.spool.end
        self.replay_progress = (0, end - begin)
        while position < end and not self.stop_requested:
            records, next_position = self.spool.read(position, end, READ_CHUNK_BYTES)
            for record in records:
                try:
                    key = decode_key(record.payload)
                except Exception:
                    continue
                if key is not None:
                    self.dedupe.add(key, record.offset)
            if next_position <= position:
                break  # cannot happen with a sane spool; never loop on it
            position = next_position
            self.replay_progress = (position - begin, end - begin)
        self._snapshot_loaded = position >= end

    @defer.inlineCallbacks
    def stop(self) -> Any:
        """Drain sources, let the spool finish what it holds, then commit every sink.

        A stop during start first lets the start reach a safe point: sinks that have not
        recovered their state are neither fed nor stopped (a sink fed before it read its
        commit record would write again what it had already published).
        """
        self.stop_requested = True
        stop_began = self.reactor.seconds()
        if self._starting is not None:
            yield defer.DeferredList([self._starting], consumeErrors=True)
        if self._reload_done is not None:
            yield defer.DeferredList([self._reload_done], consumeErrors=True)
        if self._spool_retry_call is not None and self._spool_retry_call.active():
            self._spool_retry_call.cancel()
        if self.metrics_port is not None:
            yield self.metrics_port.stopListening()
        for feed in self.feeds.values():
            # No hold starts once stopping: sources read what their senders sent while they drain.
            self._release_hold(feed)
        yield defer.DeferredList([defer.maybeDeferred(s.stop) for s in self.sources.values()], consumeErrors=True)
        # The sources no longer wait for the batches of connections their clients closed
        # before the stop: the sinks' drain below must count them, so they are stored first.
        if self._storing:
            yield defer.DeferredList(list(self._storing), consumeErrors=True)
        # The spool stays open while the sinks catch up: dead letters their filters report
        # on the way are stored and delivered like any batch (sources no longer add any).
        limit = float(self.config.router["shutdown_timeout_secs"])
        if limit:
            # The sinks' share of the stop is what is left of it after the sources drained.
            spent = self.reactor.seconds() - stop_began
            yield self._drain(max(0.001, limit * DRAIN_SHARE - spent))
        else:
            yield self._drain(0)
        self.stopping = True
        for feed in self.feeds.values():
            feed.stop_watching()
        reads = [feed.reading for feed in self.feeds.values() if feed.reading is not None]
        if reads:
            yield defer.DeferredList(reads, consumeErrors=True)
        started = {name: feed.sink for name, feed in self.feeds.items() if feed.started}
        results = yield defer.DeferredList([defer.maybeDeferred(s.stop) for s in started.values()], consumeErrors=True)
        for (ok, result), name in zip(results, started):
            if not ok:
                self.log.failure("sink {name} failed to stop cleanly", result, name=name)
        self.errors.flush()  # what the sinks reported while stopping: stored if it can be
        try:
            yield self.spool.close()
        except Exception:
            # A disk that refuses the final fsync: what was acked was fsync'd before its ack.
            self.log.failure("closing the spool failed")
        if self._snapshot is not None:
            yield self._snapshot
        yield self.retired.idle()
        if self._snapshot_loaded:
            try:
                entries, writers, events = self.dedupe.snapshot()
                yield threads.deferToThread(dedupe.save_snapshot, self.dedupe_path, entries, self.routed_end, writers, events)
            except OSError as e:
                # A full disk must not fail the stop: the next start reads the window back
                # from the older snapshot and the spool after it (trimmed only past a snapshot).
                self.log.error("saving the dedupe snapshot at the stop failed ({error}); the next start "
                               "rebuilds the window from the spool", error=e)
        self.filter_memory.release(self.filters, self.min_cursor())  # the sinks' final commits
        memory = self.filter_memory.capture(self.filters)
        if memory is not None:
            try:
                yield threads.deferToThread(self.filter_memory.save, memory)
            except OSError as e:
                # As above: the next start warms the filters up from the older memory (the
                # spool is trimmed only past what a saved memory covers).
                self.log.error("saving the filters' memory at the stop failed ({error}); the next start "
                               "reads it back from the spool", error=e)

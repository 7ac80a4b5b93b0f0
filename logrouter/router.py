"""The router: builds the configured graph and moves spool records to sinks.

It owns the running graph (sources, filters, sinks, the routes between them), starts,
reloads and stops it, and puts together the parts that each do one job:

* ``logrouter.ingest``: a source's batch is deduplicated, appended to the spool and,
  once durable, acked; ``route_stored`` then pushes it down the routes
  (``logrouter.routes``) to every sink that is live.
* ``logrouter.feeds``: per sink, how far it was handed the spool and how it is fed now
  (a state machine: starting, behind, reading, live, held, removed). When a live sink's
  queue passes ``max_queue_bytes``, the sources that can push back and feed it stop
  reading until it drains (for at most its ``hold_sources_secs``): the senders wait, the
  sink stays live, and nothing is read back and decoded a second time.
* ``logrouter.catch_up``: a sink still full after that, that failed, or that just
  started is behind: it catches up by reading the spool from its position in a thread,
  through the same filters, until it reaches the live end, and then goes live again.
  Startup recovery is that same catch-up from the cursor each sink saved. So a slow sink
  costs spool space, never memory.
* ``logrouter.backpressure``: when the spool's backlog (from the slowest sink's cursor to
  the end) passes ``spool.max_bytes`` every source stops reading until it falls under
  the low-water mark.
* ``logrouter.snapshots``: the id window and the filters' memory are saved so the spool
  can be trimmed, and read back at start.

The clock (``reactor``) and the thread runner (``run_blocking``) are injected and handed
to every part and to the sources (``SourceContext``): tests run the router on a
``task.Clock`` with a synchronous runner.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

from twisted.internet import defer
from twisted.logger import Logger

from logrouter import dedupe, routes
from logrouter.backpressure import Backpressure
from logrouter.batch import Batch, Routing
from logrouter.catch_up import CatchUp
from logrouter.config.load import Config
from logrouter.errors import RoutedErrors
from logrouter.feeds import HELD, SinkFeed
from logrouter.filters.memory import FilterMemory
from logrouter.flow import Flow
from logrouter.ingest import Ingest
from logrouter.retired import RetiredSources
from logrouter.routes import filter_reach
from logrouter.serial import defer_to_thread
from logrouter.sinks.state import SinkState
from logrouter.snapshots import Snapshots
from logrouter.sources.base import Source, SourceContext, build_source
from logrouter.spool.ages import StoreTimes
from logrouter.spool.log import SpoolLog
from logrouter.spool.record import RecentBatches

DRAIN_SHARE = 0.8  # of shutdown_timeout_secs, for sinks to catch up before they commit


class Router:
    log = Logger(namespace="logrouter.router")

    def __init__(
        self, config: Config, reactor: Any, *, worker: int = 0, passed: Any = None, run_blocking: Any = defer_to_thread
    ) -> None:
        """``worker`` and ``passed``: see ``SourceContext`` (set in a worker process).
        ``reactor``: the clock (and, for the spool's writer and the metrics endpoint, the
        reactor). ``run_blocking(function, *args)``: a Deferred of a blocking call run off
        the reactor (spool reads, snapshots, the saved routes, the sources' blocking
        calls); tests pass a synchronous one."""
        self.config = config
        self.reactor = reactor
        self.run_blocking = run_blocking
        self.errors = RoutedErrors(self, reactor)
        self.errors.on_flushed = self._check_drained
        spool = config.spool
        self.spool = SpoolLog(reactor, spool["path"], spool["durability"], spool["segment_bytes"])
        self.dedupe = dedupe.DedupeWindow(spool["dedupe_window"], lambda source: dedupe.event_limits(self.config, source))
        self.filter_memory = FilterMemory(spool["path"])  # what dedupe filters remember, across restarts
        # Batches a sink behind has still to read, so that catching up need not decode them again.
        self.recent_batches = RecentBatches()
        self.flow = Flow()
        self.store_times = StoreTimes(reactor.seconds())
        self.sinks = {name: c.cls(name, c.options, self.errors, reactor) for name, c in config.sinks.items()}
        self.filters = {name: c.cls(name, c.options, self.errors) for name, c in config.filters.items()}
        self.source_context = SourceContext(
            router=self, reactor=reactor, errors=self.errors, state_dir=os.path.join(spool["path"], "sources"),
            run_in_thread=run_blocking, worker=worker, passed=passed,
        )
        # Sources are used only through the contract of logrouter.sources.base.Source.
        self.sources: dict[str, Source] = {
            name: build_source(c.cls, name, c.options, self.source_context) for name, c in config.sources.items()
        }
        # A source's own `durability` overrides the spool's for its batches.
        durability = {name: c.options.get("durability", "") for name, c in config.sources.items()}
        self.intake = Ingest(
            self.spool, self.dedupe, self.flow, reactor, durability,
            on_stored=self.route_stored, on_pressure=self.check_backpressure, on_settled=self._check_drained,
        )
        self.backpressure = Backpressure(reactor, spool["max_bytes"])
        self.snapshots = Snapshots(
            os.path.join(spool["path"], "dedupe.msgpack"), self.dedupe, self.filter_memory, self.spool, reactor, run_blocking
        )
        self.snapshots.on_saved = self._trim
        self.catch_up = CatchUp(self.spool, self.recent_batches, reactor, run_blocking, self)
        self.retired = RetiredSources(spool["path"], self.errors, run_blocking)
        self.routes = self.build_routes()
        self.feeds = {name: self._new_feed(name, sink) for name, sink in self.sinks.items()}
        self.routed_end = 0
        self.stopping = False
        self.stop_requested = False
        self._starting: defer.Deferred | None = None
        self._drain_waiter: defer.Deferred | None = None
        self.metrics_port: Any = None
        self._reloading = False
        self._reload_done: defer.Deferred | None = None
        self.left_out: list[str] = []  # components the last reload could not start (/health names them)

    @property
    def paused(self) -> bool:
        """The spool's backlog holds every source (``logrouter.backpressure``)."""
        return self.backpressure.paused

    @property
    def spool_failing(self) -> bool:
        """The disk refused the last spool write; the sources wait and try again."""
        return self.intake.failing

    def build_routes(self) -> dict[str, list[Any]]:
        """Per batch source (a source's name, ``<component>.errors`` for dead letters, or a
        removed source whose stored batches a sink has still to pass), the nodes its
        batches are pushed to."""
        built, self.errors.routed = routes.build(self.config, self.filters, self.sinks, self.errors, self.flow)
        return {**self.retired.routes(self.sinks, self.config), **built}

    # -- taking batches in, routing them live ---------------------------------------------

    def ingest(
        self,
        batch: Batch,
        key: bytes | None = None,
        *,
        writer: tuple[bytes, int] | None = None,
        events: list[dedupe.EventKey | None] | None = None,
    ) -> defer.Deferred:
        """Store ``batch``; the Deferred fires once it is durable, and routed
        (``logrouter.ingest``: ``key``, ``writer`` and ``events`` are its idempotency keys)."""
        return self.intake.ingest(batch, key, writer=writer, events=events)

    def last_event_number(self, source: str, writer: bytes) -> int | None:
        """The number of the last event stored for ``writer`` of ``source`` (survives restarts)."""
        return self.dedupe.last_event_number(source, writer)

    def route_stored(self, batch: Batch, position: int, end: int, size: int) -> None:
        """A batch is durable at ``position`` (to ``end``, ``size`` payload bytes): hand it
        to every live sink, through the filters on its routes. Sinks and the recent
        batches count it as ``batch.charge(size)``: what it holds in memory, where known."""
        size = batch.charge(size)
        self.routed_end = end
        self.store_times.stored(position, self.reactor.seconds(), self.min_cursor)
        if self.paused:
            self.check_backpressure()
        self.recent_batches.add(position, batch, size)
        if self.stopping:
            return  # the sinks are stopping or stopped: it is in the spool for the next start
        targets = frozenset(name for name, feed in self.feeds.items() if feed.live and not feed.sink.failing)
        if targets:
            # A held source still hands over what it had read before it stopped: what a
            # held sink takes of that is allowed besides its slack (SinkFeed.check_queue).
            held: list[tuple[SinkFeed, int]] = []
            if self.sources.get(batch.source) in self.backpressure.waiting:
                held = [(f, f.sink.queued_bytes) for f in map(self.feeds.__getitem__, targets) if f.state is HELD]
            try:
                self.route(batch, Routing(position, end, size, targets))
            except Exception:
                # Filter and sink nodes catch their own errors, so this is a bug: log it
                # loudly, and still ack, since the batch is durable in the spool.
                self.log.failure("routing the batch at spool position {position} failed", position=position)
            for feed, before in held:
                feed.held_inflow += max(feed.sink.queued_bytes - before, 0)
            may_hold = not self.stop_requested
            for name in targets:
                feed = self.feeds[name]
                feed.moved(end)
                feed.check_queue(may_hold)
        self._release_recent()

    def route(self, batch: Batch, routing: Routing) -> None:
        """Push one spool record's batch down its routes."""
        self.errors.pass_number += 1
        for node in self.routes.get(batch.source, ()):
            node.push(batch, routing)

    def _release_recent(self) -> None:
        """The recent batches every sink has been handed are no longer needed."""
        self.recent_batches.release(min((f.delivered for f in self.feeds.values()), default=self.routed_end))

    # -- feeding the sinks ------------------------------------------------------------------

    def _new_feed(self, name: str, sink: Any) -> SinkFeed:
        feed = SinkFeed(name, sink, self.reactor, on_hold_change=self._apply_reading, on_hold_expired=self.catch_up.step)
        sink.state = SinkState(os.path.join(self.config.spool["path"], "sinks", f"{name}.json"))
        sink.on_progress = lambda feed=feed: self._progress(feed)
        sink.on_rewind = lambda feed=feed: self._rewind(feed)
        return feed

    def _progress(self, feed: SinkFeed) -> None:
        """The sink moved (took records, committed, failed, retried)."""
        feed.note_commit(self.reactor.seconds())
        if feed.sink.failing and (feed.live or feed.reading is not None):
            feed.fall_behind()  # it dropped what it held; it asks to be fed from its cursor once it retries
        feed.check_drained()
        self.check_backpressure()
        if self.retired.entries:
            self._release_retired()
        self._trim()
        if not feed.live:
            self.catch_up.step(feed)
        self._check_drained()

    def _rewind(self, feed: SinkFeed) -> None:
        """The sink dropped what it held: feed it again from its cursor."""
        feed.rewind()
        self.catch_up.step(feed)

    # What catching up (logrouter.catch_up) asks of the router.

    def catch_up_limit(self, feed: SinkFeed) -> int | None:
        if self.stopping or not self.filter_memory.ready or self.feeds.get(feed.name) is not feed:
            return None  # a stop, a sink taken off, or the start's warm-up (logrouter.filters.memory) first
        return self.routed_end

    def filtered_sources(self, sink: str) -> frozenset[str]:
        return routes.filtered_sources(self.routes, sink)

    def read_done(self, feed: SinkFeed) -> None:
        self._release_recent()
        self._check_drained()

    # -- bounds -------------------------------------------------------------------------

    def min_cursor(self) -> int:
        return min((feed.sink.cursor for feed in self.feeds.values()), default=self.routed_end)

    def backlog_bytes(self) -> int:
        return self.spool.end - min(self.min_cursor(), self.spool.end)

    def check_backpressure(self) -> None:
        """Pause or resume the sources for the spool's backlog and state."""
        if self.backpressure.check(self.backlog_bytes(), self.spool.pending_bytes, self.intake.failing):
            self._apply_reading()

    def _apply_reading(self) -> None:
        held = [name for name, feed in self.feeds.items() if feed.state is HELD]
        self.backpressure.apply(self.sources, held, self.routes)

    def _trim(self) -> None:
        """Delete spool segments every sink is done with and the snapshots cover."""
        if self._reloading:
            return  # a sink being replaced has no feed for a moment; its cursor still counts
        self.snapshots.trim(self.filters, self.min_cursor(), self.routed_end)

    # -- metrics ------------------------------------------------------------------------

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        """The router's own metric samples, its spool's, and how far it fed each sink.

        Sources, sinks, the error path and compaction yield their own (``logrouter.metrics``).
        """
        intake = self.intake
        yield "logrouter_batches_in_total", "counter", {}, intake.batches_in
        yield "logrouter_events_in_total", "counter", {}, intake.events_in
        yield from self.spool.samples()
        yield "logrouter_spool_backlog_bytes", "gauge", {}, self.backlog_bytes()
        yield "logrouter_spool_failing", "gauge", {}, int(intake.failing)
        yield "logrouter_duplicates_total", "counter", {}, intake.duplicates
        yield "logrouter_duplicate_events_total", "counter", {}, intake.duplicate_events
        yield "logrouter_unstorable_batches_total", "counter", {}, intake.unstorable_batches
        yield from self.backpressure.samples()
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
        yield self.snapshots.replay_ids(lambda: self.stop_requested)
        yield self.snapshots.load_memory(self.filters)
        saved = yield self.run_blocking(self.retired.load)
        self.retired.start(saved, self.config, self.spool.end)
        self.routes = self.build_routes()
        yield self.retired.save(self.config)  # before a source stores anything under this graph
        for feed in self.feeds.values():
            if self.stop_requested:
                break
            cursor = yield feed.sink.start()
            feed.started_at(cursor)
            feed.start(max(cursor, self.spool.start))
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
        yield self.filter_memory.warm_up(span, self.spool.read, self.route, self.run_blocking)
        for feed in self.feeds.values():
            self.catch_up.step(feed)
        if self.stop_requested:
            return
        self._release_retired()
        self._log_retired()
        for source in self.sources.values():
            if self.stop_requested:
                return
            yield source.start()
        self.check_backpressure()
        if self.config.router["metrics_listen"] and not self.stop_requested:
            from logrouter import http_endpoint, tls

            endpoint = tls.listening_endpoint(self.reactor, self.config.router["metrics_listen"])
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
            if self.backpressure.forget(source) and not self.paused:
                source.resume_reading()  # held for a sink only: let it read what its senders sent while it drains
        yield defer.DeferredList([defer.maybeDeferred(s.stop) for s in leaving], consumeErrors=True)
        # What a removed source stored keeps its route until every sink it named passed it.
        self.retired.retire(old, new, self.spool.end)
        # 2. Sinks that go get nothing more, finish a spool read under way, and commit.
        for name in plan.stop_sinks:
            feed = self.feeds.pop(name, None)
            sink = self.sinks.pop(name, None)
            if feed is not None:
                feed.remove()
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
            self.intake.durability[name] = component.options.get("durability", "")
        self.routes = self.build_routes()
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
                self.routes = self.build_routes()
                continue
            feed.started_at(cursor)
            feed.start(max(cursor, self.spool.start))
            self.feeds[feed.name] = feed
            self.catch_up.step(feed)
        yield self.retired.save(config)
        # 5. New sources start last, once everything downstream of them is in place.
        for name in list(plan.start_sources):
            source = self.sources[name]
            try:
                yield source.start()
            except Exception:  # noqa: BLE001 - e.g. a port in use
                self.log.failure("reload: source {name} could not start; it is left out", name=name)
                plan.failed.append(f"sources.{name}")
                self.backpressure.forget(self.sources.pop(name))
                del config.sources[name]
                plan.start_sources.remove(name)
                self.routes = self.build_routes()
                continue
        self.left_out = list(plan.failed)
        self._apply_reading()
        self.check_backpressure()
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
            self.routes = self.build_routes()
            self.retired.save(self.config)

    # -- stop ---------------------------------------------------------------------------

    def _drained(self) -> bool:
        """Every working sink has been handed everything the spool holds and is done with
        it, and no dead letter is on its way into the spool."""
        if self.intake.busy or self.errors.pending:
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
            self.catch_up.step(feed)
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
        self.intake.stop()
        if self.metrics_port is not None:
            yield self.metrics_port.stopListening()
        for feed in self.feeds.values():
            if feed.state is HELD:
                feed.release()  # no hold starts once stopping: sources read what their senders sent while they drain
        yield defer.DeferredList([defer.maybeDeferred(s.stop) for s in self.sources.values()], consumeErrors=True)
        # The sources no longer wait for the batches of connections their clients closed
        # before the stop: the sinks' drain below must count them, so they are stored first.
        if self.intake.busy:
            yield self.intake.idle()
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
        yield self.retired.idle()
        yield self.snapshots.save_at_stop(self.filters, self.routed_end, self.min_cursor())

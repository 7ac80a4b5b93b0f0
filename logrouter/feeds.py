"""A sink's feed: how far the router handed it the spool, in which way it is fed now, when
it last committed, how its catch-up from the spool goes, and the samples that say so.

How a sink is fed is one small state machine (``FeedState``), moved only by the
transitions below; a transition asked for in a state it does not start from is a bug and
raises ``FeedStateError``::

    STARTING ──start──► BEHIND ──begin_read──► READING ──end_read──► BEHIND
                          │  ▲                                         (a read applied, or discarded)
                   go_live  └──── overflow, fall_behind ────┐
                          ▼                                  │
                         LIVE ──hold──► HELD ──release──► LIVE
                          └────────────────┴─────────────────┘ (both: overflow, fall_behind → BEHIND)
    any state ──remove──► REMOVED

* STARTING: the sink recovers its state (its ``start`` runs): it is neither fed nor stopped
  (fed before it read its commit record, it would write again what it had published).
* BEHIND: it is fed by reading the spool from ``delivered`` (``logrouter.catch_up``), once
  its queue is under the low-water mark; it has no read under way.
* READING: a read of the spool for it runs in a thread; ``reading`` is its Deferred.
* LIVE: it is handed every batch as it is stored (``logrouter.router``).
* HELD: live, its queue past ``max_queue_bytes``: the sources that can push back and feed
  it do not read until it drains, for at most its ``hold_sources_secs`` (then it overflows).
* REMOVED: a reload took it off the graph; it is fed nothing more.

``fall_behind`` (the sink failed and dropped what it held, or rewound to its cursor) sends
LIVE and HELD back to BEHIND; in READING the read under way is discarded when it returns
(``epoch``); ``overflow`` (its queue's bound, or a hold that lasted too long) counts too.
The hold has a timer on the injected clock; entering or leaving HELD calls
``on_hold_change`` (the router tells the sources whether to read).

The feed also keeps what the metrics show: lag in bytes (spool end less the sink's
committed cursor) and in seconds (how long ago the oldest event it has not committed was
stored, from ``logrouter.spool.ages``), live or catching up, holds of the sources, and the
time of its last commit (its cursor moved: files published, acks received).
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Iterator

from twisted.logger import Logger

from logrouter.progress import ProgressLog
from logrouter.spool.ages import StoreTimes

Sample = tuple[str, str, dict[str, str], float]

LOW_WATER = 0.8  # resume sources / feed a sink again below this share of its bound
# A sink holding the sources still takes what sources that cannot push back send up to
# this share of its bound; past it, it reads from the spool. What the held sources had
# read before they stopped is taken besides (bounded: they read nothing more).
HOLD_SLACK = 1.5


class FeedState(enum.Enum):
    STARTING = "starting"
    BEHIND = "behind"
    READING = "reading"
    LIVE = "live"
    HELD = "held"
    REMOVED = "removed"


STARTING, BEHIND, READING, LIVE, HELD, REMOVED = FeedState


class FeedStateError(RuntimeError):
    """A transition asked for in a state it does not start from (a bug in the router)."""


class SinkFeed:
    """How far one sink has been handed the spool, and in which way it is fed (``state``)."""

    log = Logger(namespace="logrouter.router")

    def __init__(
        self,
        name: str,
        sink: Any,
        clock: Any,
        on_hold_change: Callable[[], None] = lambda: None,
        on_hold_expired: Callable[["SinkFeed"], None] = lambda feed: None,
    ) -> None:
        """``on_hold_change()``: the feed entered or left HELD. ``on_hold_expired(feed)``:
        its hold lasted ``hold_sources_secs`` and it overflowed (it is BEHIND now)."""
        self.name = name
        self.sink = sink
        self.clock = clock
        self.on_hold_change = on_hold_change
        self.on_hold_expired = on_hold_expired
        self.state = STARTING
        self.targets = frozenset((name,))
        self.delivered = 0  # the spool position up to which it was handed records
        self.reading: Any = None  # the Deferred of its spool read under way (READING, or REMOVED during one)
        self.epoch = 0  # bumped when it falls behind, so a read started before is not applied
        self.held_since: float | None = None  # when the hold began (HELD)
        self.hold_call: Any = None
        self.holds = 0
        self.held_secs = 0.0
        self.held_inflow = 0  # spool bytes routed to it from sources not reading, this hold
        self.overflows = 0  # times its queue's bound sent it to read from the spool
        self.committed_cursor = 0  # the sink's cursor when last seen moving
        self.committed_at = 0.0  # when that was (0: not since this process started)
        self.progress: ProgressLog | None = None  # of a catch-up from the spool under way

    @property
    def started(self) -> bool:
        """The sink recovered its state and is still on the graph: it may be fed and stopped."""
        return self.state in (BEHIND, READING, LIVE, HELD)

    @property
    def live(self) -> bool:
        """It is handed batches as they are stored (LIVE or HELD)."""
        return self.state in (LIVE, HELD)

    def __repr__(self) -> str:
        return f"SinkFeed({self.name!r}, {self.state.value}, delivered={self.delivered})"

    # -- transitions -----------------------------------------------------------------------

    def _move(self, transition: str, allowed: tuple[FeedState, ...], to: FeedState) -> None:
        if self.state not in allowed:
            raise FeedStateError(f"sink {self.name}: {transition} from {self.state.value}")
        was, self.state = self.state, to
        if was is HELD and to is not HELD:
            self._end_hold()

    def start(self, position: int) -> None:
        """STARTING → BEHIND: the sink recovered; it is fed from ``position``."""
        self._move("start", (STARTING,), BEHIND)
        self._place(position)

    def begin_read(self, reading: Any) -> int:
        """BEHIND → READING: ``reading`` (a Deferred) reads the spool for it; the epoch the
        read belongs to (its records are applied only while it is still current)."""
        self._move("begin_read", (BEHIND,), READING)
        self.reading = reading
        return self.epoch

    def end_read(self) -> None:
        """READING → BEHIND: its read returned (applied, or discarded). In REMOVED it stays."""
        if self.state is REMOVED:
            self.reading = None
            return
        self._move("end_read", (READING,), BEHIND)
        self.reading = None

    def go_live(self) -> None:
        """BEHIND → LIVE: it has been handed everything routed so far."""
        self._move("go_live", (BEHIND,), LIVE)
        self.caught_up()

    def hold(self, secs: float) -> None:
        """LIVE → HELD, for at most ``secs`` (then it overflows)."""
        self._move("hold", (LIVE,), HELD)
        self.held_since = self.clock.seconds()
        self.holds += 1
        self.hold_call = self.clock.callLater(secs, self._hold_expired)
        self.on_hold_change()

    def release(self) -> None:
        """HELD → LIVE: it drained, or the router stops (sources read while they drain)."""
        self._move("release", (HELD,), LIVE)

    def overflow(self) -> None:
        """LIVE or HELD → BEHIND: over its memory bound, or held too long; it reads the rest
        from the spool."""
        self._move("overflow", (LIVE, HELD), BEHIND)
        self.overflows += 1

    def fall_behind(self) -> None:
        """The sink dropped what it held (it failed, or rewound): LIVE or HELD → BEHIND. In
        READING the read under way is discarded when it returns; other states stay."""
        self.epoch += 1
        if self.state in (LIVE, HELD):
            self._move("fall_behind", (LIVE, HELD), BEHIND)

    def remove(self) -> None:
        """Any state → REMOVED: a reload took the sink off the graph."""
        self.epoch += 1
        self._move("remove", tuple(FeedState), REMOVED)

    def _end_hold(self) -> None:
        self.held_secs += self.clock.seconds() - self.held_since  # type: ignore[operator]
        self.held_since = None
        self.held_inflow = 0
        if self.hold_call is not None and self.hold_call.active():
            self.hold_call.cancel()
        self.hold_call = None
        self.on_hold_change()

    def _hold_expired(self) -> None:
        self.hold_call = None
        if self.state is not HELD:
            return
        self.log.info(
            "sink {name}: its queue stayed over max_queue_bytes for {secs:.1f}s (hold_sources_secs): "
            "the sources read again and it catches up from the spool",
            name=self.name,
            secs=self.clock.seconds() - self.held_since,
        )
        self.overflow()
        self.on_hold_expired(self)

    # -- what moves it ---------------------------------------------------------------------

    def moved(self, end: int) -> None:
        """It was handed the spool up to ``end``."""
        self._place(end)
        if self.sink.cursor > self.committed_cursor:  # a sink that commits as it is handed records
            self.note_commit(self.clock.seconds())

    def rewind(self) -> None:
        """The sink dropped what it held: it is fed again from its cursor."""
        self.fall_behind()
        self.stop_watching()  # it starts again from its cursor
        self._place(self.sink.cursor)

    def _place(self, position: int) -> None:
        self.delivered = position
        self.sink.advance(position)

    def check_queue(self, may_hold: bool) -> None:
        """After a live hand-off: a queue past ``max_queue_bytes`` holds the sources (LIVE →
        HELD, when ``hold_sources_secs`` and ``may_hold``) or sends the feed to the spool.

        Held, the sources that can push back and feed it stop reading until it drains
        under the low-water mark: a sink slower than its senders then sets their pace (TCP
        and the protocols' windows push back) and stays live. Left to read from the spool
        instead, it would decode every record a second time, and in one process that
        second decode takes the very CPU it is short of. Held, it still takes what sources
        that cannot stop reading send, up to ``HOLD_SLACK`` of its bound, besides what the
        held sources had read (``held_inflow``).
        """
        sink = self.sink
        bound = sink.options["max_queue_bytes"]
        if self.state is LIVE:
            if sink.queued_bytes <= bound:
                return
            secs = sink.options.get("hold_sources_secs", 0)
            if secs and may_hold:
                self.hold(secs)
                return
        elif self.state is HELD:
            if sink.queued_bytes <= bound * HOLD_SLACK + self.held_inflow:
                return  # in flight when the sources stopped, or a little from those that cannot stop reading
        else:
            return
        self.overflow()

    def check_drained(self) -> None:
        """HELD → LIVE once its queue is under the low-water mark."""
        if self.state is HELD and self.sink.queued_bytes < self.sink.options["max_queue_bytes"] * LOW_WATER:
            self.release()

    # -- commits -------------------------------------------------------------------------

    def started_at(self, cursor: int) -> None:
        """The sink recovered and says it had committed up to ``cursor`` (not a commit now)."""
        self.committed_cursor = cursor

    def note_commit(self, now: float) -> None:
        """The sink's cursor moved past the last one seen: it committed at ``now``."""
        cursor = self.sink.cursor
        if cursor > self.committed_cursor:
            self.committed_cursor = cursor
            self.committed_at = now

    # -- catching up from the spool ------------------------------------------------------

    def watch_catch_up(self, clock: Any, end: Callable[[], int | None]) -> None:
        """A catch-up read begins: log its progress (from here to ``end()``, the spool
        position that would make it live; None once the router gave up on it) until
        ``caught_up()``. A catch-up already watched goes on being watched."""
        if self.progress is not None and self.progress.active:
            return
        base = self.delivered

        def read() -> tuple[int, int] | None:
            limit = end()
            return None if limit is None else (max(self.delivered - base, 0), max(limit - base, 0))

        self.progress = ProgressLog(clock, f"sink {self.name} catching up from the spool", read)

    def caught_up(self) -> None:
        if self.progress is not None:
            self.progress.finish("caught up, live again")
            self.progress = None

    def stop_watching(self) -> None:
        """The catch-up ends without reaching the end (a rewind, a stop): no closing line."""
        if self.progress is not None:
            self.progress.cancel()
            self.progress = None

    # -- metrics -------------------------------------------------------------------------

    def samples(self, spool_end: int, now: float, times: StoreTimes) -> Iterator[Sample]:
        """How far behind the spool's end the sink's cursor is, in bytes and in seconds;
        whether it is fed live; its holds of the sources; when it last committed."""
        labels = {"sink": self.name, "type": self.sink.TYPE}
        cursor = self.sink.cursor
        yield "logrouter_sink_lag_bytes", "gauge", labels, max(spool_end - cursor, 0)
        lag_secs = now - times.stored_at(cursor) if cursor < spool_end else 0.0
        yield "logrouter_sink_lag_seconds", "gauge", labels, round(max(lag_secs, 0.0), 3)
        yield "logrouter_sink_live", "gauge", labels, int(self.live)
        held = self.held_secs + (now - self.held_since if self.held_since is not None else 0)
        yield "logrouter_sink_holding_sources", "gauge", labels, int(self.held_since is not None)
        yield "logrouter_sink_holds_total", "counter", labels, self.holds
        yield "logrouter_sink_held_seconds_total", "counter", labels, round(held, 3)
        yield "logrouter_sink_overflows_total", "counter", labels, self.overflows
        yield "logrouter_sink_last_commit_timestamp_seconds", "gauge", labels, round(self.committed_at, 3)

"""A sink's feed: how far the router handed it the spool, whether it takes live batches,
when it last committed, how its catch-up from the spool goes, and the samples that say so.

The router (``logrouter.router``) moves the numbers; this module keeps them together and
turns them into the feed's metric samples: lag in bytes (spool end less the sink's
committed cursor) and in seconds (how long ago the oldest event it has not committed was
stored, from ``logrouter.spool.ages``), live or catching up, holds of the sources, and the
time of its last commit (its cursor moved: files published, acks received).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from logrouter.progress import ProgressLog
from logrouter.spool.ages import StoreTimes

Sample = tuple[str, str, dict[str, str], float]


class SinkFeed:
    """How far one sink has been handed the spool, and whether it takes live batches."""

    def __init__(self, name: str, sink: Any) -> None:
        self.name = name
        self.sink = sink
        self.targets = frozenset((name,))
        self.delivered = 0
        self.live = False
        self.started = False  # the sink recovered its state: only then may it be fed or stopped
        self.reading: Any = None  # the Deferred of a spool read under way
        self.epoch = 0  # bumped on rewind, so a read started before it is not applied
        self.held_since: float | None = None  # its full queue holds the sources (Router._sink_full)
        self.hold_call: Any = None
        self.holds = 0
        self.held_secs = 0.0
        self.held_inflow = 0  # spool bytes routed to it from sources not reading, this hold
        self.overflows = 0  # times its queue's bound sent it to read from the spool
        self.committed_cursor = 0  # the sink's cursor when last seen moving
        self.committed_at = 0.0  # when that was (0: not since this process started)
        self.progress: ProgressLog | None = None  # of a catch-up from the spool under way

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

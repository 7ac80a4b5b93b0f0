"""Which sources read: none while the spool is over its bound, none that push back and
feed a sink holding them.

Every source stops reading while the spool's backlog (from the slowest sink's cursor to
the end) is over ``spool.max_bytes``, while more than ``MAX_UNWRITTEN_BYTES`` wait for the
spool's writer, or while the disk refuses writes (``logrouter.ingest`` retries); they read
again under the low-water mark. A source whose ``PUSHES_BACK`` is true also stops while a
sink it feeds holds it (a full sink's queue drains: ``logrouter.feeds``). A source is told
once, whatever the number of reasons: ``waiting`` holds those told to pause.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from twisted.logger import Logger

from logrouter.feeds import LOW_WATER

MAX_UNWRITTEN_BYTES = 64 << 20  # appended but not yet written by the spool's worker

Sample = tuple[str, str, dict[str, str], float]


class Backpressure:
    """The spool's bound on the sources, and what each source was told."""

    log = Logger(namespace="logrouter.router")

    def __init__(self, clock: Any, max_spool_bytes: int) -> None:
        self.clock = clock
        self.max_spool_bytes = max_spool_bytes
        self.paused = False  # the spool holds every source
        self.pauses = 0
        self.paused_secs = 0.0
        self._paused_at = 0.0
        self.waiting: set[Any] = set()  # sources told to pause (the spool, or a full sink)

    def check(self, backlog: int, unwritten: int, failing: bool) -> bool:
        """Pause or resume the sources for the spool's sake; whether that changed."""
        if not self.paused and (backlog > self.max_spool_bytes or unwritten > MAX_UNWRITTEN_BYTES or failing):
            self.paused = True
            self.pauses += 1
            self._paused_at = self.clock.seconds()
            self.log.warn(
                "spool backlog {backlog} bytes (limit spool.max_bytes = {limit}), {unwritten} bytes "
                "waiting for the disk{failing}: sources paused",
                backlog=backlog,
                limit=self.max_spool_bytes,
                unwritten=unwritten,
                failing=", the disk refused the last write" if failing else "",
            )
            return True
        if (
            self.paused
            and not failing
            and backlog < self.max_spool_bytes * LOW_WATER
            and unwritten < MAX_UNWRITTEN_BYTES * LOW_WATER
        ):
            self.paused = False
            self.paused_secs += self.clock.seconds() - self._paused_at
            self.log.info("spool backlog {backlog} bytes: sources resumed", backlog=backlog)
            return True
        return False

    def apply(self, sources: dict[str, Any], held: Iterable[str], routes: dict[str, list[Any]]) -> None:
        """Tell each source whether to read: none while the spool holds them, none that can
        push back and feeds a sink in ``held`` (names) while that holds them."""
        held = frozenset(held)
        for name, source in sources.items():
            wait = self.paused or (
                bool(held)
                and getattr(source, "PUSHES_BACK", False)
                and any(not held.isdisjoint(node.reach) for node in routes.get(name, ()))
            )
            if wait and source not in self.waiting:
                self.waiting.add(source)
                source.pause_reading()
            elif not wait and source in self.waiting:
                self.waiting.discard(source)
                source.resume_reading()

    def forget(self, source: Any) -> bool:
        """``source`` leaves the graph: whether it had been told to pause."""
        if source in self.waiting:
            self.waiting.discard(source)
            return True
        return False

    def samples(self) -> Iterator[Sample]:
        yield "logrouter_sources_paused", "gauge", {}, int(self.paused)
        yield "logrouter_sources_pauses_total", "counter", {}, self.pauses
        paused = self.paused_secs + (self.clock.seconds() - self._paused_at if self.paused else 0)
        yield "logrouter_sources_paused_seconds_total", "counter", {}, round(paused, 3)

"""The cyclic garbage collector, tuned for a process that holds many events in memory.

Every event in flight (decoded, in the spool's recent batches, queued for a sink, in a
row group being built) holds container objects the cycle collector tracks: a tuple, and
for nested records (Filebeat's ``host``, ``log``, ``agent``, …) a dict or list per level.
A generation-0 collection walks every tracked object allocated since the last one that
is still alive, and with objects allocated on the reactor and freed in bulk by a sink's
thread much later, nearly every event is still alive when it is walked: at CPython's
default (every 700 allocations) that was a third of the daemon's CPU, and still ~10% of
it with nested Beats events at 50,000 (measured: 114 collections of ~12 ms in 15 s).

Events are freed by reference counting, never by the collector, and the daemon makes
little cyclic garbage (~60 objects a second under load). So collections run on a clock
instead of on allocations: every ``COLLECT_SECS`` the young and middle generations, every
``FULL_EVERY``-th time all of them. A collection then walks only what is in flight at
that moment, not everything that passed through. The allocation threshold stays, high,
as a backstop against a burst of cyclic garbage. What start-up built (modules, config,
Twisted) is frozen out of every collection. (Written for the three generations of
CPython 3.11–3.13; 3.14's incremental collector reads the thresholds differently.)
"""

from __future__ import annotations

import gc
from typing import Any, Callable

from twisted.internet import task

THRESHOLDS = (1_000_000, 20, 100)
COLLECT_SECS = 10.0
FULL_EVERY = 30  # a full collection every five minutes


class PeriodicCollector:
    """Runs ``collect(generation)`` every ``COLLECT_SECS`` on ``clock``."""

    def __init__(self, clock: Any, collect: Callable[[int], Any] = gc.collect) -> None:
        self.runs = 0
        self._collect = collect
        self._call = task.LoopingCall(self._run)
        self._call.clock = clock

    def start(self) -> "PeriodicCollector":
        self._call.start(COLLECT_SECS, now=False)
        return self

    def stop(self) -> None:
        if self._call.running:
            self._call.stop()

    def _run(self) -> None:
        self.runs += 1
        self._collect(2 if self.runs % FULL_EVERY == 0 else 1)


def tune(clock: Any) -> PeriodicCollector:
    """Set the daemon's collector policy; the returned collector runs until stopped."""
    gc.collect()
    gc.freeze()  # what start-up built lives as long as the process: never scan it again
    gc.set_threshold(*THRESHOLDS)
    return PeriodicCollector(clock).start()

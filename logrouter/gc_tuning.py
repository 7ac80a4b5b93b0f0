"""The cyclic garbage collector, tuned for a process that holds many events in memory.

Every queued event is a ``(time, record)`` tuple holding a dict, which CPython keeps
tracked for the cycle collector; with a sink's queue and the spool's recent batches that
is millions of long-lived objects, and each full collection walks all of them (measured:
a third of the daemon's CPU under load, ~190 ms per full pass). Events are freed by
reference counting, not by the collector, so collecting far less often costs little
memory: the first generation runs after 50,000 allocations instead of 700, and what
was loaded at start-up (modules, config, Twisted) is frozen out of every collection.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 100)


def tune() -> None:
    gc.collect()
    gc.freeze()  # what start-up built lives as long as the process: never scan it again
    gc.set_threshold(*THRESHOLDS)

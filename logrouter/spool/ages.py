"""When each stretch of the spool was stored: how old the oldest event a sink has not
committed is (``logrouter_sink_lag_seconds``).

The spool's records carry no time of their own, and a per-record table would cost
memory per batch, so the router notes, at most once per ``BUCKET_SECS``, the spool
position where the records stored from then on begin. A position's time is that of the
stretch it falls in: early by less than ``BUCKET_SECS``, so an age is at most that much
too old, never too young. Records stored before this process started count as stored
when it started (their real time is unknown; their age shows at least that).
Stretches every sink has passed are forgotten as new ones begin, so the table is as
long as the oldest uncommitted event is old, in seconds, at most.
"""

from __future__ import annotations

import bisect
from typing import Callable

BUCKET_SECS = 1.0


class StoreTimes:
    """Spool position -> when it was stored, coarsely (see the module's docstring)."""

    def __init__(self, started: float, bucket_secs: float = BUCKET_SECS) -> None:
        self.bucket_secs = bucket_secs
        self._starts = [0]  # spool position where each stretch begins, ascending
        self._times = [started]  # when the first record of each stretch was stored
        self._fresh = True  # nothing stored by this process yet: its first record starts a stretch

    def stored(self, position: int, now: float, passed: Callable[[], int]) -> None:
        """A record at ``position`` was stored at ``now``; ``passed()`` is the spool position
        every sink has committed (asked only when a stretch begins)."""
        if now - self._times[-1] < self.bucket_secs and not self._fresh:
            return
        self._fresh = False
        if position > self._starts[-1]:
            self._starts.append(position)
            self._times.append(now)
        else:  # nothing was stored in the last stretch: it begins now
            self._times[-1] = now
        self.forget_before(passed())

    def stored_at(self, position: int) -> float:
        """When the record at ``position`` was stored (the start of its stretch)."""
        index = bisect.bisect_right(self._starts, position) - 1
        return self._times[max(index, 0)]

    def forget_before(self, position: int) -> None:
        """Every sink is past ``position``: the stretches that end before it go."""
        index = bisect.bisect_right(self._starts, position) - 1
        if index > 0:
            del self._starts[:index]
            del self._times[:index]

    def __len__(self) -> int:
        return len(self._starts)

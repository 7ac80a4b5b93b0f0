"""Counting and logging dropped input per reason, without flooding the log.

A message source that drops bad messages one by one (ZeroMQ keeps message boundaries, so
one bad message costs only itself) must say so: every drop is counted under its reason,
and logged, but a sender repeating the same mistake thousands of times a second must not
become thousands of log lines. ``DroppedMessages.drop(reason, detail)`` logs the first
drop of a reason at once, then at most one line per ``interval_secs`` for that reason,
saying how many were dropped since the last line and the latest detail.
"""

from __future__ import annotations

from typing import Any, Iterator

from twisted.logger import Logger

from logrouter.sources.base import Sample


class DroppedMessages:
    log = Logger(namespace="logrouter.source")

    def __init__(self, clock: Any, what: str, metric: str, labels: dict[str, str], interval_secs: float = 10.0) -> None:
        self.clock = clock
        self.what = what  # "logjam source main", the subject of the log lines
        self.metric = metric
        self.labels = labels
        self.interval_secs = interval_secs
        self.counts: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def drop(self, reason: str, detail: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        now = self.clock.seconds()
        last = self._logged_at.get(reason)
        if last is not None and now - last < self.interval_secs:
            self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
            return
        since = self._unlogged.pop(reason, 0)
        self._logged_at[reason] = now
        self.log.warn(
            "{what}: dropped a message ({reason}): {detail}{more}",
            what=self.what,
            reason=reason,
            detail=detail,
            more=f" (and {since} more of this kind since the last line)" if since else "",
        )

    def total(self) -> int:
        return sum(self.counts.values())

    def samples(self) -> Iterator[Sample]:
        for reason, count in self.counts.items():
            yield self.metric, "counter", {**self.labels, "reason": reason}, count

"""The ``throttle`` filter: at most ``rate`` events per second per key (a token bucket).

Each key (the values of the ``key`` fields; one key for all without them, and per tag
with ``per_tag``) has a bucket of ``burst`` tokens refilled at ``rate`` per second on the
injected clock (``IReactorTime``; tests drive it with ``task.Clock``). An event takes a
token; an event that finds none is over the limit: dropped and counted (``over =
"drop"``) or handed to the error path with the reason (``over = "error"``). Batches whose
tag does not match ``tag`` pass untouched. A batch arrives at one instant, so buckets are
refilled once per batch and an unkeyed batch costs one slice.

Memory is bounded: past ``max_keys`` buckets, the full ones (idle long enough to be as
good as new) are forgotten, then the oldest half if that is not enough.

The clock is wall time, not event time: a sink replaying the spool after a failure runs
its events through the buckets again, at the replay's pace.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

from logrouter import paths, registry
from logrouter.batch import Batch, Event
from logrouter.config.options import Option, one_of, positive
from logrouter.errors import ErrorPath
from logrouter.filters.common import key_function, narrowed, on_tables
from logrouter.filters.match import check_tag_patterns, compile_tag_pattern


def _check_keys(value: list[Any]) -> None:
    if value:
        paths.check_list(value)


def _check_burst(value: int) -> None:
    if value < 0:
        raise ValueError(f"must be 0 (= rate, at least 1) or more, got {value!r}")


def _default_clock() -> Any:
    from twisted.internet import reactor

    return reactor


@registry.filter("throttle")
class ThrottleFilter:
    """Lets through at most ``rate`` events per second per key, with bursts of ``burst``."""

    OPTIONS = {
        "rate": Option((int, float), doc="events per second per key", check=positive),
        "burst": Option(int, 0, "events a key may send at once after a quiet spell (0 = `rate`, at least 1)", _check_burst),
        "key": Option(list, [], "fields whose values make the key (`[\"host\"]`); empty = one bucket for all events", _check_keys),
        "per_tag": Option(bool, False, "a bucket per tag (and key)"),
        "tag": Option((str, list), None, "throttle only batches whose tag matches these patterns (as `match`); others pass", check_tag_patterns),
        "over": Option(str, "drop", "events over the limit: `drop` (counted) or `error` (to the error path, with the reason)", one_of("drop", "error")),
        "max_keys": Option(int, 10_000, "buckets kept at most; bounds memory", positive),
    }

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath, clock: Any = None) -> None:
        self.name = name
        self.errors = errors
        self.clock = clock
        self.rate = float(options["rate"])
        positive(self.rate)
        self.burst = float(options["burst"] or max(1, math.ceil(self.rate)))
        self._key = key_function(options["key"]) if options["key"] else None
        self._per_tag = options["per_tag"]
        self._tag = compile_tag_pattern(options["tag"]) if options.get("tag") is not None else None
        self._to_errors = options["over"] == "error"
        self.max_keys = options["max_keys"]
        self._buckets: dict[Any, list[float]] = {}
        self.throttled = 0

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        labels = {"filter": self.name}
        yield "logrouter_filter_throttled_total", "counter", labels, self.throttled
        yield "logrouter_filter_throttle_keys", "gauge", labels, len(self._buckets)

    def _now(self) -> float:
        if self.clock is None:
            self.clock = _default_clock()
        return self.clock.seconds()

    def _bucket(self, key: Any, now: float) -> list[float]:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._evict(now)
            bucket = self._buckets[key] = [self.burst, now]
        elif bucket[1] != now:
            bucket[0] = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
            bucket[1] = now
        return bucket

    def _evict(self, now: float) -> None:
        burst, rate = self.burst, self.rate
        buckets = self._buckets
        full = [k for k, (tokens, last) in buckets.items() if tokens + (now - last) * rate >= burst]
        for k in full:
            del buckets[k]
        if len(buckets) >= self.max_keys:
            for k in list(buckets)[: max(1, len(buckets) // 2)]:
                del buckets[k]

    def process(self, batch: Batch) -> Batch | None:
        if self._tag is not None and not self._tag(batch.tag):
            return batch
        now = self._now()
        tag = batch.tag if self._per_tag else None
        over: list[Event] = []
        kept = on_tables(self.name, batch, self.errors, lambda events: self._run(events, now, tag, over))
        if over:
            self.throttled += len(over)
            if self._to_errors:
                reason = f"throttle: over {self.rate:g} events/s"
                get = self._key
                for event in over:
                    key = get(event[1]) if get is not None else None
                    self.errors(self.name, batch.tag, event[1], reason if key is None else f"{reason} for key {key!r}")
        return narrowed(batch, kept)

    def _run(self, events: list[Event], now: float, tag: str | None, over: list[Event]) -> list[Event]:
        over.clear()
        get = self._key
        if get is None:
            bucket = self._bucket(tag, now)
            allowed = min(len(events), int(bucket[0]))
            bucket[0] -= allowed
            if allowed < len(events):
                over.extend(events[allowed:])
                return events[:allowed]
            return events
        kept: list[Event] = []
        buckets = self._buckets
        for event in events:
            key = get(event[1])
            if tag is not None:
                key = (tag, key)
            bucket = buckets.get(key)
            if bucket is None or bucket[1] != now:
                bucket = self._bucket(key, now)
            if bucket[0] >= 1.0:
                bucket[0] -= 1.0
                kept.append(event)
            else:
                over.append(event)
        return kept

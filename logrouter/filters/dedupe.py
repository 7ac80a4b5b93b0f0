"""The ``dedupe`` filter: drops events whose ``fields`` repeat within a time window.

The first event of a key (the values of ``fields``) passes and opens a window of
``window_secs`` of *event time* around it; a later event of that key less than
``window_secs`` before or after the event that opened the key's current window is a
duplicate, dropped and counted; the first one outside it passes and opens a new window.
Records without any of the fields (all missing or null) always pass.

*Later* means later in the spool. Every event has a place that no resend shares and every
replay keeps: the spool position of its record and its ordinal among the events of that
record handed to the filter in one routing (``batch.Routing``). The same event sent again,
in its own message or in a batch resent under a new chunk id, is another spool record: a
later place, so a duplicate. When a sink replays the spool (after a failure, a restart, or
a sink catching up behind another), the router routes a record again: each event is then
decided against the window opener placed last *before* it, as it was the first time, so a
replay passes what was passed and drops what was dropped, whatever else was routed in
between. (This holds while the filters upstream of ``dedupe`` are deterministic;
``throttle`` is not.) A batch handed without a routing counts as a new record.

Memory: per key, the window openers by place. An opener is forgotten once the next one's
record lies before every sink's cursor (``release``): no replay comes back to the events it
decided. At most ``max_keys`` keys are kept, those whose window opened last. The memory
survives restarts through ``logrouter.filters.memory`` (``snapshot``/``restore``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator

from logrouter import paths, registry
from logrouter.batch import Batch, Event, Routing
from logrouter.config.options import Option, positive
from logrouter.errors import ErrorPath
from logrouter.filters.common import key_function, narrowed, on_tables

# A place is (spool position << ORDINAL_BITS) + ordinal: one int, so ordering is one compare.
ORDINAL_BITS = 32
ORDINAL_MASK = (1 << ORDINAL_BITS) - 1

Opener = tuple[int, int]  # (place, event time in ns)


@registry.filter("dedupe")
class DedupeFilter:
    """Drops an event whose key was seen within ``window_secs`` (event time) before or after."""

    OPTIONS = {
        "fields": Option(list, doc="fields whose values make the key (`[\"message\", \"host\"]`); " + paths.SYNTAX, check=paths.check_list),
        "window_secs": Option((int, float), 60, "an event repeating a key seen less than this long before or after it (in event time) is a duplicate", positive),
        "max_keys": Option(int, 100_000, "keys remembered at most (those whose window opened last); bounds memory", positive),
    }
    TAKES_ROUTING = True

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath) -> None:
        self.name = name
        self.errors = errors
        paths.check_list(options["fields"])
        self.fields = list(options["fields"])
        self._key = key_function(options["fields"])
        self._empty = None if len(options["fields"]) == 1 else (None,) * len(options["fields"])
        self.window = int(float(options["window_secs"]) * 1e9)
        self.max_keys = options["max_keys"]
        # key -> its window openers in place order (immutable, so a snapshot is a shallow
        # copy), oldest window first (an OrderedDict: a plain dict's first key gets slow
        # to find after many deletions at its front)
        self._seen: OrderedDict[Any, tuple[Opener, ...]] = OrderedDict()
        self._routing: Routing | None = None
        self._place = 0  # the place of the next event handed to the filter
        self._unrouted = 0  # records made up for batches handed without a routing
        self._floor = 0  # no record before this place is routed again (release)
        self.frontier = 0  # the end of the furthest spool record routed through the filter
        self.released = 0  # the spool position of the last release
        self.changes = 0  # windows opened: the memory changed since a snapshot
        self.duplicates = 0

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        labels = {"filter": self.name}
        yield "logrouter_filter_duplicates_total", "counter", labels, self.duplicates
        yield "logrouter_filter_dedupe_keys", "gauge", labels, len(self._seen)

    def process(self, batch: Batch, routing: Routing | None = None) -> Batch | None:
        if routing is None:
            # No spool record behind it (a test, a tool): a record of its own, after the others.
            self._unrouted = max(self._unrouted + 1, self.frontier)
            self._routing = None
            self._place = self._unrouted << ORDINAL_BITS
        elif routing is not self._routing:
            # A new routing of a record: its events are numbered from 0 again, in the
            # order the routing hands them over (several batches when routes join here).
            self._routing = routing
            self._place = routing.position << ORDINAL_BITS
            if routing.end > self.frontier:
                self.frontier = routing.end
        kept = on_tables(self.name, batch, self.errors, self._run)
        self.duplicates += len(batch.events) - len(kept)
        return narrowed(batch, kept)

    def _run(self, events: list[Event]) -> list[Event]:
        get, empty, window, seen = self._key, self._empty, self.window, self._seen
        base = self._place
        self._place = base + len(events)
        kept: list[Event] = []
        append = kept.append
        for index, event in enumerate(events):
            key = get(event[1])
            if key == empty:
                append(event)
                continue
            openers = seen.get(key)
            if openers is None:
                if len(seen) >= self.max_keys:
                    seen.popitem(last=False)
                seen[key] = ((base + index, event[0]),)
                self.changes += 1
                append(event)
                continue
            last_place, last_time = openers[-1]
            # After every opener of the key (the usual case; the first test spares an addition).
            if last_place < base or last_place < base + index:
                when = event[0]
                if -window < when - last_time < window:
                    continue  # a duplicate
                seen[key] = self._opened(openers, (base + index, when))
                seen.move_to_end(key)  # a new window: the key moves to the newest end
                self.changes += 1
                append(event)
            elif self._passes_again(key, openers, base + index, event[0]):
                append(event)
        return kept

    def _opened(self, openers: tuple[Opener, ...], opener: Opener) -> tuple[Opener, ...]:
        """The openers with a new last one; those whose events can no longer be routed again
        (the next opener's record is before every cursor) are left out."""
        kept = (*openers, opener)
        floor = self._floor
        start, last = 0, len(kept) - 1
        while start < last and kept[start + 1][0] < floor:
            start += 1
        return kept[start:] if start else kept

    def _passes_again(self, key: Any, openers: tuple[Opener, ...], place: int, when: int) -> bool:
        """An event placed before the key's last opener: a record routed again. It is
        decided against the opener placed last before it, as the first time it was."""
        window = self.window
        at = len(openers)
        while at:
            opener_place, opener_time = openers[at - 1]
            if opener_place == place:
                return True  # it opened a window
            if opener_place < place:
                if -window < when - opener_time < window:
                    return False
                break
            at -= 1
        # It passes but was not remembered (its memory was lost): remember it in place order.
        self._seen[key] = (*openers[:at], (place, when), *openers[at:])
        self.changes += 1
        return True

    # -- memory across routings and restarts (logrouter.filters.memory) -----------------------

    def release(self, position: int) -> None:
        """No record before spool ``position`` will be routed again (every sink's cursor is past it)."""
        if position > self.released:
            self.released = position
            self._floor = position << ORDINAL_BITS

    def fingerprint(self) -> list[Any]:
        """What decisions depend on: a memory saved under other options is not restored."""
        return [self.fields, self.window]

    def covered(self) -> int:
        """The spool position before which every record routed here has been decided."""
        return max(self.frontier, self.released)

    def snapshot(self) -> tuple[int, Any]:
        """``covered()`` and the memory as of now (immutable parts only: cheap, on the reactor)."""
        return self.covered(), list(self._seen.items())

    @staticmethod
    def encode(state: list[tuple[Any, tuple[Opener, ...]]]) -> list[Any]:
        """``snapshot``'s memory as msgpack can hold it (any thread)."""
        return [
            [key, [[place >> ORDINAL_BITS, place & ORDINAL_MASK, when] for place, when in openers]]
            for key, openers in state
        ]

    def restore(self, rows: list[Any], covered: int) -> None:
        """Take back what ``encode`` made; ``covered`` is ``snapshot``'s position."""
        seen: OrderedDict[Any, tuple[Opener, ...]] = OrderedDict()
        for key, openers in rows[-self.max_keys :]:
            seen[key] = tuple(((position << ORDINAL_BITS) + ordinal, when) for position, ordinal, when in openers)
        self._seen = seen
        self.frontier = max(self.frontier, covered)

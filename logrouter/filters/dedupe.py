"""The ``dedupe`` filter: drops events whose ``fields`` repeat within a time window.

The first event of a key (the values of ``fields``) passes and opens a window of
``window_secs`` of *event time* around it; later events of that key inside the window are
duplicates, dropped and counted; the first one outside it passes and opens a new window.
Records without any of the fields (all missing or null) always pass.

The key memory holds at most ``max_keys`` keys, the ones whose window opened last (the
oldest are forgotten first), so memory stays bounded whatever the key count.

Replays are safe: each remembered key keeps which event opened its window (its time and
place in its batch), so when a sink replays the spool after a failure, that event passes
again and its duplicates are dropped again — the same output as the first time. (This
holds while the filters upstream of ``dedupe`` are deterministic; ``throttle`` is not.)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator

from logrouter import paths, registry
from logrouter.batch import Batch, Event
from logrouter.config.options import Option, positive
from logrouter.errors import ErrorPath
from logrouter.filters.common import key_function, narrowed, on_tables


@registry.filter("dedupe")
class DedupeFilter:
    """Drops an event whose key was seen within ``window_secs`` (event time) before or after."""

    OPTIONS = {
        "fields": Option(list, doc="fields whose values make the key (`[\"message\", \"host\"]`); " + paths.SYNTAX, check=paths.check_list),
        "window_secs": Option((int, float), 60, "an event repeating a key seen less than this long before or after it (in event time) is a duplicate", positive),
        "max_keys": Option(int, 100_000, "keys remembered at most (those whose window opened last); bounds memory", positive),
    }

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath) -> None:
        self.name = name
        self.errors = errors
        paths.check_list(options["fields"])
        self._key = key_function(options["fields"])
        self._empty = None if len(options["fields"]) == 1 else (None,) * len(options["fields"])
        self.window = int(float(options["window_secs"]) * 1e9)
        self.max_keys = options["max_keys"]
        # key -> (time_ns, index, batch length) of the event that opened its window, oldest
        # window first (an OrderedDict: a plain dict's first key gets slow to find after
        # many deletions at its front)
        self._seen: OrderedDict[Any, tuple[int, int, int]] = OrderedDict()
        self.duplicates = 0

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        labels = {"filter": self.name}
        yield "logrouter_filter_duplicates_total", "counter", labels, self.duplicates
        yield "logrouter_filter_dedupe_keys", "gauge", labels, len(self._seen)

    def process(self, batch: Batch) -> Batch | None:
        kept = on_tables(self.name, batch, self.errors, self._run)
        self.duplicates += len(batch.events) - len(kept)
        return narrowed(batch, kept)

    def _run(self, events: list[Event]) -> list[Event]:
        get, empty, window, seen = self._key, self._empty, self.window, self._seen
        size = len(events)
        kept: list[Event] = []
        append = kept.append
        for index, event in enumerate(events):
            key = get(event[1])
            if key == empty:
                append(event)
                continue
            opener = seen.get(key)
            when = event[0]
            if opener is not None:
                if opener[0] == when and opener[1] == index and opener[2] == size:
                    append(event)  # the opener itself, replayed
                    continue
                if -window < when - opener[0] < window:
                    continue  # a duplicate
                seen.move_to_end(key)  # a new window: the key moves to the newest end
            elif len(seen) >= self.max_keys:
                seen.popitem(last=False)
            seen[key] = (when, index, size)
            append(event)
        return kept

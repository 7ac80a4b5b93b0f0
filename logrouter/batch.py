"""The unit that moves through the router: one tag and its events.

An event is a ``(time_ns, record)`` tuple: ``time_ns`` is an ``int`` of nanoseconds
since the Unix epoch (UTC) and ``record`` a ``dict`` with ``str`` keys. Sources build
batches, filters return new or narrowed batches, sinks consume them. Nothing in the
router handles single events outside of a batch.

A source may also hand over the events as they arrived, still encoded (``packed``:
e.g. a PackedForward entries blob and the clock reading its decode used), so the spool
stores those bytes instead of encoding the events again (``logrouter.spool.record``).
``packed`` must decode to exactly ``events``; a batch made by ``replace`` has none.

``json_values`` says the records hold nothing but what JSON decodes to (dicts with str
keys, lists, str, int, float, bool, None) and bytes, as the JSON sources (and Pravega's
raw payloads) build them: the spool then encodes them with a faster encoder
(``logrouter.spool.record``). ``replace`` drops it.
"""

from __future__ import annotations

from typing import Any

Event = tuple[int, dict[str, Any]]


class Batch:
    """A tag with its events, plus the name of the source that produced it."""

    __slots__ = ("tag", "events", "source", "packed", "json_values")

    def __init__(
        self, tag: str, events: list[Event], source: str = "", packed: tuple | None = None, json_values: bool = False
    ) -> None:
        self.tag = tag
        self.events = events
        self.source = source
        self.packed = packed
        self.json_values = json_values

    def replace(self, events: list[Event] | None = None, tag: str | None = None) -> "Batch":
        """A copy with other events and/or tag; the source is kept (``packed`` is not)."""
        return Batch(
            self.tag if tag is None else tag,
            self.events if events is None else events,
            self.source,
        )

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        return f"Batch(tag={self.tag!r}, events={len(self.events)}, source={self.source!r})"

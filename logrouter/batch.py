"""The unit that moves through the router: one tag and its events.

An event is a ``(time_ns, record)`` tuple: ``time_ns`` is an ``int`` of nanoseconds
since the Unix epoch (UTC) and ``record`` a ``dict`` with ``str`` keys. Sources build
batches, filters return new or narrowed batches, sinks consume them. Nothing in the
router handles single events outside of a batch.

A source may also hand over the events as they arrived, still encoded (``packed``: a
format name and what that format stores, e.g. a PackedForward entries blob and the clock
reading its decode used), so the spool stores those bytes instead of encoding the events
again (``logrouter.spool.formats`` holds the formats). ``packed`` must decode to exactly
``events``; a batch made by ``replace`` has none.

A batch read back from the spool for a sink that reads events in its own worker thread
may be *deferred* (``Batch.deferred``): it holds the record's bytes and decodes them each
time ``events`` is read, keeping nothing, so a sink's queue (and the run of the sink's
thread over it) holds records at their size on disk rather than several times that as
Python objects, and the decode runs in the sink's thread. A failed decode raises from
``events``. ``materialized`` gives a batch that holds its events.

``held_bytes`` is what the batch's events hold in memory, where its source or the
spool's stored format knows it and it may be far more than the spool record (a Beats
window stored compressed as it arrived: ~25 times fewer bytes than the documents it
inflates to, and the native scan's entries beside them). A sink's queue is bounded in
memory (``max_queue_bytes``): each record counts ``charge(record bytes)``, the larger of
the two. 0: the record's size stands for it (a deferred batch holds just the record).

``json_values`` says the records hold nothing but what JSON decodes to (dicts with str
keys, lists, str, int, float, bool, None) and bytes, as the JSON sources (and Pravega's
raw payloads) build them: the spool then encodes them with a faster encoder
(``logrouter.spool.record``). ``replace`` drops it.

A ``Routing`` is one routing of one spool record down the graph: live, in a sink's
catch-up, or (``dry``) in a filter memory's warm-up at start. A record is routed again
whenever a sink replays the spool, so its position tells a replay from a new record,
whatever the events look like; filters that keep state (``dedupe``) are handed it.
"""

from __future__ import annotations

from typing import Any, Callable

Event = tuple[int, dict[str, Any]]


class Batch:
    """A tag with its events, plus the name of the source that produced it."""

    __slots__ = ("tag", "_events", "source", "packed", "json_values", "_decode", "held_bytes")

    def __init__(
        self,
        tag: str,
        events: list[Event],
        source: str = "",
        packed: tuple | None = None,
        json_values: bool = False,
        held_bytes: int = 0,
    ) -> None:
        self.tag = tag
        self._events = events
        self.source = source
        self.packed = packed
        self.json_values = json_values
        self.held_bytes = held_bytes
        self._decode: Callable[[], list[Event]] | None = None

    @classmethod
    def deferred(cls, tag: str, source: str, decode: Callable[[], list[Event]]) -> "Batch":
        """A batch whose events are ``decode()``, called each time they are read."""
        batch = cls(tag, None, source)  # type: ignore[arg-type]
        batch._decode = decode
        return batch

    @property
    def events(self) -> list[Event]:
        events = self._events
        if events is None:
            return self._decode()  # type: ignore[misc]
        return events

    @property
    def is_deferred(self) -> bool:
        return self._events is None

    def charge(self, record_bytes: int) -> int:
        """The bytes a sink's queue counts for this batch of a spool record of
        ``record_bytes``: what its events hold in memory, where that is known and more."""
        held = self.held_bytes
        return held if held > record_bytes else record_bytes

    def materialized(self) -> "Batch":
        """This batch, or for a deferred one a batch holding its decoded events."""
        if self._events is not None:
            return self
        return Batch(self.tag, self._decode(), self.source)  # type: ignore[misc]

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


class Routing:
    """One routing of the spool record at ``position`` (ending at ``end``; ``size``: the
    bytes a sink's queue counts for it, ``Batch.charge``) to the sinks named in
    ``targets``; ``dry``: to none of them, for the filters' memory only
    (``logrouter.filters.memory``). Each routing is a new object: the batches
    a filter is handed with the same one come from one routing of one record."""

    __slots__ = ("position", "end", "size", "targets", "dry")

    def __init__(self, position: int, end: int, size: int, targets: frozenset[str], dry: bool = False) -> None:
        self.position = position
        self.end = end
        self.size = size
        self.targets = targets
        self.dry = dry

    def __repr__(self) -> str:
        return f"Routing(position={self.position}, targets={sorted(self.targets)}{', dry' if self.dry else ''})"

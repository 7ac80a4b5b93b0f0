"""Forward events kept as the PackedForward entries that arrived (pure, no Twisted).

``PackedEvents`` is a batch's events as an (inflated) entries blob plus the clock
reading its time-0 entries take: a read-only sequence of ``(time_ns, record)`` that
decodes the blob only when something reads an event (then through
``fluent_forward.decode_entries``, the reference, once), while its length and hour
buckets come from the native extension's scan, which reads the bytes without
building anything. A Parquet sink hands such events to the native decoder, which
builds the lake's columns from the same bytes (``logrouter.lake.native_table``), so
on a route without filters that read records an event never becomes a Python object.

Filters that know packed batches (``logrouter.filters.columnar``) narrow and edit them
without decoding: a ``PackedEvents`` may carry a ``selection`` (the row numbers kept,
ascending, among its rows) and ``edits`` (``Edit``: top-level fields set to constants,
removed or renamed). ``events()`` applies them to the decoded records (copies: the
reference, with ``logrouter.filters.fields``' semantics) and the native build applies
the same while it fills the columns (``native/src/edits.rs``), so the rows agree.

``lazy_events(entries, now)`` makes one, or answers None where the native
extension is not installed or the blob is outside the subset it takes (see
``native/src/reader.rs``): the caller then decodes it in Python as before.
``kept_or_decoded`` is the same for the codec, which reads its clock only if a
time-0 entry needs it.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from logrouter.native import NATIVE

__all__ = ["HOUR_NS", "Edit", "PackedEvents", "kept_or_decoded", "lazy_events"]

Event = tuple[int, dict[str, Any]]
HOUR_NS = 3_600_000_000_000  # as logrouter.lake.partition: the hour buckets the lake splits by


class Edit:
    """One filter's change to every record of a packed batch: ``op`` ``SET`` (``pairs``:
    top-level key -> value), ``REMOVE`` (keys -> None) or ``RENAME`` (old -> new, at
    once); ``native`` is the same as ``logrouter_native`` takes it (keys as UTF-8, set
    values as msgpack)."""

    SET, REMOVE, RENAME = 1, 2, 3
    __slots__ = ("op", "pairs", "native")

    def __init__(self, op: int, pairs: tuple[tuple[str, Any], ...], native: tuple) -> None:
        self.op = op
        self.pairs = pairs
        self.native = native

    def apply(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record as the filter's record path makes it (a copy when changed)."""
        if self.op == Edit.SET:
            return {**record, **dict(self.pairs)}
        if self.op == Edit.REMOVE:
            if not any(key in record for key, _ in self.pairs):
                return record
            new = dict(record)
            for key, _ in self.pairs:
                new.pop(key, None)
            return new
        if not any(old in record for old, _ in self.pairs):
            return record
        new = dict(record)
        for old, _ in self.pairs:
            new.pop(old, None)
        for old, name in self.pairs:
            if old in record:
                new[name] = record[old]
        return new

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Edit) and (self.op, self.pairs) == (other.op, other.pairs)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Edit({self.op}, {self.pairs!r})"


class PackedEvents(Sequence):
    """The events of an entries blob, or of the rows ``start`` to ``stop`` among those of
    its hour ``bucket`` (None: all its entries); of those only the ``selection`` (row
    numbers from 0, ascending; None: all), each with ``edits`` applied in order. Never
    changed once made; shared between threads like any batch's events (a decode two
    threads race for gives both the same).
    """

    __slots__ = ("entries", "now", "bucket", "start", "stop", "buckets", "selection", "edits", "checked", "texts", "_events")

    def __init__(
        self,
        entries: bytes,
        now: int | None,
        buckets: tuple[tuple[int, int], ...],
        bucket: int | None = None,
        start: int = 0,
        stop: int | None = None,
        selection: array | None = None,
        edits: tuple[Edit, ...] = (),
        *,
        checked: bool = False,
        texts: tuple[bytes, bytes] | None = None,
    ) -> None:
        self.entries = entries
        #: The extension's ``scan`` took ``entries`` (in this process): its build need not
        #: check them again. Only this module's makers, which scanned them, set it.
        self.checked = checked
        #: Where ``entries`` is the extension's transcode of JSON documents: the JSON
        #: text of their top-level objects and arrays (``json_lazy``), which the lake's
        #: build writes into ``_extra`` as it came. Only with the blob it was made with.
        self.texts = texts
        self.now = now
        #: ``(hour bucket, entries)`` of the whole blob, in order of first appearance.
        self.buckets = buckets
        self.bucket = bucket
        total = sum(count for _, count in buckets) if bucket is None else dict(buckets).get(bucket, 0)
        self.start = min(start, total)
        self.stop = total if stop is None else max(self.start, min(stop, total))
        #: ``array("I")`` of row numbers among ``start``..``stop`` (None: all of them).
        self.selection = selection
        self.edits = edits
        self._events: list[Event] | None = None

    def piece(self) -> tuple[bytes, int | None, int | None, int, int]:
        """What ``logrouter_native.build`` takes for these rows."""
        return self.entries, self.now, self.bucket, self.start, self.stop

    def filtered(self) -> tuple[bytes | None, list] | None:
        """What ``logrouter_native.build`` takes as ``filtered`` for these rows (None:
        nothing was filtered)."""
        if self.selection is None and not self.edits:
            return None
        selection = None if self.selection is None else self.selection.tobytes()
        return selection, [edit.native for edit in self.edits]

    def narrowed(self, rows: Sequence[int]) -> "PackedEvents":
        """These events' rows numbered ``rows`` (ascending, from 0)."""
        chosen = array("I", rows) if self.selection is None else array("I", [self.selection[i] for i in rows])
        return PackedEvents(self.entries, self.now, self.buckets, self.bucket, self.start, self.stop, chosen, self.edits,
                            checked=self.checked, texts=self.texts)

    def edited(self, edit: Edit) -> "PackedEvents":
        """These events with ``edit`` applied after the edits they have."""
        return PackedEvents(self.entries, self.now, self.buckets, self.bucket, self.start, self.stop,
                            self.selection, (*self.edits, edit), checked=self.checked, texts=self.texts)

    def events(self) -> list[Event]:
        """The decoded events (the reference decode, done once)."""
        events = self._events
        if events is None:
            # Imported here: a batch whose events nobody reads never pays for the decoder.
            from logrouter.wire.forward_packed import decode_entries

            events, _ = decode_entries(self.entries, self.now)
            if self.bucket is not None:
                bucket = self.bucket
                events = [event for event in events if event[0] // HOUR_NS == bucket]
            if self.start or self.stop != len(events):
                events = events[self.start : self.stop]
            if self.selection is not None:
                events = [events[i] for i in self.selection]
            for edit in self.edits:
                apply = edit.apply
                events = [(time, apply(record)) for time, record in events]
            self._events = events
        return events

    def split_by_hour(self) -> list[tuple[int, Sequence[Event]]]:
        """As ``lake.partition.split_by_hour``: the rows per hour bucket, in order of first
        appearance, each still packed."""
        if not self:
            return []
        if self.bucket is not None or len(self.buckets) == 1:
            return [(self.bucket if self.bucket is not None else self.buckets[0][0], self)]
        if self.selection is not None or self.start or self.stop != sum(count for _, count in self.buckets):
            # A slice across hours (the lake never makes one), or filtered rows across
            # hours (the few batches that straddle an hour): grouped decoded.
            return _group(self.events())
        return [(bucket, PackedEvents(self.entries, self.now, self.buckets, bucket, edits=self.edits, checked=self.checked, texts=self.texts))
                for bucket, _ in self.buckets]

    def __len__(self) -> int:
        return self.stop - self.start if self.selection is None else len(self.selection)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1 and self.selection is not None:
                return PackedEvents(self.entries, self.now, self.buckets, self.bucket, self.start, self.stop,
                                    self.selection[start : max(start, stop)], self.edits, checked=self.checked, texts=self.texts)
            if step == 1:
                return PackedEvents(self.entries, self.now, self.buckets, self.bucket,
                                    self.start + start, self.start + max(start, stop), edits=self.edits,
                                    checked=self.checked, texts=self.texts)
        return self.events()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedEvents):
            same = self.piece() == other.piece() and self.selection == other.selection and self.edits == other.edits
            return same or self.events() == other.events()
        if isinstance(other, (list, tuple)):
            return self.events() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compared by value, like the list it stands for

    def __repr__(self) -> str:
        filtered = "" if self.filtered() is None else f", filtered ({len(self.edits)} edits)"
        return f"<PackedEvents: {len(self)} of {len(self.entries)} bytes of entries{filtered}>"


def _group(events: list[Event]) -> list[tuple[int, list[Event]]]:
    groups: dict[int, list[Event]] = {}
    for event in events:
        groups.setdefault(event[0] // HOUR_NS, []).append(event)
    return list(groups.items())


def lazy_events(entries: bytes, now: int | None) -> PackedEvents | None:
    """The events of an entries blob as ``PackedEvents``, or None where the native
    extension is missing or the blob is outside its subset (decode it in Python then).
    ``now`` is the clock reading time-0 entries take (None: the blob must have none)."""
    if NATIVE is None or type(entries) is not bytes:
        return None
    try:
        found = NATIVE.scan(entries, now)
    except Exception:  # noqa: BLE001 - a bug in the extension: the Python path is the reference
        return None
    if found is None:
        return None
    count, needs_now, buckets = found
    if needs_now and now is None:
        return None
    return PackedEvents(entries, now, tuple(buckets), checked=True)


def kept_or_decoded(
    blob: bytes, now_ns: Callable[[], int], decode: Callable[[bytes, Callable[[], int]], tuple[Any, int]]
) -> tuple[Sequence[Event], int]:
    """``(events, invalid)`` of a whole inflated blob for the forward codec: kept packed
    where the extension takes it (nothing decoded, none invalid), else ``decode(blob,
    now_ns)``, the codec's own decode. ``now_ns`` is called at most once, and only for a
    blob with time-0 entries, as the codec's decode calls it."""
    if NATIVE is not None and type(blob) is bytes:
        now: int | None = None
        try:
            found = NATIVE.scan(blob, None)
            if found is not None and found[1]:  # time-0 entries: one clock reading for them all
                now = now_ns()
                found = NATIVE.scan(blob, now)
        except Exception:  # noqa: BLE001 - a bug in the extension: the Python path is the reference
            found = None
        if found is not None:
            return PackedEvents(blob, now, tuple(found[2]), checked=True), 0
    return decode(blob, now_ns)

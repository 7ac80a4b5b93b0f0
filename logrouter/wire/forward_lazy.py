"""Forward events kept as the PackedForward entries that arrived (pure, no Twisted).

``PackedEvents`` is a batch's events as an (inflated) entries blob plus the clock
reading its time-0 entries take: a read-only sequence of ``(time_ns, record)`` that
decodes the blob only when something reads an event (then through
``fluent_forward.decode_entries``, the reference, once), while its length and hour
buckets come from the native extension's scan, which reads the bytes without
building anything. A Parquet sink hands such events to the native decoder, which
builds the lake's columns from the same bytes (``logrouter.lake.native_table``), so
on a route without filters that read records an event never becomes a Python object.

``lazy_events(entries, now)`` makes one, or answers None where the native
extension is not installed or the blob is outside the subset it takes (see
``native/src/reader.rs``): the caller then decodes it in Python as before.
``kept_or_decoded`` is the same for the codec, which reads its clock only if a
time-0 entry needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from logrouter.native import NATIVE

__all__ = ["HOUR_NS", "PackedEvents", "kept_or_decoded", "lazy_events"]

Event = tuple[int, dict[str, Any]]
HOUR_NS = 3_600_000_000_000  # as logrouter.lake.partition: the hour buckets the lake splits by


class PackedEvents(Sequence):
    """The events of an entries blob, or of the rows ``start`` to ``stop`` among those of
    its hour ``bucket`` (None: all its entries). Never changed once made; shared between
    threads like any batch's events (a decode two threads race for gives both the same).
    """

    __slots__ = ("entries", "now", "bucket", "start", "stop", "buckets", "checked", "_events")

    def __init__(
        self,
        entries: bytes,
        now: int | None,
        buckets: tuple[tuple[int, int], ...],
        bucket: int | None = None,
        start: int = 0,
        stop: int | None = None,
        *,
        checked: bool = False,
    ) -> None:
        self.entries = entries
        #: The extension's ``scan`` took ``entries`` (in this process): its build need not
        #: check them again. Only this module's makers, which scanned them, set it.
        self.checked = checked
        self.now = now
        #: ``(hour bucket, entries)`` of the whole blob, in order of first appearance.
        self.buckets = buckets
        self.bucket = bucket
        total = sum(count for _, count in buckets) if bucket is None else dict(buckets).get(bucket, 0)
        self.start = min(start, total)
        self.stop = total if stop is None else max(self.start, min(stop, total))
        self._events: list[Event] | None = None

    def piece(self) -> tuple[bytes, int | None, int | None, int, int]:
        """What ``logrouter_native.build`` takes for these rows."""
        return self.entries, self.now, self.bucket, self.start, self.stop

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
            self._events = events
        return events

    def split_by_hour(self) -> list[tuple[int, Sequence[Event]]]:
        """As ``lake.partition.split_by_hour``: the rows per hour bucket, in order of first
        appearance, each still packed."""
        if not self:
            return []
        if self.bucket is not None or len(self.buckets) == 1:
            return [(self.bucket if self.bucket is not None else self.buckets[0][0], self)]
        if self.start or self.stop != sum(count for _, count in self.buckets):
            return _group(self.events())  # a slice across hours (the lake never makes one)
        return [(bucket, PackedEvents(self.entries, self.now, self.buckets, bucket, checked=self.checked))
                for bucket, _ in self.buckets]

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return PackedEvents(self.entries, self.now, self.buckets, self.bucket,
                                    self.start + start, self.start + max(start, stop), checked=self.checked)
        return self.events()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedEvents):
            return self.piece() == other.piece() or self.events() == other.events()
        if isinstance(other, (list, tuple)):
            return self.events() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compared by value, like the list it stands for

    def __repr__(self) -> str:
        return f"<PackedEvents: {len(self)} of {len(self.entries)} bytes of entries>"


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

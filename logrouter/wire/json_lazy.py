"""Beats / Log Courier JSON events kept undecoded, read by the native extension (pure, no Twisted).

A read of JSON documents (one event each) that the native extension takes is scanned
once in native code (``logrouter_native.scan_documents``): it checks every document is
a JSON object Python reads the same way, gives each event its time by the rules of
``logrouter.sources.events`` and hands back the values of the fields the source asks
for (the tag template's, the idempotency key's), and transcodes the records into a
PackedForward-style entries blob, which the lake's native builder reads exactly as it
reads forward entries (``logrouter.lake.native_table``), except that a record's
top-level objects and arrays go into ``_extra`` as the documents' own text
(``PackedEvents.texts``: same values, the sender's spelling). So on a route without
filters that read records a Beats event never becomes a Python object.

``DocumentEvents`` is such a read's events: a ``PackedEvents`` over the transcoded
blob whose ``events()`` gives the reference decode of the documents (``reference``, the
source's Python path) when something reads them. Its hour splits and slices are plain
``PackedEvents`` over the same blob: those decode the transcoded records, which hold the
same values (tests/unit/test_native_documents.py).

``scan_documents`` answers None where the extension is missing or any document is
outside the subset it takes (see ``native/src/jsondoc.rs``): the caller then decodes
the documents in Python as before. ``scan_runs`` reads the documents where the
Lumberjack codec left them (``Events.runs``: a buffer and where each document lies in
it), and ``split_runs`` makes them bytes objects where Python needs them. Both scans
can also give the events' idempotency keys (``key``, see
``logrouter.sources.event_keys.native_key``), made natively from the same fields.
"""

from __future__ import annotations

from typing import Any, Callable

from logrouter.native import NATIVE
from logrouter.wire.forward_lazy import PackedEvents

__all__ = ["CONTAINER", "DocumentEvents", "DOTTED_FIRST", "KeyAsk", "Run", "Scanned", "WALK", "scan_documents", "scan_runs", "split_runs"]

Event = tuple[int, dict[str, Any]]
#: A looked-up value that is an object or an array (``scan_documents`` gives no more of it).
CONTAINER = ...
#: How a field path is looked up: nested objects key by key; or a top-level key with the
#: whole dotted name first (unless null), else nested (tag templates, field-list keys).
WALK, DOTTED_FIRST = 0, 1
Path = tuple[int, str, tuple[str, ...]]
#: Documents where a codec left them: a buffer, and per document ``(seq, start, stop)``
#: as native-endian u32 triples (``logrouter_native.json_frames``).
Run = tuple[bytes, bytes]
#: An idempotency key asked of a scan: ``(kind, name, first path)`` (``event_keys.native_key``).
KeyAsk = tuple[int, str, int]
Scanned = tuple[bytes, tuple[tuple[int, int], ...], list[list[Any]], tuple[bytes, bytes], "list | None"]


class DocumentEvents(PackedEvents):
    """The events of a read of JSON documents, as the entries blob the extension made of
    them; ``events()`` of the whole read is ``reference()``, the Python decode."""

    __slots__ = ("reference",)

    def __init__(
        self,
        entries: bytes,
        buckets: tuple[tuple[int, int], ...],
        reference: Callable[[], list[Event]],
        texts: tuple[bytes, bytes] | None = None,
    ) -> None:
        # The entries are the extension's own transcode of documents it checked.
        super().__init__(entries, None, buckets, checked=True, texts=texts)
        self.reference = reference

    def events(self) -> list[Event]:
        events = self._events
        if events is None:
            events = self._events = self.reference()
        return events

    def __repr__(self) -> str:
        return f"<DocumentEvents: {len(self)} events, {len(self.entries)} bytes of entries>"


def scan_documents(
    documents: list[bytes], now: int, drop_metadata: bool, paths: list[Path], key: KeyAsk | None = None
) -> Scanned | None:
    """``(entries, buckets, values, texts, keys)`` of ``documents`` read at ``now`` (ns):
    the records as an entries blob (``@metadata`` left out with ``drop_metadata``), the
    hour buckets with their event counts, per path each event's value there (None for
    missing or null, ``CONTAINER`` for an object or array), and the JSON text of the
    records' top-level objects and arrays with where they lie in the blob
    (``DocumentEvents``' ``texts``). With ``key``, the paths from its ``first`` on are
    the key's: ``values`` stops before them and ``keys`` is each event's key or None
    (None: no event has one; ``event_keys.key_maker``'s). None: decode them in Python."""
    if NATIVE is None or not documents:
        return None
    return _scanned(NATIVE.scan_documents, documents, now, drop_metadata, paths, key)


def scan_runs(runs: list[Run], now: int, drop_metadata: bool, paths: list[Path], key: KeyAsk | None = None) -> Scanned | None:
    """``scan_documents`` of the documents of ``runs``, read where they lie."""
    if NATIVE is None or not runs:
        return None
    return _scanned(NATIVE.scan_runs, runs, now, drop_metadata, paths, key)


def _scanned(scan: Callable[..., Any], documents: Any, now: int, drop_metadata: bool, paths: list[Path], key: KeyAsk | None) -> Scanned | None:
    try:
        found = scan(documents, now, drop_metadata, [(lookup, name, list(keys)) for lookup, name, keys in paths], key)
    except Exception:  # noqa: BLE001 - a bug in the extension (or a document not bytes): the Python path
        return None
    if found is None:
        return None
    entries, buckets, values, texts, keys = found
    return entries, tuple(buckets), values, texts, keys


def split_runs(runs: list[Run]) -> tuple[list[bytes], list[int]]:
    """The documents of ``runs`` as bytes objects, and their frames' seqs."""
    if not runs:
        return [], []
    return NATIVE.split_documents(runs)  # type: ignore[union-attr] - runs exist only where it does

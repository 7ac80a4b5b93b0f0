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
the documents in Python as before.
"""

from __future__ import annotations

from typing import Any, Callable

from logrouter.native import NATIVE
from logrouter.wire.forward_lazy import PackedEvents

__all__ = ["CONTAINER", "DocumentEvents", "DOTTED_FIRST", "WALK", "scan_documents"]

Event = tuple[int, dict[str, Any]]
#: A looked-up value that is an object or an array (``scan_documents`` gives no more of it).
CONTAINER = ...
#: How a field path is looked up: nested objects key by key; or a top-level key with the
#: whole dotted name first (unless null), else nested (tag templates, field-list keys).
WALK, DOTTED_FIRST = 0, 1
Path = tuple[int, str, tuple[str, ...]]


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
    documents: list[bytes], now: int, drop_metadata: bool, paths: list[Path]
) -> tuple[bytes, tuple[tuple[int, int], ...], list[list[Any]], tuple[bytes, bytes]] | None:
    """``(entries, buckets, values, texts)`` of ``documents`` read at ``now`` (ns): the
    records as an entries blob (``@metadata`` left out with ``drop_metadata``), the hour
    buckets with their event counts, per path each event's value there (None for missing
    or null, ``CONTAINER`` for an object or array), and the JSON text of the records'
    top-level objects and arrays with where they lie in the blob (``DocumentEvents``'
    ``texts``). None: decode them in Python."""
    if NATIVE is None or not documents:
        return None
    try:
        found = NATIVE.scan_documents(documents, now, drop_metadata, [(lookup, name, list(keys)) for lookup, name, keys in paths])
    except Exception:  # noqa: BLE001 - a bug in the extension (or a document not bytes): the Python path
        return None
    if found is None:
        return None
    entries, buckets, values, texts = found
    return entries, tuple(buckets), values, texts

"""A read of Beats / Log Courier JSON documents made into a batch without decoding it.

Where the native extension takes a read (``wire.json_lazy.scan_documents``), the
source's per-event work runs on what the scan handed back instead of on decoded
records: the tag from the template's fields' values, the idempotency keys made by the
scan itself (``event_keys.native_key``), the events kept as
``DocumentEvents`` (the lake builds its columns from them natively), and the batch
carries what arrived for the spool: the ``C`` frames' payloads when they hold all of the
read (``lumberjack-zlib``: the documents are then never made bytes objects unless
something decodes them in Python), else the documents (``json-documents``), as on the
Python path (``events.batch_builder``), which gives the same tag, keys and events. A read whose events do not all get one tag is left to that path (a batch per
tag would need the rows picked out of the blob).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from logrouter.batch import Batch
from logrouter.sources import event_keys
from logrouter.sources.compressed_documents import LUMBERJACK_ZLIB
from logrouter.sources.events import JSON_DOCUMENTS, TagTemplate, decode_documents, held_bytes
from logrouter.wire.json_lazy import (
    CONTAINER,
    DOTTED_FIRST,
    DocumentEvents,
    KeyAsk,
    Path,
    Run,
    Scanned,
    scan_documents,
    scan_runs,
    split_runs,
)

__all__ = ["NativeReads"]


def _text(value: Any, default: str) -> str:
    """A tag field's text, as ``events._field_getter`` renders it."""
    if value.__class__ is str:
        return value
    if value is None or value is CONTAINER:
        return default
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


class NativeReads:
    """A source's reads made into batches from the native scan (``read``)."""

    def __init__(self, template: TagTemplate, drop_metadata: bool, key_spec: str | list[str] | None = None) -> None:
        self.static = template.static
        self.parts = template.parts
        self.fields = [part for part in template.parts if not isinstance(part, str)]
        self.drop_metadata = drop_metadata
        self.paths: list[Path] = [(DOTTED_FIRST, name, keys) for name, keys, _ in self.fields]
        made = None if key_spec is None else event_keys.native_key(key_spec)
        self.key: KeyAsk | None = None
        if made is not None:
            key_paths, kind, name = made
            self.key = (kind, name, len(self.paths))
            self.paths += key_paths

    def _tag(self, columns: list[list[Any]]) -> str | None:
        """The one tag of every event, or None when they differ."""
        if self.static is not None:
            return self.static
        texts = iter(columns)
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            column = next(texts)
            first = column[0]
            if first.__class__ is str and column.count(first) == len(column) and set(map(type, column)) == {str}:
                out.append(first)
                continue
            default = part[2]
            found = {_text(value, default) for value in column}
            if len(found) != 1:
                return None
            out.append(found.pop())
        return "".join(out)

    def read(self, documents: list[bytes], now: int) -> tuple[Batch, list | None] | None:
        """The batch of ``documents`` read ``now`` (ns) and its events' idempotency keys
        (None: none has one), or None: the caller decodes them and takes its Python path."""
        found = scan_documents(documents, now, self.drop_metadata, self.paths, self.key)
        return None if found is None else self._batch(found, documents, now)

    def read_runs(
        self, runs: list[Run], now: int, compressed: tuple[list[bytes], int] | None = None
    ) -> tuple[Batch, list | None] | None:
        """``read`` of the documents of ``runs`` (``Events.runs``), scanned where they lie.
        ``compressed``: the payloads all of them arrived in and what those inflate to; the
        batch is then stored as those (``lumberjack-zlib``) and the documents become bytes
        objects only if something decodes the events in Python. Without it they are made
        now, for the stored form (``json-documents``)."""
        found = scan_runs(runs, now, self.drop_metadata, self.paths, self.key)
        if found is None:
            return None
        if compressed is None:
            return self._batch(found, split_runs(runs)[0], now)
        drop_metadata = self.drop_metadata

        def reference() -> list:
            return decode_documents(split_runs(runs)[0], now, drop_metadata)

        payloads, inflated_bytes = compressed
        packed = (LUMBERJACK_ZLIB, payloads, now, drop_metadata, inflated_bytes)
        made = self._batch(found, None, now, reference, packed)
        if made is not None:
            # What it holds: the entries and texts (held_bytes counts them), the compressed
            # payloads, and the inflated runs, unless the texts are that buffer itself.
            texts = made[0].events.texts
            kept = sum(len(buffer) for buffer, _ in runs if texts is None or buffer is not texts[1])
            made[0].held_bytes = held_bytes(made[0].events, kept + sum(map(len, payloads)))
        return made

    def _batch(
        self, found: Scanned, documents: list[bytes] | None, now: int, reference: Any = None, packed: tuple | None = None
    ) -> tuple[Batch, list | None] | None:
        entries, buckets, values, texts, keys = found
        tag = self._tag(values)
        if tag is None:
            return None
        if reference is None:
            reference = partial(decode_documents, documents, now, self.drop_metadata)
        if packed is None:
            packed = (JSON_DOCUMENTS, documents, now, self.drop_metadata)
        events = DocumentEvents(entries, buckets, reference, texts)
        return Batch(tag, events, json_values=True, packed=packed), keys

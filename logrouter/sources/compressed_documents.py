"""The spool's stored formats of JSON events kept compressed, as they arrived: a Beats
window's ``C`` frame payloads (``lumberjack-zlib``) and a Log Courier payload's zlib
stream (``log-courier-zlib``).

A Filebeat window of 2048 events comes as one ``C`` frame of ~70 KB that inflates to
~2 MB of JSON; storing the documents (``json-documents``) writes, checksums and fsyncs
those 2 MB. These formats store the compressed bytes the codec read off the wire
(``Events.payloads``: the very ``bytes`` the Beats codec inflated, which it cut out of
its read buffer anyway, so no copy is made for the spool; ``Payload.compressed``: the
Log Courier codec's one copy of the zlib stream out of its read buffer, which it then
inflates, a twenty-fifth of the documents' size), with what the events were read with (``now``, ``drop_metadata``)
and the size they inflated to. A replay (a restart, a sink reading the spool after its
queue overflowed) inflates them within that size, cuts out the documents as the codec
did (``J`` frames: ``lumberjack_frames.json_frame_documents``; ``u32`` length-prefixed
records: ``log_courier_records.record_documents``) and reads them through
``events.events_of_documents``, the path of ``json-documents``: the native scan where it
takes them, else the Python decode, so the same events as on arrival (the tag and the
idempotency keys are the record's, stored beside them). A record whose bytes do not
inflate, inflate to another size or do not cut into whole documents raises
``ValueError``: the spool's readers report and skip it like any unreadable record.

The sources use these formats only where they are exact (``store_compressed``): the
batch is all of what arrived (one tag; every document a JSON object; for Beats, ``C``
frames holding nothing but this window's ``J`` frames, none of them plain). Anything
else keeps ``json-documents`` or decoded records.

A record of these formats is ~25 times smaller than the events it gives: the batch
carries what those hold in memory (``Batch.held_bytes``, ``events.held_bytes``), which
a sink's queue counts instead (``Batch.charge``), live and read back (``held``).

**A name is a version** (``logrouter.spool.formats``): what a record decodes to may
never change; ``tests/unit/test_spool_golden.py`` holds one of each.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from logrouter.batch import Batch
from logrouter.sources.events import JSON_DOCUMENTS, events_of_documents, held_bytes
from logrouter.spool import formats
from logrouter.wire.inflate import InflateError, inflate
from logrouter.wire.log_courier_records import record_documents
from logrouter.wire.lumberjack_frames import json_frame_documents

__all__ = ["LOG_COURIER_ZLIB", "LUMBERJACK_ZLIB", "store_compressed"]

FIELDS = ("payloads", "now", "drop_metadata", "inflated_bytes")
Event = tuple[int, dict[str, Any]]


def _documents(payloads: Any, inflated_bytes: Any, cut: Callable[[bytes], list[bytes]]) -> list[bytes]:
    """The documents of ``payloads`` (zlib streams) that inflate to ``inflated_bytes`` in all."""
    if payloads.__class__ is not list or inflated_bytes.__class__ is not int or inflated_bytes < 0:
        raise ValueError("a compressed spool record holds no list of payloads and their inflated size")
    documents: list[bytes] = []
    left = inflated_bytes
    for payload in payloads:
        if payload.__class__ is not bytes:
            raise ValueError(f"a compressed spool record holds a {type(payload).__name__}, not a payload")
        try:
            content = inflate(payload, left)
        except InflateError as e:
            raise ValueError(f"a compressed spool record: {e.reason}") from None
        left -= len(content)
        documents += cut(content)
    if left:
        raise ValueError(f"a compressed spool record inflates to {inflated_bytes - left} bytes, not {inflated_bytes}")
    return documents


def _decoder(cut: Callable[[bytes], list[bytes]]) -> Callable[..., Sequence[Event]]:
    def decode(payloads: Any, now: int, drop_metadata: bool, inflated_bytes: Any) -> Sequence[Event]:
        return events_of_documents(_documents(payloads, inflated_bytes, cut), now, drop_metadata)

    return decode


def _held(events: Sequence[Event], payloads: list[bytes], now: int, drop_metadata: bool, inflated_bytes: int) -> int:
    # The documents are about what the payloads inflated to (less the frames' headers).
    return held_bytes(events, inflated_bytes)


# Each decodes as ``json-documents`` decodes the documents it cuts out: a change to what
# that gives needs new names here too.
LUMBERJACK_ZLIB = formats.register("lumberjack-zlib", FIELDS, _decoder(json_frame_documents), _held).name
LOG_COURIER_ZLIB = formats.register("log-courier-zlib", FIELDS, _decoder(record_documents), _held).name


def store_compressed(batch: Batch, name: str, payloads: list[bytes], inflated_bytes: int, events: int) -> None:
    """Have the spool store ``batch`` as ``payloads`` (format ``name``), the compressed
    bytes its ``events`` documents arrived in, when the batch holds them all as
    ``json-documents``; and set what it holds in memory either way (``Batch.held_bytes``).
    ``events`` is how many documents the payloads hold (the caller counted them as it
    read them): a batch with another count (one tag of several, a document that was no
    JSON object) keeps its documents."""
    packed = batch.packed
    if packed is None or packed[0] != JSON_DOCUMENTS:
        return
    documents = packed[1]
    if payloads and events == len(documents):
        batch.packed = (name, payloads, packed[2], packed[3], inflated_bytes)
        batch.held_bytes = held_bytes(batch.events, inflated_bytes)
    else:
        batch.held_bytes = held_bytes(batch.events, sum(map(len, documents)))

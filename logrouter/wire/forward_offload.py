"""The parts of a deferred forward message (``DeferredMessage``), pure, no Twisted.

``ForwardDecoder`` with ``offload_bytes`` set only frames a big message; these
generators build its events later, wherever the caller can afford it (the source runs
them in a worker thread), in parts of about ``part_bytes`` of entries with ``None``
between bounded steps of work: ``list_parts`` for a Forward-mode entry array (already
unpacked while it was framed), ``blob_parts`` for a (Compressed)PackedForward blob.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from logrouter.wire.forward_entries import MSGPACK_ERRORS, EntryTally, collect_events, new_unpacker
from logrouter.wire.forward_messages import EventMessage
from logrouter.wire.forward_packed import DECOMPRESS_STEP_BYTES, check_entries, entries_error, inflated_pieces

_LIST_STEP_ENTRIES = 1 << 16  # parsed entries looked at per step of a deferred message


def list_parts(
    tag: str,
    entries: list[Any],
    chunk: bytes | None,
    options: dict[str, Any],
    size_bytes: int,
    now_ns: Callable[[], int],
    part_bytes: int,
) -> Iterator[EventMessage | None]:
    """Parts of a Forward-mode entry array (already unpacked while it was framed)."""
    count = len(entries)
    # Parsed entries no longer know their wire size: each part takes an even share.
    per_part = max(1, part_bytes * count // max(size_bytes, 1))
    tally = EntryTally()
    for start in range(0, max(count, 1), per_part):
        events: list[tuple[int, dict[str, Any]]] = []
        invalid = 0
        for step in range(start, min(start + per_part, count), _LIST_STEP_ENTRIES):
            if step > start:
                yield None
            got, bad = collect_events(entries[step : min(step + _LIST_STEP_ENTRIES, start + per_part)], now_ns, tally)
            events += got
            invalid += bad
        yield EventMessage(tag, events, chunk, options, invalid, size_bytes if start == 0 else 0)


def blob_parts(
    tag: str,
    blob: str | bytes,
    compressed: Any,
    chunk: bytes | None,
    options: dict[str, Any],
    size_bytes: int,
    max_decompressed: int,
    now_ns: Callable[[], int],
    part_bytes: int,
) -> Iterator[EventMessage | None]:
    """Parts of a (Compressed)PackedForward blob, inflated and unpacked as they go.

    Inflating twice (once to check, once to build) costs far less than building the
    events: zlib runs without the GIL, and it keeps a bad message from yielding parts.
    """
    if type(blob) is str:
        blob = blob.encode("utf-8", "surrogateescape")  # str32 from out_forward
    limit = len(blob) if compressed is None or compressed == "text" else max_decompressed
    yield from check_entries(inflated_pieces(blob, compressed, limit), limit)
    unpacker = new_unpacker(limit + DECOMPRESS_STEP_BYTES + 1)
    tally = EntryTally()
    events: list[tuple[int, dict[str, Any]]] = []
    invalid = 0
    fed = 0
    part_start = 0
    first = True
    step = min(part_bytes, DECOMPRESS_STEP_BYTES)  # parts end on a step: no per-entry check
    for inflated in inflated_pieces(blob, compressed, limit):
        view = memoryview(inflated)
        for start in range(0, len(view), step):
            piece = view[start : start + step]
            unpacker.feed(piece)
            try:
                got, bad = collect_events(unpacker, now_ns, tally)
            except MSGPACK_ERRORS as exc:
                raise entries_error(exc, unpacker, piece, fed) from exc
            fed += len(piece)
            events += got
            invalid += bad
            if unpacker.tell() - part_start >= part_bytes:
                part_start = unpacker.tell()
                yield EventMessage(tag, events, chunk, options, invalid, size_bytes if first else 0)
                events, invalid, first = [], 0, False
            else:
                yield None
    if first or events or invalid:
        yield EventMessage(tag, events, chunk, options, invalid, size_bytes if first else 0)

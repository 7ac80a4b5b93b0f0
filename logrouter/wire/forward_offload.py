"""The parts of a deferred forward message (``DeferredMessage``), pure, no Twisted.

``ForwardDecoder`` with ``offload_bytes`` set only frames a big message; these
generators build its events later, wherever the caller can afford it (the source runs
them in a worker thread), in parts of about ``part_bytes`` of entries with ``None``
between bounded steps of work: ``list_parts`` for a Forward-mode entry array (already
unpacked while it was framed), ``blob_parts`` for a (Compressed)PackedForward blob.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from logrouter.native import NATIVE
from logrouter.wire.forward_entries import (
    MSGPACK_ERRORS,
    EntryTally,
    ForwardDecodeError,
    byte_in,
    collect_events,
    msgpack_problem,
    new_unpacker,
)
from logrouter.wire.forward_lazy import PackedEvents
from logrouter.wire.forward_messages import EventMessage
from logrouter.wire.forward_packed import DECOMPRESS_STEP_BYTES, check_entries, inflated_pieces

_LIST_STEP_ENTRIES = 1 << 16  # parsed entries looked at per step of a deferred message
# A native part carries the bytes of an entry not complete yet into the next step; past
# this it is the Python unpacker's job (re-framing a growing entry each step would not be
# linear).
CARRY_LIMIT_BYTES = 4 * DECOMPRESS_STEP_BYTES


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
    native: Any = NATIVE,
    carry_limit: int = CARRY_LIMIT_BYTES,
) -> Iterator[EventMessage | None]:
    """Parts of a (Compressed)PackedForward blob, inflated and unpacked as they go.

    Inflating twice (once to check, once to build) costs far less than building the
    events: zlib runs without the GIL, and it keeps a bad message from yielding parts.
    The check is the native framer's where it can tell the blob is good (``_checked``),
    else ``check_entries``.
    A part ends after the step of input at which the unpacker has read ``part_bytes``
    since the last one ended, and holds the entries that step completed.

    With the native extension (``native``) the parts stay packed: each is the bytes of
    its entries (``PackedEvents``, and ``packed`` for the spool), found by ``frame``
    (where entries end, and where the unpacker would stand, so the parts are the ones
    the Python path makes) and checked by ``scan``, a step at a time. From an entry it
    does not take, or one left incomplete over more than ``carry_limit`` bytes, the
    rest of the message, from the start of the part, is decoded in Python as before.
    """
    if type(blob) is str:
        blob = blob.encode("utf-8", "surrogateescape")  # str32 from out_forward
    limit = len(blob) if compressed is None or compressed == "text" else max_decompressed
    pieces = inflated_pieces(blob, compressed, limit)
    if native is None or not (yield from _checked(pieces, native, carry_limit)):
        yield from check_entries(inflated_pieces(blob, compressed, limit), limit)
    parts = _Parts(tag, chunk, options, size_bytes, now_ns, part_bytes, limit)
    steps = _steps(inflated_pieces(blob, compressed, limit), min(part_bytes, DECOMPRESS_STEP_BYTES))
    if native is not None:
        yield from parts.packed(steps, native, carry_limit)
    else:
        yield from parts.unpacked(steps, 0, [])


def _checked(pieces: Iterator[Any], native: Any, carry_limit: int) -> Iterator[None]:
    """``check_entries``' pass, by the native framer: True if the entries are all pairs
    and end cleanly, so ``check_entries`` would find nothing; False (after as much of
    the blob as it read) if it cannot say, and ``check_entries`` must. What inflating
    raises is what ``check_entries`` would raise for it: its pieces are the same, and
    it frames as the framer does (msgpack's ``skip`` checks no declared length)."""
    frame = native.frame
    carry = b""
    for piece in pieces:
        data = carry + piece if carry else bytes(piece)
        framed = frame(data)
        if framed is None or len(data) - framed[0] > carry_limit:
            return False
        carry = data[framed[0]:]
        yield None
    return not carry


def _steps(pieces: Iterator[Any], step: int) -> Iterator[Any]:
    # Parts end on a step: no per-entry check.
    for inflated in pieces:
        view = memoryview(inflated)
        for start in range(0, len(view), step):
            yield view[start : start + step]


class _Parts:
    """The parts of one blob, made by the native framer or by msgpack's unpacker; the
    bookkeeping both share: where the current part started (in the unpacker's counting)
    and whether the first part is out."""

    def __init__(
        self,
        tag: str,
        chunk: bytes | None,
        options: dict[str, Any],
        size_bytes: int,
        now_ns: Callable[[], int],
        part_bytes: int,
        limit: int,
    ) -> None:
        self.tag, self.chunk, self.options, self.size_bytes = tag, chunk, options, size_bytes
        self.now_ns = now_ns
        self.part_bytes = part_bytes
        self.limit = limit
        self.part_start = 0
        self.first = True
        self.tally = EntryTally()

    def message(self, events: Any, invalid: int, packed: tuple[bytes, int | None] | None = None) -> EventMessage:
        first, self.first = self.first, False
        return EventMessage(self.tag, events, self.chunk, self.options, invalid,
                            self.size_bytes if first else 0, packed)

    def ends_part(self, tell: int) -> bool:
        if tell - self.part_start >= self.part_bytes:
            self.part_start = tell
            return True
        return False

    def packed(self, steps: Iterator[Any], native: Any, carry_limit: int) -> Iterator[EventMessage | None]:
        frame, scan, now_ns = native.frame, native.scan, self.now_ns
        chunks: list[bytes] = []  # the current part's complete entries
        buckets: dict[int, int] = {}
        now: int | None = None
        carry = b""  # the start of an entry not complete yet
        base = 0  # where carry starts in the stream
        part_base = 0  # where the current part's entries start
        for piece in steps:
            data = carry + piece if carry else bytes(piece)
            framed = frame(data)
            found = None
            if framed is not None and framed[0]:
                found = scan(data, now, framed[0])
                if found is not None and found[1] and now is None:
                    now = now_ns()  # one clock reading for the part's time-0 entries
                    found = scan(data, now, framed[0])
            if framed is None or (framed[0] and found is None) or len(data) - framed[0] > carry_limit:
                # From the part's first entry on, as msgpack's unpacker reads it.
                yield from self.unpacked(steps, part_base, [*chunks, data])
                return
            end, tell = framed
            if end:
                chunks.append(data if end == len(data) else data[:end])
                for bucket, count in found[2]:
                    buckets[bucket] = buckets.get(bucket, 0) + count
            carry = data[end:]
            base += end
            if self.ends_part(base - end + tell):
                yield self._packed_part(chunks, buckets, now)
                chunks, buckets, now, part_base = [], {}, None, base
            else:
                yield None
        if carry:  # check_entries saw the entries end cleanly: never here
            yield from self.unpacked(iter(()), part_base, [*chunks, carry], decided=True)
            return
        if self.first or chunks:
            yield self._packed_part(chunks, buckets, now)

    def _packed_part(self, chunks: list[bytes], buckets: dict[int, int], now: int | None) -> EventMessage:
        if not chunks:
            return self.message([], 0)
        entries = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        events = PackedEvents(entries, now, tuple(buckets.items()), checked=True)  # every chunk was scanned
        self.tally.valid += len(events)
        return self.message(events, 0, (entries, now))

    def unpacked(
        self, steps: Iterator[Any], offset: int, replay: list[bytes], decided: bool = False
    ) -> Iterator[EventMessage | None]:
        """Parts decoded by msgpack's unpacker from stream offset ``offset`` (an entry's
        start): first ``replay``, the stream up to the end of the step being worked on
        (whether it ends a part is to be decided, unless ``decided``), then the rest of
        ``steps``."""
        unpacker = new_unpacker(self.limit + DECOMPRESS_STEP_BYTES + 1)
        now_ns, tally = self.now_ns, self.tally
        events: list[tuple[int, dict[str, Any]]] = []
        invalid = 0
        fed = offset
        step = min(self.part_bytes, DECOMPRESS_STEP_BYTES)
        replayed = [view[start : start + step]
                    for view in map(memoryview, replay) for start in range(0, len(view), step)]
        for index, piece in enumerate(itertools.chain(replayed, steps)):
            unpacker.feed(piece)
            try:
                got, bad = collect_events(unpacker, now_ns, tally)
            except MSGPACK_ERRORS as exc:
                problem = msgpack_problem(exc, offset + unpacker.tell(), byte_in(piece, fed))
                raise ForwardDecodeError(f"PackedForward entries are not valid msgpack: {problem}") from exc
            fed += len(piece)
            events += got
            invalid += bad
            if index >= len(replayed) - 1 + decided and self.ends_part(offset + unpacker.tell()):
                yield self.message(events, invalid)
                events, invalid = [], 0
            else:
                yield None
        if self.first or events or invalid:
            yield self.message(events, invalid)

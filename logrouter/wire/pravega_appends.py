"""Pravega appends, what a writer sends a segment store (``pravega`` has the overview):
``SetupAppend``, ``Append`` (an ``AppendBlock`` with its ``AppendBlockEnd``, or a
standalone ``AppendBlockEnd``), ``ConditionalAppend``; the segment store's decoder of
them (``PravegaServerDecoder``, which also takes ``Hello``, ``KeepAlive`` and
``Padding``) and their encoders. Pure, no Twisted.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

from logrouter.wire.errors import DecodeError
from logrouter.wire.pravega_frames import (
    APPEND_BLOCK,
    APPEND_BLOCK_END,
    CONDITIONAL_APPEND,
    EVENT,
    HEADER,
    HEADER_BYTES,
    HELLO,
    HELLO_BODY,
    INT,
    KEEP_ALIVE,
    LONG,
    MAX_EVENT_BYTES,
    MAX_FRAME_BYTES,
    PADDING,
    PARTIAL_EVENT,
    SETUP_APPEND,
    Fields,
    FrameDecoder,
    Hello,
    KeepAlive,
    command_name,
    encode_modified_utf8,
    frame,
)

_BLOCK_END_SIZES = struct.Struct(">16sii")  # writer id, sizeOfWholeEvents, dataLength
_BLOCK_END_TAIL = struct.Struct(">iq")  # numEvents, lastEventNumber
_COND_HEAD = struct.Struct(">16sqqii")  # writer id, eventNumber, expectedOffset, Event type, Event length


@dataclass(frozen=True, slots=True)
class SetupAppend:
    request_id: int
    writer_id: uuid.UUID
    segment: str
    delegation_token: str


@dataclass(frozen=True, slots=True)
class Append:
    """One append: an ``AppendBlock`` with its ``AppendBlockEnd``, or a standalone
    ``AppendBlockEnd``. ``events`` are the payloads of its whole ``Event`` frames (a
    ``PartialEvent`` at the block's end joined with the end's data), ``num_events`` their
    count, ``size`` the bytes of those ``Event`` frames (what the segment grows by)."""

    writer_id: uuid.UUID
    events: tuple[bytes, ...]
    num_events: int
    last_event_number: int
    request_id: int
    size: int


@dataclass(frozen=True, slots=True)
class ConditionalAppend:
    """One event to store only if the segment's length is ``expected_offset``; ``event``
    is the payload (its ``Event`` frame is ``len(event) + 8`` bytes)."""

    writer_id: uuid.UUID
    event_number: int
    expected_offset: int
    event: bytes
    request_id: int


ServerCommand = Hello | KeepAlive | SetupAppend | Append | ConditionalAppend


class PravegaServerDecoder(FrameDecoder):
    """Incremental decoder for what a segment store reads from a client.

    ``feed(data)`` returns the commands completed by ``data``, in order: ``Hello``,
    ``KeepAlive``, ``SetupAppend``, ``Append``, ``ConditionalAppend``. An ``AppendBlock``
    is held until its ``AppendBlockEnd``; ``pending_bytes`` counts it meanwhile.
    """

    _accepts = frozenset((HELLO, KEEP_ALIVE, PADDING, SETUP_APPEND, APPEND_BLOCK, APPEND_BLOCK_END, CONDITIONAL_APPEND))
    _side = "a client sends to a segment store (only appends are taken)"

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__(max_frame_bytes)
        self.max_event_bytes = max_event_bytes
        self._block: bytes | None = None  # the body of an AppendBlock awaiting its end
        self._writers: dict[bytes, uuid.UUID] = {}  # writer ids seen lately, made once

    @property
    def pending_bytes(self) -> int:
        """Bytes received and not yet decoded into a command: of a frame not complete yet,
        and of an ``AppendBlock`` waiting for its ``AppendBlockEnd``."""
        block = self._block
        return len(self._buffer) + (0 if block is None else len(block) + HEADER_BYTES)

    def _reset(self) -> None:
        self._block = None

    def _check_type(self, kind: int) -> None:
        if self._block is not None and kind != APPEND_BLOCK_END:
            raise DecodeError(f"{command_name(kind)} following an AppendBlock (only AppendBlockEnd may follow)")
        if kind == EVENT:
            raise DecodeError("Event (0) frame outside an append block")
        if kind == PARTIAL_EVENT:
            raise DecodeError("PartialEvent (-2) frame outside an append block")
        super()._check_type(kind)

    def _command(self, kind: int, body: bytes, out: list[Any]) -> None:
        if kind == APPEND_BLOCK_END:
            out.append(self._block_end(body))
        elif kind == APPEND_BLOCK:
            if len(body) < 16:
                raise DecodeError(f"AppendBlock frame of {len(body)} bytes is shorter than its 16-byte writer id")
            self._block = body
        elif kind == SETUP_APPEND:
            f = Fields(body, "SetupAppend")
            out.append(SetupAppend(f.long(), f.uuid(), f.utf(), f.utf_or("")))
        elif kind == HELLO:
            if len(body) < 8:
                raise DecodeError(f"Hello frame of {len(body)} bytes ends inside its fields")
            out.append(Hello(*HELLO_BODY.unpack_from(body)))
        elif kind == KEEP_ALIVE:
            out.append(KeepAlive())
        elif kind == CONDITIONAL_APPEND:
            out.append(self._conditional_append(body))
        # PADDING between commands: skipped, as the Java AppendDecoder does.

    def _writer(self, raw: bytes) -> uuid.UUID:
        writer = self._writers.get(raw)
        if writer is None:
            if len(self._writers) >= 64:
                self._writers.clear()
            writer = self._writers[raw] = uuid.UUID(bytes=raw)
        return writer

    def _block_end(self, body: bytes) -> Append:
        length = len(body)
        if length < 24:
            raise DecodeError(f"AppendBlockEnd frame of {length} bytes ends inside its fields")
        writer, whole, data_length = _BLOCK_END_SIZES.unpack_from(body)
        if data_length < 0:
            raise DecodeError(f"AppendBlockEnd with negative data length {data_length}")
        tail = 24 + data_length
        if tail + 12 > length:
            raise DecodeError(f"AppendBlockEnd frame of {length} bytes ends inside its fields")
        num_events, last_event_number = _BLOCK_END_TAIL.unpack_from(body, tail)
        request_id = LONG.unpack_from(body, tail + 12)[0] if length - tail - 12 >= 8 else -1
        block, self._block = self._block, None
        if num_events <= 0:
            raise DecodeError(f"AppendBlockEnd with invalid number of events {num_events} (must be > 0)")
        if block is None:
            data = body[24:tail]  # the standalone form (the Rust client's)
        else:
            if block[:16] != writer:
                raise DecodeError(
                    f"writer id mismatch: AppendBlock of {uuid.UUID(bytes=block[:16])}, "
                    f"AppendBlockEnd of {uuid.UUID(bytes=writer)}"
                )
            data = self._block_data(block, whole, body[24:tail])
        events = self._events(data, num_events)
        return Append(self._writer(writer), events, num_events, last_event_number, request_id, len(data))

    @staticmethod
    def _block_data(block: bytes, whole: int, end_data: bytes) -> bytes:
        """The event bytes of an AppendBlock (its body, writer id included) and its end's data."""
        size = len(block) - 16
        if whole < 0 or whole > size:
            raise DecodeError(f"invalid sizeOfWholeEvents {whole} in an append block of {size} bytes")
        rest = size - whole
        if rest == 0:
            if end_data:
                raise DecodeError(
                    f"AppendBlockEnd carries {len(end_data)} bytes of data but its block ends without a PartialEvent"
                )
            return block[16:]
        if rest < HEADER_BYTES:
            raise DecodeError(f"append block ends with {rest} bytes after its whole events, not a whole frame")
        at = 16 + whole
        kind, length = HEADER.unpack_from(block, at)
        if kind != PARTIAL_EVENT and kind != PADDING:
            raise DecodeError(
                f"found {command_name(kind)} at the end of an append block, expected a PartialEvent or Padding"
            )
        if length != rest - HEADER_BYTES:
            raise DecodeError(
                f"the {command_name(kind)} at the end of an append block says {length} bytes, "
                f"{rest - HEADER_BYTES} remain in the block"
            )
        if kind == PADDING:
            if end_data:
                raise DecodeError(f"AppendBlockEnd carries {len(end_data)} bytes of data after a Padding block end")
            return block[16:at]
        return block[16:at] + block[at + HEADER_BYTES :] + end_data

    def _events(self, data: bytes, expected: int) -> tuple[bytes, ...]:
        """The payloads of the ``Event`` frames ``data`` consists of (the per-event path)."""
        events: list[bytes] = []
        append = events.append
        unpack = HEADER.unpack_from
        limit = self.max_event_bytes
        pos = 0
        end = len(data)
        while pos < end:
            if end - pos < HEADER_BYTES:
                raise DecodeError(f"append data ends inside the header of event {len(events) + 1}")
            kind, size = unpack(data, pos)
            if kind != EVENT:
                raise DecodeError(f"expected an Event (0) frame in the append data, found {command_name(kind)}")
            if size < 0:
                raise DecodeError(f"Event frame with negative length {size}")
            if size > limit:
                raise DecodeError(f"event of {size} bytes exceeds max_event_bytes {limit}")
            start = pos + HEADER_BYTES
            pos = start + size
            if pos > end:
                raise DecodeError(f"append data ends inside event {len(events) + 1} ({end - start} of {size} bytes)")
            append(data[start:pos])
        if len(events) != expected:
            raise DecodeError(f"AppendBlockEnd says {expected} events, its data holds {len(events)}")
        return tuple(events)

    def _conditional_append(self, body: bytes) -> ConditionalAppend:
        length = len(body)
        if length < _COND_HEAD.size:
            raise DecodeError(f"ConditionalAppend frame of {length} bytes ends inside its fields")
        writer, event_number, expected_offset, kind, size = _COND_HEAD.unpack_from(body)
        if kind != EVENT:
            raise DecodeError(f"ConditionalAppend holds {command_name(kind)}, expected an Event (0) frame")
        if size < 0:
            raise DecodeError(f"ConditionalAppend with a negative event length {size}")
        if size > self.max_event_bytes:
            raise DecodeError(f"event of {size} bytes exceeds max_event_bytes {self.max_event_bytes}")
        start = _COND_HEAD.size
        stop = start + size
        if stop > length:
            raise DecodeError(f"ConditionalAppend frame of {length} bytes ends inside its event ({size} bytes)")
        request_id = LONG.unpack_from(body, stop)[0] if length - stop >= 8 else -1
        return ConditionalAppend(self._writer(writer), event_number, expected_offset, body[start:stop], request_id)


# -- encoders --------------------------------------------------------------------------------


def encode_setup_append(request_id: int, writer_id: uuid.UUID, segment: str, delegation_token: str = "") -> bytes:
    body = LONG.pack(request_id) + writer_id.bytes + encode_modified_utf8(segment) + encode_modified_utf8(delegation_token)
    return frame(SETUP_APPEND, body)


def encode_event(payload: bytes) -> bytes:
    """One ``Event`` frame: how an event travels in an append and is stored in a segment."""
    return frame(EVENT, bytes(payload))


def encode_append_block(writer_id: uuid.UUID, block_bytes: bytes) -> bytes:
    """An ``AppendBlock`` with its block (``Event`` frames, then maybe a ``PartialEvent``
    or ``Padding`` frame)."""
    return frame(APPEND_BLOCK, writer_id.bytes + bytes(block_bytes))


def encode_append_block_end(
    writer_id: uuid.UUID,
    size_of_whole_events: int,
    data: bytes,
    num_events: int,
    last_event_number: int,
    request_id: int,
) -> bytes:
    body = (
        writer_id.bytes
        + INT.pack(size_of_whole_events)
        + INT.pack(len(data))
        + bytes(data)
        + _BLOCK_END_TAIL.pack(num_events, last_event_number)
        + LONG.pack(request_id)
    )
    return frame(APPEND_BLOCK_END, body)


def encode_padding(n: int) -> bytes:
    if n < 0:
        raise ValueError(f"padding length must be >= 0, got {n}")
    return HEADER.pack(PADDING, n) + bytes(n)


def encode_partial_event(fragment: bytes) -> bytes:
    return frame(PARTIAL_EVENT, bytes(fragment))


def encode_conditional_append(
    writer_id: uuid.UUID, event_number: int, expected_offset: int, payload: bytes, request_id: int
) -> bytes:
    body = (
        writer_id.bytes
        + LONG.pack(event_number)
        + LONG.pack(expected_offset)
        + encode_event(payload)
        + LONG.pack(request_id)
    )
    return frame(CONDITIONAL_APPEND, body)

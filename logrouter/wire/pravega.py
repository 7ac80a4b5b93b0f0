"""Pravega segment-store wire protocol codec, pure Python with no Twisted imports.

It owns the bytes of one connection between a Pravega writer and a segment store
(``docs/protocols/pravega.md``; section numbers in comments refer to it):

- ``PravegaServerDecoder``: an incremental decoder for the client->server half. It yields
  ``Hello``, ``KeepAlive``, ``SetupAppend``, ``Append`` (one per ``AppendBlock`` +
  ``AppendBlockEnd`` pair, or per standalone ``AppendBlockEnd`` as the Rust client sends
  them) and ``ConditionalAppend``; ``Padding`` between commands is skipped.
- ``PravegaClientDecoder``: the client side's reader for the server->client half
  (``Hello``, ``KeepAlive``, ``AppendSetup``, ``DataAppended``, ``ConditionalCheckFailed``
  and the error replies), for tests and a future sink.
- Encoders for every one of those commands, both directions, and Java's ``writeUTF`` /
  ``readUTF`` string form (``encode_modified_utf8`` / ``decode_modified_utf8``).

Framing: ``int32 type``, ``int32 length``, ``length`` bytes of fields (section 2). What
this codec decides:

- Any problem raises ``DecodeError`` (always fatal: the segment store closes the
  connection on ``InvalidMessageException``). Its ``messages`` hold the commands the same
  ``feed`` call decoded before the bad frame; later calls raise again. The same bytes give
  the same commands and the same error however they are split into reads: header checks
  (negative length, a frame over ``max_frame_bytes``, an unknown type or one this side
  does not take, anything but ``AppendBlockEnd`` after an ``AppendBlock``) are made as soon
  as the 8-byte header is here, before the body is buffered; field checks once the whole
  frame is.
- Append validation follows the Java ``AppendDecoder`` (section 6.5): ``numEvents`` > 0,
  writer ids of the block and its end match, ``sizeOfWholeEvents`` within the block, the
  block's tail after it exactly one ``PartialEvent`` or ``Padding`` frame, no end data
  after ``Padding``. Stricter than Java, because a log router must not drop data silently:
  end data after a block that has no tail is refused (Java ignores it), and the append
  data must parse as whole ``Event`` frames (type 0, each payload at most
  ``max_event_bytes``) whose count equals ``numEvents``. A standalone ``AppendBlockEnd``
  carries its events in its data; its ``sizeOfWholeEvents`` is not checked (Java ignores
  it too; the Rust client sets it to the data length). Event numbers and whether the
  writer did a ``SetupAppend`` are not tracked here: that is connection state, the source's.
- Trailing-field compatibility as the Java ``readFrom`` methods (section 2): fields read
  only "if available" get Java's defaults (-1 or ""), unknown trailing bytes are skipped.
  A ``SetupAppend`` without its delegation token is also accepted (token ""), which Java
  would refuse; older peers never sent one.
- Strings: modified UTF-8 as Java's ``readUTF`` (``C0 80`` and a raw ``00`` for NUL,
  surrogate pairs as two 3-byte forms). Refused: unpaired surrogates (a Python ``str``
  holding one cannot be encoded later) and overlong forms other than ``C0 80``. Standard
  4-byte UTF-8 forms are accepted (Java refuses them; a non-Java peer may send them).
- Decoding costs time linear in the bytes received: bytes wait in one buffer until the
  frame their header announces is complete (its length is known from the header), then
  the frame is parsed once.
"""

from __future__ import annotations

import re
import struct
import uuid
from dataclasses import dataclass
from typing import Any

from logrouter.wire.errors import DecodeError

__all__ = [
    "Append",
    "AppendSetup",
    "AuthTokenCheckFailed",
    "ConditionalAppend",
    "ConditionalCheckFailed",
    "DataAppended",
    "Hello",
    "InvalidEventNumber",
    "KeepAlive",
    "MAX_EVENT_BYTES",
    "MAX_FRAME_BYTES",
    "NO_EVENT_NUMBER",
    "NoSuchSegment",
    "OLDEST_COMPATIBLE_VERSION",
    "OperationUnsupported",
    "PravegaClientDecoder",
    "PravegaServerDecoder",
    "SegmentIsSealed",
    "SetupAppend",
    "WIRE_VERSION",
    "WrongHost",
    "command_name",
    "decode_modified_utf8",
    "encode_append_block",
    "encode_append_block_end",
    "encode_append_setup",
    "encode_auth_token_check_failed",
    "encode_conditional_append",
    "encode_conditional_check_failed",
    "encode_data_appended",
    "encode_event",
    "encode_hello",
    "encode_invalid_event_number",
    "encode_keep_alive",
    "encode_modified_utf8",
    "encode_no_such_segment",
    "encode_operation_unsupported",
    "encode_padding",
    "encode_partial_event",
    "encode_segment_is_sealed",
    "encode_setup_append",
    "encode_wrong_host",
]

WIRE_VERSION = 17
OLDEST_COMPATIBLE_VERSION = 5
MAX_FRAME_BYTES = 0x00FFFFFF  # MAX_WIRECOMMAND_SIZE: the whole frame, header included (section 1)
MAX_EVENT_BYTES = 8 * 1024 * 1024  # Serializer.MAX_EVENT_SIZE: one event payload (section 6.3)
NO_EVENT_NUMBER = -(1 << 63)  # Long.MIN_VALUE: a new writer's last event number, no previous ack
HEADER_BYTES = 8

# Type codes (section 4).
HELLO = -127
PADDING = -1
PARTIAL_EVENT = -2
EVENT = 0
SETUP_APPEND = 1
APPEND_SETUP = 2
APPEND_BLOCK = 3
APPEND_BLOCK_END = 4
CONDITIONAL_APPEND = 5
DATA_APPENDED = 7
CONDITIONAL_CHECK_FAILED = 8
WRONG_HOST = 50
SEGMENT_IS_SEALED = 51
NO_SUCH_SEGMENT = 53
INVALID_EVENT_NUMBER = 55
OPERATION_UNSUPPORTED = 57
AUTH_TOKEN_CHECK_FAILED = 60
KEEP_ALIVE = 100

_NAMES = {
    HELLO: "Hello",
    PADDING: "Padding",
    PARTIAL_EVENT: "PartialEvent",
    -3: "FlushToStorage",
    -4: "FlushedToStorage",
    -5: "ListStorageChunks",
    -6: "StorageChunksListed",
    EVENT: "Event",
    SETUP_APPEND: "SetupAppend",
    APPEND_SETUP: "AppendSetup",
    APPEND_BLOCK: "AppendBlock",
    APPEND_BLOCK_END: "AppendBlockEnd",
    CONDITIONAL_APPEND: "ConditionalAppend",
    DATA_APPENDED: "DataAppended",
    CONDITIONAL_CHECK_FAILED: "ConditionalCheckFailed",
    9: "ReadSegment",
    10: "SegmentRead",
    11: "GetStreamSegmentInfo",
    12: "StreamSegmentInfo",
    20: "CreateSegment",
    21: "SegmentCreated",
    28: "SealSegment",
    29: "SegmentSealed",
    30: "DeleteSegment",
    31: "SegmentDeleted",
    32: "UpdateSegmentPolicy",
    33: "SegmentPolicyUpdated",
    34: "GetSegmentAttribute",
    35: "SegmentAttribute",
    36: "UpdateSegmentAttribute",
    37: "SegmentAttributeUpdated",
    38: "TruncateSegment",
    39: "SegmentTruncated",
    40: "CreateTransientSegment",
    41: "LocateOffset",
    42: "OffsetLocated",
    WRONG_HOST: "WrongHost",
    SEGMENT_IS_SEALED: "SegmentIsSealed",
    52: "SegmentAlreadyExists",
    NO_SUCH_SEGMENT: "NoSuchSegment",
    INVALID_EVENT_NUMBER: "InvalidEventNumber",
    56: "SegmentIsTruncated",
    OPERATION_UNSUPPORTED: "OperationUnsupported",
    58: "MergeSegments",
    59: "SegmentsMerged",
    AUTH_TOKEN_CHECK_FAILED: "AuthTokenCheckFailed",
    61: "ErrorMessage",
    89: "ConditionalBlockEnd",
    90: "MergeSegmentsBatch",
    91: "SegmentsBatchMerged",
    KEEP_ALIVE: "KeepAlive",
}
_NAMES.update({code: f"table-segment command {code}" for code in range(68, 89)})

_HEADER = struct.Struct(">ii")
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_U16 = struct.Struct(">H")
_HELLO_BODY = struct.Struct(">ii")
_BLOCK_END_SIZES = struct.Struct(">16sii")  # writer id, sizeOfWholeEvents, dataLength
_BLOCK_END_TAIL = struct.Struct(">iq")  # numEvents, lastEventNumber
_COND_HEAD = struct.Struct(">16sqqii")  # writer id, eventNumber, expectedOffset, Event type, Event length


def command_name(code: int) -> str:
    """``"SetupAppend (1)"``, or ``"unknown type 42"`` for a code Pravega does not define."""
    name = _NAMES.get(code)
    return f"{name} ({code})" if name is not None else f"unknown type {code}"


# -- commands ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    high_version: int
    low_version: int


@dataclass(frozen=True, slots=True)
class KeepAlive:
    pass


@dataclass(frozen=True, slots=True)
class SetupAppend:
    request_id: int
    writer_id: uuid.UUID
    segment: str
    delegation_token: str


@dataclass(frozen=True, slots=True)
class AppendSetup:
    request_id: int
    segment: str
    writer_id: uuid.UUID
    last_event_number: int


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


@dataclass(frozen=True, slots=True)
class DataAppended:
    writer_id: uuid.UUID
    event_number: int
    previous_event_number: int
    request_id: int
    current_segment_write_offset: int


@dataclass(frozen=True, slots=True)
class ConditionalCheckFailed:
    writer_id: uuid.UUID
    event_number: int
    request_id: int


@dataclass(frozen=True, slots=True)
class WrongHost:
    request_id: int
    segment: str
    correct_host: str
    server_stack_trace: str


@dataclass(frozen=True, slots=True)
class NoSuchSegment:
    request_id: int
    segment: str
    server_stack_trace: str
    offset: int


@dataclass(frozen=True, slots=True)
class SegmentIsSealed:
    request_id: int
    segment: str
    server_stack_trace: str
    offset: int


@dataclass(frozen=True, slots=True)
class InvalidEventNumber:
    writer_id: uuid.UUID
    request_id: int
    server_stack_trace: str
    event_number: int


@dataclass(frozen=True, slots=True)
class AuthTokenCheckFailed:
    """``error_code``: -1 unspecified, 0 token check failed, 1 token expired."""

    request_id: int
    server_stack_trace: str
    error_code: int


@dataclass(frozen=True, slots=True)
class OperationUnsupported:
    request_id: int
    operation_name: str
    server_stack_trace: str


ServerCommand = Hello | KeepAlive | SetupAppend | Append | ConditionalAppend
ClientCommand = (
    Hello
    | KeepAlive
    | AppendSetup
    | DataAppended
    | ConditionalCheckFailed
    | WrongHost
    | NoSuchSegment
    | SegmentIsSealed
    | InvalidEventNumber
    | AuthTokenCheckFailed
    | OperationUnsupported
)


# -- modified UTF-8 --------------------------------------------------------------------------

_NON_BMP = re.compile("[\U00010000-\U0010ffff]")


def _surrogates(match: re.Match[str]) -> str:
    c = ord(match.group()) - 0x10000
    return chr(0xD800 | (c >> 10)) + chr(0xDC00 | (c & 0x3FF))


def _modified_utf8_body(text: str) -> bytes:
    if text.isascii():
        body = text.encode("ascii")
    else:
        try:
            text.encode("utf-16-be")  # refuses unpaired surrogates
        except UnicodeEncodeError as e:
            raise ValueError(f"string holds an unpaired surrogate at index {e.start}") from None
        body = _NON_BMP.sub(_surrogates, text).encode("utf-8", "surrogatepass")
    if b"\0" in body:
        body = body.replace(b"\0", b"\xc0\x80")
    if len(body) > 0xFFFF:
        raise ValueError(f"string is {len(body)} bytes in modified UTF-8, more than 65535")
    return body


def encode_modified_utf8(text: str) -> bytes:
    """Java's ``DataOutput.writeUTF``: u16 byte length + modified UTF-8 (NUL as ``C0 80``,
    non-BMP characters as two 3-byte surrogates). ``ValueError`` beyond 65535 bytes or for
    a string holding an unpaired surrogate."""
    body = _modified_utf8_body(text)
    return _U16.pack(len(body)) + body


def _decode_utf_body(body: bytes | bytearray | memoryview, what: str) -> str:
    raw = bytes(body)
    if raw.isascii():
        return raw.decode("ascii")  # a raw 00 is NUL for Java's readUTF too
    try:
        text = raw.replace(b"\xc0\x80", b"\0").decode("utf-8", "surrogatepass")
        # Join surrogate pairs (the 3-byte halves of a non-BMP character); a lone one raises.
        return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be")
    except UnicodeDecodeError as e:
        raise DecodeError(f"{what}: invalid modified UTF-8 string ({e.reason})") from None


def decode_modified_utf8(data: bytes | bytearray | memoryview) -> str:
    """Java's ``DataInput.readUTF`` of exactly ``data`` (u16 length + that many bytes);
    ``DecodeError`` for invalid modified UTF-8 or a length that does not match."""
    if len(data) < 2:
        raise DecodeError("modified UTF-8 string: shorter than its 2-byte length")
    size = _U16.unpack_from(data, 0)[0]
    if size != len(data) - 2:
        raise DecodeError(f"modified UTF-8 string: length field says {size} bytes, {len(data) - 2} follow")
    return _decode_utf_body(memoryview(data)[2:], "modified UTF-8 string")


# -- field reading ---------------------------------------------------------------------------


class _Fields:
    """Reads the fields of one frame body, as Java's ``DataInput`` over the frame's slice."""

    __slots__ = ("body", "pos", "what")

    def __init__(self, body: bytes, what: str) -> None:
        self.body = body
        self.pos = 0
        self.what = what

    def available(self) -> int:
        return len(self.body) - self.pos

    def _take(self, n: int) -> int:
        p = self.pos
        if p + n > len(self.body):
            raise DecodeError(f"{self.what} frame of {len(self.body)} bytes ends inside its fields")
        self.pos = p + n
        return p

    def int(self) -> int:
        return _INT.unpack_from(self.body, self._take(4))[0]

    def long(self) -> int:
        return _LONG.unpack_from(self.body, self._take(8))[0]

    def uuid(self) -> uuid.UUID:
        p = self._take(16)
        return uuid.UUID(bytes=self.body[p : p + 16])

    def utf(self) -> str:
        size = _U16.unpack_from(self.body, self._take(2))[0]
        p = self._take(size)
        return _decode_utf_body(self.body[p : p + size], self.what)

    # Fields newer peers add at the end: read only when present (Java's ``available()``).
    def long_or(self, default: int) -> int:
        return self.long() if self.available() >= 8 else default

    def int_or(self, default: int) -> int:
        return self.int() if self.available() >= 4 else default

    def utf_or(self, default: str) -> str:
        return self.utf() if self.available() > 0 else default


# -- the shared framing ----------------------------------------------------------------------


class _FrameDecoder:
    """Cuts the stream into frames and hands each whole one to ``_command``."""

    _accepts: frozenset[int] = frozenset()
    _side = ""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._need = HEADER_BYTES  # the buffer must hold this many bytes before parsing can progress
        self._failed: str | None = None

    @property
    def pending_bytes(self) -> int:
        """Bytes received of a frame not complete yet (0 at a frame boundary)."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        if self._failed is not None:
            raise DecodeError(f"decoder already failed: {self._failed}")
        buf = self._buffer
        buf += data
        if len(buf) < self._need:
            return []
        out: list[Any] = []
        try:
            pos = self._parse(buf, out)
        except DecodeError as error:
            self._failed = error.reason
            self._buffer = bytearray()
            self._reset()
            error.messages = out
            raise
        if pos:
            del buf[:pos]
        return out

    def _parse(self, buf: bytearray, out: list[Any]) -> int:
        pos = 0
        end = len(buf)
        limit = self.max_frame_bytes - HEADER_BYTES
        need = HEADER_BYTES
        while end - pos >= HEADER_BYTES:
            kind, length = _HEADER.unpack_from(buf, pos)
            self._check_type(kind)
            if length < 0:
                raise DecodeError(f"{command_name(kind)} frame with negative length {length}")
            if length > limit:
                raise DecodeError(
                    f"{command_name(kind)} frame of {length + HEADER_BYTES} bytes exceeds max_frame_bytes "
                    f"{self.max_frame_bytes}"
                )
            stop = pos + HEADER_BYTES + length
            if stop > end:
                need = HEADER_BYTES + length
                break
            self._command(kind, bytes(buf[pos + HEADER_BYTES : stop]), out)
            pos = stop
        self._need = need
        return pos

    def _check_type(self, kind: int) -> None:
        if kind not in self._accepts:
            if kind in _NAMES:
                raise DecodeError(f"{command_name(kind)} is not a command {self._side}")
            raise DecodeError(f"unknown wire command type {kind}")

    def _reset(self) -> None:
        pass

    def _command(self, kind: int, body: bytes, out: list[Any]) -> None:
        raise NotImplementedError


# -- the server-side decoder -----------------------------------------------------------------


class PravegaServerDecoder(_FrameDecoder):
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
            f = _Fields(body, "SetupAppend")
            out.append(SetupAppend(f.long(), f.uuid(), f.utf(), f.utf_or("")))
        elif kind == HELLO:
            if len(body) < 8:
                raise DecodeError(f"Hello frame of {len(body)} bytes ends inside its fields")
            out.append(Hello(*_HELLO_BODY.unpack_from(body)))
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
        request_id = _LONG.unpack_from(body, tail + 12)[0] if length - tail - 12 >= 8 else -1
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
        kind, length = _HEADER.unpack_from(block, at)
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
        unpack = _HEADER.unpack_from
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
        request_id = _LONG.unpack_from(body, stop)[0] if length - stop >= 8 else -1
        return ConditionalAppend(self._writer(writer), event_number, expected_offset, body[start:stop], request_id)


# -- the client-side decoder -----------------------------------------------------------------


def _hello(f: _Fields) -> Hello:
    return Hello(f.int(), f.int())


def _append_setup(f: _Fields) -> AppendSetup:
    return AppendSetup(f.long(), f.utf(), f.uuid(), f.long())


def _data_appended(f: _Fields) -> DataAppended:
    return DataAppended(f.uuid(), f.long(), f.long_or(-1), f.long_or(-1), f.long_or(-1))


def _conditional_check_failed(f: _Fields) -> ConditionalCheckFailed:
    return ConditionalCheckFailed(f.uuid(), f.long(), f.long_or(-1))


def _wrong_host(f: _Fields) -> WrongHost:
    return WrongHost(f.long(), f.utf(), f.utf(), f.utf_or(""))


def _no_such_segment(f: _Fields) -> NoSuchSegment:
    return NoSuchSegment(f.long(), f.utf(), f.utf_or(""), f.long_or(-1))


def _segment_is_sealed(f: _Fields) -> SegmentIsSealed:
    return SegmentIsSealed(f.long(), f.utf(), f.utf_or(""), f.long_or(-1))


def _invalid_event_number(f: _Fields) -> InvalidEventNumber:
    return InvalidEventNumber(f.uuid(), f.long(), f.utf_or(""), f.long_or(-1))


def _auth_token_check_failed(f: _Fields) -> AuthTokenCheckFailed:
    return AuthTokenCheckFailed(f.long(), f.utf_or(""), f.int_or(-1))


def _operation_unsupported(f: _Fields) -> OperationUnsupported:
    return OperationUnsupported(f.long(), f.utf(), f.utf_or(""))


_REPLY_READERS = {
    HELLO: _hello,
    APPEND_SETUP: _append_setup,
    DATA_APPENDED: _data_appended,
    CONDITIONAL_CHECK_FAILED: _conditional_check_failed,
    WRONG_HOST: _wrong_host,
    NO_SUCH_SEGMENT: _no_such_segment,
    SEGMENT_IS_SEALED: _segment_is_sealed,
    INVALID_EVENT_NUMBER: _invalid_event_number,
    AUTH_TOKEN_CHECK_FAILED: _auth_token_check_failed,
    OPERATION_UNSUPPORTED: _operation_unsupported,
}


class PravegaClientDecoder(_FrameDecoder):
    """Incremental decoder for what a writer reads from a segment store: ``Hello``,
    ``KeepAlive``, ``AppendSetup``, ``DataAppended``, ``ConditionalCheckFailed``,
    ``WrongHost``, ``NoSuchSegment``, ``SegmentIsSealed``, ``InvalidEventNumber``,
    ``AuthTokenCheckFailed`` and ``OperationUnsupported``."""

    _accepts = frozenset((KEEP_ALIVE, *_REPLY_READERS))
    _side = "this writer-side decoder takes"

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        super().__init__(max_frame_bytes)

    def _command(self, kind: int, body: bytes, out: list[Any]) -> None:
        if kind == KEEP_ALIVE:
            out.append(KeepAlive())
        else:
            out.append(_REPLY_READERS[kind](_Fields(body, _NAMES[kind])))


# -- encoders --------------------------------------------------------------------------------


def _frame(kind: int, body: bytes) -> bytes:
    return _HEADER.pack(kind, len(body)) + body


def encode_hello(high: int = WIRE_VERSION, low: int = OLDEST_COMPATIBLE_VERSION) -> bytes:
    return _frame(HELLO, _HELLO_BODY.pack(high, low))


def encode_keep_alive() -> bytes:
    return _HEADER.pack(KEEP_ALIVE, 0)


def encode_setup_append(request_id: int, writer_id: uuid.UUID, segment: str, delegation_token: str = "") -> bytes:
    body = _LONG.pack(request_id) + writer_id.bytes + encode_modified_utf8(segment) + encode_modified_utf8(delegation_token)
    return _frame(SETUP_APPEND, body)


def encode_append_setup(request_id: int, segment: str, writer_id: uuid.UUID, last_event_number: int) -> bytes:
    body = _LONG.pack(request_id) + encode_modified_utf8(segment) + writer_id.bytes + _LONG.pack(last_event_number)
    return _frame(APPEND_SETUP, body)


def encode_event(payload: bytes) -> bytes:
    """One ``Event`` frame: how an event travels in an append and is stored in a segment."""
    return _frame(EVENT, bytes(payload))


def encode_append_block(writer_id: uuid.UUID, block_bytes: bytes) -> bytes:
    """An ``AppendBlock`` with its block (``Event`` frames, then maybe a ``PartialEvent``
    or ``Padding`` frame)."""
    return _frame(APPEND_BLOCK, writer_id.bytes + bytes(block_bytes))


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
        + _INT.pack(size_of_whole_events)
        + _INT.pack(len(data))
        + bytes(data)
        + _BLOCK_END_TAIL.pack(num_events, last_event_number)
        + _LONG.pack(request_id)
    )
    return _frame(APPEND_BLOCK_END, body)


def encode_padding(n: int) -> bytes:
    if n < 0:
        raise ValueError(f"padding length must be >= 0, got {n}")
    return _HEADER.pack(PADDING, n) + bytes(n)


def encode_partial_event(fragment: bytes) -> bytes:
    return _frame(PARTIAL_EVENT, bytes(fragment))


def encode_conditional_append(
    writer_id: uuid.UUID, event_number: int, expected_offset: int, payload: bytes, request_id: int
) -> bytes:
    body = (
        writer_id.bytes
        + _LONG.pack(event_number)
        + _LONG.pack(expected_offset)
        + encode_event(payload)
        + _LONG.pack(request_id)
    )
    return _frame(CONDITIONAL_APPEND, body)


def encode_data_appended(
    writer_id: uuid.UUID,
    event_number: int,
    previous_event_number: int,
    request_id: int,
    current_segment_write_offset: int,
) -> bytes:
    body = (
        writer_id.bytes
        + _LONG.pack(event_number)
        + _LONG.pack(previous_event_number)
        + _LONG.pack(request_id)
        + _LONG.pack(current_segment_write_offset)
    )
    return _frame(DATA_APPENDED, body)


def encode_conditional_check_failed(writer_id: uuid.UUID, event_number: int, request_id: int) -> bytes:
    return _frame(CONDITIONAL_CHECK_FAILED, writer_id.bytes + _LONG.pack(event_number) + _LONG.pack(request_id))


def encode_wrong_host(request_id: int, segment: str, correct_host: str = "", server_stack_trace: str = "") -> bytes:
    body = (
        _LONG.pack(request_id)
        + encode_modified_utf8(segment)
        + encode_modified_utf8(correct_host)
        + encode_modified_utf8(server_stack_trace)
    )
    return _frame(WRONG_HOST, body)


def encode_no_such_segment(request_id: int, segment: str, server_stack_trace: str = "", offset: int = -1) -> bytes:
    body = _LONG.pack(request_id) + encode_modified_utf8(segment) + encode_modified_utf8(server_stack_trace) + _LONG.pack(offset)
    return _frame(NO_SUCH_SEGMENT, body)


def encode_segment_is_sealed(request_id: int, segment: str, server_stack_trace: str = "", offset: int = -1) -> bytes:
    body = _LONG.pack(request_id) + encode_modified_utf8(segment) + encode_modified_utf8(server_stack_trace) + _LONG.pack(offset)
    return _frame(SEGMENT_IS_SEALED, body)


def encode_invalid_event_number(
    writer_id: uuid.UUID, request_id: int, server_stack_trace: str = "", event_number: int = -1
) -> bytes:
    body = writer_id.bytes + _LONG.pack(request_id) + encode_modified_utf8(server_stack_trace) + _LONG.pack(event_number)
    return _frame(INVALID_EVENT_NUMBER, body)


def encode_auth_token_check_failed(request_id: int, server_stack_trace: str = "", error_code: int = -1) -> bytes:
    body = _LONG.pack(request_id) + encode_modified_utf8(server_stack_trace) + _INT.pack(error_code)
    return _frame(AUTH_TOKEN_CHECK_FAILED, body)


def encode_operation_unsupported(request_id: int, operation_name: str, server_stack_trace: str = "") -> bytes:
    body = _LONG.pack(request_id) + encode_modified_utf8(operation_name) + encode_modified_utf8(server_stack_trace)
    return _frame(OPERATION_UNSUPPORTED, body)

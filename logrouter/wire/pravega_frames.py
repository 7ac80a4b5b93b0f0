"""The Pravega wire protocol's common ground, both directions (``pravega`` has the
overview): type codes and their names, the 8-byte frame header, Java's modified UTF-8
strings, a reader of a frame's fields (``Fields``), the incremental frame cutter both
decoders build on (``FrameDecoder``), and the two commands either side sends, ``Hello``
and ``KeepAlive``. Pure, no Twisted.
"""

from __future__ import annotations

import re
import struct
import uuid
from dataclasses import dataclass
from typing import Any

from logrouter.wire.errors import DecodeError

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

NAMES = {
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
NAMES.update({code: f"table-segment command {code}" for code in range(68, 89)})

HEADER = struct.Struct(">ii")
INT = struct.Struct(">i")
LONG = struct.Struct(">q")
U16 = struct.Struct(">H")
HELLO_BODY = struct.Struct(">ii")


def command_name(code: int) -> str:
    """``"SetupAppend (1)"``, or ``"unknown type 42"`` for a code Pravega does not define."""
    name = NAMES.get(code)
    return f"{name} ({code})" if name is not None else f"unknown type {code}"


# -- the commands of both directions ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    high_version: int
    low_version: int


@dataclass(frozen=True, slots=True)
class KeepAlive:
    pass


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
    return U16.pack(len(body)) + body


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
    size = U16.unpack_from(data, 0)[0]
    if size != len(data) - 2:
        raise DecodeError(f"modified UTF-8 string: length field says {size} bytes, {len(data) - 2} follow")
    return _decode_utf_body(memoryview(data)[2:], "modified UTF-8 string")


# -- field reading ---------------------------------------------------------------------------


class Fields:
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
        return INT.unpack_from(self.body, self._take(4))[0]

    def long(self) -> int:
        return LONG.unpack_from(self.body, self._take(8))[0]

    def uuid(self) -> uuid.UUID:
        p = self._take(16)
        return uuid.UUID(bytes=self.body[p : p + 16])

    def utf(self) -> str:
        size = U16.unpack_from(self.body, self._take(2))[0]
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


class FrameDecoder:
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
            kind, length = HEADER.unpack_from(buf, pos)
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
            if kind in NAMES:
                raise DecodeError(f"{command_name(kind)} is not a command {self._side}")
            raise DecodeError(f"unknown wire command type {kind}")

    def _reset(self) -> None:
        pass

    def _command(self, kind: int, body: bytes, out: list[Any]) -> None:
        raise NotImplementedError


# -- encoders of both directions -------------------------------------------------------------


def frame(kind: int, body: bytes) -> bytes:
    return HEADER.pack(kind, len(body)) + body


def encode_hello(high: int = WIRE_VERSION, low: int = OLDEST_COMPATIBLE_VERSION) -> bytes:
    return frame(HELLO, HELLO_BODY.pack(high, low))


def encode_keep_alive() -> bytes:
    return HEADER.pack(KEEP_ALIVE, 0)

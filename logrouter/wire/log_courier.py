"""Log Courier protocol ("courier") codec, pure Python with no Twisted imports.

It owns the bytes of a Log Courier / Log Carver v2 connection (``docs/protocols/log_courier.md``;
section numbers in comments refer to it):

- ``LogCourierDecoder``: an incremental decoder for the client->server half: ``HELO``,
  ``PING``, ``????``, ``JDAT`` and ``EVNT`` messages (and, leniently, unknown type codes).
- ``AcknDecoder``: the client side's reader for the server->client half: ``VERS``,
  ``PONG``, ``ACKN`` and ``????``.
- Encoders for every message, both directions.

Framing: 4 ASCII type bytes, u32 BE body length, body (section 2). What this codec decides:

- Payloads come whole: a ``Payload`` frame is returned once its ``JDAT`` body, or its
  ``EVNT`` zlib stream, is complete, with all its events. Memory and work per payload
  are bounded by ``max_payload_bytes`` (a ``JDAT`` body, checked from the header; the
  nonce plus compressed stream of an ``EVNT``, checked as it streams),
  ``max_decompressed_bytes`` (inflated records), ``max_event_bytes`` (one record, from
  its length field) and ``max_payload_events`` (records per payload, so tiny records
  cannot turn a payload into millions of objects). An ``EVNT`` is inflated as it arrives,
  across ``feed`` calls, and ends exactly where its zlib stream ends; the bytes after it
  are the next message.
- A record that is not valid JSON, or not a JSON object, does not stop the stream (the
  framing is intact): like the Ruby server it becomes ``{"message": <the record's text>}``
  (UTF-8, malformed bytes as U+FFFD), is counted in ``Payload.invalid`` (first reason in
  ``invalid_reason``) and keeps its place, so ``len(events)`` is the payload's record count
  and an ``ACKN`` sequence is an index into ``events``.
- Unknown type codes: the Ruby server answers ``????`` and carries on, Log Carver closes.
  This decoder is lenient only while the framing is certainly intact: a type of four
  printable ASCII characters with a body of at most ``max_unknown_bytes`` (default 1024)
  is skipped and returned as ``UnrecognizedMessage`` (the source answers ``encode_unknown()``);
  anything else, and any unknown type when ``max_unknown_bytes`` is None, raises.
  Server->client types (``VERS``, ``PONG``, ``ACKN``) sent by a client raise.
- ``HELO`` is decoded wherever it appears; the connection rules (``HELO`` only as the
  first message, a first ``JDAT``/``EVNT`` meaning a pre-handshake client, a later ``HELO``
  answered with ``????`` as the Ruby server does) are the source's: ``messages`` counts the
  messages decoded so far.
- Every other problem raises ``DecodeError`` (always fatal): wrong lengths (``PING``/``????``
  not 0, ``HELO`` over 32, ``JDAT`` under 17, ``EVNT`` not 0xFFFFFFFF), oversize, bad or
  truncated zlib, bytes after a ``JDAT``'s zlib stream, a record cut short. Its
  ``messages`` hold the frames the same ``feed`` call decoded before the bad input; the
  same bytes give the same frames and the same error however they are split into reads.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from logrouter.wire import json_text
from logrouter.wire.errors import DecodeError
from logrouter.wire.inflate import InflateError, StreamInflater, inflate

__all__ = [
    "Ackn",
    "AcknDecoder",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "DEFAULT_MAX_EVENT_BYTES",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MAX_PAYLOAD_EVENTS",
    "DEFAULT_MAX_UNKNOWN_BYTES",
    "Helo",
    "LogCourierDecoder",
    "Payload",
    "Ping",
    "Pong",
    "Unknown",
    "UnrecognizedMessage",
    "Vers",
    "encode_ackn",
    "encode_evnt",
    "encode_helo",
    "encode_jdat",
    "encode_ping",
    "encode_pong",
    "encode_records",
    "encode_unknown",
    "encode_vers",
]

DEFAULT_MAX_PAYLOAD_BYTES = 10_485_760  # GO's JDAT limit and RB's max_packet_size (section 5)
DEFAULT_MAX_EVENT_BYTES = 10_485_760  # GO's per-event limit
# Log Courier's "spool max bytes" (10 MiB of events) makes real payloads inflate to about
# that much; this leaves room and still bounds one connection's memory.
DEFAULT_MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
# Log Courier's "spool size" is 1024 events by default.
DEFAULT_MAX_PAYLOAD_EVENTS = 100_000
DEFAULT_MAX_UNKNOWN_BYTES = 1024

HELO = b"HELO"
VERS = b"VERS"
PING = b"PING"
PONG = b"PONG"
JDAT = b"JDAT"
EVNT = b"EVNT"
ACKN = b"ACKN"
UNKN = b"????"

STREAMED = 0xFFFFFFFF  # the EVNT length field
HANDSHAKE_BYTES = 32
NONCE_BYTES = 16
EVNT_FLAG = 0x01000000  # bit 0x01 of the first flags byte (section 4)

_HEADER = struct.Struct(">4sI")
_U32 = struct.Struct(">I")
_HANDSHAKE = struct.Struct(">IIII4s")  # flags, major, minor, patch, client id
_ACKN_BODY = struct.Struct(">16sI")

_JSON_ERRORS = (ValueError, RecursionError)


# -- frames ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Handshake:
    """The body both sides' handshakes share. ``client_id`` is the 4-byte id without NULs
    (``"LCOR"``, ``"RYLC"``, ``""`` for unknown); ``size`` the body length it came with (0-32)."""

    flags: int
    version: tuple[int, int, int]
    client_id: str
    size: int = HANDSHAKE_BYTES

    @property
    def supports_evnt(self) -> bool:
        return bool(self.flags & EVNT_FLAG)


@dataclass(frozen=True, slots=True)
class Helo(_Handshake):
    """A client's handshake."""


@dataclass(frozen=True, slots=True)
class Vers(_Handshake):
    """A server's handshake answer."""


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Pong:
    pass


@dataclass(frozen=True, slots=True)
class Unknown:
    """The ``????`` message: the peer did not understand our last message."""


@dataclass(frozen=True, slots=True)
class UnrecognizedMessage:
    """A message of a type this codec does not know, skipped (``length`` body bytes).
    The Ruby server answers these with ``????``."""

    code: bytes
    length: int


@dataclass(slots=True)
class Payload:
    """One ``JDAT`` or ``EVNT`` message with all its events, in order.

    ``events`` has one dict per record; records that were not a JSON object are
    ``{"message": text}`` and counted in ``invalid`` (first reason in ``invalid_reason``).
    ``documents`` are the JSON texts of the valid ones, in order (the spool stores those
    rather than encoding the records again).
    Acknowledge with ``encode_ackn(nonce, n)`` once the first ``n`` events are stored.
    """

    kind: str  # "JDAT" or "EVNT"
    nonce: bytes
    events: list[dict[str, Any]] = field(default_factory=list)
    documents: list[bytes] = field(default_factory=list, compare=False, repr=False)
    invalid: int = 0
    invalid_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Ackn:
    nonce: bytes
    sequence: int


Frame = Helo | Ping | Unknown | UnrecognizedMessage | Payload
ServerFrame = Vers | Pong | Ackn | Unknown


def _handshake(body: bytes) -> tuple[int, tuple[int, int, int], str, int]:
    flags, major, minor, patch, ident = _HANDSHAKE.unpack_from(body.ljust(HANDSHAKE_BYTES, b"\0"))
    return flags, (major, minor, patch), ident.rstrip(b"\0").decode("latin-1"), len(body)


def _printable(code: bytes) -> bool:
    return all(0x20 <= c < 0x7F for c in code)


def _show(code: bytes) -> str:
    return code.decode("latin-1") if _printable(code) else "0x" + code.hex()


# -- records -----------------------------------------------------------------------------


def _decode_records(content: bytes, kind: str, nonce: bytes, max_event_bytes: int, max_events: int) -> Payload:
    """The records of an inflated payload: ``u32 BE length`` + JSON, back to back.

    The per-event hot path, in two tight passes: the records cut out (one unpack, one
    slice each), then all of them decoded at once (``json_text.objects_or_none``); a
    record that is not an object msgspec reads sends the payload one by one.
    """
    payload = Payload(kind, nonce)
    raws: list[bytes] = []
    keep = raws.append
    unpack = _U32.unpack_from
    end = len(content)
    pos = 0
    while pos < end:
        if end - pos < 4:
            raise DecodeError(f"{kind} payload ends inside a record length ({end - pos} bytes left over)")
        size = unpack(content, pos)[0]
        if size > max_event_bytes:
            raise DecodeError(f"{kind} event {len(raws) + 1} of {size} bytes exceeds max_event_bytes {max_event_bytes}")
        start = pos + 4
        pos = start + size
        if pos > end:
            raise DecodeError(f"{kind} payload ends inside event {len(raws) + 1} ({end - start} of {size} bytes)")
        if len(raws) >= max_events:
            raise DecodeError(f"{kind} payload holds more than max_payload_events {max_events} events")
        keep(content[start:pos])
    records = json_text.objects_or_none(raws)
    if records is not None:
        payload.events = records
        payload.documents = raws
        return payload
    # Each record on its own, for its own verdict. Inline, not in a helper: JSON decoders
    # count nesting against the recursion limit, and a frame more would change the
    # verdict on a record nested near it.
    fast_loads, fast_refused = json_text.fast_loads, json_text.FAST_REFUSED
    for raw in raws:
        try:
            record = fast_loads(raw)
        except fast_refused:
            try:
                record = json_text.standard_loads(raw)
            except _JSON_ERRORS as e:
                record = e
        except ValueError as e:  # msgspec's own verdict stands (UnicodeDecodeError), as in loads
            record = e
        if record.__class__ is dict:
            payload.events.append(record)
            payload.documents.append(raw)
        else:
            _invalid(payload, record, raw)
            record = None  # an exception's traceback would tie this frame (and the payload) to it
    return payload


def _invalid(payload: Payload, problem: Any, raw: bytes) -> None:
    payload.invalid += 1
    if payload.invalid_reason is None:
        if isinstance(problem, UnicodeDecodeError):
            reason = "not valid UTF-8"
        elif isinstance(problem, BaseException):
            reason = f"not JSON: {problem}"
        else:
            reason = f"a JSON {type(problem).__name__}, not an object"
        payload.invalid_reason = f"event {len(payload.events) + 1}: {reason}"
    payload.events.append({"message": raw.decode("utf-8", "replace")})


# -- the server-side decoder -------------------------------------------------------------


class LogCourierDecoder:
    """Incremental decoder for the client->server half of one Log Courier connection.

    ``feed(data)`` returns the frames completed by ``data`` in order: ``Helo``, ``Ping``,
    ``Unknown``, ``UnrecognizedMessage``, ``Payload``. Raises ``DecodeError`` (fatal) on
    anything it cannot decode, with the frames this call decoded before it in
    ``messages``; later calls raise again.
    """

    def __init__(
        self,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
        max_payload_events: int = DEFAULT_MAX_PAYLOAD_EVENTS,
        max_unknown_bytes: int | None = DEFAULT_MAX_UNKNOWN_BYTES,
    ) -> None:
        self.max_payload_bytes = max_payload_bytes
        self.max_event_bytes = max_event_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self.max_payload_events = max_payload_events
        self.max_unknown_bytes = max_unknown_bytes
        self.messages = 0  # messages decoded so far (HELO is valid only as the first)
        self._buffer = bytearray()
        self._need = 8  # bytes the buffer must hold before parsing can progress
        self._stream: StreamInflater | None = None  # the EVNT being inflated
        self._nonce = b""  # of that EVNT
        self._parts: list[bytes] = []  # its inflated content so far
        self._failed: str | None = None

    @property
    def pending_bytes(self) -> int:
        """Bytes received of a message not complete yet (0 at a message boundary)."""
        stream = self._stream
        if stream is not None:
            return 8 + NONCE_BYTES + stream.consumed
        return len(self._buffer)

    @property
    def nonce_in_progress(self) -> bytes | None:
        """The nonce of a payload whose nonce has arrived but not its end, else None.

        A server that stops reading in the middle of a payload can still tell the client,
        with a partial ``ACKN`` of it, that it is alive (Log Carver's 5-second ACKN)."""
        if self._stream is not None:
            return self._nonce
        buf = self._buffer
        if len(buf) >= 8 + NONCE_BYTES and buf[:4] == JDAT:
            return bytes(buf[8 : 8 + NONCE_BYTES])
        return None

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        if self._failed is not None:
            raise DecodeError(f"decoder already failed: {self._failed}")
        out: list[Frame] = []
        try:
            if self._stream is not None:
                used = self._stream_feed(data, out)
                if self._stream is not None:
                    return out
                data = data[used:]
            buf = self._buffer
            buf += data
            if len(buf) >= self._need:
                self._parse(out)
        except DecodeError as error:
            self._failed = error.reason
            self._buffer = bytearray()  # a new one: a traceback may still hold views of the old
            self._stream = None
            self._parts = []
            error.messages = out
            raise
        return out

    def _parse(self, out: list[Frame]) -> None:
        buf = self._buffer
        end = len(buf)
        pos = 0
        need = 8
        while end - pos >= 8:
            code, length = _HEADER.unpack_from(buf, pos)
            if code == JDAT:
                if length < NONCE_BYTES + 1:
                    raise DecodeError(f"JDAT message of {length} bytes is shorter than 17 (nonce and zlib stream)")
                if length > self.max_payload_bytes:
                    raise DecodeError(f"JDAT message of {length} bytes exceeds max_payload_bytes {self.max_payload_bytes}")
                stop = pos + 8 + length
                if stop > end:
                    need = stop - pos
                    break
                body = memoryview(buf)[pos + 8 : stop]
                try:
                    nonce = bytes(body[:NONCE_BYTES])
                    try:
                        content = inflate(body[NONCE_BYTES:], self.max_decompressed_bytes)
                    except InflateError as e:
                        raise self._inflate_error("JDAT", e) from None
                finally:
                    body.release()
                out.append(self._payload("JDAT", nonce, content))
                pos = stop
            elif code == EVNT:
                if length != STREAMED:
                    raise DecodeError(f"EVNT message with length {length} (must be 0xFFFFFFFF)")
                if end - pos < 8 + NONCE_BYTES:
                    need = 8 + NONCE_BYTES
                    break
                self._nonce = bytes(buf[pos + 8 : pos + 8 + NONCE_BYTES])
                self._parts = []
                # The nonce counts towards max_payload_bytes as it does in a JDAT body.
                self._stream = StreamInflater(
                    self.max_decompressed_bytes, max_input=max(self.max_payload_bytes - NONCE_BYTES, 0)
                )
                start = pos + 8 + NONCE_BYTES
                view = memoryview(buf)[start:]
                try:
                    used = self._stream_feed(view, out)
                finally:
                    view.release()
                if self._stream is not None:
                    buf.clear()  # all of it went into the stream
                    self._need = 8
                    return
                pos = start + used
            elif code == PING or code == UNKN:
                if length:
                    raise DecodeError(f"{code.decode()} message with a {length}-byte body (must be empty)")
                out.append(Ping() if code == PING else Unknown())
                self.messages += 1
                pos += 8
            elif code == HELO:
                if length > HANDSHAKE_BYTES:
                    raise DecodeError(f"HELO message of {length} bytes exceeds {HANDSHAKE_BYTES}")
                stop = pos + 8 + length
                if stop > end:
                    need = stop - pos
                    break
                out.append(Helo(*_handshake(bytes(buf[pos + 8 : stop]))))
                self.messages += 1
                pos = stop
            else:
                if code in (VERS, PONG, ACKN):
                    raise DecodeError(f"{code.decode()} is a server message, sent by the client")
                limit = self.max_unknown_bytes
                if limit is None or not _printable(code):
                    raise DecodeError(f"unknown message type {_show(code)}")
                if length > limit:
                    raise DecodeError(
                        f"unknown message type {_show(code)} with {length} bytes exceeds max_unknown_bytes {limit}"
                    )
                stop = pos + 8 + length
                if stop > end:
                    need = stop - pos
                    break
                out.append(UnrecognizedMessage(code, length))
                self.messages += 1
                pos = stop
        if pos:
            del buf[:pos]
        self._need = need

    def _stream_feed(self, data: bytes | bytearray | memoryview, out: list[Frame]) -> int:
        """Hand ``data`` to the EVNT being inflated; once it ends, add its ``Payload``.
        Return how many bytes of ``data`` belonged to the EVNT (the rest is the next message)."""
        stream = self._stream
        assert stream is not None
        try:
            piece = stream.feed(data, keep_unused=False)
        except InflateError as e:
            raise self._inflate_error("EVNT", e) from None
        if piece:
            self._parts.append(piece)
        if not stream.eof:
            return len(data)
        content = b"".join(self._parts)
        self._parts = []
        self._stream = None
        out.append(self._payload("EVNT", self._nonce, content))
        return stream.last_used

    def _inflate_error(self, kind: str, error: InflateError) -> DecodeError:
        if error.too_big and "inflates" in error.reason:
            return DecodeError(f"{kind} payload inflates to more than max_decompressed_bytes {self.max_decompressed_bytes}")
        if error.too_big:
            return DecodeError(f"{kind} payload exceeds max_payload_bytes {self.max_payload_bytes}")
        return DecodeError(f"{kind} payload: {error.reason}")

    def _payload(self, kind: str, nonce: bytes, content: bytes) -> Payload:
        payload = _decode_records(content, kind, nonce, self.max_event_bytes, self.max_payload_events)
        self.messages += 1
        return payload


# -- the client-side reader --------------------------------------------------------------


class AcknDecoder:
    """Reads the server->client half: ``VERS``, ``PONG``, ``ACKN`` and ``????`` (used by
    tests and clients). Anything else, or a wrong length, raises ``DecodeError`` (Log
    Courier's client closes the connection too), with the frames the same call decoded
    before it in ``messages``."""

    def __init__(self) -> None:
        self._buffer = b""
        self._failed: str | None = None

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[ServerFrame]:
        if self._failed is not None:
            raise DecodeError(f"decoder already failed: {self._failed}")
        buf = self._buffer + bytes(data) if self._buffer else bytes(data)
        out: list[ServerFrame] = []
        pos = 0
        end = len(buf)
        try:
            while end - pos >= 8:
                code, length = _HEADER.unpack_from(buf, pos)
                if code == ACKN:
                    if length != _ACKN_BODY.size:
                        raise DecodeError(f"ACKN message of {length} bytes (must be 20)")
                elif code == PONG or code == UNKN:
                    if length:
                        raise DecodeError(f"{code.decode()} message with a {length}-byte body (must be empty)")
                elif code == VERS:
                    if length > HANDSHAKE_BYTES:
                        raise DecodeError(f"VERS message of {length} bytes exceeds {HANDSHAKE_BYTES}")
                elif code in (JDAT, EVNT, HELO, PING):
                    raise DecodeError(f"{code.decode()} is a client message, sent by the server")
                else:
                    raise DecodeError(f"unknown message type {_show(code)}")
                stop = pos + 8 + length
                if stop > end:
                    break
                if code == ACKN:
                    out.append(Ackn(*_ACKN_BODY.unpack_from(buf, pos + 8)))
                elif code == VERS:
                    out.append(Vers(*_handshake(buf[pos + 8 : stop])))
                else:
                    out.append(Pong() if code == PONG else Unknown())
                pos = stop
        except DecodeError as error:
            self._failed = error.reason
            self._buffer = b""
            error.messages = out
            raise
        self._buffer = buf[pos:]
        return out


# -- encoders ----------------------------------------------------------------------------


def _message(code: bytes, body: bytes = b"") -> bytes:
    return _HEADER.pack(code, len(body)) + body


def _handshake_body(
    supports_evnt: bool, version: tuple[int, int, int], client_id: bytes | str, flags: int | None, size: int
) -> bytes:
    if isinstance(client_id, str):
        client_id = client_id.encode("ascii")
    if len(client_id) > 4:
        raise ValueError(f"client id must be at most 4 bytes, got {client_id!r}")
    if not 0 <= size <= HANDSHAKE_BYTES:
        raise ValueError(f"handshake body size must be 0..32, got {size}")
    if flags is None:
        flags = EVNT_FLAG if supports_evnt else 0
    body = _HANDSHAKE.pack(flags, *version, client_id.ljust(4, b"\0")).ljust(HANDSHAKE_BYTES, b"\0")
    return body[:size]


def encode_helo(
    supports_evnt: bool = False,
    version: tuple[int, int, int] = (2, 12, 0),
    client_id: bytes | str = b"LCOR",
    *,
    flags: int | None = None,
    size: int = HANDSHAKE_BYTES,
) -> bytes:
    """A client's ``HELO``: 32-byte body (the Ruby client sends ``size=20``). ``flags``
    overrides ``supports_evnt`` (the EVNT bit is 0x01000000, the first body byte)."""
    return _message(HELO, _handshake_body(supports_evnt, version, client_id, flags, size))


def encode_vers(
    supports_evnt: bool = True,
    version: tuple[int, int, int] = (2, 12, 0),
    client_id: bytes | str = b"LCVR",
    *,
    flags: int | None = None,
    size: int = HANDSHAKE_BYTES,
) -> bytes:
    """A server's ``VERS`` (Log Carver sets the EVNT bit; the Ruby server sends 20 bytes
    with flags 0 and ``RYLC``)."""
    return _message(VERS, _handshake_body(supports_evnt, version, client_id, flags, size))


def encode_ping() -> bytes:
    return _message(PING)


def encode_pong() -> bytes:
    return _message(PONG)


def encode_unknown() -> bytes:
    """``????``: the answer to a message the receiver does not understand."""
    return _message(UNKN)


def _nonce(nonce: bytes) -> bytes:
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be 16 bytes, got {len(nonce)}")
    return bytes(nonce)


def encode_ackn(nonce: bytes, sequence: int) -> bytes:
    """``ACKN``: the first ``sequence`` events of the payload are done (0 = keepalive)."""
    return _message(ACKN, _ACKN_BODY.pack(_nonce(nonce), sequence))


def encode_records(events: Iterable[Mapping[str, Any] | str | bytes]) -> bytes:
    """A payload's inflated content: each event as ``u32 BE length`` + JSON. Mappings are
    serialised compactly (as Go's encoding/json does); str/bytes are sent as they are."""
    parts: list[bytes] = []
    for event in events:
        if isinstance(event, Mapping):
            event = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        if isinstance(event, str):
            event = event.encode()
        parts += (_U32.pack(len(event)), event)
    return b"".join(parts)


def encode_jdat(nonce: bytes, events: Iterable[Mapping[str, Any] | str | bytes], level: int = 3) -> bytes:
    """``JDAT``: nonce + one zlib stream of the records (Log Courier compresses at level 3)."""
    blob = zlib.compress(encode_records(events), level)
    return _message(JDAT, _nonce(nonce) + blob)


def encode_evnt(nonce: bytes, events: Iterable[Mapping[str, Any] | str | bytes], level: int = 3) -> bytes:
    """``EVNT``: length 0xFFFFFFFF, nonce, then the zlib stream; the message ends with it."""
    blob = zlib.compress(encode_records(events), level)
    return _HEADER.pack(EVNT, STREAMED) + _nonce(nonce) + blob

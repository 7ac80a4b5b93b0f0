"""Log Courier protocol ("courier") codec, pure Python with no Twisted imports.

It owns the bytes of a Log Courier / Log Carver v2 connection (``docs/protocols/log_courier.md``;
section numbers in comments refer to it):

- ``LogCourierDecoder``: an incremental decoder for the client->server half: ``HELO``,
  ``PING``, ``????``, ``JDAT`` and ``EVNT`` messages (and, leniently, unknown type codes).
- ``AcknDecoder``: the client side's reader for the server->client half: ``VERS``,
  ``PONG``, ``ACKN`` and ``????``.
- Encoders for every message, both directions.

The message types and their encoders are ``log_courier_messages``'; a payload's records
(``Payload``, cutting an inflated payload into records, the verdict on one that is not a
JSON object) are ``log_courier_records``'. This module decodes the stream of messages:
the framing, the ``JDAT`` bodies and the ``EVNT`` zlib streams inflated as they arrive,
and the limits on them. It exports the other two's public names, so users import this one.

Framing: 4 ASCII type bytes, u32 BE body length, body (section 2). What this codec decides:

- Payloads come whole: a ``Payload`` frame is returned once its ``JDAT`` body, or its
  ``EVNT`` zlib stream, is complete, with all its events, and the zlib stream as it came
  (``Payload.compressed``, which the spool may store instead of the documents). Memory and work per payload
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

from logrouter.wire.errors import DecodeError
from logrouter.wire.inflate import InflateError, StreamInflater, inflate
from logrouter.wire.log_courier_messages import (
    ACKN,
    ACKN_BODY,
    EVNT,
    EVNT_FLAG,
    HANDSHAKE_BYTES,
    HEADER,
    HELO,
    JDAT,
    NONCE_BYTES,
    PING,
    PONG,
    STREAMED,
    UNKN,
    VERS,
    Ackn,
    Frame,
    Helo,
    Ping,
    Pong,
    ServerFrame,
    Unknown,
    UnrecognizedMessage,
    Vers,
    encode_ackn,
    encode_evnt,
    encode_helo,
    encode_jdat,
    encode_ping,
    encode_pong,
    encode_unknown,
    encode_vers,
    handshake_fields,
    printable,
    show_code,
)
from logrouter.wire.log_courier_records import Payload, decode_payload, decode_records, encode_records

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
    "decode_payload",
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
        keep_documents: bool = False,
    ) -> None:
        self.max_payload_bytes = max_payload_bytes
        self.max_event_bytes = max_event_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self.max_payload_events = max_payload_events
        self.max_unknown_bytes = max_unknown_bytes
        self.keep_documents = keep_documents  # Payload.undecoded where the extension takes them
        self.messages = 0  # messages decoded so far (HELO is valid only as the first)
        self._buffer = bytearray()
        self._need = 8  # bytes the buffer must hold before parsing can progress
        self._stream: StreamInflater | None = None  # the EVNT being inflated
        self._nonce = b""  # of that EVNT
        self._parts: list[bytes] = []  # its inflated content so far
        self._compressed: list[bytes] = []  # its zlib stream so far, as received
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
            self._compressed = []
            error.messages = out
            raise
        return out

    def _parse(self, out: list[Frame]) -> None:
        buf = self._buffer
        end = len(buf)
        pos = 0
        need = 8
        while end - pos >= 8:
            code, length = HEADER.unpack_from(buf, pos)
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
                    compressed = bytes(body[NONCE_BYTES:])  # kept as received (Payload.compressed)
                finally:
                    body.release()
                try:
                    content = inflate(compressed, self.max_decompressed_bytes)
                except InflateError as e:
                    raise self._inflate_error("JDAT", e) from None
                out.append(self._payload("JDAT", nonce, content, compressed))
                pos = stop
            elif code == EVNT:
                if length != STREAMED:
                    raise DecodeError(f"EVNT message with length {length} (must be 0xFFFFFFFF)")
                if end - pos < 8 + NONCE_BYTES:
                    need = 8 + NONCE_BYTES
                    break
                self._nonce = bytes(buf[pos + 8 : pos + 8 + NONCE_BYTES])
                self._parts = []
                self._compressed = []
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
                out.append(Helo(*handshake_fields(bytes(buf[pos + 8 : stop]))))
                self.messages += 1
                pos = stop
            else:
                if code in (VERS, PONG, ACKN):
                    raise DecodeError(f"{code.decode()} is a server message, sent by the client")
                limit = self.max_unknown_bytes
                if limit is None or not printable(code):
                    raise DecodeError(f"unknown message type {show_code(code)}")
                if length > limit:
                    raise DecodeError(
                        f"unknown message type {show_code(code)} with {length} bytes exceeds max_unknown_bytes {limit}"
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
            self._compressed.append(bytes(data))
            return len(data)
        self._compressed.append(bytes(data[: stream.last_used]))
        content = b"".join(self._parts)
        compressed = b"".join(self._compressed)
        self._parts = []
        self._compressed = []
        self._stream = None
        out.append(self._payload("EVNT", self._nonce, content, compressed))
        return stream.last_used

    def _inflate_error(self, kind: str, error: InflateError) -> DecodeError:
        if error.too_big and "inflates" in error.reason:
            return DecodeError(f"{kind} payload inflates to more than max_decompressed_bytes {self.max_decompressed_bytes}")
        if error.too_big:
            return DecodeError(f"{kind} payload exceeds max_payload_bytes {self.max_payload_bytes}")
        return DecodeError(f"{kind} payload: {error.reason}")

    def _payload(self, kind: str, nonce: bytes, content: bytes, compressed: bytes) -> Payload:
        payload = decode_records(content, kind, nonce, self.max_event_bytes, self.max_payload_events, self.keep_documents)
        payload.compressed = compressed
        payload.inflated_bytes = len(content)
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
                code, length = HEADER.unpack_from(buf, pos)
                if code == ACKN:
                    if length != ACKN_BODY.size:
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
                    raise DecodeError(f"unknown message type {show_code(code)}")
                stop = pos + 8 + length
                if stop > end:
                    break
                if code == ACKN:
                    out.append(Ackn(*ACKN_BODY.unpack_from(buf, pos + 8)))
                elif code == VERS:
                    out.append(Vers(*handshake_fields(buf[pos + 8 : stop])))
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

"""Fluentd forward protocol codec (transport phase), pure Python with no Twisted imports.

It owns the bytes a forward client sends and the ack a server answers with:

- ``ForwardDecoder``: an incremental decoder for one client->server TCP stream. It picks
  msgpack or JSON from the connection's first byte (as in_forward does), frames messages,
  tells the carrier modes apart (Message, Forward, PackedForward, CompressedPackedForward,
  ``nil`` heartbeat), inflates gzip/zstd blobs under a size limit, and turns every event
  time into an ``int`` of nanoseconds since the epoch.
- Encoders for acks and for the three carrier modes (used by tests and forward clients).

Wire facts and the quirks of real peers are in ``protocols/fluent-forward.md``; the
section numbers in comments below refer to it. The handshake (HELO/PING/PONG) is in
``fluent_handshake``.
"""

from __future__ import annotations

import codecs
import gzip
import json
import math
import re
import struct
import time as _time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from logrouter.wire.errors import DecodeError

try:
    import zstandard
except ImportError:  # zstd is optional: fluentd itself calls it experimental (section 5)
    zstandard = None

__all__ = [
    "EventMessage",
    "EventNanos",
    "ForwardDecodeError",
    "ForwardDecoder",
    "Heartbeat",
    "decode_ack",
    "encode_ack",
    "encode_event_time",
    "encode_forward",
    "encode_message",
    "encode_packed_forward",
]

NANOS_PER_SECOND = 1_000_000_000
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024

EVENT_TIME_EXT_CODE = 0
_EVENT_TIME = struct.Struct(">II")  # u32 seconds, u32 nanoseconds (section 6)

# One inflate/read step produces at most this much, so a bomb is caught one step after
# it passes the limit instead of after it has filled memory.
_DECOMPRESS_STEP_BYTES = 1 << 20


# -- results and errors ------------------------------------------------------------------


class ForwardDecodeError(DecodeError):
    """Input the forward decoder cannot decode.

    ``messages`` holds the messages decoded from the same ``feed`` call before the bad
    input; the caller may act on them or drop them (the client resends unacked chunks).
    """

    def __init__(self, reason: str, fatal: bool = True) -> None:
        super().__init__(reason, fatal)
        self.messages: list[EventMessage | Heartbeat] = []


@dataclass(slots=True)
class EventMessage:
    """One forward request: a tag and its valid events.

    ``chunk`` is the ``chunk`` option's bytes exactly as received (None when the client
    wants no ack); echo it unchanged. ``invalid`` counts events skipped for a bad time or a
    record that is not a map: like fluentd, the request is still acked. ``size_bytes`` is
    the message's size on the wire (characters in JSON mode), for metrics.
    """

    tag: str
    events: list[tuple[int, dict[str, Any]]]
    chunk: bytes | None
    options: dict[str, Any]
    invalid: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A msgpack ``nil`` message: a TCP keepalive no-op (section 9)."""


_HEARTBEAT = Heartbeat()


class EventNanos(int):
    """An EventTime already converted to nanoseconds by the unpacker's ext hook.

    Being a distinct type is what tells the event loop not to scale it as seconds. It
    only escapes the decoder inside records (an EventTime nested in a record value).
    """

    __slots__ = ()


def _ext_hook(code: int, data: bytes) -> Any:
    # Converting here keeps the per-event loop to a type check (see _collect_events).
    # Both fixext8 (d7 00) and ext8 (c7 08 00) arrive here with 8 bytes of data.
    if code == EVENT_TIME_EXT_CODE and len(data) == 8:
        seconds, nanos = _EVENT_TIME.unpack(data)
        return EventNanos(seconds * NANOS_PER_SECOND + nanos)
    return msgpack.ExtType(code, data)


def _new_unpacker(max_buffer_size: int) -> msgpack.Unpacker:
    # raw=False + surrogateescape: out_forward puts binary msgpack inside a str32 and Fluent
    # Bit sends raw salt bytes as str (section 2), so strings must decode losslessly.
    return msgpack.Unpacker(
        raw=False,
        unicode_errors="surrogateescape",
        max_buffer_size=max_buffer_size,
        strict_map_key=False,
        ext_hook=_ext_hook,
    )


# msgpack's own errors for garbage: FormatError/StackError/limit errors are ValueErrors,
# TypeError comes from unhashable map keys (e.g. an array used as a key).
_MSGPACK_ERRORS = (ValueError, TypeError, msgpack.UnpackException)


# -- events ------------------------------------------------------------------------------


def _time_ns(value: Any) -> int | None:
    """The slow path for times that are neither int seconds nor EventTime; None if invalid."""
    kind = type(value)
    if kind is int:
        return value * NANOS_PER_SECOND
    if kind is EventNanos:
        return int(value)
    if kind is float:
        # fluentd rejects floats; we accept them as seconds rather than drop the event.
        return round(value * NANOS_PER_SECOND) if math.isfinite(value) else None
    if kind is msgpack.Timestamp:  # ext -1 (fluentd's enable_msgpack_time_support)
        return value.to_unix_nano()
    if kind is list and value and type(value[0]) is not list:
        return _time_ns(value[0])  # Fluent Bit's [time, metadata] (section 5)
    return None


def _str_keyed(record: dict[Any, Any]) -> dict[str, Any]:
    """A copy of ``record`` with str keys: bin keys decode as UTF-8 losslessly, others via str()."""
    return {
        key if type(key) is str
        else key.decode("utf-8", "surrogateescape") if type(key) is bytes
        else str(key): value
        for key, value in record.items()
    }


def _collect_events(
    entries: Iterable[Any], now_ns: Callable[[], int]
) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """Valid ``(time_ns, record)`` events from ``[time, record]`` entries, and the invalid count.

    This is the per-event path: keep it to type checks and one append.
    """
    events: list[tuple[int, dict[str, Any]]] = []
    append = events.append
    invalid = 0
    now = None
    for entry in entries:
        try:
            time, record = entry
        except (TypeError, ValueError):
            invalid += 1
            continue
        if type(record) is not dict:
            invalid += 1
            continue
        kind = type(time)
        if kind is EventNanos:
            time_ns = time + 0  # a plain int again
        elif kind is int:
            time_ns = time * NANOS_PER_SECOND
        else:
            time_ns = _time_ns(time)
            if time_ns is None:
                invalid += 1
                continue
        if not time_ns:  # time 0 means "now" (in_forward); one clock read per message
            if now is None:
                now = now_ns()
            time_ns = now
        for key in record:
            if type(key) is not str:
                record = _str_keyed(record)
                break
        append((time_ns, record))
    return events, invalid


# -- decompression -----------------------------------------------------------------------


def _too_big(limit: int) -> ForwardDecodeError:
    return ForwardDecodeError(f"decompressed entries exceed max_decompressed_bytes ({limit})")


def _gunzip(blob: bytes, limit: int) -> bytes:
    """Inflate one or more concatenated gzip members, never producing more than limit+1 bytes."""
    parts: list[bytes] = []
    total = 0
    rest = blob
    try:
        while rest:  # one gzip member per round (compressable.rb concatenates members)
            inflater = zlib.decompressobj(wbits=31)
            pending = rest
            while not inflater.eof:
                piece = inflater.decompress(pending, min(limit - total + 1, _DECOMPRESS_STEP_BYTES))
                total += len(piece)
                if total > limit:
                    raise _too_big(limit)
                parts.append(piece)
                pending = inflater.unconsumed_tail
                if not pending and not piece and not inflater.eof:
                    raise ForwardDecodeError("bad gzip data: truncated member")
            rest = inflater.unused_data
    except zlib.error as exc:
        raise ForwardDecodeError(f"bad gzip data: {exc}") from exc
    return b"".join(parts)


def _unzstd(blob: bytes, limit: int) -> bytes:
    """Inflate concatenated zstd frames, never producing more than limit+1 bytes.

    zstandard's stream reader does not report a truncated last frame; a cut inside an
    entry is still caught when the entries are unpacked.
    """
    if zstandard is None:
        raise ForwardDecodeError("compressed 'zstd' needs the zstandard package (not installed)")
    parts: list[bytes] = []
    total = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(blob, read_across_frames=True) as reader:
            while True:
                piece = reader.read(min(limit - total + 1, _DECOMPRESS_STEP_BYTES))
                if not piece:
                    break
                total += len(piece)
                if total > limit:
                    raise _too_big(limit)
                parts.append(piece)
    except zstandard.ZstdError as exc:
        raise ForwardDecodeError(f"bad zstd data: {exc}") from exc
    return b"".join(parts)


def _entries_end_cleanly(unpacker: msgpack.Unpacker) -> bool:
    """Whether an exhausted entry unpacker stopped between entries rather than inside one.

    Unpacker.tell() cannot say: it counts the bytes of a half-parsed entry as consumed. A
    lone nil fed afterwards comes back as a top-level nil only at an entry boundary;
    inside an entry it completes or extends the partial one instead.
    """
    unpacker.feed(b"\xc0")
    try:
        return unpacker.unpack() is None
    except (msgpack.OutOfData, *_MSGPACK_ERRORS):
        return False


# -- framing -----------------------------------------------------------------------------


def _oversize(limit: int, detail: str = "") -> ForwardDecodeError:
    return ForwardDecodeError(f"message exceeds max_message_bytes ({limit}){detail}")


class _MsgpackFramer:
    """Splits a msgpack byte stream into top-level objects, each at most ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._unpacker = _new_unpacker(limit)
        self._fed = 0  # stream offset of the end of everything fed so far
        self._message_start = 0  # stream offset where the current message began

    def frames(self, data: bytes) -> Iterator[tuple[Any, int]]:
        """Yield ``(object, wire_size)`` for each message completed by ``data``."""
        unpacker = self._unpacker
        while data:
            # The unpacker raises BufferFull when its unparsed bytes would pass
            # max_buffer_size, even if they hold many small messages: feed only what fits
            # and drain between feeds. Bytes of a half-parsed message count as parsed in
            # tell(), so the room is measured from there.
            room = self._limit - (self._fed - unpacker.tell())
            if room <= 0:
                raise _oversize(self._limit)
            if len(data) <= room:
                piece, data = data, b""
            else:
                view = memoryview(data)
                piece, data = view[:room], view[room:]
            unpacker.feed(piece)
            self._fed += len(piece)
            yield from self._drain()

    def _drain(self) -> Iterator[tuple[Any, int]]:
        unpacker = self._unpacker
        while True:
            try:
                obj = unpacker.unpack()
            except msgpack.OutOfData:
                # Big messages are parsed incrementally, so the buffer limit alone would
                # never stop a huge array of small items: count the message's bytes.
                if self._fed - self._message_start > self._limit:
                    raise _oversize(self._limit) from None
                return
            except _MSGPACK_ERRORS as exc:
                # A declared str/bin/array length over the unpacker's limits (which follow
                # max_buffer_size) is an over-size message, reported as such.
                if "exceeds max_" in str(exc):
                    raise _oversize(self._limit, f": {exc}") from exc
                raise ForwardDecodeError(f"invalid msgpack: {exc}") from exc
            end = unpacker.tell()
            size = end - self._message_start
            self._message_start = end
            if size > self._limit:
                raise _oversize(self._limit)
            yield obj, size


_JSON_WHITESPACE = re.compile(r"[ \t\r\n]*")
_JSON_BRACKET_OR_QUOTE = re.compile(r'[\[\]{}"]')
_JSON_QUOTE_OR_BACKSLASH = re.compile(r'["\\]')


class _JsonFramer:
    """Splits a stream of JSON arrays/objects into values (in_forward's JSON mode).

    json.JSONDecoder cannot tell a truncated value from a broken one, so a small scanner
    finds where each top-level value ends (bracket depth outside strings) and only whole
    values are parsed: a parse error is then always garbage. Limits count characters.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._text = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self._parser = json.JSONDecoder()
        self._pieces: list[str] = []  # text received so far of the value in progress
        self._pending_chars = 0
        self._in_value = False
        self._depth = 0
        self._in_string = False
        self._skip_next_char = False  # the previous piece ended in a backslash in a string

    def frames(self, data: bytes) -> Iterator[tuple[Any, int]]:
        text = self._text.decode(data)
        pos = 0
        while pos < len(text):
            if not self._in_value:
                pos = _JSON_WHITESPACE.match(text, pos).end()
                if pos == len(text):
                    return
                if text[pos] not in "[{":
                    found = text[pos]
                    raise ForwardDecodeError(f"invalid JSON stream: expected an array, found {found!r}")
                self._in_value = True
            end = self._value_end(text, pos)
            self._keep(text[pos:end])
            if end == len(text) and self._in_value:
                return
            value_text = "".join(self._pieces)
            self._pieces.clear()
            self._pending_chars = 0
            yield self._parse(value_text), len(value_text)
            pos = end

    def _keep(self, piece: str) -> None:
        self._pieces.append(piece)
        self._pending_chars += len(piece)
        if self._pending_chars > self._limit:
            raise _oversize(self._limit)

    def _value_end(self, text: str, pos: int) -> int:
        """Index just past the current value's closing bracket, or len(text) if it goes on."""
        depth, in_string = self._depth, self._in_string
        if self._skip_next_char:
            pos += 1
            self._skip_next_char = False
        while True:
            if in_string:
                match = _JSON_QUOTE_OR_BACKSLASH.search(text, pos)
                if match is None:
                    break
                if match.group() == "\\":
                    pos = match.end() + 1  # skip the escaped character
                    if pos > len(text):
                        self._skip_next_char = True
                        break
                    continue
                in_string = False
                pos = match.end()
            else:
                match = _JSON_BRACKET_OR_QUOTE.search(text, pos)
                if match is None:
                    break
                char = match.group()
                pos = match.end()
                if char == '"':
                    in_string = True
                elif char in "[{":
                    depth += 1
                else:
                    depth -= 1
                    if depth == 0:
                        self._depth, self._in_string, self._in_value = 0, False, False
                        return pos
        self._depth, self._in_string = depth, in_string
        return len(text)

    def _parse(self, value_text: str) -> Any:
        try:
            return self._parser.decode(value_text)
        except json.JSONDecodeError as exc:
            raise ForwardDecodeError(f"invalid JSON: {exc}") from exc


# -- the decoder -------------------------------------------------------------------------


def _tag_of(value: Any) -> str:
    if type(value) is str:
        return value
    if type(value) is bytes:  # Ruby sends binary-encoded strings as bin; it is still a String
        return value.decode("utf-8", "surrogateescape")
    raise ForwardDecodeError(f"tag is not a string (got {type(value).__name__})")


def _options_of(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if type(value) is not dict:
        raise ForwardDecodeError(f"options is not a map (got {type(value).__name__})")
    for key in value:
        if type(key) is not str:
            return _str_keyed(value)
    return value


def _chunk_of(options: dict[str, Any]) -> bytes | None:
    chunk = options.get("chunk")
    if chunk is None or type(chunk) is bytes:
        return chunk
    if type(chunk) is str:
        # Back to the exact bytes received, e.g. Ruby's Base64 with its trailing "\n".
        return chunk.encode("utf-8", "surrogateescape")
    raise ForwardDecodeError(f"chunk option is not a string (got {type(chunk).__name__})")


class ForwardDecoder:
    """Incremental decoder for one forward connection (client -> server direction).

    ``feed(data)`` returns the ``EventMessage``/``Heartbeat`` objects completed by
    ``data``, in order; partial messages stay buffered. Bad input raises
    ``ForwardDecodeError``; after a fatal one the decoder refuses further input.
    With ``allow_json=False`` the stream is msgpack whatever its first byte (a session
    that began with the msgpack handshake stays msgpack, as in_forward's does).
    """

    def __init__(
        self,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
        now_ns: Callable[[], int] = _time.time_ns,
        allow_json: bool = True,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self.allow_json = allow_json
        self.json_mode = False  # decided by the connection's first byte
        self._now_ns = now_ns
        self._framer: _MsgpackFramer | _JsonFramer | None = None
        self._failure: ForwardDecodeError | None = None

    def feed(self, data: bytes) -> list[EventMessage | Heartbeat]:
        if self._failure is not None:
            raise ForwardDecodeError(f"decoder already failed: {self._failure.reason}")
        if self._framer is None:
            if not data:
                return []
            self._framer = self._choose_framer(data)
        messages: list[EventMessage | Heartbeat] = []
        try:
            for obj, size in self._framer.frames(data):
                messages.append(self._interpret(obj, size))
        except ForwardDecodeError as error:
            if error.fatal:
                self._failure = error
            error.messages = messages
            raise
        return messages

    def _choose_framer(self, data: bytes) -> _MsgpackFramer | _JsonFramer:
        # in_forward switches a connection to JSON when its very first byte is { or [
        self.json_mode = self.allow_json and data[:1] in (b"{", b"[")
        if self.json_mode:
            return _JsonFramer(self.max_message_bytes)
        return _MsgpackFramer(self.max_message_bytes)

    def _interpret(self, message: Any, size: int) -> EventMessage | Heartbeat:
        """Tell the carrier mode from element 2's type (section 5) and collect the events."""
        if message is None:
            return _HEARTBEAT
        if type(message) is not list:
            raise ForwardDecodeError(f"message is not an array (got {type(message).__name__})")
        if not message:
            raise ForwardDecodeError("message is an empty array")
        tag = _tag_of(message[0])
        length = len(message)
        carrier = message[1] if length > 1 else None
        carrier_kind = type(carrier)
        options_index = 2 if carrier_kind in (str, bytes, list) else 3
        if not options_index <= length <= options_index + 1:
            shape = "[tag, entries, options?]" if options_index == 2 else "[tag, time, record, options?]"
            raise ForwardDecodeError(f"message has {length} element(s), expected {shape}")
        options = _options_of(message[options_index] if length > options_index else None)
        chunk = _chunk_of(options)
        if carrier_kind is list:
            events, invalid = _collect_events(carrier, self._now_ns)
        elif options_index == 2:
            events, invalid = self._packed_events(carrier, options.get("compressed"))
        else:
            events, invalid = _collect_events(((carrier, message[2]),), self._now_ns)
        return EventMessage(tag, events, chunk, options, invalid, size)

    def _packed_events(
        self, blob: str | bytes, compressed: Any
    ) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        if type(blob) is str:
            blob = blob.encode("utf-8", "surrogateescape")  # str32 from out_forward
        blob = self._inflate(blob, compressed)
        # A second unpacker over the blob: entries are decoded straight into the loop.
        unpacker = _new_unpacker(len(blob) + 1)  # +1: room for the end-of-entries probe
        unpacker.feed(blob)
        try:
            collected = _collect_events(unpacker, self._now_ns)
        except _MSGPACK_ERRORS as exc:
            raise ForwardDecodeError(f"PackedForward entries are not valid msgpack: {exc}") from exc
        if not _entries_end_cleanly(unpacker):
            raise ForwardDecodeError("PackedForward entries end inside an entry (truncated)")
        return collected

    def _inflate(self, blob: bytes, compressed: Any) -> bytes:
        if compressed is None or compressed == "text":
            return blob
        if compressed == "gzip":
            return _gunzip(blob, self.max_decompressed_bytes)
        if compressed == "zstd":
            return _unzstd(blob, self.max_decompressed_bytes)
        raise ForwardDecodeError(f"unknown compressed option {compressed!r}")


# -- encoders ----------------------------------------------------------------------------


def _str_header(length: int) -> bytes:
    if length < 32:
        return bytes((0xA0 | length,))
    if length < 0x100:
        return b"\xd9" + bytes((length,))
    if length < 0x10000:
        return b"\xda" + length.to_bytes(2, "big")
    return b"\xdb" + length.to_bytes(4, "big")


def encode_ack(chunk: bytes, json_mode: bool = False) -> bytes:
    """The server's reply ``{"ack": chunk}``, the chunk's bytes written unchanged (section 8)."""
    if json_mode:
        text = chunk.decode("utf-8", "surrogateescape")
        return json.dumps({"ack": text}, separators=(",", ":")).encode("ascii")
    # Built by hand: packb would need the chunk as str and might pick bin for bytes.
    return b"\x81\xa3ack" + _str_header(len(chunk)) + chunk


def decode_ack(data: bytes) -> bytes:
    """The chunk bytes of one ack reply, msgpack or JSON (for clients and tests)."""
    try:
        if data[:1] == b"{":
            reply = json.loads(data.decode("utf-8", "surrogateescape"))
            ack = reply.get("ack") if type(reply) is dict else None
            if type(ack) is str:
                return ack.encode("utf-8", "surrogateescape")
        else:
            reply = msgpack.unpackb(data, raw=True, strict_map_key=False)
            ack = reply.get(b"ack") if type(reply) is dict else None
            if type(ack) is bytes:
                return ack
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ForwardDecodeError(f"invalid ack reply: {exc}") from exc
    raise ForwardDecodeError(f"not an ack reply: {data[:64]!r}")


def encode_event_time(time_ns: int) -> msgpack.ExtType:
    """EventTime for ``time_ns``; msgpack packs it as fixext8 ``d7 00 …`` like fluentd does."""
    seconds, nanos = divmod(time_ns, NANOS_PER_SECOND)
    return msgpack.ExtType(EVENT_TIME_EXT_CODE, _EVENT_TIME.pack(seconds, nanos))


def _wire_time(time_ns: int, time_as_integer: bool) -> Any:
    # Times are always written as EventTime unless the caller asks for fluentd 0.12's
    # integer seconds (out_forward / Fluent Bit option time_as_integer).
    return time_ns // NANOS_PER_SECOND if time_as_integer else encode_event_time(time_ns)


def encode_message(
    tag: str,
    time_ns: int,
    record: dict[str, Any],
    options: dict[str, Any] | None = None,
    *,
    time_as_integer: bool = False,
) -> bytes:
    """Message mode: ``[tag, time, record, options?]``."""
    message: list[Any] = [tag, _wire_time(time_ns, time_as_integer), record]
    if options is not None:
        message.append(options)
    return msgpack.packb(message)


def encode_forward(
    tag: str,
    events: Iterable[tuple[int, dict[str, Any]]],
    options: dict[str, Any] | None = None,
    *,
    time_as_integer: bool = False,
) -> bytes:
    """Forward mode: ``[tag, [[time, record], ...], options?]`` (what Fluent Bit sends)."""
    entries = [[_wire_time(time_ns, time_as_integer), record] for time_ns, record in events]
    message: list[Any] = [tag, entries]
    if options is not None:
        message.append(options)
    return msgpack.packb(message)


def _compress(entries: bytes, compressed: str | None) -> bytes:
    if compressed is None or compressed == "text":
        return entries
    if compressed == "gzip":
        return gzip.compress(entries, mtime=0)
    if compressed == "zstd":
        if zstandard is None:
            raise ValueError("compressed 'zstd' needs the zstandard package")
        return zstandard.ZstdCompressor().compress(entries)
    raise ValueError(f"unknown compression {compressed!r}")


def encode_packed_forward(
    tag: str,
    events: Iterable[tuple[int, dict[str, Any]]],
    options: dict[str, Any] | None = None,
    compressed: str | None = None,
    *,
    time_as_integer: bool = False,
    blob_as_bin: bool = False,
) -> bytes:
    """(Compressed)PackedForward: ``[tag, entries_blob, options?]``.

    The blob is a str32 like out_forward sends (or bin, as Fluent Bit does for gzip, with
    ``blob_as_bin``). ``compressed`` ("text", "gzip", "zstd") compresses the blob and sets
    the ``compressed`` option; options are written in the caller's key order.
    """
    packer = msgpack.Packer()
    entries = b"".join(
        packer.pack([_wire_time(time_ns, time_as_integer), record]) for time_ns, record in events
    )
    blob = _compress(entries, compressed)
    if compressed is not None:
        options = {**(options or {}), "compressed": compressed}
    parts = [b"\x93" if options is not None else b"\x92", packer.pack(tag)]
    if blob_as_bin:
        parts.append(packer.pack(blob))
    else:
        parts += [b"\xdb", len(blob).to_bytes(4, "big"), blob]
    if options is not None:
        parts.append(packer.pack(options))
    return b"".join(parts)

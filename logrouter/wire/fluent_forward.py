"""Fluentd forward protocol codec (transport phase), pure Python with no Twisted imports.

It owns the bytes a forward client sends and the ack a server answers with:

- ``ForwardDecoder``: an incremental decoder for one client->server TCP stream. It picks
  msgpack or JSON from the connection's first byte (as in_forward does), frames messages,
  tells the carrier modes apart (Message, Forward, PackedForward, CompressedPackedForward,
  ``nil`` heartbeat), inflates gzip/zstd blobs under a size limit, and turns every event
  time into an ``int`` of nanoseconds since the epoch.
- ``DeferredMessage``: with ``offload_bytes`` set, a message whose entries are bigger than
  that (a long Forward array, a big PackedForward blob, a blob that inflates beyond it, a
  long JSON value) is only framed by ``feed``; its ``parts()`` does the inflating and
  unpacking, in parts of about ``part_bytes`` of entries, wherever the caller can afford
  it (the source runs it in a worker thread). Framing stays cheap and incremental.
- ``encode_ack``: the server's ack reply.

The parts: ``forward_framing`` splits the stream into messages, ``forward_packed``
inflates and decodes PackedForward blobs, ``forward_offload`` builds a deferred
message's parts, ``forward_messages`` holds the result types; which entries are events,
and the bomb rule that refuses a message of mostly invalid ones on every path, are in
``forward_entries``. What a client sends is in ``fluent_client``.

Event times: an event's time in nanoseconds must fit a signed int64 (the lake stores
int64 ns timestamps: 1677-09-21 to 2262-04-11). A time outside that range (int seconds
beyond +-9223372036, a float like 1e308, a msgpack Timestamp far out) makes that event
invalid: counted in ``invalid`` and skipped like a bad record, the rest of the message
kept and acked. Negative times (before 1970) inside the range are real dates and are
kept; only 0 is special ("now", as in_forward does). JSON integers that msgpack cannot
hold (outside int64..uint64), anywhere in a record, are kept as their decimal text.

Wire facts and the quirks of real peers are in ``docs/protocols/fluent_forward.md``; the
section numbers in comments below refer to it. The handshake (HELO/PING/PONG) is in
``fluent_handshake``.
"""

from __future__ import annotations

import functools
import json
import time as _time
from collections.abc import Callable, Iterator
from typing import Any

from logrouter.wire.forward_entries import (
    MAX_TIME_NS,
    MIN_TIME_NS,
    EntryBombError,
    EventNanos,
    ForwardDecodeError,
    collect_events,
    str_keyed,
)
from logrouter.wire.forward_framing import JsonFramer, MsgpackFramer, parse_json
from logrouter.wire.forward_lazy import kept_or_decoded
from logrouter.wire.forward_messages import HEARTBEAT, DeferredMessage, EventMessage, Heartbeat
from logrouter.wire.forward_offload import blob_parts, list_parts
from logrouter.wire.forward_packed import DECOMPRESS_STEP_BYTES, decode_entries, inflated_pieces, packed_events

__all__ = [
    "DeferredMessage",
    "EntryBombError",
    "EventMessage",
    "EventNanos",
    "ForwardDecodeError",
    "ForwardDecoder",
    "Heartbeat",
    "MAX_TIME_NS",
    "MIN_TIME_NS",
    "decode_entries",
    "encode_ack",
]

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024


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
            return str_keyed(value)
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

    With ``offload_bytes`` set, a message whose entries pass that size comes out as a
    ``DeferredMessage`` instead, so that ``feed`` does a bounded amount of work per call:
    a Forward or JSON message longer than it, a PackedForward blob longer than it, or a
    compressed blob that inflates beyond it (found out by inflating at most that much).
    """

    def __init__(
        self,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
        now_ns: Callable[[], int] = _time.time_ns,
        allow_json: bool = True,
        offload_bytes: int | None = None,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self.allow_json = allow_json
        self.offload_bytes = offload_bytes
        self.json_mode = False  # decided by the connection's first byte
        self._now_ns = now_ns
        self._framer: MsgpackFramer | JsonFramer | None = None
        self._failure: str | None = None  # the reason only: the error's traceback holds buffers

    @property
    def pending_bytes(self) -> int:
        """What was received of a message not yet complete (JSON: characters); 0 between messages."""
        return 0 if self._framer is None else self._framer.pending_bytes

    def feed(self, data: bytes) -> list[EventMessage | Heartbeat | DeferredMessage]:
        if self._failure is not None:
            raise ForwardDecodeError(f"decoder already failed: {self._failure}")
        if self._framer is None:
            if not data:
                return []
            self._framer = self._choose_framer(data)
        messages: list[EventMessage | Heartbeat | DeferredMessage] = []
        interpret = self._json_frame if self.json_mode else self._frame
        try:
            for obj, size in self._framer.frames(data):
                messages.append(interpret(obj, size))
        except ForwardDecodeError as error:
            if error.fatal:
                self._failure = error.reason
                self._framer = None  # nothing more is decoded: let its buffers go
            error.messages = messages
            raise
        return messages

    def _choose_framer(self, data: bytes) -> MsgpackFramer | JsonFramer:
        # in_forward switches a connection to JSON when its very first byte is { or [
        self.json_mode = self.allow_json and data[:1] in (b"{", b"[")
        if self.json_mode:
            return JsonFramer(self.max_message_bytes)
        return MsgpackFramer(self.max_message_bytes)

    def _json_frame(self, text: str, size: int) -> EventMessage | Heartbeat | DeferredMessage:
        if self.offload_bytes is not None and size > self.offload_bytes:
            return DeferredMessage(size, lambda part_bytes: self._json_parts(text, size, part_bytes))
        return self._frame(parse_json(text), size)

    def _json_parts(self, text: str, size: int, part_bytes: int) -> Iterator[EventMessage | None]:
        frame = self._frame(parse_json(text), size)  # a long entry array defers again
        if type(frame) is DeferredMessage:
            yield None
            yield from frame.steps(part_bytes)
        elif type(frame) is EventMessage:
            yield frame
        else:  # cannot happen: JSON has no top-level nil, the framer wants [ or {
            raise ForwardDecodeError("invalid JSON: a heartbeat")

    def _frame(self, message: Any, size: int) -> EventMessage | Heartbeat | DeferredMessage:
        """Tell the carrier mode from element 2's type (section 5) and collect the events."""
        if message is None:
            return HEARTBEAT
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
            if self.offload_bytes is not None and size > self.offload_bytes:
                return DeferredMessage(
                    size, functools.partial(list_parts, tag, carrier, chunk, options, size, self._now_ns), tag
                )
            events, invalid = collect_events(carrier, self._now_ns)
        elif options_index == 2:
            return self._packed(tag, carrier, chunk, options, size)
        else:
            events, invalid = collect_events(((carrier, message[2]),), self._now_ns)
        return EventMessage(tag, events, chunk, options, invalid, size)

    def _packed(
        self, tag: str, blob: str | bytes, chunk: bytes | None, options: dict[str, Any], size: int
    ) -> EventMessage | DeferredMessage:
        compressed = options.get("compressed")
        limit = self.max_decompressed_bytes
        offload = self.offload_bytes
        deferred = DeferredMessage(
            size, functools.partial(blob_parts, tag, blob, compressed, chunk, options, size, limit, self._now_ns), tag
        )
        if type(blob) is str and (offload is None or len(blob) <= offload):
            # str32 from out_forward (the framer makes most of them bin). Its UTF-8 bytes
            # are at least as many as its characters, so a text longer than the offload
            # size is too big in bytes as well: only a shorter one is encoded here, and
            # measured in bytes, as the same blob handed over as bin would be.
            blob = blob.encode("utf-8", "surrogateescape")
        if offload is not None and len(blob) > offload:
            inflated_pieces(b"", compressed, limit)  # an unknown compression is refused now
            return deferred  # even the str32 -> bytes copy of a long text is left to the parts
        if compressed is not None and compressed != "text":
            inflated = []
            total = 0
            # Steps no bigger than the budget: feed inflates at most offload_bytes + 1.
            step = DECOMPRESS_STEP_BYTES if offload is None else min(DECOMPRESS_STEP_BYTES, offload + 1)
            for piece in inflated_pieces(blob, compressed, limit, step):
                total += len(piece)
                if offload is not None and total > offload:
                    return deferred  # too big to finish here: the parts start over from the blob
                inflated.append(piece)
            blob = b"".join(inflated)
        clock = self._now_ns
        now_used: list[int] = []

        def now_ns() -> int:  # called at most once per message (collect_events)
            now_used.append(clock())
            return now_used[0]

        if type(blob) is not bytes:
            blob = bytes(blob)
        events, invalid = kept_or_decoded(blob, now_ns, packed_events)
        packed = (blob, now_used[0] if now_used else None)
        return EventMessage(tag, events, chunk, options, invalid, size, packed)


# -- the ack -----------------------------------------------------------------------------


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

"""Fluentd forward protocol, client side (what out_forward sends), pure Python with no Twisted.

It owns the bytes a forwarding client writes and reads in the transport phase:

- ``chunk_id``: the ``chunk`` option of one message, derived from where its events sit
  in the spool (a per-spool random id, the sink's name, the record's position and the
  chunk's index within the record) and from the events themselves, so a message resent
  after a failure or a crash carries the same id and a deduplicating receiver stores
  it once.
- ``pack_entries``: events packed as PackedForward entries (``[EventTime, record]``),
  split into groups of at most ``max_bytes`` (a single larger event is a group alone).
- ``encode_chunk``: a (Compressed)PackedForward message ``[tag, entries, options]``:
  entries in a str32 as out_forward sends them (gzip members for ``compressed: "gzip"``),
  options ``size``, ``compressed`` and, when an ack is wanted, ``chunk``.
- ``ReplyReader``: an incremental decoder of what a server sends back: HELO and PONG
  during the handshake (read by ``fluent_handshake.ClientHandshake``) and ``{"ack": id}``.

Wire facts are in ``docs/protocols/fluent_forward.md``.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import zlib
from collections.abc import Iterable
from typing import Any

import msgpack

from logrouter.wire.errors import DecodeError

__all__ = [
    "COMPRESSIONS",
    "HEARTBEAT_REQUEST",
    "HEARTBEAT_REPLY",
    "ReplyError",
    "ReplyReader",
    "ack_of",
    "chunk_id",
    "encode_chunk",
    "pack_entries",
]

COMPRESSIONS = ("text", "gzip")
HEARTBEAT_REQUEST = b"\x00"  # UDP heartbeat datagram (docs/protocols/fluent_forward.md section 12, F5)
HEARTBEAT_REPLY = b"\x00"
MAX_REPLY_BYTES = 1 << 20  # acks are ~30 bytes, HELO/PONG a few hundred

_NANOS = 1_000_000_000
_EVENT_TIME = struct.Struct(">II")
_U32 = 1 << 32
_ID_PERSON = b"lr-fwd-chunk-v1"  # blake2b personalisation: never equal to a hash of anything else
_POSITION = struct.Struct(">QI")


class ReplyError(DecodeError):
    """Bytes from a server that are not a reply a forward client understands."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, fatal=True)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _field(value: bytes) -> bytes:
    return len(value).to_bytes(4, "big") + value


def chunk_id(spool_id: bytes, sink: str, position: int, index: int, tag: str, entries: bytes) -> bytes:
    """16 bytes derived from where a message's events sit in the spool, base64 (24 ASCII bytes).

    The same spool record (``spool_id``, ``sink``, ``position``) and message ``index``
    always give the same id, as long as the message carries the same events (``tag``,
    packed ``entries`` before compression): a resend is recognised by the receiver.
    Should the events at that place differ on a later send (another ``max_chunk_bytes``,
    a changed filter), the id differs too, so the receiver stores them instead of taking
    them for a duplicate: at worst twice, never lost.
    """
    head = _field(spool_id) + _field(_utf8(sink)) + _POSITION.pack(position, index) + _field(_utf8(tag))
    digest = hashlib.blake2b(head, digest_size=16, person=_ID_PERSON)
    digest.update(entries)
    return base64.b64encode(digest.digest())


def _fallback(value: Any) -> Any:
    """Values msgpack cannot pack (a TOML datetime set by a filter, …) go as text, never dropped."""
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    isoformat = getattr(value, "isoformat", None)
    return isoformat() if isoformat is not None else str(value)


def _packer() -> msgpack.Packer:
    # surrogateescape: strings may carry invalid UTF-8 received inside msgpack str (section 2).
    return msgpack.Packer(use_bin_type=True, unicode_errors="surrogateescape", default=_fallback)


def _time_prefix(time_ns: int) -> bytes:
    """``fixarray(2)`` + the EventTime (fixext8 ``d7 00``) of one entry."""
    seconds, nanos = divmod(int(time_ns), _NANOS)
    if 0 <= seconds < _U32:
        return b"\x92\xd7\x00" + _EVENT_TIME.pack(seconds, nanos)
    return b"\x92" + msgpack.packb(seconds)  # outside EventTime's range: integer seconds


def pack_entries(events: Iterable[Any], max_bytes: int) -> list[tuple[int, bytes]]:
    """``(count, entries)`` groups of packed ``[time, record]`` entries, each group at most
    ``max_bytes`` unless it holds a single larger entry. The split depends only on the
    events, so packing the same events again gives the same groups."""
    pack = _packer().pack
    groups: list[tuple[int, bytes]] = []
    parts: list[bytes] = []
    size = 0
    for time_ns, record in events:
        entry = _time_prefix(time_ns) + pack(record)
        if parts and size + len(entry) > max_bytes:
            groups.append((len(parts), b"".join(parts)))
            parts, size = [], 0
        parts.append(entry)
        size += len(entry)
    if parts:
        groups.append((len(parts), b"".join(parts)))
    return groups


def _gzip(data: bytes, level: int) -> bytes:
    """One gzip member, mtime 0, so the same entries always compress to the same bytes."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush()


def encode_chunk(
    tag: str,
    entries: bytes,
    count: int,
    chunk: bytes | None,
    compressed: str = "text",
    level: int = 6,
) -> bytes:
    """``[tag, entries, {"size", "compressed", "chunk"?}]`` with the entries in a str32.

    ``chunk`` (ASCII bytes) asks the server for ``{"ack": chunk}``; None asks for nothing.
    """
    if compressed == "gzip":
        entries = _gzip(entries, level)
    elif compressed != "text":
        raise ValueError(f"unknown compression {compressed!r} (known: {', '.join(COMPRESSIONS)})")
    options: dict[str, Any] = {"size": count, "compressed": compressed}
    if chunk is not None:
        options["chunk"] = chunk.decode("ascii")
    pack = _packer().pack
    return b"".join((b"\x93", pack(tag), b"\xdb", len(entries).to_bytes(4, "big"), entries, pack(options)))


def ack_of(message: Any) -> bytes | None:
    """The chunk id of an ``{"ack": id}`` reply (exact bytes), None for any other message."""
    if type(message) is not dict:
        return None
    ack = message.get("ack")
    if ack is None:
        ack = message.get(b"ack")
    if type(ack) is str:
        return ack.encode("utf-8", "surrogateescape")
    if type(ack) is bytes:
        return ack
    return None


class ReplyReader:
    """Incremental decoder of the server->client direction: whole msgpack objects in order.

    Strings decode losslessly (``surrogateescape``), so ids and salts compare as the exact
    bytes sent. A reply longer than ``max_bytes`` or undecodable bytes raise ``ReplyError``,
    carrying in ``messages`` the replies the same ``feed`` call decoded before; the
    verdict does not depend on how the bytes were split into reads.
    """

    def __init__(self, max_bytes: int = MAX_REPLY_BYTES) -> None:
        self._max = max(max_bytes, 1)
        self._unpacker = msgpack.Unpacker(
            raw=False, unicode_errors="surrogateescape", strict_map_key=False, max_buffer_size=self._max
        )
        self._fed = 0  # bytes fed to the unpacker since the start
        self._boundary = 0  # where the last whole reply ended, in the same count
        self._failed: str | None = None

    @property
    def pending_bytes(self) -> int:
        """Bytes held of a reply not complete yet (0 at a reply boundary)."""
        return self._fed - self._boundary

    def feed(self, data: bytes) -> list[Any]:
        if self._failed is not None:
            raise ReplyError(f"reader already failed: {self._failed}")
        messages: list[Any] = []
        unpacker = self._unpacker
        view = memoryview(data)
        start = 0
        try:
            while start < len(view):
                # Never more than fits beside the reply being assembled: the buffer then
                # overflows exactly when one reply is longer than the bound, however the
                # bytes were split (a fixed step would refuse a shorter reply that
                # happened to straddle a step boundary).
                room = self._max - (self._fed - self._boundary)
                if room <= 0:
                    raise ReplyError(f"reply longer than {self._max} bytes")
                piece = view[start : start + room]
                unpacker.feed(piece)
                start += len(piece)
                self._fed += len(piece)
                for message in unpacker:
                    messages.append(message)
                    self._boundary = unpacker.tell()
        except ReplyError as error:
            self._fail(error, messages)
            raise
        except msgpack.BufferFull:
            raise self._fail(ReplyError(f"reply longer than {self._max} bytes"), messages) from None
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise self._fail(ReplyError(f"undecodable reply: {exc}"), messages) from None
        return messages

    def _fail(self, error: ReplyError, messages: list[Any]) -> ReplyError:
        self._failed = error.reason
        error.messages = messages
        return error

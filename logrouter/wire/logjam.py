"""Logjam ZeroMQ message codec, pure Python with no Twisted or ZeroMQ imports.

It owns the frames of one logjam multipart message (``docs/protocols/logjam.md``; section
numbers in comments refer to it):

- ``decode_message(frames)``: a data message (app-env, topic, body, meta-info) becomes a
  ``LogjamMessage``; a device heartbeat (``"heartbeat"``, ``"tcp://host:port"``, ``{}``,
  meta) becomes a ``Heartbeat``. Both carry the decoded ``Meta`` (device number and
  sequence number are what a consumer's gap tracker needs). ``decode_message_sized``
  also says how many bytes the body's JSON text had, decompressed (what a source sizes
  its batches by).
- ``encode_message`` / ``encode_heartbeat`` / ``encode_meta``: the other direction (a
  device-like sink, tests).
- The ROUTER side's replies as the real device sends them (section 4, no empty delimiter
  frame): ``encode_accepted``, ``encode_pong``, ``encode_bad_request``.

What this codec decides:

- Exactly 4 frames (the importer drops anything else). 3-frame legacy PULL messages and
  the ROUTER side's empty first frame / ``ping`` are the source's business, not this one's.
- meta-info is exactly 24 bytes, version 1, tag 0xCABD or the byte-swapped 0xBDCA (the
  C code tolerates it, section 2); every other field is big-endian. There is one
  device-number width only: a u32 at offset 4, in the spec, the C struct and the Go
  code alike, so the frame length is not used to tell layouts apart.
- app-env must be well formed as the device checks it (bytes 32..127, at least one
  ``-``) and is split at the **last** ``-``: ``app`` may contain ``-``, ``env`` may not.
- The topic must be ASCII; its prefix is not checked (the importer does not);
  ``is_well_formed_topic`` is the device's prefix check for a source that wants it.
- Bodies: compression 0 none, 1 zlib (RFC 1950, through ``wire/inflate``), 2 raw Snappy
  block (varint length prefix), 3 u32 BE length + LZ4 block (section 3), the last two
  through ``cramjam``. The declared length of Snappy and LZ4 is checked against
  ``max_decompressed_bytes`` before anything is allocated, and must match what the block
  decompresses to; zlib is inflated with a bound. The body frame itself may not exceed
  ``max_body_bytes``. The decompressed body must be a UTF-8 JSON object (section 6) and
  is returned as a ``dict``; or, where the caller reads the text itself (``undecoded``:
  the source's native read, ``logrouter.sources.logjam_native``), left as it is in an
  ``UndecodedMessage``, which ``decode_body`` decodes as ``decode_message`` would have.
- Every problem raises ``LogjamDecodeError`` (a ``DecodeError``, never fatal: one bad
  message costs only itself) with a human ``reason`` and a machine ``kind`` from
  ``ERROR_KINDS`` so that a source can count drops per kind.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import cramjam

from logrouter.wire import json_text
from logrouter.wire.errors import DecodeError
from logrouter.wire.inflate import ZLIB, InflateError, inflate

__all__ = [
    "ACCEPTED",
    "BAD_REQUEST",
    "COMPRESSION_NAMES",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "ERROR_KINDS",
    "HEARTBEAT",
    "Heartbeat",
    "LZ4",
    "LogjamDecodeError",
    "LogjamMessage",
    "META_BYTES",
    "META_TAG",
    "META_TAG_SWAPPED",
    "META_VERSION",
    "METADATA_NAMES",
    "Meta",
    "NONE",
    "OK",
    "PING",
    "SNAPPY",
    "TOPIC_PREFIXES",
    "UndecodedMessage",
    "ZLIB_COMPRESSION",
    "compress_body",
    "decode_body",
    "decode_message",
    "decode_message_sized",
    "decode_meta",
    "decompress_body",
    "encode_accepted",
    "encode_bad_request",
    "encode_heartbeat",
    "encode_message",
    "encode_meta",
    "encode_pong",
    "is_well_formed_topic",
    "split_stream_name",
]

#: What a logrouter record carries of its message, as ``<prefix><name>`` fields (the
#: ``logjam`` source adds them, the ``logjam`` sink publishes under them).
METADATA_NAMES = ("app", "env", "topic", "device", "sequence")

# Compression ids (section 2, meta offset 2).
NONE = 0
ZLIB_COMPRESSION = 1
SNAPPY = 2
LZ4 = 3
COMPRESSION_NAMES = {NONE: "none", ZLIB_COMPRESSION: "zlib", SNAPPY: "snappy", LZ4: "lz4"}

META_TAG = 0xCABD
META_TAG_SWAPPED = 0xBDCA  # UTIL META_INFO_TAG_LE, tolerated by the C decoder
META_VERSION = 1
META_BYTES = 24
_META = struct.Struct(">HBBIQQ")  # tag, compression, version, device, created_ms, sequence
_U32 = struct.Struct(">I")

HEARTBEAT = b"heartbeat"
PING = b"ping"
ACCEPTED = b"202 Accepted"
OK = b"200 OK"
BAD_REQUEST = b"400 Bad Request"
TOPIC_PREFIXES = ("logs", "javascript", "events", "frontend.page", "frontend.ajax", "mobile")

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024  # logjam's decompressors give up above 64 MiB
DEFAULT_MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024

# LogjamDecodeError.kind values.
ERROR_KINDS = (
    "frames",  # not exactly 4 frames
    "meta",  # meta-info length, tag or version
    "stream",  # app-env not well formed (or a heartbeat's endpoint not ASCII)
    "topic",  # topic not ASCII
    "compression",  # unknown method, corrupt or truncated compressed body
    "too_big",  # body frame over max_body_bytes
    "bomb",  # body decompresses (or declares it would) to over max_decompressed_bytes
    "body",  # not UTF-8 JSON, or not a JSON object
)


class LogjamDecodeError(DecodeError):
    """A logjam message that cannot be decoded; ``kind`` is one of ``ERROR_KINDS``.

    Never fatal: ZeroMQ keeps message boundaries, so the next message is unaffected.
    """

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason, fatal=False)
        self.kind = kind


# The message types are NamedTuples, not frozen dataclasses: two are made per message,
# and a frozen dataclass's __init__ (object.__setattr__ per field) cost ~2 µs each.


class Meta(NamedTuple):
    """The 24-byte meta-info frame (section 2). ``tag`` is as received (0xCABD or 0xBDCA)."""

    compression: int = NONE
    device: int = 0
    created_ms: int = 0
    sequence: int = 0
    version: int = META_VERSION
    tag: int = META_TAG


class LogjamMessage(NamedTuple):
    """A data message: stream ``app``-``env``, ``topic``, the JSON object ``body``."""

    app: str
    env: str
    topic: str
    body: dict[str, Any]
    meta: Meta

    @property
    def stream(self) -> str:
        return f"{self.app}-{self.env}"


class UndecodedMessage(NamedTuple):
    """A data message whose ``body`` is its text, decompressed but not decoded (not yet
    known to be a JSON object: ``decode_body`` says)."""

    app: str
    env: str
    topic: str
    body: bytes
    meta: Meta


class Heartbeat(NamedTuple):
    """A device heartbeat (section 5): ``endpoint`` is its ``tcp://fqdn:port``."""

    endpoint: str
    meta: Meta


# --- meta-info -------------------------------------------------------------------------


def encode_meta(meta: Meta) -> bytes:
    return _META.pack(meta.tag, meta.compression, meta.version, meta.device, meta.created_ms, meta.sequence)


def decode_meta(frame: bytes) -> Meta:
    if len(frame) != META_BYTES:
        raise LogjamDecodeError("meta", f"meta-info is {len(frame)} bytes, not {META_BYTES}")
    tag, compression, version, device, created_ms, sequence = _META.unpack(frame)
    if tag != META_TAG and tag != META_TAG_SWAPPED:
        raise LogjamDecodeError("meta", f"meta-info tag is 0x{tag:04X}, not 0xCABD")
    if version != META_VERSION:
        raise LogjamDecodeError("meta", f"meta-info version is {version}, not {META_VERSION}")
    return Meta(compression, device, created_ms, sequence, version, tag)


# --- names -----------------------------------------------------------------------------

#: (app-env frame, topic frame) -> (app, env, topic) of names already checked; emptied when full
_NAMES: dict[tuple[bytes, bytes], tuple[str, str, str]] = {}
_MAX_NAMES = 4096


def split_stream_name(frame: bytes) -> tuple[str, str]:
    """(app, env) of a well-formed app-env frame: bytes 32..127 with a ``-``, split at the last one."""
    if not frame or min(frame) < 32 or max(frame) > 127:
        raise LogjamDecodeError("stream", f"stream name {frame[:64]!r} has bytes outside 32..127")
    app, dash, env = frame.decode("ascii").rpartition("-")
    if not dash:
        raise LogjamDecodeError("stream", f"stream name {frame[:64]!r} has no '-'")
    return app, env


def is_well_formed_topic(topic: str) -> bool:
    """The device's check (DEV ``well_formed_topic``): the topic starts with a known prefix."""
    return topic.startswith(TOPIC_PREFIXES)


def _ascii(frame: bytes, kind: str, what: str) -> str:
    try:
        return frame.decode("ascii")
    except UnicodeDecodeError:
        raise LogjamDecodeError(kind, f"{what} {frame[:64]!r} is not ASCII") from None


# --- bodies ----------------------------------------------------------------------------


def _snappy_length(blob: bytes) -> int:
    """The uncompressed length a raw Snappy block declares (a varint of at most 5 bytes)."""
    value = 0
    for i in range(min(len(blob), 5)):
        byte = blob[i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value
    raise LogjamDecodeError("compression", "snappy block has no valid length prefix")


def decompress_body(blob: bytes, compression: int, limit: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> bytes:
    """``blob`` decompressed as ``compression`` says, never more than ``limit`` bytes."""
    if compression == NONE:
        if len(blob) > limit:
            raise LogjamDecodeError("bomb", f"body of {len(blob)} bytes is over {limit}")
        return bytes(blob)
    if compression == ZLIB_COMPRESSION:
        try:
            return inflate(blob, limit, ZLIB)
        except InflateError as e:
            raise LogjamDecodeError("bomb" if e.too_big else "compression", f"zlib body: {e.reason}") from None
    if compression == SNAPPY:
        declared = _snappy_length(blob)
        if declared > limit:
            raise LogjamDecodeError("bomb", f"snappy body declares {declared} bytes, over {limit}")
        try:
            out = bytes(cramjam.snappy.decompress_raw(blob))
        except Exception as e:  # cramjam.DecompressionError, and whatever else the binding raises
            raise LogjamDecodeError("compression", f"snappy body: {e}") from None
        if len(out) != declared:  # the binding checks this too; never trust one check
            raise LogjamDecodeError("compression", f"snappy body is {len(out)} bytes, declared {declared}")
        return out
    if compression == LZ4:
        if len(blob) < 4:
            raise LogjamDecodeError("compression", f"lz4 body of {len(blob)} bytes has no length prefix")
        (declared,) = _U32.unpack_from(blob)
        if declared > limit:
            raise LogjamDecodeError("bomb", f"lz4 body declares {declared} bytes, over {limit}")
        out = bytearray(declared)
        try:
            written = cramjam.lz4.decompress_block_into(memoryview(blob)[4:], out)
        except Exception as e:  # cramjam.DecompressionError, and whatever else the binding raises
            raise LogjamDecodeError("compression", f"lz4 body: {e}") from None
        if written != declared:
            raise LogjamDecodeError("compression", f"lz4 body is {written} bytes, declared {declared}")
        return bytes(out)
    raise LogjamDecodeError("compression", f"unknown compression method {compression}")


def compress_body(data: bytes, compression: int) -> bytes:
    """``data`` in the exact format of ``compression`` (section 3)."""
    if compression == NONE:
        return bytes(data)
    if compression == ZLIB_COMPRESSION:
        return zlib.compress(data)
    if compression == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if compression == LZ4:
        return _U32.pack(len(data)) + bytes(cramjam.lz4.compress_block(data, store_size=False))
    raise ValueError(f"unknown compression method {compression}")


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        value = json_text.loads(data)
    except UnicodeDecodeError:
        raise LogjamDecodeError("body", "body is not UTF-8") from None
    except RecursionError:
        raise LogjamDecodeError("body", "body JSON is nested too deeply") from None
    except ValueError as e:
        raise LogjamDecodeError("body", f"body is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise LogjamDecodeError("body", f"body is a JSON {type(value).__name__}, not an object")
    return value


# --- messages --------------------------------------------------------------------------


def decode_message(
    frames: Sequence[bytes],
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> LogjamMessage | Heartbeat:
    """One logjam message (4 frames) as published by a device or sent by a producer."""
    return decode_message_sized(frames, max_body_bytes, max_decompressed_bytes)[0]


def decode_message_sized(
    frames: Sequence[bytes],
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    undecoded: bool = False,
) -> tuple[LogjamMessage | UndecodedMessage | Heartbeat, int]:
    """``decode_message``, and the size of the body's JSON text once decompressed (for a
    heartbeat, of its body frame as sent). With ``undecoded`` a data message's body is
    not decoded: the message is an ``UndecodedMessage``."""
    if len(frames) != 4:
        raise LogjamDecodeError("frames", f"message has {len(frames)} frames, not 4")
    stream, topic_frame, body, meta_frame = frames
    meta = decode_meta(bytes(meta_frame))
    if len(body) > max_body_bytes:
        raise LogjamDecodeError("too_big", f"body frame of {len(body)} bytes is over {max_body_bytes}")
    if stream == HEARTBEAT:
        endpoint = _ascii(bytes(topic_frame), "stream", "heartbeat endpoint")
        # The body is "{}" as sent; it is not decoded, a heartbeat's content is its meta.
        return Heartbeat(endpoint, meta), len(body)
    key = (bytes(stream), bytes(topic_frame))
    names = _NAMES.get(key)
    if names is None:
        # A stream sends many messages under few names: checked and decoded once each.
        names = (*split_stream_name(key[0]), _ascii(key[1], "topic", "topic"))
        if len(_NAMES) >= _MAX_NAMES:
            _NAMES.clear()
        _NAMES[key] = names
    app, env, topic = names
    data = decompress_body(bytes(body), meta.compression, max_decompressed_bytes)
    if undecoded:
        return UndecodedMessage(app, env, topic, data, meta), len(data)
    return LogjamMessage(app, env, topic, _json_object(data), meta), len(data)


def decode_body(message: UndecodedMessage) -> LogjamMessage:
    """The ``LogjamMessage`` of an undecoded one: its body decoded, or ``LogjamDecodeError``
    (kind ``body``) as ``decode_message`` raises it."""
    return LogjamMessage(message.app, message.env, message.topic, _json_object(message.body), message.meta)


def encode_message(
    app: str,
    env: str,
    topic: str,
    body: Mapping[str, Any] | bytes,
    meta: Meta = Meta(),
) -> list[bytes]:
    """The 4 frames of a data message; ``body`` (a mapping is JSON-encoded) is compressed
    as ``meta.compression`` says."""
    data = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode("utf-8")
    return [f"{app}-{env}".encode("ascii"), topic.encode("ascii"), compress_body(data, meta.compression), encode_meta(meta)]


def encode_heartbeat(endpoint: str, device: int, sequence: int, created_ms: int) -> list[bytes]:
    """A device heartbeat (UTIL ``send_heartbeat``): compression 0, body ``{}``."""
    meta = Meta(NONE, device, created_ms, sequence)
    return [HEARTBEAT, endpoint.encode("ascii"), b"{}", encode_meta(meta)]


# --- ROUTER replies (section 4: as the DEALER receives them, no empty delimiter) --------


def encode_accepted(app_env: bytes) -> list[bytes]:
    """Reply to a valid request-reply data message: the app-env frame as sent, ``202 Accepted``."""
    return [bytes(app_env), ACCEPTED]


def encode_pong(fqdn: str) -> list[bytes]:
    """Reply to a ping with valid meta: ``ping``, ``200 OK``, the device's FQDN."""
    return [PING, OK, fqdn.encode("ascii")]


def encode_bad_request(first: bytes) -> list[bytes]:
    """Reply to a ping or request-reply data message that failed validation: the frame in
    the app-env slot (``ping`` for pings), ``400 Bad Request``."""
    return [bytes(first), BAD_REQUEST]

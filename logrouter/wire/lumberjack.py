"""Lumberjack (Beats) protocol codec, v1 and v2, pure Python with no Twisted imports.

It owns the bytes a Beats/Lumberjack client sends and the acks a server answers with:

- ``LumberjackDecoder``: an incremental decoder for one client->server TCP stream. The
  connection's first byte picks the version (``'1'`` or ``'2'``); every later frame must
  carry the same one. It decodes ``W`` window frames, ``J`` JSON data frames, ``D``
  key/value data frames and ``C`` compressed frames (a zlib stream whose inflated bytes
  are themselves whole frames, possibly nested), tracks windows, and returns data frames
  grouped into ``Events`` together with the value to acknowledge them with.
- ``AckDecoder``: the client side's reader for ``A`` frames.
- Encoders for ``A`` (server) and ``W``/``J``/``D``/``C`` (client) frames.

Wire facts and the differences between real peers are in ``protocols/lumberjack.md``;
the section numbers in comments refer to it. Summary of what this codec decides:

- Acks carry the highest ``seq`` seen in the window so far (Logstash style, section 4).
  Beats numbers every window 1..N so that is the count; clients that keep counting
  across windows (pylogbeat, the Node ``lumberjack-protocol`` v1 client) need exactly it.
- Data frames past a window's announced count, or before any ``W``, are accepted into
  the current window (Logstash accepts them too; logstash-forwarder-style clients send
  one ``W`` per connection and then stream ``D`` frames). A ``W`` arriving before the
  previous window was complete starts a new window; ``Window.missing`` tells how many
  events the previous one lacked.
- ``D`` and ``J`` frames are accepted under either version byte, but the version byte
  may not change on a connection. ``W`` frames inside ``C`` frames are accepted
  (Logstash does). Nesting of ``C`` frames is bounded by ``MAX_NESTING``.
- A ``J`` payload that is not valid JSON, or not an object, does not stop the stream:
  the framing is intact, so the event is counted in ``Events.invalid`` (and covered by
  the ack) and the rest decodes normally. Everything else that is wrong raises
  ``DecodeError`` (always fatal: the connection must be closed, section 8).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from logrouter.wire.errors import DecodeError

__all__ = [
    "Ack",
    "AckDecoder",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_WINDOW_SIZE",
    "Events",
    "LumberjackDecoder",
    "MAX_NESTING",
    "Window",
    "encode_ack",
    "encode_compressed",
    "encode_data",
    "encode_json",
    "encode_window",
    "encode_window_frames",
]

DEFAULT_MAX_WINDOW_SIZE = 10_000  # go-lumber's MaxWindowSize default (section 3)
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024
MAX_NESTING = 8  # C frames inside C frames; real clients never nest at all

VERSION_BYTES = {1: 0x31, 2: 0x32}
_VERSIONS = {0x31: 1, 0x32: 2}

WINDOW = 0x57  # 'W'
DATA = 0x44  # 'D'
JSON = 0x4A  # 'J'
COMPRESSED = 0x43  # 'C'
ACK = 0x41  # 'A'
_CLIENT_FRAMES = frozenset((WINDOW, DATA, JSON, COMPRESSED))

_U32 = struct.Struct(">I")
_U32X2 = struct.Struct(">II")
_HEADER_U32 = struct.Struct(">BBI")
_HEADER_U32X2 = struct.Struct(">BBII")

# One inflate step produces at most this much, so a bomb is caught one step after it
# passes the limit instead of after it has filled memory.
_INFLATE_STEP_BYTES = 1 << 20

# The C scanner behind json.loads, called directly: it skips json.loads' type dispatch,
# encoding detection and whitespace regexes, which cost about as much as the scan itself.
# Anything it does not accept outright goes through json.loads for the exact verdict.
_scan_json = json.decoder.JSONDecoder().scan_once
_JSON_ERRORS = (ValueError, RecursionError)


# -- results -----------------------------------------------------------------------------


@dataclass(slots=True)
class Window:
    """A ``W`` frame: the client announces ``size`` events.

    ``window`` is this window's serial number on the connection (1 for the first ``W``).
    ``missing`` is how many announced events the previous window still lacked when this
    one started (0 normally; Logstash logs a warning and treats the partial window as
    complete, section 3).
    """

    version: int
    size: int
    window: int
    missing: int = 0


@dataclass(slots=True)
class Events:
    """Consecutive data frames of one window, decoded by one ``feed`` call.

    ``records`` are the valid events in order (v2: the JSON objects; v1: dicts of str).
    ``ack_seq`` is the highest ``seq`` seen in this window up to and including these
    frames: acknowledge with it once these and all earlier events are stored. ``frames``
    counts the data frames (valid and invalid); ``invalid`` those whose payload was not a
    JSON object, with the first reason in ``invalid_reason``. ``complete`` says whether
    the window has now received at least its announced count. ``window`` is 0 for data
    frames that arrived before any ``W``.
    """

    version: int
    window: int
    records: list[dict[str, Any]] = field(default_factory=list)
    ack_seq: int = 0
    frames: int = 0
    invalid: int = 0
    invalid_reason: str | None = None
    complete: bool = False


@dataclass(frozen=True, slots=True)
class Ack:
    version: int
    seq: int


# -- the server-side decoder ---------------------------------------------------------------


class LumberjackDecoder:
    """Incremental decoder for the client->server half of one Lumberjack connection.

    ``feed(data)`` returns the ``Window`` and ``Events`` completed by ``data``, in order.
    An ``Events`` never spans two ``feed`` calls (the caller stores what it got and may
    acknowledge it), nor two windows. Raises ``DecodeError`` on anything it cannot decode;
    the connection cannot continue after that.
    """

    def __init__(
        self,
        max_window_size: int = DEFAULT_MAX_WINDOW_SIZE,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    ) -> None:
        self.max_window_size = max_window_size
        self.max_frame_bytes = max_frame_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self.version: int | None = None  # 1 or 2 once the first byte arrived
        self._vbyte = -1
        self._buffer = bytearray()
        self._need = 0  # the buffer must hold this many bytes before parsing can progress
        self._window = 0  # serial of the current window
        self._window_size: int | None = None  # announced count; None before any W
        self._window_left = 0  # announced events not yet received (negative: overfull)
        self._top_seq = 0  # highest seq in the current window
        self._group: Events | None = None  # the Events being filled by this feed call
        self._out: list[Window | Events] = []
        self._inflate_left = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not decoded yet (an incomplete frame)."""
        return len(self._buffer)

    @property
    def window_pending(self) -> bool:
        """Whether the current window still waits for announced events."""
        return self._window_size is not None and self._window_left > 0

    def feed(self, data: bytes) -> list[Window | Events]:
        buf = self._buffer
        buf += data
        if len(buf) < self._need:
            return []
        self._out = out = []
        self._group = None
        try:
            pos = self._parse(buf, 0, len(buf), 0)
        finally:
            self._group = None
        if pos:
            del buf[:pos]
            if self._need:
                self._need -= pos  # it was counted from the old start of the buffer
        return out

    # -- parsing -----------------------------------------------------------------------

    def _parse(self, buf: bytes | bytearray, pos: int, end: int, depth: int) -> int:
        """Decode whole frames from ``buf[pos:end]``; return where the first incomplete one starts."""
        vbyte = self._vbyte
        if vbyte < 0:
            if pos >= end:
                return pos
            vbyte = buf[pos]
            if vbyte not in _VERSIONS:
                raise DecodeError(f"invalid protocol version byte 0x{vbyte:02x} (expected '1' or '2')")
            self._vbyte = vbyte
            self.version = _VERSIONS[vbyte]
        need = 0
        while pos < end:
            if buf[pos] != vbyte:
                raise self._version_error(buf[pos])
            if end - pos < 6:
                if end - pos >= 2 and buf[pos + 1] not in _CLIENT_FRAMES:
                    raise self._type_error(buf[pos + 1])
                need = pos + 6
                break
            kind = buf[pos + 1]
            if kind == JSON:
                if end - pos < 10:
                    need = pos + 10
                    break
                size = _U32.unpack_from(buf, pos + 6)[0]
                if size > self.max_frame_bytes:
                    raise DecodeError(f"JSON frame of {size} bytes exceeds max_frame_bytes {self.max_frame_bytes}")
                if pos + 10 + size > end:
                    need = pos + 10 + size
                    break
                pos = self._json_frames(buf, pos, end)
            elif kind == COMPRESSED:
                size = _U32.unpack_from(buf, pos + 2)[0]
                if size > self.max_frame_bytes:
                    raise DecodeError(
                        f"compressed frame of {size} bytes exceeds max_frame_bytes {self.max_frame_bytes}"
                    )
                stop = pos + 6 + size
                if stop > end:
                    need = stop
                    break
                if depth >= MAX_NESTING:
                    raise DecodeError(f"compressed frames nested more than {MAX_NESTING} deep")
                if depth == 0:
                    self._inflate_left = self.max_decompressed_bytes
                inner = self._inflate(bytes(buf[pos + 6 : stop]))
                inner_end = len(inner)
                left = inner_end - self._parse(inner, 0, inner_end, depth + 1)
                if left:
                    raise DecodeError(f"compressed frame ends inside a frame ({left} bytes left over)")
                pos = stop
            elif kind == WINDOW:
                self._window_frame(_U32.unpack_from(buf, pos + 2)[0])
                pos += 6
            elif kind == DATA:
                stop = self._data_frame(buf, pos, end)
                if stop < 0:
                    need = -stop
                    break
                pos = stop
            else:
                raise self._type_error(kind)
        if depth == 0:
            self._need = need
        return pos

    @staticmethod
    def _type_error(kind: int) -> DecodeError:
        printable = chr(kind) if 0x20 < kind < 0x7F else "?"
        return DecodeError(f"unknown frame type 0x{kind:02x} ({printable!r})")

    def _version_error(self, got: int) -> DecodeError:
        printable = chr(got) if 0x20 < got < 0x7F else "?"
        return DecodeError(
            f"frame version byte 0x{got:02x} ({printable!r}) differs from the connection's version "
            f"'{self.version}' (or the stream is out of sync)"
        )

    @property
    def window_incomplete(self) -> bool:
        """A window was announced and not all of its events have arrived yet."""
        return self._window_size is not None and self._window_left > 0

    def _window_frame(self, size: int) -> None:
        if size > self.max_window_size:
            raise DecodeError(f"window size {size} exceeds max_window_size {self.max_window_size}")
        announced, left = self._window_size, self._window_left
        missing = left if announced is not None and 0 < left < announced else 0
        self._group = None
        self._window += 1
        self._window_size = size
        self._window_left = size
        self._top_seq = 0
        self._out.append(Window(self.version, size, self._window, missing))  # type: ignore[arg-type]

    def _open_group(self) -> Events:
        group = self._group
        if group is None:
            group = self._group = Events(self.version, self._window)  # type: ignore[arg-type]
            self._out.append(group)
        return group

    def _close_run(self, group: Events, frames: int, top: int) -> None:
        """Account ``frames`` data frames just appended to ``group``."""
        self._top_seq = top
        self._window_left -= frames
        group.frames += frames
        group.ack_seq = top
        group.complete = self._window_size is not None and self._window_left <= 0

    def _json_frames(self, buf: bytes | bytearray, pos: int, end: int) -> int:
        """Decode the run of whole ``J`` frames starting at ``pos`` (the caller checked
        that the first one is whole); return where the run stopped.

        This is the per-event hot path: keep it to one unpack, one slice, one scan.
        """
        group = self._open_group()
        append = group.records.append
        scan = _scan_json
        unpack = _U32X2.unpack_from
        vbyte = self._vbyte
        limit = self.max_frame_bytes
        top = self._top_seq
        frames = 0
        while end - pos >= 10 and buf[pos + 1] == JSON and buf[pos] == vbyte:
            seq, size = unpack(buf, pos + 2)
            if size > limit:
                raise DecodeError(f"JSON frame of {size} bytes exceeds max_frame_bytes {limit}")
            stop = pos + 10 + size
            if stop > end:
                break
            try:
                text = buf[pos + 10 : stop].decode()
                try:
                    record, at = scan(text, 0)
                except StopIteration:  # no JSON value at offset 0 (e.g. leading whitespace)
                    at = -1
                if at != len(text):
                    record = json.loads(text)  # the exact verdict: whitespace is fine, the rest raises
            except _JSON_ERRORS as e:
                record = e
            if record.__class__ is dict:
                append(record)
            else:
                self._invalid(group, record, seq)
            frames += 1
            if seq > top:
                top = seq
            pos = stop
        self._close_run(group, frames, top)
        return pos

    @staticmethod
    def _invalid(group: Events, problem: Any, seq: int) -> None:
        group.invalid += 1
        if group.invalid_reason is None:
            if isinstance(problem, UnicodeDecodeError):
                reason = "payload is not valid UTF-8"
            elif isinstance(problem, BaseException):
                reason = f"payload is not JSON: {problem}"
            else:
                reason = f"payload is a JSON {type(problem).__name__}, not an object"
            group.invalid_reason = f"event seq {seq}: {reason}"

    def _data_frame(self, buf: bytes | bytearray, pos: int, end: int) -> int:
        """Decode one v1 ``D`` frame; return its end, or ``-need`` when it is incomplete."""
        if end - pos < 10:
            return -(pos + 10)
        seq, pairs = _U32X2.unpack_from(buf, pos + 2)
        limit = self.max_frame_bytes
        if pairs * 8 > limit:
            raise DecodeError(f"data frame with {pairs} fields exceeds max_frame_bytes {limit}")
        unpack = _U32.unpack_from
        p = pos + 10
        spans = []
        for _ in range(pairs * 2):  # key, value, key, value, ...
            if end - p < 4:
                return -(p + 4)
            size = unpack(buf, p)[0]
            start = p + 4
            p = start + size
            if p - pos > limit:
                raise DecodeError(f"data frame exceeds max_frame_bytes {limit}")
            if p > end:
                return -p
            spans.append((start, p))
        record = {}
        for i in range(0, len(spans), 2):
            (ks, ke), (vs, ve) = spans[i], spans[i + 1]
            # Like Logstash: UTF-8, malformed bytes become U+FFFD (logstash-forwarder
            # ships file lines in whatever encoding the file had).
            record[buf[ks:ke].decode("utf-8", "replace")] = buf[vs:ve].decode("utf-8", "replace")
        group = self._open_group()
        group.records.append(record)
        self._close_run(group, 1, max(seq, self._top_seq))
        return p

    def _inflate(self, blob: bytes) -> bytes:
        """Inflate one ``C`` payload (zlib, RFC 1950) within the remaining size budget."""
        inflater = zlib.decompressobj()
        parts: list[bytes] = []
        pending = blob
        try:
            while not inflater.eof:
                step = min(self._inflate_left + 1, _INFLATE_STEP_BYTES)
                piece = inflater.decompress(pending, step)
                self._inflate_left -= len(piece)
                if self._inflate_left < 0:
                    raise DecodeError(
                        f"compressed frame inflates to more than max_decompressed_bytes "
                        f"{self.max_decompressed_bytes}"
                    )
                parts.append(piece)
                pending = inflater.unconsumed_tail
                if not pending and not piece and not inflater.eof:
                    raise DecodeError("truncated zlib stream in compressed frame")
        except zlib.error as e:
            raise DecodeError(f"bad zlib data in compressed frame: {e}") from None
        if inflater.unused_data:
            raise DecodeError(
                f"{len(inflater.unused_data)} bytes after the end of the zlib stream in a compressed frame"
            )
        return b"".join(parts)


# -- the client-side ack reader ------------------------------------------------------------


class AckDecoder:
    """Reads the server->client half: ``A`` frames only (used by tests and clients)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[Ack]:
        buf = self._buffer + data
        acks = []
        pos = 0
        while len(buf) - pos >= 6:
            vbyte, kind, seq = _HEADER_U32.unpack_from(buf, pos)
            if vbyte not in _VERSIONS:
                raise DecodeError(f"invalid protocol version byte 0x{vbyte:02x} in an ack")
            if kind != ACK:
                raise DecodeError(f"expected an ACK frame, got frame type 0x{kind:02x}")
            acks.append(Ack(_VERSIONS[vbyte], seq))
            pos += 6
        self._buffer = buf[pos:]
        return acks


# -- encoders ------------------------------------------------------------------------------


def _vbyte(version: int) -> int:
    try:
        return VERSION_BYTES[version]
    except KeyError:
        raise ValueError(f"version must be 1 or 2, got {version!r}") from None


def encode_ack(seq: int, version: int = 2) -> bytes:
    """The server's ``A`` frame; ``seq`` 0 is the keepalive (section 5)."""
    return _HEADER_U32.pack(_vbyte(version), ACK, seq)


def encode_window(size: int, version: int = 2) -> bytes:
    return _HEADER_U32.pack(_vbyte(version), WINDOW, size)


def encode_json(seq: int, document: Mapping[str, Any] | str | bytes, version: int = 2) -> bytes:
    """A ``J`` frame; a mapping is serialised compactly, str/bytes are sent as they are."""
    if isinstance(document, Mapping):
        document = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    if isinstance(document, str):
        document = document.encode()
    return _HEADER_U32X2.pack(_vbyte(version), JSON, seq, len(document)) + document


def encode_data(seq: int, fields: Mapping[str, str], version: int = 1) -> bytes:
    """A v1 ``D`` frame of key/value pairs (values are sent as their ``str``)."""
    parts = [_HEADER_U32X2.pack(_vbyte(version), DATA, seq, len(fields))]
    for key, value in fields.items():
        k, v = str(key).encode(), str(value).encode()
        parts += (_U32.pack(len(k)), k, _U32.pack(len(v)), v)
    return b"".join(parts)


def encode_compressed(frames: bytes, level: int = 3, version: int = 2) -> bytes:
    """A ``C`` frame wrapping already encoded ``frames`` (Beats' default level is 3)."""
    blob = zlib.compress(frames, level)
    return _HEADER_U32.pack(_vbyte(version), COMPRESSED, len(blob)) + blob


def encode_window_frames(
    records: Iterable[Mapping[str, Any]],
    version: int = 2,
    compress_level: int | None = 3,
    first_seq: int = 1,
) -> bytes:
    """One whole window as Beats sends it: ``W`` N, then N data frames numbered from
    ``first_seq``, inside one ``C`` frame unless ``compress_level`` is None (or 0, which is
    what Beats' ``compression_level: 0`` means)."""
    encode = encode_json if version == 2 else encode_data
    frames = [encode(first_seq + i, record, version) for i, record in enumerate(records)]
    body = b"".join(frames)
    if compress_level:
        body = encode_compressed(body, compress_level, version)
    return encode_window(len(frames), version) + body

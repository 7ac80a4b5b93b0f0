"""Lumberjack (Beats) protocol codec, v1 and v2: the server's decoder, pure Python with
no Twisted imports.

``LumberjackDecoder`` is an incremental decoder for one client->server TCP stream. The
connection's first byte picks the version (``'1'`` or ``'2'``); every later frame must
carry the same one. It decodes ``W`` window frames, ``J`` JSON data frames, ``D``
key/value data frames and ``C`` compressed frames (a zlib stream whose inflated bytes are
themselves whole frames, possibly nested), tracks windows, and returns data frames
grouped into ``Events`` together with the value to acknowledge them with.

The frames themselves (version bytes, frame types, ``Window`` and ``Events``, the
encoders of ``W``/``J``/``D``/``C``) are ``lumberjack_frames``'; the ``A`` frames
(``Ack``, ``encode_ack`` and the client side's reader ``AckDecoder``) are
``lumberjack_acks``'. This module exports both modules' public names, so users import
this one.

Wire facts and the differences between real peers are in ``docs/protocols/lumberjack.md``;
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
- Decoding costs time linear in the bytes received, whatever the frames and however
  they are split into reads, and each event is bounded: ``max_event_bytes`` (a ``J``
  payload, a whole ``D`` frame) and ``max_data_fields`` (pairs in one ``D`` frame) are
  checked from the length fields, before the bytes they announce are decoded. A ``C``
  frame is bounded by ``max_decompressed_bytes`` and may hold at most
  ``max_window_size`` + 1 frames (one window and its ``W``), nested frames included.
- The result does not depend on how the stream is split into ``feed`` calls: the same
  frames, and the same error at the same place (its ``messages`` carry what that call
  decoded before it). A ``C`` frame is all or nothing: when anything inside it is bad,
  none of its frames is returned.
- A top-level ``C`` frame that holds only ``J`` frames of one ``Events`` leaves its
  payload with it, the very ``bytes`` inflated (``Events.payloads``): the spool may
  store those instead of the documents (``logrouter.sources.compressed_documents``).
"""

from __future__ import annotations

import struct
import sys
from typing import Any

from logrouter.native import NATIVE
from logrouter.wire import json_text
from logrouter.wire.errors import DecodeError
from logrouter.wire.inflate import InflateError, inflate
from logrouter.wire.json_lazy import split_runs
from logrouter.wire.lumberjack_acks import Ack, AckDecoder, encode_ack
from logrouter.wire.lumberjack_frames import (
    CLIENT_FRAMES,
    COMPRESSED,
    DATA,
    JSON,
    VERSIONS,
    WINDOW,
    Events,
    Window,
    encode_compressed,
    encode_data,
    encode_json,
    encode_window,
    encode_window_frames,
)

__all__ = [
    "Ack",
    "AckDecoder",
    "DEFAULT_MAX_DATA_FIELDS",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "DEFAULT_MAX_EVENT_BYTES",
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
    "add_documents",
    "decode_group",
]

DEFAULT_MAX_WINDOW_SIZE = 10_000  # go-lumber's MaxWindowSize default (section 3)
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024
# Filebeat cuts a line at max_bytes, 10 MiB by default; this leaves room for its fields
# and JSON escaping.
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024
# logstash-forwarder sends a handful of fields (line, offset, file, host and the user's
# "fields"); Elasticsearch refuses more than 1000 fields per index by default anyway.
DEFAULT_MAX_DATA_FIELDS = 1024
MAX_NESTING = 8  # C frames inside C frames; real clients never nest at all

_U32 = struct.Struct(">I")
_U32X2 = struct.Struct(">II")
_TAG_U32X2 = struct.Struct(">HII")  # version and frame type as one number, seq, length

_UNBOUNDED = sys.maxsize


def decode_group(group: Events) -> None:
    """Decode an ``Events`` kept undecoded (``records`` its documents) into what the
    Python path gives: the records of the JSON objects, the others counted invalid."""
    if group.undecoded:
        documents, seqs = split_runs(group.runs)
        group.runs, group.undecoded = [], False
        add_documents(group, documents, seqs)


def add_documents(group: Events, documents: list[bytes], seqs: list[int]) -> None:
    """Decode a run of ``J`` documents (their frames' ``seqs``) into ``group``: all at
    once (``json_text.objects_or_none``), or, where one is not an object msgspec reads,
    one by one (``json_text.objects_or_reasons``), each getting its own verdict."""
    records = json_text.objects_or_none(documents)
    if records is not None:
        group.records.extend(records)
        group.documents.extend(documents)
        return
    for document, seq, verdict in zip(documents, seqs, json_text.objects_or_reasons(documents)):
        if verdict.__class__ is dict:
            group.records.append(verdict)
            group.documents.append(document)
        else:
            group.invalid += 1
            if group.invalid_reason is None:
                group.invalid_reason = f"event seq {seq}: payload is {verdict}"


# -- the server-side decoder ---------------------------------------------------------------


class LumberjackDecoder:
    """Incremental decoder for the client->server half of one Lumberjack connection.

    ``feed(data)`` returns the ``Window`` and ``Events`` completed by ``data``, in order.
    An ``Events`` never spans two ``feed`` calls (the caller stores what it got and may
    acknowledge it), nor two windows. Raises ``DecodeError`` on anything it cannot decode,
    with the frames this call decoded before the bad one in its ``messages``; the
    connection cannot continue after that, and later calls raise again.
    """

    def __init__(
        self,
        max_window_size: int = DEFAULT_MAX_WINDOW_SIZE,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_data_fields: int = DEFAULT_MAX_DATA_FIELDS,
        keep_documents: bool = False,
    ) -> None:
        self.max_window_size = max_window_size
        self.max_frame_bytes = max_frame_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self.max_event_bytes = max_event_bytes
        self.max_data_fields = max_data_fields
        # Runs of J frames stay undecoded, for the source's native read (Events.undecoded),
        # cut out natively (an extension built before json_frames: decoded here).
        self._json_frames_native = getattr(NATIVE, "json_frames", None) if keep_documents else None
        self.keep_documents = self._json_frames_native is not None
        # One event may be no larger than either limit; errors name the one that bit.
        if max_event_bytes < max_frame_bytes:
            self._event_limit, self._event_limit_name = max_event_bytes, "max_event_bytes"
        else:
            self._event_limit, self._event_limit_name = max_frame_bytes, "max_frame_bytes"
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
        # Frames the C frame being decoded may still yield (unbounded outside C frames).
        self._frames_left = _UNBOUNDED
        # A top-level D frame cut by the end of a read: (offset of the next length field
        # from the frame's start, fields left, record so far, key awaiting its value).
        self._partial: tuple[int, int, dict[str, str], str | None] | None = None
        self._c_mark: tuple[int, Events | None, tuple[Any, ...]] | None = None  # output before the C frame being decoded
        self._c_plain = False  # the top-level C frame being decoded held only J frames so far
        self._failed: str | None = None  # the reason of the error that ended the stream

    @property
    def pending_bytes(self) -> int:
        """Bytes held of a frame not complete yet (0 at a frame boundary)."""
        return len(self._buffer)

    buffered = pending_bytes

    @property
    def window_pending(self) -> bool:
        """Whether the current window still waits for announced events."""
        return self._window_size is not None and self._window_left > 0

    def feed(self, data: bytes) -> list[Window | Events]:
        if self._failed is not None:
            raise DecodeError(f"decoder already failed: {self._failed}")
        buf = self._buffer
        buf += data
        if len(buf) < self._need:
            return []
        self._out = out = []
        self._group = None
        try:
            pos = self._parse(buf, 0, len(buf), 0)
        except DecodeError as error:
            if self._c_mark is not None:
                self._rollback(self._c_mark)
            self._failed = error.reason  # not the error: its traceback holds the inflated bytes
            error.messages = out
            raise
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
            if vbyte not in VERSIONS:
                raise DecodeError(f"invalid protocol version byte 0x{vbyte:02x} (expected '1' or '2')")
            self._vbyte = vbyte
            self.version = VERSIONS[vbyte]
        need = 0
        while pos < end:
            if depth and self._frames_left <= 0:
                raise DecodeError(
                    f"compressed frame holds more than {self.max_window_size + 1} frames "
                    f"(max_window_size {self.max_window_size} and a W frame)"
                )
            if buf[pos] != vbyte:
                raise self._version_error(buf[pos])
            if end - pos < 6:
                # Wake up again for the type byte: it is checked as soon as it is here,
                # as it would be had the header arrived in one piece.
                if end - pos < 2:
                    need = pos + 2
                    break
                if buf[pos + 1] not in CLIENT_FRAMES:
                    raise self._type_error(buf[pos + 1])
                need = pos + 6
                break
            kind = buf[pos + 1]
            if kind == JSON:
                if end - pos < 10:
                    need = pos + 10
                    break
                size = _U32.unpack_from(buf, pos + 6)[0]
                if size > self._event_limit:
                    raise DecodeError(
                        f"JSON frame of {size} bytes exceeds {self._event_limit_name} {self._event_limit}"
                    )
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
                    # A real C frame holds one window's events (Logstash also lets the W
                    # frame sit inside). Without a count, tiny frames (6-byte W frames,
                    # 12-byte {} events) inflating from a small payload would turn into
                    # millions of objects: a GiB of memory and a minute of CPU per frame.
                    self._frames_left = self.max_window_size + 1
                    self._c_mark = self._mark()
                    self._c_plain = True
                    out_before, group_before = len(self._out), self._group
                    frames_before = 0 if group_before is None else group_before.frames
                else:
                    self._frames_left -= 1
                    self._c_plain = False
                payload = bytes(buf[pos + 6 : stop])  # kept as it arrived (Events.payloads)
                inner = self._inflate(payload)
                inner_end = len(inner)
                left = inner_end - self._parse(inner, 0, inner_end, depth + 1)
                if left:
                    raise DecodeError(f"compressed frame ends inside a frame ({left} bytes left over)")
                if depth == 0:
                    self._c_mark = None
                    self._frames_left = _UNBOUNDED
                    self._keep_payload(payload, inner_end, out_before, group_before, frames_before)
                pos = stop
            elif kind == WINDOW:
                self._window_frame(_U32.unpack_from(buf, pos + 2)[0])
                self._frames_left -= 1
                self._c_plain = False
                pos += 6
            elif kind == DATA:
                stop = self._data_frame(buf, pos, end, depth)
                if stop < 0:
                    need = -stop
                    break
                self._frames_left -= 1
                self._c_plain = False
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

    def _mark(self) -> tuple[int, Events | None, tuple[Any, ...]]:
        """Where the output stands, for ``_rollback``."""
        group = self._group
        if group is None:
            return len(self._out), None, ()
        return len(self._out), group, (
            len(group.records), len(group.documents), group.documents_match,
            group.frames, group.invalid, group.invalid_reason, group.ack_seq, group.complete, group.undecoded,
            len(group.runs),
        )

    def _rollback(self, mark: tuple[int, Events | None, tuple[Any, ...]]) -> None:
        """Take back the output added since ``mark`` (a C frame that turned out bad)."""
        count, group, fields = mark
        del self._out[count:]
        if group is not None:
            del group.records[fields[0] :]
            del group.documents[fields[1] :]
            group.documents_match = fields[2]
            group.frames, group.invalid, group.invalid_reason, group.ack_seq, group.complete = fields[3:8]
            # Records decoded since the mark stay decoded; a group undecoded since is empty again.
            group.undecoded = group.undecoded and fields[8]
            del group.runs[fields[9] :]
        self._c_mark = None

    def _keep_payload(self, payload: bytes, inflated: int, out_before: int, group_before: Events | None, frames_before: int) -> None:
        """After a top-level ``C`` frame: its payload goes with the group its frames went
        to (``Events.payloads``) when they were ``J`` frames only, all of that one group."""
        group = self._group
        if not self._c_plain or group is None:
            return
        if group is not group_before:
            if group_before is not None or len(self._out) != out_before + 1:
                return
            frames_before = 0
        group.payloads.append(payload)
        group.payload_frames += group.frames - frames_before
        group.inflated_bytes += inflated

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

        This is the per-event hot path. Kept undecoded (``keep_documents``), the run is
        cut out natively (``logrouter_native.json_frames``: where each document lies in
        ``buf``, no bytes object per document; this walk below is its reference, and
        they stop at the same frame). Else in two tight passes: the frames' documents
        cut out (one unpack, one slice each), then all of them decoded at once
        (``json_text.objects_or_none``). A document that is not an object msgspec reads
        sends the run one by one (``json_text.objects_or_reasons``), each document
        getting its own verdict.
        """
        group = self._open_group()
        json_tag = self._vbyte << 8 | JSON
        if self.keep_documents and (group.undecoded or not group.records):
            # Offsets from the buffer's start where it is the inflated payload (kept
            # whole); else from the run's, which is copied out of the receive buffer.
            inflated = buf.__class__ is bytes
            base = 0 if inflated else pos
            found = self._json_frames_native(buf, pos, end, json_tag, self._event_limit, self._frames_left, self._top_seq, base)  # type: ignore[misc]
            if found is not None:
                stop, top, spans = found
                frames = len(spans) // 12
                group.undecoded = True
                group.runs.append((buf if inflated else bytes(buf[pos:stop]), spans))  # type: ignore[arg-type]
                self._frames_left -= frames
                self._close_run(group, frames, top)
                return stop
        documents: list[bytes] = []
        keep = documents.append
        unpack = _TAG_U32X2.unpack_from
        limit = self._event_limit
        top = self._top_seq
        seqs: list[int] = []
        keep_seq = seqs.append
        for _ in range(self._frames_left):
            if end - pos < 10:
                break
            tag, seq, size = unpack(buf, pos)
            if tag != json_tag:
                break
            stop = pos + 10 + size
            if stop > end or size > limit:
                break  # the caller waits for it, or refuses it once this run is accounted
            keep(buf[pos + 10 : stop])
            keep_seq(seq)
            if seq > top:
                top = seq
            pos = stop
        frames = len(documents)
        if group.undecoded:
            decode_group(group)
        add_documents(group, documents, seqs)
        self._frames_left -= frames
        self._close_run(group, frames, top)
        return pos

    def _data_frame(self, buf: bytes | bytearray, pos: int, end: int, depth: int) -> int:
        """Decode one v1 ``D`` frame; return its end, or ``-need`` when it is incomplete.

        A top-level frame cut by the end of the input keeps what it decoded in
        ``_partial`` and the next call resumes there: starting over on every read made a
        large frame arriving in many reads cost time quadratic in its size.
        """
        if end - pos < 10:
            return -(pos + 10)
        limit = self._event_limit
        partial = self._partial
        if partial is None:
            seq, pairs = _U32X2.unpack_from(buf, pos + 2)
            if pairs > self.max_data_fields:
                raise DecodeError(f"data frame with {pairs} fields exceeds max_data_fields {self.max_data_fields}")
            if 10 + pairs * 8 > limit:
                raise DecodeError(f"data frame with {pairs} fields exceeds {self._event_limit_name} {limit}")
            p = pos + 10
            left = pairs * 2  # key, value, key, value, ...
            record: dict[str, str] = {}
            key: str | None = None
        else:
            self._partial = None
            seq = _U32.unpack_from(buf, pos + 2)[0]
            offset, left, record, key = partial
            p = pos + offset
        unpack = _U32.unpack_from
        while left:
            if end - p < 4:
                need = p + 4
                break
            start = p + 4
            stop = start + unpack(buf, p)[0]
            if stop - pos > limit:
                raise DecodeError(f"data frame exceeds {self._event_limit_name} {limit}")
            if stop > end:
                need = stop
                break
            # Like Logstash: UTF-8, malformed bytes become U+FFFD (logstash-forwarder
            # ships file lines in whatever encoding the file had).
            text = buf[start:stop].decode("utf-8", "replace")
            if key is None:
                key = text
            else:
                record[key] = text
                key = None
            left -= 1
            p = stop
        else:
            group = self._open_group()
            if group.undecoded:
                decode_group(group)
            group.records.append(record)
            group.documents_match = False  # a record without a JSON text
            self._close_run(group, 1, max(seq, self._top_seq))
            return p
        if depth == 0:
            self._partial = (p - pos, left, record, key)
        return -need

    def _inflate(self, blob: bytes) -> bytes:
        """Inflate one ``C`` payload (zlib, RFC 1950) within the remaining size budget
        (``max_decompressed_bytes`` counts every C frame nested in a top-level one)."""
        try:
            inflated = inflate(blob, self._inflate_left)
        except InflateError as e:
            raise self._inflate_error(e) from None
        self._inflate_left -= len(inflated)
        return inflated

    def _inflate_error(self, error: InflateError) -> DecodeError:
        """The codec's reasons for what ``inflate`` refused."""
        if error.too_big:
            return DecodeError(
                f"compressed frame inflates to more than max_decompressed_bytes {self.max_decompressed_bytes}"
            )
        reason = error.reason
        if reason == "compressed data is truncated":
            return DecodeError("truncated zlib stream in compressed frame")
        if reason.startswith("bad compressed data: "):
            return DecodeError(f"bad zlib data in compressed frame: {reason[len('bad compressed data: '):]}")
        if reason.endswith(" bytes after the end of the compressed stream"):
            trailing = reason[: -len(" bytes after the end of the compressed stream")]
            return DecodeError(f"{trailing} bytes after the end of the zlib stream in a compressed frame")
        return DecodeError(f"compressed frame: {reason}")

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
- Encoders for acks and for the three carrier modes (used by tests and forward clients).

Which entries are events, and the bomb rule that refuses a message of mostly invalid
ones on every path, are in ``forward_entries``.

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

import codecs
import functools
import gzip
import json
import re
import struct
import time as _time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import msgspec

from logrouter.wire.forward_entries import (
    MAX_TIME_NS,
    MIN_TIME_NS,
    NANOS_PER_SECOND,
    EntryBombError,
    EntryTally,
    EventNanos,
    ForwardDecodeError,
    collect_events,
    is_bomb,
    str_keyed,
)
from logrouter.wire.inflate import GZIP, InflateError, inflate_pieces

try:
    import zstandard
except ImportError:  # zstd is optional: fluentd itself calls it experimental (section 5)
    zstandard = None

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
    "decode_ack",
    "decode_entries",
    "encode_ack",
    "encode_event_time",
    "encode_forward",
    "encode_message",
    "encode_packed_forward",
]

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024
DEFAULT_PART_BYTES = 8 * 1024 * 1024

EVENT_TIME_EXT_CODE = 0
_EVENT_TIME = struct.Struct(">II")  # u32 seconds, u32 nanoseconds (section 6)

# One inflate/read step produces at most this much, so a bomb is caught one step after
# it passes the limit instead of after it has filled memory.
_DECOMPRESS_STEP_BYTES = 1 << 20
# Compressed gzip input handed to zlib per call. The inflated pieces end where a slice was
# used up and a deferred message's parts end on pieces, and a part's dedupe key is its
# index: a resend after a crash, even one by an upgraded logrouter, must split the same
# way, so this stays what it has been (inflate.py's default is 64 KiB).
_INFLATE_INPUT_BYTES = 256 << 10
# msgpack refuses nesting deeper than this (its C unpacker's fixed stack).
_MSGPACK_MAX_DEPTH = 1024
# The first bytes of an array that may hold two items: fixarray 2, array16, array32.
_PAIR_HEADS = frozenset((0x92, 0xDC, 0xDD))
_LIST_STEP_ENTRIES = 1 << 16  # parsed entries looked at per step of a deferred message


# -- results and errors ------------------------------------------------------------------


@dataclass(slots=True)
class EventMessage:
    """One forward request: a tag and its valid events.

    ``chunk`` is the ``chunk`` option's bytes exactly as received (None when the client
    wants no ack); echo it unchanged. ``invalid`` counts events skipped for a bad time or a
    record that is not a map: like fluentd, the request is still acked. ``size_bytes`` is
    the message's size on the wire (characters in JSON mode), for metrics.

    ``packed`` is set for a (Compressed)PackedForward message decoded whole: the exact
    bytes of its entries (inflated) and the clock reading its time-0 entries got (None
    if none needed one). ``decode_entries(*packed)`` gives ``events`` and ``invalid``
    again, exactly, so the spool can store the bytes that arrived.
    """

    tag: str
    events: list[tuple[int, dict[str, Any]]]
    chunk: bytes | None
    options: dict[str, Any]
    invalid: int
    size_bytes: int
    packed: tuple[bytes, int | None] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A msgpack ``nil`` message: a TCP keepalive no-op (section 9)."""


_HEARTBEAT = Heartbeat()


class DeferredMessage:
    """A framed message whose events cost too much to build inside ``feed``.

    ``parts()`` builds them: ``EventMessage`` objects in order, each with the message's
    tag, chunk and options and the events of about ``part_bytes`` of its entries, so only
    one part's events need to exist at a time. It is pure and may run on another thread
    (one thread at a time). Everything that makes the whole message bad (a compression
    bomb, corrupt or truncated compressed data, garbage or a cut in the entries) is found
    by a first pass that builds nothing, and raised as ``ForwardDecodeError`` before any
    part is yielded; only a fault that shows once values are built (a malformed msgpack
    Timestamp, an array used as a map key) can stop it after earlier parts. The parts of
    one message always come out the same, so a resend splits the same way. The first
    part's ``size_bytes`` is the message's wire size, later parts have 0. A message the
    bomb rule refuses (``forward_entries``) raises ``EntryBombError``, from the first pass
    when its entries are not even pairs, else once the parts have looked at its entries.

    ``steps()`` is ``parts()`` with ``None`` between bounded steps of work (an inflated
    piece or step of at most 1 MiB, a JSON parse, 65536 parsed entries): a scheduler
    takes turns between messages there, and a stop can leave a message there.
    """

    __slots__ = ("size_bytes", "_produce")

    def __init__(self, size_bytes: int, produce: Callable[[int], Iterator[EventMessage | None]]) -> None:
        self.size_bytes = size_bytes
        self._produce = produce

    def steps(self, part_bytes: int = DEFAULT_PART_BYTES) -> Iterator[EventMessage | None]:
        return self._produce(part_bytes)

    def parts(self, part_bytes: int = DEFAULT_PART_BYTES) -> Iterator[EventMessage]:
        return (part for part in self._produce(part_bytes) if part is not None)

    def decode(self) -> EventMessage:
        """The whole message at once, as ``feed`` returns it without ``offload_bytes``."""
        events: list[tuple[int, dict[str, Any]]] = []
        invalid = 0
        first = None
        for part in self.parts():
            first = first or part
            events += part.events
            invalid += part.invalid
        assert first is not None  # every producer yields at least one part
        return EventMessage(first.tag, events, first.chunk, first.options, invalid, self.size_bytes)

    def __repr__(self) -> str:
        return f"<DeferredMessage of {self.size_bytes} bytes>"


def _ext_hook(code: int, data: bytes) -> Any:
    # Converting here keeps the per-event loop to a type check (see collect_events).
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


def _msgpack_problem(exc: Exception, offset: int, byte_at: Callable[[int], int | None]) -> str:
    """What was wrong, never empty: msgpack raises FormatError and StackError without a message.

    ``offset`` is where the unpacker stopped (its ``tell()``), ``byte_at`` finds the byte
    there if it is still at hand.
    """
    if isinstance(exc, msgpack.FormatError):
        byte = byte_at(offset)
        found = f"byte 0x{byte:02x}" if byte is not None else "byte"
        return f"FormatError (unexpected {found} at offset {offset})"
    if isinstance(exc, msgpack.StackError):
        return f"StackError (nested more than {_MSGPACK_MAX_DEPTH} levels deep)"
    return str(exc) or type(exc).__name__


def _byte_in(data: Any, start: int) -> Callable[[int], int | None]:
    """A ``byte_at`` for ``_msgpack_problem``: ``data`` holds the stream's bytes from ``start``."""

    def byte_at(offset: int) -> int | None:
        index = offset - start
        return data[index] if 0 <= index < len(data) else None

    return byte_at


# -- decompression -----------------------------------------------------------------------


def _too_big(limit: int) -> ForwardDecodeError:
    return ForwardDecodeError(f"decompressed entries exceed max_decompressed_bytes ({limit})")


def _inflated_pieces(
    blob: bytes, compressed: Any, limit: int, step: int = _DECOMPRESS_STEP_BYTES
) -> Iterator[bytes]:
    """The entries of a PackedForward blob in pieces of at most ``step``, never more than ``limit``.

    An unknown ``compressed`` option is refused here at once; bad compressed data only
    as the pieces are read.
    """
    if compressed is None or compressed == "text":
        return _slices(blob)
    if compressed == "gzip":
        return _gunzip_pieces(blob, limit, step)
    if compressed == "zstd":
        if zstandard is None:
            raise ForwardDecodeError("compressed 'zstd' needs the zstandard package (not installed)")
        return _unzstd_pieces(blob, limit, step)
    raise ForwardDecodeError(f"unknown compressed option {compressed!r}")


def _slices(blob: bytes) -> Iterator[memoryview]:
    view = memoryview(blob)
    for start in range(0, len(view), _DECOMPRESS_STEP_BYTES):
        yield view[start : start + _DECOMPRESS_STEP_BYTES]


def _gunzip_pieces(blob: bytes, limit: int, step: int) -> Iterator[bytes]:
    """Inflate one or more concatenated gzip members (compressable.rb concatenates them)."""
    try:
        yield from inflate_pieces(blob, limit, GZIP, step=step, input_slice=_INFLATE_INPUT_BYTES)
    except InflateError as exc:
        raise _gunzip_error(exc, limit) from None


def _gunzip_error(error: InflateError, limit: int) -> ForwardDecodeError:
    """The codec's reasons for what the bounded inflate refused."""
    if error.too_big:
        return _too_big(limit)
    reason = error.reason
    if reason == "compressed data is truncated":
        return ForwardDecodeError("bad gzip data: truncated member")
    if reason.startswith("bad compressed data: "):
        reason = reason[len("bad compressed data: ") :]
    return ForwardDecodeError(f"bad gzip data: {reason}")


def _unzstd_pieces(blob: bytes, limit: int, step: int) -> Iterator[bytes]:
    """Inflate concatenated zstd frames.

    zstandard's stream reader does not report a truncated last frame; a cut inside an
    entry is still caught when the entries are unpacked.
    """
    total = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(blob, read_across_frames=True) as reader:
            while True:
                piece = reader.read(min(limit - total + 1, step))
                if not piece:
                    break
                total += len(piece)
                if total > limit:
                    raise _too_big(limit)
                yield piece
    except zstandard.ZstdError as exc:
        raise ForwardDecodeError(f"bad zstd data: {exc}") from exc


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


def _entries_error(exc: Exception, unpacker: msgpack.Unpacker, piece: Any, piece_start: int) -> ForwardDecodeError:
    problem = _msgpack_problem(exc, unpacker.tell(), _byte_in(piece, piece_start))
    return ForwardDecodeError(f"PackedForward entries are not valid msgpack: {problem}")


def _check_entries(pieces: Iterator[Any], limit: int) -> Iterator[None]:
    """Read a blob's entries through without building them: every fatal fault of its
    compression (bomb, corrupt or truncated data) or of its msgpack framing (garbage,
    too deep, cut inside an entry) surfaces here, before any part is handed out. So does
    a bomb of entries that are not even pairs: an entry whose first byte is no array
    header that can hold two items is invalid, any other counts as valid here, so this
    refuses no message the bomb rule would let through. ``None`` after every piece."""
    unpacker = msgpack.Unpacker(max_buffer_size=limit + _DECOMPRESS_STEP_BYTES + 1)
    skip, tell = unpacker.skip, unpacker.tell
    pair_heads = _PAIR_HEADS
    fed = entries = invalid = 0
    cut = False  # the entry being read began in an earlier piece
    for piece in pieces:
        unpacker.feed(piece)
        end = fed + len(piece)
        try:
            while True:
                start = tell()  # an entry's first byte, unless it is the rest of a cut one
                if start < end:
                    if not cut:
                        entries += 1
                        if piece[start - fed] not in pair_heads:
                            invalid += 1
                            if is_bomb(entries - invalid, invalid):
                                raise EntryBombError(entries - invalid, invalid)
                    cut = True
                skip()
                cut = False
        except msgpack.OutOfData:
            pass
        except _MSGPACK_ERRORS as exc:
            raise _entries_error(exc, unpacker, piece, fed) from exc
        fed = end
        yield None
    if not _entries_end_cleanly(unpacker):
        raise ForwardDecodeError("PackedForward entries end inside an entry (truncated)")


# -- framing -----------------------------------------------------------------------------


def _oversize(limit: int, detail: str = "") -> ForwardDecodeError:
    return ForwardDecodeError(f"message exceeds max_message_bytes ({limit}){detail}")


# A PackedForward blob sent as str (out_forward's str32) is fed to the unpacker as bin of
# the same length instead: the unpacker then copies the entries' bytes rather than decoding
# them as UTF-8 (surrogateescape) only for _packed to encode them back, which cost a sixth
# of the decode. The bytes that come out are the same either way.
_STR_AS_BIN = {0xD9: 0xC4, 0xDA: 0xC5, 0xDB: 0xC6}
_SHORT_TAG = range(0xA0, 0xC0)  # fixstr
_SCAN_BYTES = 1 << 20  # the longest message in progress the scanner keeps a copy of


def _blob_header_at(data: Any, index: int) -> int | None:
    """Where the str header of a PackedForward blob is, for a message starting at ``index``.

    Only ``[tag, str blob, options?]`` with a fixstr, str8 or bin8 tag, and only when the
    header is inside ``data``; None otherwise (the message is then fed as it came).
    """
    end = len(data)
    if index + 1 >= end or data[index] not in (0x92, 0x93):
        return None
    at = index + 1
    kind = data[at]
    if kind in _SHORT_TAG:
        at += 1 + (kind & 0x1F)
    elif kind == 0xD9 or kind == 0xC4:  # str8, bin8
        if at + 1 >= end:
            return None
        at += 2 + data[at + 1]
    else:
        return None
    return at if at < end and data[at] in _STR_AS_BIN else None


class _MsgpackFramer:
    """Splits a msgpack byte stream into top-level objects, each at most ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._unpacker = _new_unpacker(limit)
        self._fed = 0  # stream offset of the end of everything fed so far
        self._message_start = 0  # stream offset where the current message began
        # Runs ahead over the same bytes without building anything (skip), to find where
        # messages start before they are fed; None once it met input it cannot skip (the
        # unpacker then reports the fault).
        # It holds a copy of a message in progress, so it stands down for a message longer
        # than _SCAN_BYTES (restarted after it: _rescan), and memory stays about one copy.
        self._scanner: msgpack.Unpacker | None = msgpack.Unpacker(max_buffer_size=limit)
        self._scan_base = 0  # stream offset of the scanner's first byte
        self._next_start = 0  # stream offset where the first message not yet skipped starts
        self._rescan = False

    @property
    def pending_bytes(self) -> int:
        return self._fed - self._message_start

    def frames(self, data: bytes) -> Iterator[tuple[Any, int]]:
        """Yield ``(object, wire_size)`` for each message completed by ``data``."""
        unpacker = self._unpacker
        while data:
            # Never hand the unpacker more than the rest of the current message's
            # allowance: it then never sees a byte past the limit, so a message is refused
            # as oversize at its (limit+1)th byte however the stream was split, never for
            # what a later byte would have shown; and its buffer (max_buffer_size) never
            # fills. Messages completed by a piece advance the start, so the next piece
            # gets a fresh allowance.
            room = self._limit - (self._fed - self._message_start)
            if room <= 0:
                raise _oversize(self._limit)
            if len(data) <= room:
                piece, data = data, b""
            else:
                view = memoryview(data)
                piece, data = view[:room], view[room:]
            if self._scanner is not None:
                piece = self._blobs_as_bin(piece)
            unpacker.feed(piece)
            self._fed += len(piece)
            yield from self._drain(piece)

    def _blobs_as_bin(self, piece: Any) -> Any:
        """``piece``, with the str header of each PackedForward blob starting in it made bin."""
        scanner = self._scanner
        assert scanner is not None
        start = self._fed
        end = start + len(piece)
        headers = []
        try:
            scanner.feed(piece)
            while True:
                if start <= self._next_start < end:
                    header = _blob_header_at(piece, self._next_start - start)
                    if header is not None:
                        headers.append(header)
                scanner.skip()
                self._next_start = self._scan_base + scanner.tell()
        except msgpack.OutOfData:
            if end - self._next_start > _SCAN_BYTES:
                self._scanner = None  # a long message: the unpacker's copy is enough
                self._rescan = True
        except Exception:  # noqa: BLE001 - garbage, too deep, ...: the unpacker says what
            self._scanner = None
        if not headers:
            return piece
        changed = bytearray(piece)
        for header in headers:
            changed[header] = _STR_AS_BIN[changed[header]]
        return changed

    def _restart_scanner(self, piece: Any, end: int) -> None:
        """A new scanner from ``end`` (where the long message ended, inside ``piece``): the
        rest of ``piece`` was fed as it came; the messages after it are scanned again."""
        self._rescan = False
        scanner = self._scanner = msgpack.Unpacker(max_buffer_size=self._limit)
        self._scan_base = self._next_start = end
        try:
            scanner.feed(piece[end - (self._fed - len(piece)) :])
            while True:
                scanner.skip()
                self._next_start = end + scanner.tell()
        except msgpack.OutOfData:
            pass
        except Exception:  # noqa: BLE001 - the unpacker reports it
            self._scanner = None

    def _drain(self, piece: Any) -> Iterator[tuple[Any, int]]:
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
                # The parser stops at a bad byte as soon as it arrives, so it is in this piece.
                byte_at = _byte_in(piece, self._fed - len(piece))
                problem = _msgpack_problem(exc, unpacker.tell(), byte_at)
                raise ForwardDecodeError(f"invalid msgpack: {problem}") from exc
            end = unpacker.tell()
            size = end - self._message_start
            self._message_start = end
            if self._rescan:
                self._restart_scanner(piece, end)
            if size > self._limit:
                raise _oversize(self._limit)
            yield obj, size


_JSON_WHITESPACE = re.compile(r"[ \t\r\n]*")
_JSON_BRACKET_OR_QUOTE = re.compile(r'[\[\]{}"]')
_JSON_QUOTE_OR_BACKSLASH = re.compile(r'["\\]')


class _JsonFramer:
    """Splits a stream of JSON arrays/objects into the text of each value (in_forward's JSON mode).

    json.JSONDecoder cannot tell a truncated value from a broken one, so a small scanner
    finds where each top-level value ends (bracket depth outside strings) and only whole
    values are parsed (by ``_parse_json``): a parse error is then always garbage. Limits
    count characters.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._text = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self._pieces: list[str] = []  # text received so far of the value in progress
        self._pending_chars = 0
        self._in_value = False
        self._depth = 0
        self._in_string = False
        self._skip_next_char = False  # the previous piece ended in a backslash in a string

    @property
    def pending_bytes(self) -> int:
        # characters of the value so far, plus the bytes of a character cut in two
        return self._pending_chars + len(self._text.getstate()[0])

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
            yield value_text, len(value_text)
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



_INT64_MIN = -(1 << 63)
_UINT64_MAX = (1 << 64) - 1


def _json_int(text: str) -> int | str:
    # The spool stores records as msgpack, which holds int64..uint64 only; a longer
    # integer is kept as its digits rather than failing the whole batch later.
    if len(text) < 19:
        return int(text)
    if len(text) > 21:
        return text  # also spares int() its 4300-digit refusal
    value = int(text)
    return value if _INT64_MIN <= value <= _UINT64_MAX else text


_JSON_PARSER = json.JSONDecoder(parse_int=_json_int)
# A \uD800-\uDFFF escape: paired ones make one character, a lone one a lone surrogate.
_JSON_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# Lone surrogates no UTF-8 can hold; U+DC80-U+DCFF are left alone: they are bytes that were
# not UTF-8 (surrogateescape), written back unchanged.
_UNSTORABLE_SURROGATE = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def _parse_json(value_text: str) -> Any:
    try:
        value = _JSON_PARSER.decode(value_text)
    except ValueError as exc:  # JSONDecodeError and its kin
        raise ForwardDecodeError(f"invalid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ForwardDecodeError("invalid JSON: nested too deep") from exc
    if _JSON_SURROGATE_ESCAPE.search(value_text):
        value = _replace_lone_surrogates(value)
    return value


def _replace_lone_surrogates(value: Any) -> Any:
    """``value`` with U+FFFD for every lone surrogate a JSON escape made, in strings and keys.

    Such a string cannot be stored (the spool and the lake write UTF-8) or echoed in an
    ack. Only text that holds such an escape comes here. Iterative: the parser allows
    nesting as deep as the recursion limit.
    """

    def fixed(item: Any) -> Any:
        return _UNSTORABLE_SURROGATE.sub("\ufffd", item) if type(item) is str else item

    root = [value]
    stack: list[Any] = [root]
    while stack:
        container = stack.pop()
        if type(container) is list:
            for index, item in enumerate(container):
                if type(item) in (list, dict):
                    stack.append(item)
                else:
                    container[index] = fixed(item)
        else:
            items = list(container.items())
            container.clear()
            for key, item in items:
                if type(item) in (list, dict):
                    stack.append(item)
                else:
                    item = fixed(item)
                container[fixed(key)] = item
    return root[0]


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


# The head of an entry [EventTime, ...] with its time as fixext8 of type 0, as fluentd and
# Fluent Bit send it: 0x92, 0xd7 0x00, u32 seconds, u32 nanoseconds.
_EVENT_TIME_ENTRY = struct.Struct(">BHII")
_ENTRY_ARRAY = 0x92
_FIXEXT8_EVENT_TIME = 0xD700


def _event_time_entries(
    blob: bytes, now_ns: Callable[[], int]
) -> tuple[list[tuple[int, dict[str, Any]]], int] | None:
    """``_packed_events`` for a blob whose every entry is ``[EventTime, map]``; else None.

    Each entry's time is read from its bytes rather than built by the ext hook (a
    Python call per event, a fifth of the decode); the record is unpacked as always
    (an EventTime nested in it still comes out as ``EventNanos``). At the first entry
    of any other shape, or any fault, it gives up and the general path decodes the whole
    blob: the events and errors are then exactly that path's.
    """
    unpacker = _new_unpacker(len(blob) + 1)
    unpacker.feed(blob)
    read, unpack = unpacker.read_bytes, unpacker.unpack
    head_size, unpack_head = _EVENT_TIME_ENTRY.size, _EVENT_TIME_ENTRY.unpack
    array, event_time, scale = _ENTRY_ARRAY, _FIXEXT8_EVENT_TIME, NANOS_PER_SECOND
    str_keys = "".join  # raises TypeError for a key that is not str, without a loop per key
    events: list[tuple[int, dict[str, Any]]] = []
    append = events.append
    now = None
    try:
        while True:
            head = read(head_size)
            try:
                marker, ext, seconds, nanos = unpack_head(head)
            except struct.error:
                if head:
                    return None  # a short entry
                break
            if marker != array or ext != event_time:
                return None
            time_ns = seconds * scale + nanos
            record = unpack()
            if type(record) is not dict:
                return None
            if not time_ns:  # time 0 means "now" (in_forward); one clock read per message
                if now is None:
                    now = now_ns()
                time_ns = now
            try:
                str_keys(record)
            except TypeError:
                record = str_keyed(record)
            append((time_ns, record))
    except Exception:  # noqa: BLE001 - e.g. a record cut short or not msgpack: the general path says
        return None
    return events, 0


def _ext_from_msgspec(code: int, data: memoryview) -> Any:
    return _ext_hook(code, bytes(data))


# The entries of a usual blob as one msgpack array (the blob behind an array32 header):
# msgspec builds the records several times faster than msgpack's Unpacker, and checks in
# C that every entry is [ext, map with str keys].
_WHOLE_BLOB_DECODER = msgspec.msgpack.Decoder(
    list[tuple[msgspec.msgpack.Ext, dict[str, Any]]], ext_hook=_ext_from_msgspec
)
_ARRAY32_HEAD = struct.Struct(">BI")
_ENTRY_HEAD = bytes((_ENTRY_ARRAY, _FIXEXT8_EVENT_TIME >> 8, EVENT_TIME_EXT_CODE))
# Where msgpack gives a Timestamp object for an ext -1 (fixext4, fixext8, ext8 of 12 bytes),
# msgspec gives a datetime: a blob with any of these bytes is left to the other paths.
_TIMESTAMP_HEADS = (b"\xd6\xff", b"\xd7\xff", b"\xc7\x0c\xff")
_FF_PROBES = 64


def _may_hold_timestamp(blob: bytes) -> bool:
    """Whether a Timestamp head's bytes occur in ``blob`` (True may be a false alarm).

    A scan for a two-byte needle runs at ~1 GB/s, a fifth of the decode for three of
    them; finding the 0xff bytes (memchr) and looking behind each is a few microseconds
    for a usual blob, where 0xff shows up only in some time bytes. Blobs full of 0xff
    (many -1 values) go back to the scans after ``_FF_PROBES`` of them.
    """
    find = blob.find
    position = find(b"\xff", 1)
    for _ in range(_FF_PROBES):
        if position < 0:
            return False
        before = blob[position - 1]
        if before == 0xD6 or before == 0xD7 or (before == 0x0C and position > 1 and blob[position - 2] == 0xC7):
            return True
        position = find(b"\xff", position + 1)
    return any(head in blob for head in _TIMESTAMP_HEADS)


def _whole_blob_entries(
    blob: bytes, now_ns: Callable[[], int]
) -> tuple[list[tuple[int, dict[str, Any]]], int] | None:
    """``_packed_events`` for a blob of ``[EventTime, map]`` entries, by msgspec; else None.

    The entry count is a guess: how often an entry head (``92 d7 00``) occurs in the blob.
    msgspec refuses the array unless it holds exactly that many entries and nothing
    follows, so a wrong guess (the head's bytes inside a value, or entries of another
    shape) only means None. None too for anything msgspec refuses (a map key that is not
    str, invalid UTF-8, an entry of another shape) and for a blob with a msgpack
    Timestamp's bytes in it: the other paths then decode it exactly as they always did.

    Where it does decode, the events are the general path's, with one difference in
    what is accepted: an array used as a map key inside a record is kept as a tuple
    (as fluentd's in_forward keeps it), where msgpack's unpacker refuses the message.
    """
    if _may_hold_timestamp(blob):
        return None
    try:
        entries = _WHOLE_BLOB_DECODER.decode(_ARRAY32_HEAD.pack(0xDD, blob.count(_ENTRY_HEAD)) + blob)
    except Exception:  # noqa: BLE001 - msgspec's DecodeError, or a nesting too deep for it
        return None
    unpack_time, scale = _EVENT_TIME.unpack, NANOS_PER_SECOND
    events: list[tuple[int, dict[str, Any]]] = []
    append = events.append
    now = None
    try:
        for ext, record in entries:
            if ext.code:
                return None
            seconds, nanos = unpack_time(ext.data)  # struct.error unless 8 bytes
            time_ns = seconds * scale + nanos
            if not time_ns:  # time 0 means "now" (in_forward); one clock read per message
                if now is None:
                    now = now_ns()
                time_ns = now
            append((time_ns, record))
    except struct.error:
        return None
    return events, 0


def _packed_events(
    blob: bytes, now_ns: Callable[[], int], bounded: bool = True
) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """The events of a whole (inflated) PackedForward blob, decoded at once.

    Three paths, each giving the events of the one after it for what it takes (save
    the array keys ``_whole_blob_entries`` keeps): msgspec over the whole blob, then
    msgpack entry by entry reading EventTimes from the bytes, then the general path
    for entries of any shape.
    """
    usual = _whole_blob_entries(blob, now_ns)
    if usual is not None:
        return usual
    usual = _event_time_entries(blob, now_ns)
    if usual is not None:
        return usual
    # A second unpacker over the blob: entries are decoded straight into the loop.
    unpacker = _new_unpacker(len(blob) + 1)  # +1: room for the end-of-entries probe
    unpacker.feed(blob)
    try:
        collected = collect_events(unpacker, now_ns, EntryTally(bounded))
    except _MSGPACK_ERRORS as exc:
        raise _entries_error(exc, unpacker, blob, 0) from exc
    if not _entries_end_cleanly(unpacker):
        raise ForwardDecodeError("PackedForward entries end inside an entry (truncated)")
    return collected


def decode_entries(entries: bytes, now_ns: int | None) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """The events and invalid count of a PackedForward entries blob (``EventMessage.packed``).

    ``now_ns`` is the time time-0 entries get. Decoding the same bytes with the same
    ``now_ns`` always gives the same events: the spool replays stored blobs with this,
    so the bomb rule is not applied (what was stored passed it, or came before it).
    Raises ``ForwardDecodeError`` for entries that are not valid msgpack.
    """
    return _packed_events(entries, lambda: now_ns, False)  # type: ignore[arg-type,return-value]


def _list_parts(
    tag: str,
    entries: list[Any],
    chunk: bytes | None,
    options: dict[str, Any],
    size_bytes: int,
    now_ns: Callable[[], int],
    part_bytes: int,
) -> Iterator[EventMessage | None]:
    """Parts of a Forward-mode entry array (already unpacked while it was framed)."""
    count = len(entries)
    # Parsed entries no longer know their wire size: each part takes an even share.
    per_part = max(1, part_bytes * count // max(size_bytes, 1))
    tally = EntryTally()
    for start in range(0, max(count, 1), per_part):
        events: list[tuple[int, dict[str, Any]]] = []
        invalid = 0
        for step in range(start, min(start + per_part, count), _LIST_STEP_ENTRIES):
            if step > start:
                yield None
            got, bad = collect_events(entries[step : min(step + _LIST_STEP_ENTRIES, start + per_part)], now_ns, tally)
            events += got
            invalid += bad
        yield EventMessage(tag, events, chunk, options, invalid, size_bytes if start == 0 else 0)


def _blob_parts(
    tag: str,
    blob: str | bytes,
    compressed: Any,
    chunk: bytes | None,
    options: dict[str, Any],
    size_bytes: int,
    max_decompressed: int,
    now_ns: Callable[[], int],
    part_bytes: int,
) -> Iterator[EventMessage | None]:
    """Parts of a (Compressed)PackedForward blob, inflated and unpacked as they go.

    Inflating twice (once to check, once to build) costs far less than building the
    events: zlib runs without the GIL, and it keeps a bad message from yielding parts.
    """
    if type(blob) is str:
        blob = blob.encode("utf-8", "surrogateescape")  # str32 from out_forward
    limit = len(blob) if compressed is None or compressed == "text" else max_decompressed
    yield from _check_entries(_inflated_pieces(blob, compressed, limit), limit)
    unpacker = _new_unpacker(limit + _DECOMPRESS_STEP_BYTES + 1)
    tally = EntryTally()
    events: list[tuple[int, dict[str, Any]]] = []
    invalid = 0
    fed = 0
    part_start = 0
    first = True
    step = min(part_bytes, _DECOMPRESS_STEP_BYTES)  # parts end on a step: no per-entry check
    for inflated in _inflated_pieces(blob, compressed, limit):
        view = memoryview(inflated)
        for start in range(0, len(view), step):
            piece = view[start : start + step]
            unpacker.feed(piece)
            try:
                got, bad = collect_events(unpacker, now_ns, tally)
            except _MSGPACK_ERRORS as exc:
                raise _entries_error(exc, unpacker, piece, fed) from exc
            fed += len(piece)
            events += got
            invalid += bad
            if unpacker.tell() - part_start >= part_bytes:
                part_start = unpacker.tell()
                yield EventMessage(tag, events, chunk, options, invalid, size_bytes if first else 0)
                events, invalid, first = [], 0, False
            else:
                yield None
    if first or events or invalid:
        yield EventMessage(tag, events, chunk, options, invalid, size_bytes if first else 0)


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
        self._framer: _MsgpackFramer | _JsonFramer | None = None
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

    def _choose_framer(self, data: bytes) -> _MsgpackFramer | _JsonFramer:
        # in_forward switches a connection to JSON when its very first byte is { or [
        self.json_mode = self.allow_json and data[:1] in (b"{", b"[")
        if self.json_mode:
            return _JsonFramer(self.max_message_bytes)
        return _MsgpackFramer(self.max_message_bytes)

    def _json_frame(self, text: str, size: int) -> EventMessage | Heartbeat | DeferredMessage:
        if self.offload_bytes is not None and size > self.offload_bytes:
            return DeferredMessage(size, lambda part_bytes: self._json_parts(text, size, part_bytes))
        return self._frame(_parse_json(text), size)

    def _json_parts(self, text: str, size: int, part_bytes: int) -> Iterator[EventMessage | None]:
        frame = self._frame(_parse_json(text), size)  # a long entry array defers again
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
            if self.offload_bytes is not None and size > self.offload_bytes:
                return DeferredMessage(
                    size, functools.partial(_list_parts, tag, carrier, chunk, options, size, self._now_ns)
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
            size, functools.partial(_blob_parts, tag, blob, compressed, chunk, options, size, limit, self._now_ns)
        )
        if type(blob) is str and (offload is None or len(blob) <= offload):
            # str32 from out_forward (the framer makes most of them bin). Its UTF-8 bytes
            # are at least as many as its characters, so a text longer than the offload
            # size is too big in bytes as well: only a shorter one is encoded here, and
            # measured in bytes, as the same blob handed over as bin would be.
            blob = blob.encode("utf-8", "surrogateescape")
        if offload is not None and len(blob) > offload:
            _inflated_pieces(b"", compressed, limit)  # an unknown compression is refused now
            return deferred  # even the str32 -> bytes copy of a long text is left to the parts
        if compressed is not None and compressed != "text":
            inflated = []
            total = 0
            # Steps no bigger than the budget: feed inflates at most offload_bytes + 1.
            step = _DECOMPRESS_STEP_BYTES if offload is None else min(_DECOMPRESS_STEP_BYTES, offload + 1)
            for piece in _inflated_pieces(blob, compressed, limit, step):
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
        events, invalid = _packed_events(blob, now_ns)
        packed = (blob, now_used[0] if now_used else None)
        return EventMessage(tag, events, chunk, options, invalid, size, packed)


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

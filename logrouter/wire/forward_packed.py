"""PackedForward entry blobs (pure, no Twisted): inflating them (gzip members, zstd frames)
in bounded steps under ``max_decompressed_bytes``, reading them through to find every
fatal fault before any event is built (``check_entries``), and decoding a whole blob at
once (``packed_events``: msgspec over the whole blob, else msgpack entry by entry with
EventTimes read from the bytes, else the general path of ``forward_entries``).

``decode_entries`` is what the spool replays a stored blob with.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import msgspec

from logrouter.wire.forward_entries import (
    EVENT_TIME,
    EVENT_TIME_EXT_CODE,
    MSGPACK_ERRORS,
    NANOS_PER_SECOND,
    EntryBombError,
    EntryTally,
    ForwardDecodeError,
    byte_in,
    collect_events,
    ext_hook,
    is_bomb,
    msgpack_problem,
    new_unpacker,
    str_keyed,
)
from logrouter.wire.inflate import GZIP, InflateError, inflate_pieces

try:
    import zstandard
except ImportError:  # zstd is optional: fluentd itself calls it experimental (section 5)
    zstandard = None

# One inflate/read step produces at most this much, so a bomb is caught one step after
# it passes the limit instead of after it has filled memory.
DECOMPRESS_STEP_BYTES = 1 << 20
# Compressed gzip input handed to zlib per call. The inflated pieces end where a slice was
# used up and a deferred message's parts end on pieces, and a part's dedupe key is its
# index: a resend after a crash, even one by an upgraded logrouter, must split the same
# way, so this stays what it has been (inflate.py's default is 64 KiB).
_INFLATE_INPUT_BYTES = 256 << 10
# The first bytes of an array that may hold two items: fixarray 2, array16, array32.
_PAIR_HEADS = frozenset((0x92, 0xDC, 0xDD))


# -- decompression -----------------------------------------------------------------------


def _too_big(limit: int) -> ForwardDecodeError:
    return ForwardDecodeError(f"decompressed entries exceed max_decompressed_bytes ({limit})")


def inflated_pieces(
    blob: bytes, compressed: Any, limit: int, step: int = DECOMPRESS_STEP_BYTES
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
    for start in range(0, len(view), DECOMPRESS_STEP_BYTES):
        yield view[start : start + DECOMPRESS_STEP_BYTES]


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


def entries_end_cleanly(unpacker: msgpack.Unpacker) -> bool:
    """Whether an exhausted entry unpacker stopped between entries rather than inside one.

    Unpacker.tell() cannot say: it counts the bytes of a half-parsed entry as consumed. A
    lone nil fed afterwards comes back as a top-level nil only at an entry boundary;
    inside an entry it completes or extends the partial one instead.
    """
    unpacker.feed(b"\xc0")
    try:
        return unpacker.unpack() is None
    except (msgpack.OutOfData, *MSGPACK_ERRORS):
        return False


def entries_error(exc: Exception, unpacker: msgpack.Unpacker, piece: Any, piece_start: int) -> ForwardDecodeError:
    problem = msgpack_problem(exc, unpacker.tell(), byte_in(piece, piece_start))
    return ForwardDecodeError(f"PackedForward entries are not valid msgpack: {problem}")


def check_entries(pieces: Iterator[Any], limit: int) -> Iterator[None]:
    """Read a blob's entries through without building them: every fatal fault of its
    compression (bomb, corrupt or truncated data) or of its msgpack framing (garbage,
    too deep, cut inside an entry) surfaces here, before any part is handed out. So does
    a bomb of entries that are not even pairs: an entry whose first byte is no array
    header that can hold two items is invalid, any other counts as valid here, so this
    refuses no message the bomb rule would let through. ``None`` after every piece."""
    unpacker = msgpack.Unpacker(max_buffer_size=limit + DECOMPRESS_STEP_BYTES + 1)
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
        except MSGPACK_ERRORS as exc:
            raise entries_error(exc, unpacker, piece, fed) from exc
        fed = end
        yield None
    if not entries_end_cleanly(unpacker):
        raise ForwardDecodeError("PackedForward entries end inside an entry (truncated)")


# -- decoding a whole blob ---------------------------------------------------------------


# The head of an entry [EventTime, ...] with its time as fixext8 of type 0, as fluentd and
# Fluent Bit send it: 0x92, 0xd7 0x00, u32 seconds, u32 nanoseconds.
_EVENT_TIME_ENTRY = struct.Struct(">BHII")
_ENTRY_ARRAY = 0x92
_FIXEXT8_EVENT_TIME = 0xD700


def _event_time_entries(
    blob: bytes, now_ns: Callable[[], int]
) -> tuple[list[tuple[int, dict[str, Any]]], int] | None:
    """``packed_events`` for a blob whose every entry is ``[EventTime, map]``; else None.

    Each entry's time is read from its bytes rather than built by the ext hook (a
    Python call per event, a fifth of the decode); the record is unpacked as always
    (an EventTime nested in it still comes out as ``EventNanos``). At the first entry
    of any other shape, or any fault, it gives up and the general path decodes the whole
    blob: the events and errors are then exactly that path's.
    """
    unpacker = new_unpacker(len(blob) + 1)
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
    return ext_hook(code, bytes(data))


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
    """``packed_events`` for a blob of ``[EventTime, map]`` entries, by msgspec; else None.

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
    unpack_time, scale = EVENT_TIME.unpack, NANOS_PER_SECOND
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


def packed_events(
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
    unpacker = new_unpacker(len(blob) + 1)  # +1: room for the end-of-entries probe
    unpacker.feed(blob)
    try:
        collected = collect_events(unpacker, now_ns, EntryTally(bounded))
    except MSGPACK_ERRORS as exc:
        raise entries_error(exc, unpacker, blob, 0) from exc
    if not entries_end_cleanly(unpacker):
        raise ForwardDecodeError("PackedForward entries end inside an entry (truncated)")
    return collected


def decode_entries(entries: bytes, now_ns: int | None) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """The events and invalid count of a PackedForward entries blob (``EventMessage.packed``).

    ``now_ns`` is the time time-0 entries get. Decoding the same bytes with the same
    ``now_ns`` always gives the same events: the spool replays stored blobs with this,
    so the bomb rule is not applied (what was stored passed it, or came before it).
    Raises ``ForwardDecodeError`` for entries that are not valid msgpack.
    """
    return packed_events(entries, lambda: now_ns, False)  # type: ignore[arg-type,return-value]

"""Spool segment files: the frame layout, and walking frames with recovery from damage.

A frame is ``magic "LRS1" | u32 payload length | u32 crc32(payload) | u32 crc32(first
12 bytes) | payload`` (big-endian). The magic and the header's own checksum let a reader
find the next good frame after a damaged one, so one bad record costs only itself.

Pure and synchronous: the spool runs these in worker threads.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator

MAGIC = b"LRS1"
HEADER = struct.Struct(">4sIII")
HEADER_SIZE = HEADER.size
SEGMENT_SUFFIX = ".seg"
MAX_PAYLOAD = 256 << 20  # a header claiming more than this is damage, not data


def segment_name(base: int) -> str:
    return f"{base:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    stem = name[: -len(SEGMENT_SUFFIX)]
    if name.endswith(SEGMENT_SUFFIX) and stem.isdigit():
        return int(stem)
    return None


def frame_head(payload: bytes) -> bytes:
    """The ``HEADER_SIZE`` bytes that go before ``payload`` in a segment."""
    head = struct.pack(">4sII", MAGIC, len(payload), zlib.crc32(payload))
    return head + struct.pack(">I", zlib.crc32(head))


def frame(payload: bytes) -> bytes:
    return frame_head(payload) + payload


@dataclass(frozen=True)
class Record:
    offset: int  # of the frame within the buffer's file
    end: int  # offset just past the frame
    payload: bytes


@dataclass(frozen=True)
class Damage:
    offset: int  # first byte that is not part of a good frame
    end: int  # where the next good frame starts (or where the data ends)
    reason: str


def _header_at(data: bytes | memoryview, i: int) -> tuple[int, int] | None:
    """``(length, payload crc)`` if a well-formed header starts at ``i``, else ``None``."""
    if len(data) - i < HEADER_SIZE:
        return None
    magic, length, crc, head_crc = HEADER.unpack_from(data, i)
    if magic != MAGIC or zlib.crc32(data[i : i + 12]) != head_crc or length > MAX_PAYLOAD:
        return None
    return length, crc


def walk(data: bytes, base: int = 0) -> Iterator[Record | Damage]:
    """The good frames and damaged regions of ``data``, which starts at file offset ``base``.

    ``data`` must end at a frame boundary of the writer (a segment's end, or the spool's
    durable end); a frame cut off by the end of ``data`` is reported as damage.
    """
    i, n = 0, len(data)
    view = memoryview(data)
    while i < n:
        header = _header_at(view, i)
        if header is None:
            reason = "no valid frame header"
        else:
            length, crc = header
            end = i + HEADER_SIZE + length
            if end > n:
                reason = "frame runs past the end of the data"
            else:
                payload = bytes(view[i + HEADER_SIZE : end])
                if zlib.crc32(payload) == crc:
                    yield Record(base + i, base + end, payload)
                    i = end
                    continue
                reason = "payload checksum mismatch"
        next_good = _resync(data, i + 1)
        yield Damage(base + i, base + (n if next_good is None else next_good), reason)
        if next_good is None:
            return
        i = next_good


def _resync(data: bytes, start: int) -> int | None:
    """Offset of the next well-formed header whose payload checks out, from ``start`` on."""
    view = memoryview(data)
    i = start
    while True:
        i = data.find(MAGIC, i)
        if i < 0:
            return None
        header = _header_at(view, i)
        if header is not None:
            length, crc = header
            end = i + HEADER_SIZE + length
            if end <= len(data) and zlib.crc32(view[i + HEADER_SIZE : end]) == crc:
                return i
        i += 1


def read_frames(f: BinaryIO, offset: int, limit: int, max_bytes: int) -> Iterator[Record | Damage]:
    """Frames of an open segment file from ``offset`` up to ``limit`` (a frame boundary).

    Stops after about ``max_bytes`` of payload. Good frames are read header by header;
    at the first sign of damage the rest of the range is walked to find the next good one.
    """
    f.seek(offset)
    done = 0
    while offset < limit and done < max_bytes:
        head = f.read(HEADER_SIZE)
        header = _header_at(head, 0)
        if header is not None and offset + HEADER_SIZE + header[0] <= limit:
            payload = f.read(header[0])
            if len(payload) == header[0] and zlib.crc32(payload) == header[1]:
                end = offset + HEADER_SIZE + header[0]
                yield Record(offset, end, payload)
                offset = end
                done += len(payload)
                continue
        f.seek(offset)
        yield from walk(f.read(limit - offset), offset)
        return

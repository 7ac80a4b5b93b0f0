"""The spool: a segmented append-only log of framed records with group-commit fsync.

A record's position is its global byte offset; a segment file is named after the
position of its first byte (``00000000000000000000.seg``), so a position alone says
which file holds it. Each record is framed as ``u32 payload length | u32 crc32 |
payload`` (big-endian). Appends are assigned positions on the reactor thread and
written, flushed and fsync'd by one worker thread: every record appended while the
previous fsync ran is covered by the next one (group commit).

Durability modes: ``fsync`` fires an append's Deferred after the record is fsync'd;
``os`` after it was written to the OS (safe against a process crash, not a power loss);
``none`` at once (a crash may lose what was acknowledged but not yet written).
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterator

from twisted.internet import defer
from twisted.logger import Logger

from logrouter.serial import SerialWorker

FRAME_HEADER = struct.Struct(">II")
SEGMENT_SUFFIX = ".seg"
MAX_RECORD_BYTES = 0xFFFFFFFF


def segment_name(base: int) -> str:
    return f"{base:020d}{SEGMENT_SUFFIX}"


def frame(payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass
class ScanResult:
    """What a segment holds: the end of its last whole record and the records' spans."""

    valid_end: int
    records: list[tuple[int, int]] = field(default_factory=list)  # (offset, payload length)
    torn: bool = False


def scan_segment(f: BinaryIO) -> ScanResult:
    """Walk the frames of a segment from the start; stop at the first incomplete one."""
    result = ScanResult(0)
    offset = 0
    while True:
        header = f.read(FRAME_HEADER.size)
        if not header:
            break
        if len(header) < FRAME_HEADER.size:
            result.torn = True
            break
        length, crc = FRAME_HEADER.unpack(header)
        payload = f.read(length)
        if len(payload) < length or zlib.crc32(payload) != crc:
            # A short or mismatching final frame is a write cut off by a crash.
            result.torn = True
            break
        result.records.append((offset, length))
        offset += FRAME_HEADER.size + length
        result.valid_end = offset
    return result


def list_segments(path: str) -> list[int]:
    bases = []
    for name in os.listdir(path):
        if name.endswith(SEGMENT_SUFFIX) and name[: -len(SEGMENT_SUFFIX)].isdigit():
            bases.append(int(name[: -len(SEGMENT_SUFFIX)]))
    return sorted(bases)


class SpoolLog:
    """Append records durably; positions are global byte offsets."""

    log = Logger(namespace="logrouter.spool")

    def __init__(self, reactor: Any, path: str, durability: str = "fsync", segment_bytes: int = 64 << 20) -> None:
        self.reactor = reactor
        self.path = path
        self.durability = durability
        self.segment_bytes = segment_bytes
        self.end = 0  # position after the last appended record
        self.durable_end = 0  # position after the last record that reached the configured durability
        self.fsyncs = 0
        self._segment_base = 0
        self._file: BinaryIO | None = None
        self._worker = SerialWorker(reactor, self._write, "logrouter-spool")

    def open(self) -> None:
        """Find the end of the log, cutting a torn tail, and open the last segment for appends."""
        os.makedirs(self.path, exist_ok=True)
        bases = list_segments(self.path)
        if not bases:
            self._open_segment(0)
            return
        base = bases[-1]
        name = os.path.join(self.path, segment_name(base))
        with open(name, "rb") as f:
            scan = scan_segment(f)
        if scan.torn:
            size = os.path.getsize(name)
            self.log.warn(
                "spool: torn tail in {segment}: truncated {cut} bytes after the last whole record",
                segment=name,
                cut=size - scan.valid_end,
            )
            with open(name, "r+b") as f:
                f.truncate(scan.valid_end)
                os.fsync(f.fileno())
        self._segment_base = base
        self.end = self.durable_end = base + scan.valid_end
        self._file = open(name, "ab")

    def append(self, payload: bytes) -> defer.Deferred:
        """Queue ``payload``; the Deferred fires with its position once durable as configured."""
        position = self.end
        data = frame(payload)
        self.end += len(data)
        d = self._worker.submit((position, data))
        if self.durability == "none":
            return defer.succeed(position)
        d.addCallback(lambda _: position)
        return d

    def close(self) -> defer.Deferred:
        d = self._worker.stop()
        d.addCallback(lambda _: self._close_file())
        return d

    def segments(self) -> Iterator[str]:
        for base in list_segments(self.path):
            yield os.path.join(self.path, segment_name(base))

    # -- worker thread -------------------------------------------------------------

    def _write(self, frames: list[tuple[int, bytes]]) -> None:
        chunk: list[bytes] = []
        for position, data in frames:
            if position >= self._segment_base + self.segment_bytes and position > self._segment_base:
                self._flush(chunk)
                chunk = []
                self._sync()
                self._file.close()
                self._open_segment(position)
            chunk.append(data)
        self._flush(chunk)
        if self.durability == "fsync":
            self._sync()
        last_position, last_data = frames[-1]
        self.durable_end = last_position + len(last_data)

    def _flush(self, chunk: list[bytes]) -> None:
        if chunk:
            self._file.write(b"".join(chunk))
            self._file.flush()

    def _sync(self) -> None:
        os.fsync(self._file.fileno())
        self.fsyncs += 1

    def _open_segment(self, base: int) -> None:
        self._segment_base = base
        self._file = open(os.path.join(self.path, segment_name(base)), "ab")
        # The new file's name must survive a crash too, or its records would be lost.
        dir_fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _close_file(self) -> None:
        if self._file is not None:
            self._sync()  # a graceful stop leaves everything on disk, whatever the mode
            self._file.close()
            self._file = None

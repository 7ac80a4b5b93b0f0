"""The spool: a segmented append-only log of framed records with group-commit fsync.

A record's position is its global byte offset; a segment file is named after the
position of its first byte (``00000000000000000000.seg``), so a position alone says
which file holds it, and a segment ends where the next one begins. Frames are laid out
in ``segment.py``. Appends are given positions on the reactor thread and written,
flushed and fsync'd by one worker thread: every record appended while the previous fsync
ran is covered by the next one (group commit).

Durability modes: ``fsync`` fires an append's Deferred after the record is fsync'd;
``os`` after it was written to the OS (safe against a process crash, not a power loss);
``none`` once written too, but the router acks ``none`` appends at once, so a crash may
lose what was acknowledged and not yet written.

Damage never stops startup: a torn tail (a frame cut off by a crash) is moved aside
and cut off at ``open``; a damaged record in the middle is found by the reader, copied
to ``quarantine/`` with a loud log line and counted, and reading goes on after it.
"""

from __future__ import annotations

import bisect
import os
from typing import Any, BinaryIO

from twisted.internet import defer
from twisted.logger import Logger

from logrouter.serial import SerialWorker
from logrouter.spool.segment import Damage, Record, frame, parse_segment_name, read_frames, segment_name, walk

QUARANTINE_DIR = "quarantine"


def list_segments(path: str) -> list[int]:
    bases = [parse_segment_name(name) for name in os.listdir(path)]
    return sorted(b for b in bases if b is not None)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SpoolLog:
    """Append records durably; read them back by position; drop segments no one needs."""

    log = Logger(namespace="logrouter.spool")

    def __init__(self, reactor: Any, path: str, durability: str = "fsync", segment_bytes: int = 64 << 20) -> None:
        self.reactor = reactor
        self.path = path
        self.durability = durability
        self.segment_bytes = segment_bytes
        self.start = 0  # position of the oldest byte still on disk
        self.end = 0  # position after the last appended record
        self.written_end = 0  # position after the last record the worker has written
        self.fsyncs = 0
        self.torn_tails = 0
        self.quarantined = 0
        self._quarantined_at: set[int] = set()
        self._bases: list[int] = []  # segment bases, oldest first (reactor thread's view)
        self._segment_base = 0
        self._file: BinaryIO | None = None
        self._worker = SerialWorker(reactor, self._write, "logrouter-spool")

    @property
    def quarantine_path(self) -> str:
        return os.path.join(self.path, QUARANTINE_DIR)

    def open(self) -> None:
        """Find the end of the log, cutting a torn tail, and open the last segment for appends."""
        os.makedirs(self.path, exist_ok=True)
        self._bases = list_segments(self.path)
        if not self._bases:
            self._open_segment(0)
            self._bases = [0]
            return
        base = self._bases[-1]
        name = os.path.join(self.path, segment_name(base))
        with open(name, "rb") as f:
            data = f.read()
        items = list(walk(data, 0))
        valid_end = len(data)
        if items and isinstance(items[-1], Damage):
            # Damage that runs to the end of the newest segment is a write cut off by a
            # crash. Its bytes are kept aside, never silently dropped.
            valid_end = items[-1].offset
            self.torn_tails += 1
            self._set_aside(base + valid_end, data[valid_end:], "torn tail")
            with open(name, "r+b") as f:
                f.truncate(valid_end)
                os.fsync(f.fileno())
        self._segment_base = base
        self.start = self._bases[0]
        self.end = self.written_end = base + valid_end
        self._file = open(name, "ab")

    # -- appending (reactor thread) ---------------------------------------------------

    def append(self, payload: bytes, durability: str | None = None) -> defer.Deferred:
        """Queue ``payload``; the Deferred fires with ``(position, end)`` once written as
        ``durability`` (default: the spool's own mode) asks: fsync'd for ``fsync``."""
        position = self.end
        data = frame(payload)
        self.end += len(data)
        end = self.end
        d = self._worker.submit((position, data, (durability or self.durability) == "fsync"))
        d.addCallback(self._written, position, end)
        return d

    def _written(self, new_bases: list[int], position: int, end: int) -> tuple[int, int]:
        if new_bases:
            self._bases.extend(b for b in new_bases if not self._bases or b > self._bases[-1])
        if end > self.written_end:
            self.written_end = end
        return position, end

    def close(self) -> defer.Deferred:
        d = self._worker.stop()
        d.addCallback(lambda _: self._close_file())
        return d

    @property
    def pending_bytes(self) -> int:
        return self.end - self.written_end

    # -- reading (any thread) ----------------------------------------------------------

    def read(self, position: int, limit: int, max_bytes: int = 4 << 20) -> tuple[list[Record], int]:
        """Records from ``position`` up to ``limit`` (both frame boundaries), about
        ``max_bytes`` of payload at most; returns them and the position to read on from.

        Damaged records on the way are quarantined and skipped.
        """
        records: list[Record] = []
        total = 0
        bases = self._bases[:]
        while position < limit and total < max_bytes:
            i = bisect.bisect_right(bases, position) - 1
            if i < 0:
                position = bases[0] if bases else limit  # older segments are gone: skip ahead
                continue
            base = bases[i]
            stop = min(limit, bases[i + 1] if i + 1 < len(bases) else limit)
            if position < stop:
                with open(os.path.join(self.path, segment_name(base)), "rb") as f:
                    for item in read_frames(f, position - base, stop - base, max_bytes - total):
                        if isinstance(item, Damage):
                            self._quarantine(f, base, item)
                        else:
                            records.append(Record(base + item.offset, base + item.end, item.payload))
                            total += len(item.payload)
                        position = base + item.end
            if position >= stop:
                position = stop  # the rest of this segment is done (or was damage)
        return records, position

    def _quarantine(self, f: BinaryIO, base: int, damage: Damage) -> None:
        at = base + damage.offset
        if at in self._quarantined_at:
            return
        self._quarantined_at.add(at)
        self.quarantined += 1
        here = f.tell()
        f.seek(damage.offset)
        data = f.read(damage.end - damage.offset)
        f.seek(here)
        self._set_aside(at, data, damage.reason)

    def _set_aside(self, position: int, data: bytes, reason: str) -> None:
        os.makedirs(self.quarantine_path, exist_ok=True)
        name = os.path.join(self.quarantine_path, f"{position:020d}.bad")
        if not os.path.exists(name):
            with open(name, "wb") as f:
                f.write(data)
                os.fsync(f.fileno())
        self.log.error(
            "spool: {reason} at position {position}: {size} bytes moved aside to {name}; "
            "the records around it are kept",
            reason=reason,
            position=position,
            size=len(data),
            name=name,
        )

    # -- trimming ----------------------------------------------------------------------

    def delete_before(self, position: int) -> list[str]:
        """Delete segments that end at or before ``position`` (never the one being written)."""
        removed = []
        while len(self._bases) > 1 and self._bases[1] <= position:
            name = os.path.join(self.path, segment_name(self._bases.pop(0)))
            try:
                os.remove(name)
            except FileNotFoundError:
                pass
            removed.append(name)
        if removed:
            self.start = self._bases[0]
        return removed

    @property
    def first_segment_end(self) -> int | None:
        """Where the oldest segment ends, if it is not the one being written."""
        return self._bases[1] if len(self._bases) > 1 else None

    @property
    def size_bytes(self) -> int:
        return self.end - self.start

    # -- worker thread -----------------------------------------------------------------

    def _write(self, frames: list[tuple[int, bytes, bool]]) -> list[int]:
        chunk: list[bytes] = []
        new_bases = []
        for position, data, _ in frames:
            if position >= self._segment_base + self.segment_bytes and position > self._segment_base:
                self._flush(chunk)
                chunk = []
                self._sync()
                self._file.close()
                self._open_segment(position)
                new_bases.append(position)
            chunk.append(data)
        self._flush(chunk)
        # One fsync covers the whole run as soon as one record in it needs it (an `os`
        # record then waits for it too: never acked earlier than asked, only later).
        if any(sync for _, _, sync in frames):
            self._sync()
        return new_bases

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
        fsync_dir(self.path)

    def _close_file(self) -> None:
        if self._file is not None:
            self._sync()  # a graceful stop leaves everything on disk, whatever the mode
            self._file.close()
            self._file = None

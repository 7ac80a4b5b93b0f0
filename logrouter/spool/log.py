"""The spool: a segmented append-only log of framed records with group-commit fsync.

A record's position is its global byte offset; a segment file is named after the
position of its first byte (``00000000000000000000.seg``), so a position alone says
which file holds it, and a segment ends where the next one begins. Frames are laid out
in ``segment.py``. Appends are queued on the reactor thread; one worker thread gives
them their positions as it writes, flushes and fsyncs them: every record appended while
the previous fsync ran is covered by the next one (group commit).

A write that fails (a full disk, an I/O error) fails only the appends it had not
finished: the file is cut back to the end of the last good record, so the next record
starts exactly where a reader expects it and positions always match file offsets. The
spool needs no restart once space is back.

Durability modes: ``fsync`` fires an append's Deferred after the record is fsync'd;
``os`` after it was written to the OS (safe against a process crash, not a power loss);
``none`` once written too, but the router acks ``none`` appends at once, so a crash may
lose what was acknowledged and not yet written.

Damage never stops startup: a torn tail (a frame cut off by a crash) is moved aside
and cut off at ``open``; a damaged record in the middle is found by the reader, copied
to ``quarantine/`` with a loud log line and counted, and reading goes on after it. A
segment shorter than the position of the next one (cut by a crash on a full disk, or
truncated by hand) is read up to its end and the missing range is logged and skipped.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

from twisted.internet import defer
from twisted.logger import Logger

from logrouter.atomic_file import fsync_directory
from logrouter.serial import SerialWorker
from logrouter.spool.segment import (
    HEADER_SIZE,
    Damage,
    Record,
    frame_head,
    parse_segment_name,
    read_frames,
    segment_name,
    walk,
)
from logrouter.wire.errors import detached

QUARANTINE_DIR = "quarantine"


def list_segments(path: str) -> list[int]:
    bases = [parse_segment_name(name) for name in os.listdir(path)]
    return sorted(b for b in bases if b is not None)


@dataclass(slots=True, eq=False)
class _Append:
    """One queued record; the worker fills in where it landed, or why it did not.

    The payload is framed (its CRC, a copy behind the header) by the worker, off the
    reactor: a forward batch's payload is its whole blob.
    """

    payload: bytes
    sync: bool
    position: int = -1
    end: int = -1
    error: BaseException | None = None


class SpoolWriteError(OSError):
    """An append the spool could not write; nothing of it is on disk."""


class SpoolLog:
    """Append records durably; read them back by position; drop segments no one needs."""

    log = Logger(namespace="logrouter.spool")

    def __init__(self, reactor: Any, path: str, durability: str = "fsync", segment_bytes: int = 64 << 20) -> None:
        self.reactor = reactor
        self.path = path
        self.durability = durability
        self.segment_bytes = segment_bytes
        self.start = 0  # position of the oldest byte still on disk
        self.written_end = 0  # position after the last record the worker has written
        self.queued_bytes = 0  # frames appended and not yet written (or failed)
        self.fsyncs = 0
        self.write_errors = 0  # appends that failed (each one was reported to its caller)
        self.missing_ranges = 0  # segment ranges found shorter than their successor's start
        self.torn_tails = 0
        self.quarantined = 0
        self._quarantined_at: set[int] = set()
        self._bases: list[int] = []  # segment bases, oldest first (reactor thread's view)
        # The worker thread's own view: where the next frame goes, and segments it opened
        # that the reactor thread has not been told about yet.
        self._segment_base = 0
        self._file_end = 0
        self._opened: list[int] = []
        self._dir_synced = True
        self._file: Any = None
        self._worker = SerialWorker(reactor, self._write, "logrouter-spool")

    @property
    def end(self) -> int:
        """Where the appends queued so far will end (the written end when none is queued)."""
        return self.written_end + self.queued_bytes

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
        self.written_end = self._file_end = base + valid_end
        self._file = open(name, "ab", buffering=0)

    # -- appending (reactor thread) ---------------------------------------------------

    def append(self, payload: bytes, durability: str | None = None) -> defer.Deferred:
        """Queue ``payload``; the Deferred fires with ``(position, end)`` once written as
        ``durability`` (default: the spool's own mode) asks: fsync'd for ``fsync``.

        It fails with ``SpoolWriteError`` when the disk refused the record; nothing of
        it is then in the spool.
        """
        item = _Append(payload, (durability or self.durability) == "fsync")
        self.queued_bytes += HEADER_SIZE + len(payload)
        d = self._worker.submit(item)
        d.addCallback(self._written, item)
        return d

    def _written(self, opened: list[int], item: _Append) -> tuple[int, int]:
        self.queued_bytes -= HEADER_SIZE + len(item.payload)
        for base in opened:
            if not self._bases or base > self._bases[-1]:
                self._bases.append(base)
        if item.error is not None:
            self.write_errors += 1
            raise SpoolWriteError(f"spool write failed: {item.error}") from item.error
        if item.end > self.written_end:
            self.written_end = item.end
        return item.position, item.end

    def close(self) -> defer.Deferred:
        d = self._worker.stop()
        d.addCallback(lambda _: self._close_file())
        return d

    @property
    def pending_bytes(self) -> int:
        return self.queued_bytes

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
                if position < stop and total < max_bytes:
                    # Not stopped by the byte budget, so the file ends before ``stop``: a
                    # segment cut short. What is not there cannot be read; go on after it.
                    self._missing(base, position, stop)
                    position = stop
            if position >= stop:
                position = stop  # the rest of this segment is done (or was damage)
        return records, position

    def _missing(self, base: int, position: int, stop: int) -> None:
        if position in self._quarantined_at:
            return
        self._quarantined_at.add(position)
        self.missing_ranges += 1
        self.log.error(
            "spool: segment {name} ends at position {position}, before the next segment starts at "
            "{stop}: {size} bytes are missing (the file was cut short); reading goes on after them",
            name=segment_name(base),
            position=position,
            stop=stop,
            size=stop - position,
        )

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

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        """The spool's metric samples (``logrouter.metrics`` renders them).

        The backlog and whether writes are failing are the router's to say.
        """
        yield "logrouter_spool_fsyncs_total", "counter", {}, self.fsyncs
        yield "logrouter_spool_end_bytes", "gauge", {}, self.end
        yield "logrouter_spool_written_bytes", "gauge", {}, self.written_end
        yield "logrouter_spool_size_bytes", "gauge", {}, self.size_bytes
        yield "logrouter_spool_torn_tails_total", "counter", {}, self.torn_tails
        yield "logrouter_spool_quarantined_total", "counter", {}, self.quarantined
        yield "logrouter_spool_missing_ranges_total", "counter", {}, self.missing_ranges
        yield "logrouter_spool_write_errors_total", "counter", {}, self.write_errors

    # -- worker thread -----------------------------------------------------------------

    def _write(self, items: list[_Append]) -> list[int]:
        """Write and sync a run of appends; each one learns its position or its error.

        Items are *confirmed* once written (and fsync'd, where any item of the run asks
        for it). On a failure the unconfirmed ones fail and the file is cut back to where
        the first of them began, so the log never holds a partial or unreported record.
        """
        confirmed = 0
        try:
            if self._file_end != self._segment_base + self._file_size():
                self._cut_back()  # an earlier failed write that could not be cut back then
            needs_sync = any(item.sync for item in items)
            chunk: list[bytes] = []
            for i, item in enumerate(items):
                if self._file_end >= self._segment_base + self.segment_bytes and self._file_end > self._segment_base:
                    self._write_all(b"".join(chunk))
                    chunk = []
                    self._sync()
                    confirmed = i
                    self._roll(self._file_end)
                item.position = self._file_end
                self._file_end += HEADER_SIZE + len(item.payload)
                item.end = self._file_end
                chunk.append(frame_head(item.payload))
                chunk.append(item.payload)
            self._write_all(b"".join(chunk))
            if needs_sync:
                self._sync()
            confirmed = len(items)
        except Exception as e:  # noqa: BLE001 - any failure must fail the appends, not the thread
            failed = items[confirmed:]
            if failed and failed[0].position >= 0:
                self._file_end = failed[0].position
            for item in failed:
                item.error = detached(e)  # no traceback tying this frame (every item, the joined bytes) to it
                item.position = item.end = -1
            try:
                self._cut_back()
            except OSError:
                pass  # tried again before the next write
        opened, self._opened = self._opened, []
        return opened

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = self._file.write(view)
            view = view[written:]

    def _file_size(self) -> int:
        return os.fstat(self._file.fileno()).st_size

    def _cut_back(self) -> None:
        """Cut the segment being written back to the end of its last good record."""
        size = self._file_end - self._segment_base
        if self._file_size() != size:
            os.ftruncate(self._file.fileno(), size)

    def _sync(self) -> None:
        os.fsync(self._file.fileno())
        self._sync_dir()
        self.fsyncs += 1

    def _roll(self, base: int) -> None:
        """Start a new segment at ``base`` (if it cannot be created, the current one goes on)."""
        new = open(os.path.join(self.path, segment_name(base)), "ab", buffering=0)
        self._file.close()
        self._file = new
        self._segment_base = base
        self._opened.append(base)
        self._dir_synced = False
        self._sync_dir()

    def _sync_dir(self) -> None:
        # The new file's name must survive a crash too, or its records would be lost; a
        # failed directory fsync is retried with the next record's fsync.
        if not self._dir_synced:
            fsync_directory(self.path)
            self._dir_synced = True

    def _open_segment(self, base: int) -> None:
        self._segment_base = self._file_end = base
        self._file = open(os.path.join(self.path, segment_name(base)), "ab", buffering=0)
        fsync_directory(self.path)

    def _close_file(self) -> None:
        if self._file is not None:
            self._sync()  # a graceful stop leaves everything on disk, whatever the mode
            self._file.close()
            self._file = None

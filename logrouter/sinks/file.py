"""The ``file`` sink: JSON lines in rolling files, published atomically, exactly once.

One line per event: ``{"time":"2023-11-14T22:13:20.250000000Z","tag":"app.web","record":{…}}``
(the event time in UTC with nanoseconds; bytes as UTF-8 text, invalid bytes as ``\\xNN``;
NaN and infinities as strings). One file is open at a time, in
``<path>/_staging/<prefix>/``; it is sealed once it holds ``roll_bytes`` or is
``roll_secs`` old, and on a graceful stop. Every seal is one commit, as in the parquet
sink:

1. flush and fsync the staged file;
2. write the commit record (``SinkState``): the new spool cursor and the file to publish
   (staging name → final name) — this replace is the commit point;
3. rename the file to ``<path>/<prefix>-<opened, UTC>-<run>-<seq>.jsonl`` and fsync the
   directory.

A file only ever holds whole spool records, and the cursor of a commit is the end of the
last one in it, so the published files hold exactly the records before the cursor.
Recovery redoes step 3 from the last commit record, deletes every other staged file
(uncommitted work), and the router replays the spool from the cursor into a new file: a
crash at any point neither loses nor duplicates a line. All file work runs in one worker
thread (``SerialWorker``); the reactor only queues.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import secrets
from typing import Any, Iterator

from twisted.internet import defer, task

from logrouter import registry
from logrouter.atomic_file import fsync_directory
from logrouter.batch import Batch, Event
from logrouter.config.options import Option, positive
from logrouter.serial import SerialWorker, defer_to_thread
from logrouter.sinks.base import SINK_OPTIONS

from logrouter.sinks.worker_sink import RESET as _RESET, ROWS as _ROWS, STOP as _STOP, TICK as _TICK, WorkerSink  # noqa: F401

CURSOR_SAVE_SECS = 1.0  # a cursor-only commit (no file open) at most this often
STAGING = "_staging"
SUFFIX = ".jsonl"


def _check_prefix(value: str) -> None:
    if value and (any(c in value for c in "/\\\0") or value.startswith((".", "_"))):
        raise ValueError(f"must be a file-name-safe string not starting with '.' or '_', got {value!r}")


# -- events as JSON lines ----------------------------------------------------------------


def _default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"not a JSON type: {type(value).__name__}")


def _clean(value: Any) -> Any:
    """A copy JSON can take: non-finite floats as strings, keys as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {_key(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, (bytes, bytearray)):
        return bytes(key).decode("utf-8", "backslashreplace")
    return json.dumps(key) if isinstance(key, (bool, type(None))) else str(key)


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_default).encode


def record_json(record: Any) -> str:
    """The record as compact JSON; ``ValueError``/``TypeError`` when it cannot be one."""
    try:
        return _encode(record)
    except (ValueError, TypeError):
        return _encode(_clean(record))


class TimeText:
    """RFC 3339 UTC text with nanoseconds for an event time, cached per second."""

    def __init__(self) -> None:
        self._second = None
        self._prefix = ""

    def __call__(self, time_ns: int) -> str:
        second, nanos = divmod(time_ns, 1_000_000_000)
        if second != self._second:
            stamp = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=second)
            self._prefix = stamp.strftime("%Y-%m-%dT%H:%M:%S")
            self._second = second
        return f"{self._prefix}.{nanos:09d}Z"


def encode_lines(tag: str, events: list[Event], time_text: TimeText) -> tuple[bytes, int, list[tuple[Any, str]]]:
    """The lines of a batch as UTF-8, how many, and the records refused with their reason."""
    head = '","tag":' + json.dumps(tag, ensure_ascii=False) + ',"record":'
    lines = []
    refused = []
    for time_ns, record in events:
        try:
            lines.append('{"time":"' + time_text(time_ns) + head + record_json(record) + "}\n")
        except (ValueError, TypeError, OverflowError, RecursionError) as e:
            refused.append((record, f"cannot be written as JSON: {e}"))
    return "".join(lines).encode("utf-8", "backslashreplace"), len(lines), refused


# -- the open file -------------------------------------------------------------------------


class _OpenFile:
    __slots__ = ("staging", "final", "handle", "opened", "bytes", "lines", "first", "last")

    def __init__(self, staging: str, final: str, opened: float, position: int) -> None:
        self.staging = staging
        self.final = final
        self.handle = open(staging, "wb")
        self.opened = opened
        self.bytes = 0
        self.lines = 0
        self.first = position  # spool position of the first record in the file
        self.last = position  # ... and of the last


@registry.sink("file")
class FileSink(WorkerSink):
    WRITER_OPTION = "prefix"
    COUNTERS = {
        "files_published": "JSON lines files published",
        "lines_published": "lines in the files published",
        "commits": "commits (a file published and the cursor moved at once)",
    }
    OPTIONS = {
        "path": Option(str, doc="directory the files are published in (staged in `<path>/_staging/<prefix>/`)"),
        "prefix": Option(str, "", "start of every file name (empty = the sink's name); unique per router and sink sharing a directory", _check_prefix),
        "roll_bytes": Option(int, 64 << 20, "seal a file once it holds about this many bytes", positive),
        "roll_secs": Option((int, float), 60, "seal a file this long after it was opened", positive),
        **SINK_OPTIONS,
    }

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        super().__init__(name, options, errors, reactor)
        self.root = options["path"]
        self.prefix = options["prefix"] or name
        _check_prefix(self.prefix)
        self.staging_dir = os.path.join(self.root, STAGING, self.prefix)
        self.roll_bytes = options["roll_bytes"]
        self.roll_secs = float(options["roll_secs"])
        self.run = secrets.token_hex(4)
        self.sequence = 0
        self.worker = SerialWorker(reactor, self._work, f"logrouter-file-{name}", on_result=self._done, on_failure=self._failed)
        self.ticker = task.LoopingCall(self._tick)
        self.ticker.clock = reactor
        self.fed_end = 0
        self.files_published = 0
        self.lines_published = 0
        self.commits = 0
        self._file: _OpenFile | None = None
        self._time_text = TimeText()
        self._saved_cursor = -1
        self._saved_at = float("-inf")
        self._unpublished: list[tuple[str, str]] = []  # committed, rename not done (a failure hit)
        self._stopped = False

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        yield from super().samples()
        yield "logrouter_sink_open_files", "gauge", self.labels(), 0 if self._file is None else 1

    # -- lifecycle (reactor thread) ----------------------------------------------------

    def start(self) -> defer.Deferred:
        d = defer_to_thread(self._recover)

        def started(cursor: int) -> int:
            self.cursor = self.fed_end = cursor
            self.ticker.start(min(1.0, self.roll_secs / 4), now=False)
            return cursor

        return d.addCallback(started)

    def write(self, batch: Batch, position: int, size: int) -> None:
        if self._stopped:
            return  # after its final commit: the spool has it, the next start replays it
        self.queued_bytes += size
        self._submit((_ROWS, batch, position, size))

    def _report_refused(self, refused: list) -> None:
        for tag, record, reason in refused:
            self.errors(self.name, tag, record, reason)

    # -- worker thread -----------------------------------------------------------------

    def _recover(self) -> int:
        """Finish the last commit, delete uncommitted staged files; the cursor to resume from."""
        state = self.state.load() if self.state is not None else None
        if state:
            self._publish([tuple(f) for f in state.get("files", [])], missing_ok=True)
            self._saved_cursor = state["cursor"]
        os.makedirs(self.staging_dir, exist_ok=True)
        removed = [n for n in os.listdir(self.staging_dir) if n.endswith(SUFFIX)]
        for name in removed:
            os.unlink(os.path.join(self.staging_dir, name))
        if removed:
            self.log.info(
                "file sink {name}: discarded {count} uncommitted staging file(s); they will be rewritten from the spool",
                name=self.name,
                count=len(removed),
            )
        return state["cursor"] if state else 0

    def _work(self, items: list[tuple[tuple, float, int, int]]) -> tuple[int, int, list, list]:
        try:
            return self._run(items)
        except BaseException:
            self._abort()
            raise

    def _run(self, items: list[tuple[tuple, float, int, int]]) -> tuple[int, int, list, list]:
        freed = 0
        stop = False
        refused: list = []
        undecodable: list = []
        now = items[-1][1]
        processed_end = max(self._saved_cursor, 0)
        for item, at, fed_end, epoch in items:
            kind = item[0]
            if kind == _RESET:
                self._abort()
                if self._unpublished:
                    self._publish(self._unpublished, missing_ok=True)
                    self._unpublished = []
                processed_end = max(self._saved_cursor, 0)
                continue
            if epoch != self.epoch:
                continue  # the replay from the cursor brings it again
            processed_end = max(processed_end, fed_end)
            if kind == _ROWS:
                _, batch, position, size = item
                freed += size
                events = self.events_of(batch, position, undecodable)
                if events is None:
                    continue
                data, lines, bad = encode_lines(batch.tag, events, self._time_text)
                refused.extend((batch.tag, record, reason) for record, reason in bad)
                if lines:
                    self._append(data, lines, position, at)
            elif kind == _STOP:
                stop = True
        file = self._file
        # A file may be sealed once its last record is complete: the spool was handed over past it.
        if file is not None and processed_end > file.last and (stop or now - file.opened >= self.roll_secs or file.bytes >= self.roll_bytes):
            self._commit(processed_end, now)
        elif file is None and processed_end > self._saved_cursor and (stop or now - self._saved_at >= CURSOR_SAVE_SECS):
            self._commit(processed_end, now)  # cursor only
        # Only a committed cursor is reported: the spool may delete what lies before it.
        return freed, max(self._saved_cursor, 0), refused, undecodable

    def _append(self, data: bytes, lines: int, position: int, now: float) -> None:
        file = self._file
        if file is not None and position > file.last and file.bytes >= self.roll_bytes:
            # Full, and every record in it is complete (a later one has begun): seal it here.
            self._commit(position, now)
            file = None
        if file is None:
            file = self._file = self._open(position, now)
        file.handle.write(data)
        file.bytes += len(data)
        file.lines += lines
        file.last = position

    def _open(self, position: int, now: float) -> _OpenFile:
        os.makedirs(self.staging_dir, exist_ok=True)
        self.sequence += 1
        opened = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        name = f"{self.prefix}-{opened}-{self.run}-{self.sequence:06d}{SUFFIX}"
        return _OpenFile(os.path.join(self.staging_dir, name), os.path.join(self.root, name), now, position)

    def _commit(self, cursor: int, now: float) -> None:
        file, self._file = self._file, None
        files: list[tuple[str, str]] = []
        if file is not None:
            file.handle.flush()
            os.fsync(file.handle.fileno())
            file.handle.close()
            files.append((file.staging, file.final))
        files = [*self._unpublished, *files]  # an earlier commit's renames not done yet stay listed
        if self.state is not None:
            # The commit point: from here on, recovery finishes the renames.
            self.state.save({"cursor": cursor, "files": [list(f) for f in files]})
        self._saved_cursor = cursor
        self._saved_at = now
        self._unpublished = files
        self._publish(files, missing_ok=True)
        self._unpublished = []
        self.commits += 1
        if file is not None:
            self.files_published += 1
            self.lines_published += file.lines
            self.log.info(
                "file sink {name} published {file} ({lines} lines)", name=self.name, file=os.path.basename(file.final), lines=file.lines
            )

    def _publish(self, files: list[tuple[str, str]], missing_ok: bool = False) -> None:
        """Rename staged files into place (a file already renamed is skipped when ``missing_ok``)."""
        for staging, final in files:
            try:
                os.replace(staging, final)
            except FileNotFoundError:
                if not missing_ok:
                    raise
        if files:
            fsync_directory(self.root)

    def _abort(self) -> None:
        """Drop the open file: its lines are replayed from the spool."""
        file, self._file = self._file, None
        if file is not None:
            try:
                file.handle.close()
            finally:
                try:
                    os.unlink(file.staging)
                except FileNotFoundError:
                    pass

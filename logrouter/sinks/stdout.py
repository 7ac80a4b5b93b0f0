"""The ``stdout`` sink: JSON lines on standard output (or error), for debugging.

Lines have the ``file`` sink's shape (``{"time":…,"tag":…,"record":{…}}``). Delivery is
at most once: the cursor moves as soon as a record is handed over, so a crash may lose
lines that were not written yet but never repeats one. Writing happens in one worker
thread (a blocked pipe never blocks the reactor); what waits for it counts in
``queued_bytes``, so a reader that does not keep up makes the router hold back.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from twisted.internet import defer

from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.options import Option, one_of
from logrouter.serial import SerialWorker, defer_to_thread
from logrouter.sinks.base import SINK_OPTIONS, SinkBase
from logrouter.sinks.file import TimeText, encode_lines
from logrouter.sinks.state import CursorSaver

CURSOR_SAVE_SECS = 1.0
STREAMS = {"stdout": 1, "stderr": 2}


def write_all(fd: int) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    return write


class CursorOnly(SinkBase):
    """A sink whose cursor moves when records are handed over, saved now and then."""

    run_blocking = staticmethod(defer_to_thread)

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        super().__init__(name, options, errors, reactor)
        self.saver = CursorSaver(self, CURSOR_SAVE_SECS)

    def start(self) -> defer.Deferred:
        d = self.run_blocking(self._load)

        def loaded(cursor: int) -> int:
            self.cursor = cursor
            self.saver.loaded(cursor)
            return cursor

        return d.addCallback(loaded)

    def _load(self) -> int:
        state = self.state.load() if self.state is not None else None
        return state["cursor"] if state else 0

    def advance(self, end: int) -> None:
        if end > self.cursor:
            self.cursor = end
            self.saver.save()
            self.on_progress()

    def stop(self) -> defer.Deferred:
        self.cancel_retry()
        return self.saver.save(force=True)


@registry.sink("stdout")
class StdoutSink(CursorOnly):
    OPTIONS = {
        "stream": Option(str, "stdout", "`stdout` or `stderr`", one_of(*STREAMS)),
        **SINK_OPTIONS,
    }

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        super().__init__(name, options, errors, reactor)
        self.output: Callable[[bytes], None] = write_all(STREAMS[options["stream"]])
        self.worker = SerialWorker(reactor, self._write, f"logrouter-stdout-{name}", on_result=self._written, on_failure=self._lost)
        self._time_text = TimeText()
        self.lines_written = 0
        self._stopped = False

    COUNTERS = {"lines_written": "lines written"}

    def write(self, batch: Batch, position: int, size: int) -> None:
        if self._stopped:
            return
        self.events_in += len(batch.events)
        self.queued_bytes += size
        self.worker.submit((batch, size))

    def _write(self, items: list[tuple[Batch, int]]) -> tuple[int, int, list]:
        """Worker thread: encode and write everything queued in one go."""
        chunks, lines, refused, freed = [], 0, [], 0
        for batch, size in items:
            data, count, bad = encode_lines(batch.tag, batch.events, self._time_text)
            chunks.append(data)
            lines += count
            freed += size
            refused.extend((batch.tag, record, reason) for record, reason in bad)
        self.output(b"".join(chunks))  # an OSError: _lost (at most once)
        return freed, lines, refused

    def _written(self, result: tuple[int, int, list]) -> None:
        freed, lines, refused = result
        self.queued_bytes = max(0, self.queued_bytes - freed)
        self.lines_written += lines
        for tag, record, reason in refused:
            self.errors(self.name, tag, record, reason)
        self.on_progress()

    def settled(self) -> bool:
        return self.queued_bytes == 0  # written, refusals reported

    def _lost(self, failure: Any) -> None:
        self.queued_bytes = 0
        self.failures += 1
        self.log.failure("stdout sink {name}: writing failed; lines lost (at most once)", failure, name=self.name)
        self.on_progress()

    def stop(self) -> defer.Deferred:
        self._stopped = True
        d = self.worker.stop()
        d.addCallback(lambda _: CursorOnly.stop(self))
        return d

"""The ``parquet`` sink: batches into Hive-partitioned Parquet files in a lake.

The Twisted side of the sink: it queues batches for one worker thread that runs the lake
writer (``logrouter.lake``), seals files on a timer (by age) and as they fill (by size),
publishes sealed files, and on stop seals and publishes everything open. All Parquet
encoding and file I/O happen in the worker thread, never on the reactor.
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger

from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.options import Option, positive
from logrouter.lake.writer import LakeWriter
from logrouter.serial import SerialWorker

_TICK = object()  # a queued item that only asks the worker to seal files that are due
_STOP = object()  # seal and publish everything open


def _check_path(value: str) -> None:
    if not value:
        raise ValueError("must not be empty")
    if "://" in value and not value.startswith("file://"):
        scheme = value.split("://", 1)[0]
        raise ValueError(f"filesystem {scheme!r} is not supported yet (use a local path or file://)")


def _check_writer_id(value: str) -> None:
    if not value or any(c in value for c in "/\\\0") or value.startswith((".", "_")):
        raise ValueError(f"must be a non-empty file-name-safe string not starting with '.' or '_', got {value!r}")


@registry.sink("parquet")
class ParquetSink:
    OPTIONS = {
        "path": Option(str, doc="lake root: a directory or file:// URI", check=_check_path),
        "writer_id": Option(
            str, "", "unique per router writing into the same lake (default: host name + sink name)", _check_writer_id
        ),
        "roll_bytes": Option(int, 128 << 20, "seal a file once it holds about this many bytes", positive),
        "roll_secs": Option((int, float), 300, "seal a file this long after it was opened", positive),
    }
    log = Logger(namespace="logrouter.sink.parquet")

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        self.name = name
        self.options = options
        self.errors = errors
        self.reactor = reactor
        root = options["path"].removeprefix("file://")
        writer_id = options["writer_id"] or f"{socket.gethostname()}-{name}"
        self.writer = LakeWriter(root, writer_id, options["roll_bytes"], options["roll_secs"])
        self.worker = SerialWorker(reactor, self._work, f"logrouter-parquet-{name}")
        self.ticker = task.LoopingCall(self._tick)
        self.ticker.clock = reactor
        self.files_published = 0
        self.rows_published = 0
        self.events_in = 0

    def start(self) -> defer.Deferred:
        self.writer.discard_staging()
        interval = min(1.0, float(self.options["roll_secs"]) / 4)
        self.ticker.start(interval, now=False)
        return defer.succeed(None)

    def write(self, batch: Batch) -> None:
        self.events_in += len(batch.events)
        self.worker.submit((batch, self.reactor.seconds())).addErrback(self._failed)

    def _tick(self) -> None:
        if not self.worker.busy:
            self.worker.submit((_TICK, self.reactor.seconds())).addErrback(self._failed)

    def stop(self) -> defer.Deferred:
        if self.ticker.running:
            self.ticker.stop()
        d = self.worker.submit((_STOP, self.reactor.seconds()))
        d.addErrback(self._failed)
        d.addCallback(lambda _: self.worker.stop())
        return d

    # -- worker thread -------------------------------------------------------------

    def _work(self, items: list[tuple[Any, float]]) -> None:
        stop = False
        now = items[-1][1]
        for item, _ in items:
            if item is _STOP:
                stop = True
            elif item is not _TICK:
                self.writer.write(item.tag, item.events, now)
        sealed = self.writer.seal_all() if stop else self.writer.seal_due(now)
        if sealed:
            self.writer.publish(sealed)
            self.files_published += len(sealed)
            self.rows_published += sum(s.rows for s in sealed)

    def _failed(self, failure: Any) -> None:
        self.log.failure("parquet sink {name}: write failed", failure, name=self.name)

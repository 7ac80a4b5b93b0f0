"""What the lake's file sinks share (``parquet``, ``iceberg``): options, rows in, the run.

Both write spool records through one ``LakeWriter`` (``logrouter.lake``: the column
strategy, ``_extra``, ``flatten``, rolling by size and age) in one worker thread, and both
report dead letters the same way: records whose tag cannot name a partition go to the
error path, records whose spool bytes cannot be decoded are logged and skipped. This base
owns the options they share, the samples, and one worker run over the queued items
(``_run``); each sink supplies its commit protocol through four methods:

* ``_recover()``: at start, in a thread: finish or undo the last commit; the cursor;
* ``_reset_work()``: after a failure, before the spool is replayed from ``_saved_cursor``;
* ``_rows(batch, position, events, now, refused)``: one record's events into the writer;
* ``_finish_run(now, processed_end, stop)``: seal and commit what is due, move the cursor.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any, Iterator

from twisted.internet import defer

from logrouter.batch import Batch
from logrouter.config.options import Option, positive
from logrouter.lake.flatten import flatten_events
from logrouter.lake.partition import PartitionError
from logrouter.lake.codecs import check_codec
from logrouter.lake.column_names import DECLARED_TYPES, check_declared
from logrouter.serial import defer_to_thread
from logrouter.sinks.worker_sink import RESET, ROWS, STOP, WorkerSink

if TYPE_CHECKING:
    from logrouter.lake.schema import ColumnTypes
    from logrouter.lake.writer import LakeWriter

CURSOR_SAVE_SECS = 1.0  # a cursor-only commit (nothing sealed) at most this often
MAX_BUFFERED_BYTES = 64 << 20  # rows held in Python before they are encoded anyway



def check_writer_id(value: str) -> None:
    if value and (any(c in value for c in "/\\\0") or value.startswith((".", "_"))):
        raise ValueError(f"must be a file-name-safe string not starting with '.' or '_', got {value!r}")


def check_columns(value: dict) -> None:
    try:
        check_declared(value)  # without pyarrow: the supervisor of [router] workers checks configs too
    except ValueError as e:
        raise ValueError(f"{e} (types: {', '.join(sorted(DECLARED_TYPES))})") from None


def default_writer_id(name: str) -> str:
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname()) or "host"
    return f"{host}-{name}"


def file_options(writer_doc: str, roll_secs: float) -> dict[str, Option]:
    """The options of the lake writer both sinks have (``roll_secs``: this sink's default)."""
    return {
        "writer_id": Option(str, "", writer_doc, check_writer_id),
        "roll_bytes": Option(int, 128 << 20, "seal a file once it holds about this many bytes", positive),
        "roll_secs": Option((int, float), roll_secs, "seal a file this long after it was opened", positive),
        "row_group_rows": Option(int, 10_000, "rows per Parquet row group; bounds the memory of each open file", positive),
        "roll_row_groups": Option(int, 256, "seal a file once it holds this many row groups (each one's footer entry stays in memory "
                                  "until the file is sealed, ~4 KB with a few columns)", positive),
        "compression": Option(str, "zstd", "Parquet codec: `zstd`, `snappy`, `gzip`, `brotli`, `lz4` or `none`", check_codec),
        "columns": Option(dict, {}, "declared column types, e.g. `{ status = \"int\", latency = \"float\" }`: every file has them, typed, even "
            "across routers and restarts", check_columns),
        "flatten": Option(
            bool, False, "store nested tables as dotted columns (`host.name`) instead of JSON in `_extra`; arrays stay in `_extra`"
        ),
    }


class LakeSink(WorkerSink):
    """A sink writing Parquet through a ``LakeWriter`` in its worker thread."""

    WRITER_OPTION = "writer_id"
    default_writer = staticmethod(default_writer_id)
    writer: LakeWriter | None  # None until ``_recover`` made it (the iceberg sink's needs its table)
    _saved_cursor: int
    ticker: Any

    def new_writer(self, root: str, fs: Any, layout: Any = None, column_types: ColumnTypes | None = None) -> LakeWriter:
        # pyarrow loads here, in the process that writes: not in a config check
        from logrouter.lake.schema import ColumnTypes
        from logrouter.lake.writer import LakeWriter

        return LakeWriter(
            root,
            self.writer_id,
            self.options["roll_bytes"],
            self.options["roll_secs"],
            self.options["row_group_rows"],
            fs=fs,
            roll_row_groups=self.options["roll_row_groups"],
            column_types=column_types if column_types is not None else ColumnTypes(self.options["columns"]),
            compression=self.options["compression"],
            layout=layout,
        )

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        """SinkBase's samples, plus the files open and the rows they buffer."""
        yield from super().samples()
        labels = self.labels()
        writer = self.writer
        yield "logrouter_sink_open_files", "gauge", labels, writer.open_files if writer is not None else 0
        yield "logrouter_sink_buffered_rows", "gauge", labels, writer.buffered_rows if writer is not None else 0

    def start(self) -> defer.Deferred:
        d = defer_to_thread(self._recover)

        def started(cursor: int) -> int:
            self.cursor = self.fed_end = cursor
            self.ticker.start(min(1.0, float(self.options["roll_secs"]) / 4), now=False)
            return cursor

        return d.addCallback(started)

    def write(self, batch: Batch, position: int, size: int) -> None:
        self.queued_bytes += size
        self._submit((ROWS, batch, position, size))

    def _report_refused(self, refused: list) -> None:
        for tag, reason, events in refused:
            for _, record in events:
                self.errors(self.name, tag, record, reason)

    # -- worker thread -----------------------------------------------------------------

    def _work(self, items: list[tuple[tuple, float, int, int]]) -> tuple[int, int, list, list]:
        """One run over everything queued; on any error the writer drops what it holds."""
        try:
            return self._run(items)
        except BaseException:
            if self.writer is not None:
                self.writer.abort()
            raise

    def _run(self, items: list[tuple[tuple, float, int, int]]) -> tuple[int, int, list, list]:
        freed = 0
        stop = False
        refused: list = []
        undecodable: list = []
        now = items[-1][1]
        # How far the spool was handed over when the last item of this epoch was queued;
        # work of an older epoch (queued before a failure) proves nothing and is skipped.
        processed_end = self._saved_cursor
        for item, _, fed_end, epoch in items:
            kind = item[0]
            if kind == RESET:
                self._reset_work()
                processed_end = self._saved_cursor
                continue
            if epoch != self.epoch:
                continue  # the replay from the cursor brings it again
            processed_end = fed_end
            if kind == ROWS:
                _, batch, position, size = item
                freed += size
                events = self.events_of(batch, position, undecodable)
                if events is not None:
                    self._rows(batch, position, flatten_events(events) if self.flatten else events, now, refused)
            elif kind == STOP:
                stop = True
        if self.writer.buffered_bytes > MAX_BUFFERED_BYTES:
            self.writer.flush()
        self._finish_run(now, processed_end, stop)
        # Only a committed cursor is reported: the spool may delete what lies before it.
        return freed, self._saved_cursor, refused, undecodable

    def write_rows(self, tag: str, events: list, now: float, position: int, refused: list, published: Any = None) -> None:
        """``events`` into the writer; a tag that cannot name a partition refuses them."""
        try:
            self.writer.write(tag, events, now, position, published)
        except PartitionError as e:
            refused.append((tag, f"tag cannot name a partition: {e}", events))

    def _recover(self) -> int:
        raise NotImplementedError

    def _reset_work(self) -> None:
        raise NotImplementedError

    def _rows(self, batch: Batch, position: int, events: list, now: float, refused: list) -> None:
        raise NotImplementedError

    def _finish_run(self, now: float, processed_end: int, stop: bool) -> None:
        raise NotImplementedError

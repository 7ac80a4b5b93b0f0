"""The ``parquet`` sink: spool records into Hive-partitioned Parquet files, exactly once.

The Twisted side of the sink. One worker thread runs the lake writer
(``logrouter.lake``): rows are buffered per partition, files seal by size and by age,
and every publish is one commit:

1. seal the files (closed and fsync'd in staging);
2. write the commit record (``SinkState``): the new spool cursor, per partition the
   last spool position already in a published file, the files to publish, and the
   column types learned so far — this replace is the commit point;
3. rename the files into place.

Recovery redoes step 3 from the last commit record, deletes every other staged file
(uncommitted work), and the router replays the spool from the cursor; rows of a
partition whose position is not past its published mark are skipped, so a replay never
writes a row twice. The cursor never passes the first record of a file still open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet import task

from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.options import Option
from logrouter.lake.fs import check_lake_url, filesystem_for
from logrouter.serial import SerialWorker
from logrouter.sinks.base import SINK_OPTIONS
from logrouter.sinks.lake_sink import CURSOR_SAVE_SECS, LakeSink, file_options

from logrouter.sinks.worker_sink import RESET as _RESET, ROWS as _ROWS, STOP as _STOP, TICK as _TICK  # noqa: F401

if TYPE_CHECKING:
    from logrouter.lake.writer import LakeWriter, SealedFile


def _check_path(value: str) -> None:
    # a local path, file://… or hdfs://namenode:8020/path (which needs hdfs-native installed)
    check_lake_url(value)


@registry.sink("parquet")
class ParquetSink(LakeSink):
    COUNTERS = {
        "files_published": "Parquet files published into the lake",
        "rows_published": "rows in the files published",
        "commits": "commits (files published and the cursor moved at once)",
    }
    OPTIONS = {
        "path": Option(str, doc="lake root: a directory, `file://` or `hdfs://namenode:8020/logs` (see HDFS)", check=_check_path),
        **file_options("unique per router writing into one lake; part of every file name (empty = host name + sink name)", 300),
        **SINK_OPTIONS,
    }

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        super().__init__(name, options, errors, reactor)
        self.root = options["path"].removeprefix("file://")
        self.writer_id = options["writer_id"] or self.default_writer(name)
        self.flatten = options.get("flatten", False)
        self.writer = self._new_writer()
        self.worker = SerialWorker(
            reactor, self._work, f"logrouter-parquet-{name}", on_result=self._done, on_failure=self._failed
        )
        self.ticker = task.LoopingCall(self._tick)
        self.ticker.clock = reactor
        self.fed_end = 0  # end of the last spool record handed over (reactor thread)
        self.published: dict[tuple[str, int], int] = {}  # partition -> last position published
        self.files_published = 0
        self.rows_published = 0
        self.commits = 0
        self._saved_cursor = -1
        self._saved_at = float("-inf")
        self._unpublished: list[SealedFile] = []  # committed, renames not finished (a failure hit)
        self._stopped = False

    def _new_writer(self) -> LakeWriter:
        fs, self.root = filesystem_for(self.options["path"])
        return self.new_writer(self.root, fs)

    # -- recovery (in a thread, at start) ----------------------------------------------

    def _recover(self) -> int:
        """Finish the last commit, drop uncommitted staging files; the cursor to resume from."""
        state = self.state.load() if self.state is not None else None
        if state:
            self.writer.column_types.restore(state.get("columns", []))
            self.writer.publish(self._take_commit(state), missing_ok=True)
        # Fields this sink has not typed yet take the lake table's types (other routers'),
        # so routers sharing a lake agree (logrouter.lake.table).
        self.writer.adopt_table()
        removed = self.writer.discard_staging()
        if removed:
            self.log.info(
                "parquet sink {name}: discarded {count} uncommitted staging file(s); they will be rewritten from the spool",
                name=self.name,
                count=len(removed),
            )
        return state["cursor"] if state else 0

    def _adopt_commit_on_disk(self) -> None:
        """A commit whose save reported a failure may still have reached the disk (the
        record replaced, then the directory's fsync failed): what the record lists is
        committed, so it is published and its cursor and marks taken, never discarded
        with the staging files as uncommitted work."""
        try:
            state = self.state.load() if self.state is not None else None
        except Exception:  # noqa: BLE001 - unreadable now: the next start's recovery reads it
            return
        if not state or state.get("cursor", -1) < self._saved_cursor:
            return
        known = {f.staging_path for f in self._unpublished}
        self._unpublished = [*self._unpublished, *(f for f in self._take_commit(state) if f.staging_path not in known)]

    def _take_commit(self, state: dict) -> list:
        """A commit record's cursor and published marks taken as this sink's; the files it
        lists (to publish: their renames may not be done)."""
        from logrouter.lake.writer import SealedFile

        self.published = {(tag, bucket): mark for tag, bucket, mark in state.get("published", [])}
        self._saved_cursor = state["cursor"]
        return [SealedFile.from_dict(f) for f in state.get("files", [])]

    # -- worker thread -----------------------------------------------------------------

    def _reset_work(self) -> None:
        self.writer.abort()
        self._adopt_commit_on_disk()
        if self._unpublished:
            # committed before the failure: finish its renames (idempotent)
            self.writer.publish(self._unpublished, missing_ok=True)
            self._unpublished = []
        try:
            # What is still staged now is uncommitted (e.g. a file whose delete
            # the outage refused at the abort): the replay writes it again.
            self.writer.discard_staging()
        except Exception as e:  # noqa: BLE001 - the next reset, or the next start, retries
            self.log.warn(
                "parquet sink {name}: staged files not cleared yet ({error}); the next retry or start does it",
                name=self.name,
                error=str(e).splitlines()[0][:200] if str(e) else type(e).__name__,
            )

    def _rows(self, batch: Batch, position: int, events: list, now: float, refused: list) -> None:
        self.write_rows(batch.tag, events, now, position, refused, self.published)

    def _finish_run(self, now: float, processed_end: int, stop: bool) -> None:
        # processed_end: the end of the records handed over whole (a record's batches may
        # come in several runs when routes join at this sink): none is split across files.
        sealed = self.writer.seal_all() if stop else self.writer.seal_due(now, processed_end)
        oldest = self.writer.oldest_open_mark()
        cursor = processed_end if oldest is None else min(oldest, processed_end)
        if sealed or stop or (cursor > self._saved_cursor and now - self._saved_at >= CURSOR_SAVE_SECS):
            self._commit(sealed, cursor, now)

    def _commit(self, sealed: list[SealedFile], cursor: int, now: float) -> None:
        published = dict(self.published)
        for file in sealed:
            key = (file.tag, file.hour_bucket)
            published[key] = max(published.get(key, -1), file.last_mark)
        # Marks below the cursor can never be replayed again: forget them.
        published = {k: m for k, m in published.items() if m >= cursor}
        if self.state is not None:
            # The commit point. If it fails (a full disk), nothing is committed and the
            # sink's memory must say so: marks taken for files that never get published
            # would make the replay skip their rows, and they would be lost.
            self.state.save(
                {
                    "cursor": cursor,
                    "published": [[tag, bucket, mark] for (tag, bucket), mark in published.items()],
                    # files of an earlier commit whose renames are not done yet stay listed
                    "files": [f.to_dict() for f in [*self._unpublished, *sealed]],
                    "columns": self.writer.column_types.export(),
                }
            )
        # Committed: memory follows the record. A rename that fails now is redone before
        # the replay after the failure (``_RESET``), as recovery would after a crash.
        self.published = published
        self._saved_cursor = cursor
        self._saved_at = now
        self._unpublished = [*self._unpublished, *sealed]
        self.writer.publish(self._unpublished, missing_ok=True)
        self._unpublished = []
        self.commits += 1
        self.files_published += len(sealed)
        self.rows_published += sum(f.rows for f in sealed)
        if sealed:  # not for cursor-only commits; twisted.logger is thread-safe
            parts = sorted({"/".join(f.final_path.rsplit("/", 4)[1:4]) for f in sealed})
            self.log.info(
                "parquet sink {name} committed {files} file(s), {rows} rows: {partitions}",
                name=self.name,
                files=len(sealed),
                rows=sum(f.rows for f in sealed),
                partitions=", ".join(parts[:3]) + (f" (+{len(parts) - 3} more)" if len(parts) > 3 else ""),
            )


"""The ``iceberg`` sink: spool records into an Apache Iceberg table, exactly once.

The rows go through the same lake writer as the ``parquet`` sink's (column strategy,
``_extra``, ``flatten``, files rolled by size and age), laid out by the table
(``logrouter.lake.iceberg_table``), and are committed through the catalog
(``logrouter.lake.iceberg_catalog``). A roll is a commit: when a file is due, every open
file is sealed and all of them go into one append, so a commit covers every record the
sink was handed up to a spool position, and nothing after it. One commit:

1. seal the files (closed and fsync'd in ``<table>/_staging/<writer_id>/``);
2. save the intent in the sink's state (beside the spool): the spool end the commit
   covers and the data files' final paths;
3. rename the files into ``<table>/data/<partition>/``;
4. append them to the table; the snapshot summary carries the writer id, the spool's id
   and the spool range (``logrouter.lake.iceberg_commit``): this is the commit point;
5. save the state: the cursor at the commit's end, no intent.

Recovery (at start, and after any failure, since a commit that raised may have landed):
the table's history says how far this writer's commits reach; the sink resumes there (or
at its saved cursor, if that is further: records with nothing for the table), deletes the
intent's files if its commit is not in the table, and clears its staging directory. A
replay from an older cursor skips the records below the table's end, so nothing is
written twice, whichever step a crash interrupted.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any, Callable

from twisted.internet import task

from logrouter import faults, registry
from logrouter.batch import Batch
from logrouter.config.options import Option, list_of
from logrouter.lake import iceberg_commit
from logrouter.lake.fs import filesystem_for
from logrouter.lake.iceberg_catalog import (
    DEFAULT_CATALOG,
    DEFAULT_TABLE,
    catalog_properties,
    check_catalog_name,
    check_catalog_properties,
    check_catalog_uri,
    check_settings,
    check_table,
    check_warehouse,
    close_catalog,
    open_catalog,
    redact,
    table_identifier,
)
from logrouter.lake.iceberg_partition import DEFAULT_PARTITION_BY, check_partition_by
from logrouter.serial import SerialWorker
from logrouter.sinks.base import SINK_OPTIONS
from logrouter.sinks.lake_sink import CURSOR_SAVE_SECS, LakeSink, file_options

if TYPE_CHECKING:
    from logrouter.lake.iceberg_table import IcebergLayout
    from logrouter.lake.writer import SealedFile

# Queued when the router has handed over the last batch of a record with rows for this
# sink: a commit covers whole records only (a record's batches may span two runs).
ADVANCED = "advanced"

CATALOG_COMMIT = "iceberg.catalog-commit"  # a fault point (tests): the catalog's database transaction commits


def _check_partition_by(value: list) -> None:
    list_of(str)(value)
    check_partition_by(value)


@registry.sink("iceberg")
class IcebergSink(LakeSink):
    COUNTERS = {
        "commits": "appends to the table (each one snapshot, carrying the spool range it covers)",
        "files_committed": "Parquet data files committed into the table",
        "rows_committed": "rows in the files committed",
        "commit_conflicts": "appends another writer's commit beat even after pyiceberg's retries; retried here",
        "commit_seconds": "time spent committing (intent saved, files renamed, table refreshed, append, cursor saved): "
                          "over commits_total, the mean commit latency",
        "schema_updates": "schema updates adding columns to the table (schema evolution by name)",
    }
    OPTIONS = {
        "warehouse": Option(str, doc="where the catalog puts new tables: a directory, `file://` or `hdfs://namenode:8020/warehouse`",
                            check=check_warehouse),
        "table": Option(str, DEFAULT_TABLE, "the table, `<namespace>.<table>`; created at the first start if absent", check_table),
        "catalog": Option(str, DEFAULT_CATALOG, "the catalog's name: part of every table's key in the catalog database, so Spark's "
                          "catalog (`spark.sql.catalog.<name>`) and every router must use the same one", check_catalog_name),
        "catalog_uri": Option(str, "", "the SQL catalog's database (SQLAlchemy URL), e.g. `postgresql+psycopg2://user:pw@host/iceberg` "
                              "for several routers; empty: the SQLite file `catalog.db` in the warehouse directory", check_catalog_uri),
        "catalog_properties": Option(dict, {}, "more pyiceberg catalog properties, passed through as they are (strings), e.g. "
                                     "`{ \"py-io-impl\" = \"…\" }`", check_catalog_properties),
        "partition_by": Option(list, DEFAULT_PARTITION_BY, "a new table's hidden partitioning: `year`/`month`/`day`/`hour(time)`, "
                               "`identity(tag)`, `bucket(N, tag)`, `truncate(N, tag)`", _check_partition_by),
        **file_options("unique per router writing into one table: names its files and, in each snapshot's summary, its "
                       "commits (empty = host name + sink name)", 60),
        **SINK_OPTIONS,
    }

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[str]:
        return check_settings(options["warehouse"], options["catalog_uri"])

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        super().__init__(name, options, errors, reactor)
        self.writer_id = options["writer_id"] or self.default_writer(name)
        self.flatten = options.get("flatten", False)
        self.identifier = table_identifier(options["table"])
        self.properties = catalog_properties(options["warehouse"], options["catalog_uri"], options["catalog_properties"])
        self.catalog: Any = None
        self.table: Any = None
        self.layout: IcebergLayout | None = None
        self.writer = None
        self.spool_id = ""  # this spool's lifetime, in every commit's summary (iceberg_commit)
        self.skip_below = 0  # records before this spool position are in the table already
        self.last_written = -1  # worker thread: the position of the last record with rows in the open files
        self._record_open = False  # reactor thread: batches of a record handed over, its end not yet
        self.worker = SerialWorker(reactor, self._work, f"logrouter-iceberg-{name}", on_result=self._done, on_failure=self._failed)
        self.ticker = task.LoopingCall(self._tick)
        self.ticker.clock = reactor
        self.fed_end = 0
        self.commits = 0
        self.files_committed = 0
        self.rows_committed = 0
        self.commit_conflicts = 0
        self.commit_seconds = 0.0
        self.clock: Callable[[], float] = time.monotonic  # commit latency: a duration, not the reactor's time
        self._saved_cursor = -1
        self._saved_at = float("-inf")
        self._unpublished: list = []  # (a parquet sink's notion: the table has no renames after its commit)
        self._stopped = False
        self._recovery_error = ""

    @property
    def schema_updates(self) -> int:
        return self.layout.schema_updates if self.layout is not None else 0

    def reset_problem(self) -> str:
        return self._recovery_error or super().reset_problem()

    # -- recovery (a thread at start; the worker thread after a failure) ---------------

    def _recover(self) -> int:
        """Open the table, learn how far this writer's commits reach, undo what did not
        make it into the table; the spool position to resume from."""
        state = (self.state.load() if self.state is not None else None) or {}
        if not self.spool_id:
            self.spool_id = state.get("spool_id") or secrets.token_hex(8)
        self._open()
        assert self.writer is not None and self.table is not None
        committed = iceberg_commit.last_commit(self.table, self.writer_id)
        table_end = None
        if committed is not None and committed.spool_id == self.spool_id:
            table_end = committed.end
        elif committed is not None:
            self.log.warn(
                "iceberg sink {name}: the table's last commit of writer {writer} came from another spool ({other}, this one is "
                "{spool}); resuming from the sink's own cursor. Two routers must not share a writer_id",
                name=self.name, writer=self.writer_id, other=committed.spool_id, spool=self.spool_id,
            )
        pending = state.get("pending")
        if pending and (table_end is None or table_end < pending["end"]):
            paths = [*pending.get("files", []), *pending.get("staged", [])]
            for path in paths:
                if self.writer.fs.exists(path):
                    self.writer.fs.remove(path)
            self.log.info("iceberg sink {name}: the commit up to spool position {end} is not in the table; deleted its {count} "
                          "data file(s), they are written again from the spool", name=self.name, end=pending["end"],
                          count=len(pending.get("files", [])))
        self.writer.abort()
        self.writer.discard_staging()
        self.last_written = -1
        saved = int(state.get("cursor", 0))
        cursor = max(saved, table_end or 0)
        if cursor > saved:
            self.log.info(
                "iceberg sink {name}: the table holds this writer's commits up to spool position {end}, past the saved cursor "
                "{saved} (a commit whose answer was lost, or a stop before the cursor was saved): resuming there",
                name=self.name, end=cursor, saved=saved,
            )
        self._saved_cursor = self.skip_below = cursor
        self._save_state(cursor)
        return cursor

    def _open(self) -> None:
        # pyarrow (through the table and the schema) loads here, in the process that writes
        from logrouter.lake.iceberg_table import IcebergLayout, check_writable, load_or_create, spec_text
        from logrouter.lake.schema import ColumnTypes

        if self.catalog is None:
            self.catalog = open_catalog(self.options["catalog"], self.properties)
            self.table = None
            if faults.armed(CATALOG_COMMIT) and hasattr(self.catalog, "engine"):
                from sqlalchemy import event  # noqa: PLC0415 - tests only

                # Fires before the database transaction commits: a kill here is a commit in flight.
                event.listen(self.catalog.engine, "commit", lambda connection: faults.hit(CATALOG_COMMIT))
        if self.table is None:
            self.table, created = load_or_create(self.catalog, self.identifier, ColumnTypes(self.options["columns"]),
                                                 self.options["partition_by"], self.options["compression"])
            check_writable(self.table)
            spec = spec_text(self.table)
            self.log.info(
                "iceberg sink {name}: {verb} table {catalog}.{table} at {location} (catalog {uri}), partitioned by {spec}",
                name=self.name, verb="created" if created else "writing into", catalog=self.options["catalog"],
                table=self.options["table"], location=self.table.location(), uri=redact(self.properties["uri"]),
                spec=", ".join(spec) or "nothing",
            )
        else:
            self.table.refresh()
        if self.writer is None:
            location = self.table.location().rstrip("/")
            fs, root = filesystem_for(location)
            types = ColumnTypes(self.options["columns"])
            self.layout = IcebergLayout(self.table, types, root, location[: len(location) - len(root)], self.log)
            self.writer = self.new_writer(root, fs, self.layout, types)
        else:
            assert self.layout is not None
            self.layout.table = self.table
            self.layout.adopt()

    def _save_state(self, cursor: int, pending: dict | None = None) -> None:
        if self.state is not None:
            self.state.save({"cursor": cursor, "spool_id": self.spool_id, "writer_id": self.writer_id, "pending": pending})

    def write(self, batch: Batch, position: int, size: int) -> None:
        self._record_open = True
        super().write(batch, position, size)

    def advance(self, end: int) -> None:
        super().advance(end)
        if self._record_open:
            self._record_open = False
            self._submit((ADVANCED,))  # carries ``end``: the record's rows may now be committed

    # -- worker thread -----------------------------------------------------------------

    def _reset_work(self) -> None:
        try:
            self._recover()
        except Exception as e:
            self._recovery_error = f"recovery failed: {e}"
            raise
        self._recovery_error = ""

    def _rows(self, batch: Batch, position: int, events: list, now: float, refused: list) -> None:
        if position >= self.skip_below:
            self.write_rows(batch.tag, events, now, position, refused)
            self.last_written = position

    def _finish_run(self, now: float, processed_end: int, stop: bool) -> None:
        assert self.writer is not None
        due = self.writer.next_due()
        # Only whole records: the last one written must be handed over to its end.
        if due is not None and (stop or due <= now) and self.last_written < processed_end:
            sealed = self.writer.seal_all()
            if sealed:
                self._commit(sealed, processed_end, now)
        elif due is None and processed_end > self._saved_cursor and (stop or now - self._saved_at >= CURSOR_SAVE_SECS):
            # Nothing open: every row before processed_end is in the table (or was refused).
            self._save_state(processed_end)
            self._saved_cursor = self.skip_below = max(self.skip_below, processed_end)
            self._saved_at = now
        if stop and self.catalog is not None:
            close_catalog(self.catalog)
            self.catalog = None

    def _commit(self, sealed: list[SealedFile], end: int, now: float) -> None:
        assert self.writer is not None and self.layout is not None
        began = self.clock()
        start = min((f.first_mark for f in sealed if f.first_mark is not None), default=end)
        self._save_state(self._saved_cursor, {"end": end, "files": [f.final_path for f in sealed],
                                              "staged": [f.staging_path for f in sealed]})
        self.writer.publish(sealed)
        faults.hit("iceberg.before-commit")
        self.table.refresh()  # other writers' commits: the append then seldom needs a retry
        data_files = self.layout.data_files(sealed)
        iceberg_commit.append(self.table, data_files, iceberg_commit.summary(self.writer_id, self.spool_id, start, end),
                              on_conflict=self._conflict)
        faults.hit("iceberg.after-commit")
        self._saved_cursor = self.skip_below = end
        self._saved_at = now
        self._save_state(end)
        took = self.clock() - began
        rows = sum(f.rows for f in sealed)
        self.commit_seconds += took
        self.commits += 1
        self.files_committed += len(sealed)
        self.rows_committed += rows
        snapshot = self.table.current_snapshot()
        self.log.info(
            "iceberg sink {name} committed {files} file(s), {rows} rows, spool {start}..{end}: snapshot {snapshot} in {took:.3f} s",
            name=self.name, files=len(sealed), rows=rows, start=start, end=end,
            snapshot=snapshot.snapshot_id if snapshot is not None else "?", took=took,
        )

    def _conflict(self, attempt: int, error: Exception) -> None:
        self.commit_conflicts += 1
        self.log.warn("iceberg sink {name}: append refused, another writer committed first ({error}); retry {attempt}",
                      name=self.name, error=error, attempt=attempt)

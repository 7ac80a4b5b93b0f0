"""Parquet files in the lake: one open file per partition, rolled, sealed, published.

Owns the life of a lake file. A file is *open* while rows are added to it (buffered,
then written as row groups into ``root/_staging/<writer_id>/``), *sealed* when it is
closed and fsync'd there (by size, by age, or on stop), and *published* when it is
renamed into its partition directory. Sealing and publishing are separate calls so
the sink's commit protocol can record the sealed files (and its spool cursor)
between them; ``publish`` is idempotent so a recovery can redo it.

Synchronous, no Twisted: the parquet sink calls it from one worker thread at a time
and owns threads and timers. Time is passed in (``now``, in seconds, any clock the
caller likes), never read here.

Readers never see staged files: pyarrow's dataset discovery and Spark skip paths
starting with ``_`` or ``.``.

Where a published file goes and what its schema is belongs to a layout: the Hive
lake's by default (``HiveLayout``); the ``iceberg`` sink hands in its table's
(``logrouter.lake.iceberg_table``), whose files carry field ids and a ``tag`` column.

Rows that arrived as forward entries may stay packed until their row group is built
(``native_table``: the native extension then builds it from the bytes).
"""

from __future__ import annotations

import posixpath
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logrouter.lake.convert import TableBuilder
from logrouter.lake.fs import LakeFileSystem, LocalFileSystem
from logrouter.lake.native_table import PendingRows, build_table, file_schema_of
from logrouter.lake.partition import hour_bucket_of, hour_dirs, partition_path, split_by_hour, tag_segment
from logrouter.lake.schema import TIME, ColumnTypes, Inferred
from logrouter.lake.table import data_columns, read_table_schema, type_name, update_table

Event = tuple[int, dict[str, Any]]

STAGING_DIR = "_staging"
DEFAULT_ROW_GROUP_ROWS = 10_000
# Parquet's writer keeps every row group's footer entry (its column chunks' metadata and
# statistics, ~4 KB with a handful of columns) until the file is closed, and copies them
# all once more into the footer then: a 128 MiB file of narrow rows in 10,000-row groups
# held ~10 MiB, ~20 MiB as it was sealed (heaptrack of a worker under the forward load).
DEFAULT_ROLL_ROW_GROUPS = 256
_WRITER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# Size estimates before a file has written a row group (then its own ratio is used).
_INITIAL_DISK_BYTES_PER_ROW = 64
_INITIAL_MEMORY_BYTES_PER_ROW = 256


@dataclass(frozen=True)
class SealedFile:
    """A closed, fsync'd file in staging, and where ``publish`` will put it."""

    staging_path: str
    final_path: str
    rows: int
    bytes: int
    tag: str
    dt: str
    hour: str
    #: The ``mark`` of the first write into the file (see ``LakeWriter.write``).
    first_mark: Any = None
    #: The ``mark`` of the last write into the file.
    last_mark: Any = None
    #: The file's Parquet footer (``pyarrow.parquet.FileMetaData``), for table formats
    #: that record column statistics; not part of a commit record.
    footer: Any = field(default=None, compare=False, repr=False)

    @property
    def hour_bucket(self) -> int:
        """The hour bucket (hours since the epoch) of the file's partition."""
        return hour_bucket_of(self.dt, self.hour)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form for commit records (``first_mark`` must be JSON-able)."""
        data = asdict(self)
        del data["footer"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SealedFile":
        return cls(**data)


@dataclass(frozen=True)
class FileShape:
    """A new file's schemas: ``rows`` is what its rows are built in (``convert.TableBuilder``),
    ``written`` what the file holds; ``finish`` turns a table of the one into the other."""

    rows: pa.Schema
    written: pa.Schema
    finish: Callable[[pa.Table], pa.Table]


# A text column is dictionary-encoded unless at least this share of the values in a
# sample of the file's first row group are distinct.
_DISTINCT_SHARE = 0.5
_SAMPLE_ROWS = 2048


def dictionary_columns(first: pa.Table) -> list[str]:
    """The columns of a file Parquet dictionary-encodes, chosen from its first row group.

    Not the event time, nearly unique per row (plain + zstd: ~10% less CPU to encode a
    flat row group, files ~20% smaller), and not a string or binary column whose values
    are mostly distinct (a message, a URL, ``_extra`` JSON): Arrow's writer only falls
    back from a dictionary past 1 MiB of it, so a row group's worth of distinct values
    was hashed, dictionary-encoded and then compressed again for nothing (measured on a
    10,000-row group: write_table 0.74-0.81x the CPU, files 24-27% smaller). Every other
    column keeps Arrow's default, a dictionary.
    """
    names = []
    for name, column in zip(first.schema.names, first.columns):
        if name == TIME:
            continue
        if pa.types.is_string(column.type) or pa.types.is_binary(column.type) or pa.types.is_large_string(column.type):
            sample = column.slice(0, _SAMPLE_ROWS)
            values = len(sample) - sample.null_count
            if values and pc.count_distinct(sample).as_py() >= _DISTINCT_SHARE * values:
                continue
        names.append(name)
    return names


def _same(table: pa.Table) -> pa.Table:
    return table


class HiveLayout:
    """The ``parquet`` sink's layout: Hive partition directories under the lake root, and
    the lake's own table schema (``table.py``) kept up to date before files are published."""

    keeps_table_schema = True

    def final_path(self, root: str, tag: str, bucket: int, name: str) -> str:
        return posixpath.join(root, partition_path(tag, bucket), name)

    def file_shape(self, tag: str, bucket: int, schema: pa.Schema) -> FileShape:
        return FileShape(schema, schema, _same)


class _OpenFile:
    """One partition's current file: rows waiting for a row group, and the writer."""

    __slots__ = (
        "tag", "bucket", "name", "staging_path", "final_path", "opened_at", "first_mark", "last_mark",
        "pending", "stream", "writer", "builder", "finish", "written", "footers", "rows_written", "bytes_written",
        "row_groups",
    )

    def __init__(self, tag: str, bucket: int, name: str, staging_path: str, final_path: str,
                 opened_at: float, first_mark: Any) -> None:
        self.tag = tag
        self.bucket = bucket
        self.name = name
        self.staging_path = staging_path
        self.final_path = final_path
        self.opened_at = opened_at
        self.first_mark = first_mark
        self.last_mark = first_mark
        self.pending = PendingRows()  # events, and forward entries still packed
        self.stream: Any = None
        self.writer: pq.ParquetWriter | None = None
        self.builder: TableBuilder | None = None
        self.finish: Callable[[pa.Table], pa.Table] = _same
        self.written: pa.Schema | None = None  # the schema its row groups are written with
        self.footers: list[Any] = []  # pyarrow appends the footer here when the file is closed
        self.rows_written = 0
        self.bytes_written = 0
        self.row_groups = 0


class LakeWriter:
    """Writes events into Hive-partitioned Parquet files under ``root``.

    ``writer_id`` names this writer's files and staging directory; routers sharing a
    lake need distinct ids, and one id must not run twice at the same time (its
    staging directory is its own). File names also carry a per-run component, so
    a restarted writer never reuses a name.

    ``roll_bytes``: a file is sealed once its written bytes plus an estimate of its
    buffered rows reach this. ``roll_secs``: ``seal_due(now)`` seals files opened at
    least this long ago. ``row_group_rows``: rows buffered per file before they are
    encoded as one row group; it bounds memory per open file, and the first row
    group fixes the file's columns (schema.py). ``roll_row_groups``: a file is sealed
    once it has this many row groups (their footer entries are held until then).

    Not thread-safe. If a call raises (disk full, …), call ``abort()`` and replay.
    """

    def __init__(
        self,
        root: str,
        writer_id: str,
        roll_bytes: int,
        roll_secs: float,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
        *,
        fs: LakeFileSystem | None = None,
        column_types: ColumnTypes | None = None,
        compression: str = "zstd",
        layout: Any = None,
        roll_row_groups: int = DEFAULT_ROLL_ROW_GROUPS,
    ) -> None:
        if not _WRITER_ID.fullmatch(writer_id):
            raise ValueError(f"writer_id must match {_WRITER_ID.pattern}: {writer_id!r}")
        if roll_bytes <= 0 or roll_secs <= 0 or row_group_rows <= 0 or roll_row_groups <= 0:
            raise ValueError("roll_bytes, roll_secs, row_group_rows and roll_row_groups must be positive")
        self.root = root.rstrip("/") or "/"
        self.writer_id = writer_id
        self.roll_bytes = roll_bytes
        self.roll_secs = roll_secs
        self.row_group_rows = row_group_rows
        self.roll_row_groups = roll_row_groups
        self.fs: LakeFileSystem = fs if fs is not None else LocalFileSystem()
        self.column_types = column_types if column_types is not None else ColumnTypes()
        self.compression = compression
        self.layout = layout if layout is not None else HiveLayout()
        self.staging_dir = posixpath.join(self.root, STAGING_DIR, writer_id)
        # Unique across restarts: start time (ms, hex, so names sort by run) + random.
        self.run_id = "%x%s" % (time.time_ns() // 1_000_000, secrets.token_hex(4))
        self._sequence = 0
        self._staging_made = False
        self._files: dict[tuple[str, int], _OpenFile] = {}
        self._ready: list[SealedFile] = []
        self._disk_bytes_per_row = float(_INITIAL_DISK_BYTES_PER_ROW)
        self._memory_bytes_per_row = float(_INITIAL_MEMORY_BYTES_PER_ROW)
        self._table_columns = -1  # how many columns the lake's table has from us (table.py)
        self._orphans: list[str] = []  # staged files abort() could not delete (retried)

    # -- introspection (metrics) ------------------------------------------------------

    @property
    def open_files(self) -> int:
        return len(self._files)

    @property
    def buffered_rows(self) -> int:
        # list() copies in one step, so /metrics may read this while the worker writes.
        return sum(len(f.pending) for f in list(self._files.values()))

    @property
    def buffered_bytes(self) -> int:
        """Estimated memory of rows not yet encoded (Arrow size of recent row groups)."""
        return int(self.buffered_rows * self._memory_bytes_per_row)

    def next_due(self) -> float | None:
        """When ``seal_due`` next has work: the earliest ``now`` at which a file is
        due, ``-inf`` if size-rolled files are waiting, None if nothing is open."""
        if self._ready:
            return float("-inf")
        if not self._files:
            return None
        return min(f.opened_at for f in self._files.values()) + self.roll_secs

    def oldest_open_mark(self) -> Any:
        """The smallest ``first_mark`` among files not yet handed out by ``seal_*``.

        A sink's spool cursor may not move past it: events from there on are not in
        any sealed file yet.
        """
        marks = [f.first_mark for f in self._files.values() if f.first_mark is not None]
        marks.extend(s.first_mark for s in self._ready if s.first_mark is not None)
        return min(marks, default=None)

    # -- writing ------------------------------------------------------------------------

    def write(
        self,
        tag: str,
        events: Sequence[Event],
        now: float,
        mark: Any = None,
        published: Mapping[tuple[str, int], Any] | None = None,
    ) -> None:
        """Add events (any hours) of one tag.

        Files that reach ``roll_bytes`` are sealed here and handed out by the next
        ``seal_due``/``seal_all``. ``mark`` is an optional comparable token (e.g. the
        spool offset of the batch) remembered as ``first_mark`` by files it opens.
        Raises ``partition.PartitionError`` before buffering anything if the tag
        cannot name a directory.

        ``published`` maps a partition ``(tag, hour bucket)`` to the last mark already
        in a published file of it: rows of this write for such a partition are skipped
        when ``mark`` is not past it. A replay after a crash uses this so that no row
        lands twice.
        """
        if not events:
            return
        tag_segment(tag)
        for bucket, group in split_by_hour(events):
            if published:
                done = published.get((tag, bucket))
                if done is not None and mark is not None and mark <= done:
                    continue
            self._append(tag, bucket, group, now, mark)

    def _append(self, tag: str, bucket: int, events: Sequence[Event], now: float, mark: Any) -> None:
        key = (tag, bucket)
        file = self._files.get(key)
        # A full file rolls where a spool record ends, before a write of another mark: the
        # parquet sink commits a sealed file's last mark as published for its partition
        # and a replay skips those marks' rows, so a record split between a sealed file
        # and the next one (one big write, or a record reaching the sink as several
        # batches when routes join) would lose the next one's share in a crash.
        if file is not None and (mark is None or mark != file.last_mark) and self._full(file):
            self._seal(key)
        position = 0
        total = len(events)
        while position < total:
            file = self._files.get(key)
            if file is None:
                file = self._files[key] = self._new_file(tag, bucket, now, mark)
            file.last_mark = mark
            room = self.row_group_rows - len(file.pending)
            if position == 0 and total <= room:
                file.pending.extend(events)  # the usual case: no slicing
                position = total
            else:
                file.pending.extend(events[position : position + room])
                position += room
            if len(file.pending) >= self.row_group_rows:
                self._write_row_group(file)

    def _full(self, file: _OpenFile) -> bool:
        return self._estimated_size(file) >= self.roll_bytes or file.row_groups >= self.roll_row_groups

    def flush(self) -> None:
        """Encode every open file's buffered rows as a row group (bounds memory)."""
        for file in self._files.values():
            self._write_row_group(file)

    def _new_file(self, tag: str, bucket: int, now: float, mark: Any) -> _OpenFile:
        self._sequence += 1
        name = f"part-{self.writer_id}-{self.run_id}-{self._sequence:06d}.parquet"
        return _OpenFile(
            tag,
            bucket,
            name,
            posixpath.join(self.staging_dir, name),
            self.layout.final_path(self.root, tag, bucket, name),
            now,
            mark,
        )

    def _write_row_group(self, file: _OpenFile) -> None:
        if not file.pending:
            return
        inferred = self._start(file) if file.builder is None else None
        table = file.finish(build_table(file.builder, file.pending, inferred))  # type: ignore[arg-type, union-attr]
        if file.writer is None:
            self._open(file, table)
        file.writer.write_table(table)  # type: ignore[union-attr]
        file.rows_written += len(file.pending)
        file.row_groups += 1
        file.pending = PendingRows()
        file.bytes_written = file.stream.tell()
        self._disk_bytes_per_row = file.bytes_written / file.rows_written
        self._memory_bytes_per_row = table.nbytes / max(table.num_rows, 1)

    def _start(self, file: _OpenFile) -> Inferred:
        """The file's schema, from its first row group's rows."""
        inferred: Inferred = {}
        schema = file_schema_of(self.column_types, file.pending, inferred)
        shape = self.layout.file_shape(file.tag, file.bucket, schema)
        file.builder = TableBuilder(shape.rows, self.column_types)
        file.finish = shape.finish
        file.written = shape.written
        return inferred

    def _open(self, file: _OpenFile, first: pa.Table) -> None:
        """Open the staged file for its first row group, ``first``."""
        if not self._staging_made:
            self.fs.makedirs(self.staging_dir)
            self._staging_made = True
        file.stream = self.fs.open_write(file.staging_path)
        try:
            file.writer = pq.ParquetWriter(file.stream, file.written, compression=self.compression,
                                           use_dictionary=dictionary_columns(first), metadata_collector=file.footers)
        except BaseException:
            file.stream.close()
            file.stream = None
            raise

    def _estimated_size(self, file: _OpenFile) -> float:
        if file.rows_written:
            per_row = file.bytes_written / file.rows_written
        else:
            per_row = self._disk_bytes_per_row
        return file.bytes_written + len(file.pending) * per_row

    # -- sealing ------------------------------------------------------------------------

    def seal_due(self, now: float, complete_before: Any = None) -> list[SealedFile]:
        """Seal files opened ``roll_secs`` or more before ``now``, or full; return them and
        the files rolled since the last call. With ``complete_before`` (the end of the
        records handed over whole), a file whose last mark is not before it stays open:
        the rest of that record may still come (see ``_append``)."""
        for key, f in list(self._files.items()):
            if complete_before is not None and f.last_mark is not None and f.last_mark >= complete_before:
                continue
            if now - f.opened_at >= self.roll_secs or self._full(f):
                self._seal(key)
        return self._hand_out()

    def seal_all(self) -> list[SealedFile]:
        """Seal every open file (graceful stop, or before moving a cursor)."""
        for key in list(self._files):
            self._seal(key)
        return self._hand_out()

    def _seal(self, key: tuple[str, int]) -> None:
        file = self._files[key]
        self._write_row_group(file)
        file.writer.close()  # type: ignore[union-attr]  # writes the footer
        size = file.stream.tell()
        self.fs.sync_close(file.stream)
        del self._files[key]
        dt, hour = hour_dirs(file.bucket)
        self._ready.append(
            SealedFile(file.staging_path, file.final_path, file.rows_written, size,
                       file.tag, dt, hour, file.first_mark, file.last_mark, file.footers[0] if file.footers else None)
        )

    def _hand_out(self) -> list[SealedFile]:
        sealed, self._ready = self._ready, []
        if sealed:
            # The staged names must survive a crash once a commit record lists them.
            self.fs.sync_dir(self.staging_dir)
        return sealed

    # -- the lake's table schema (table.py) --------------------------------------------

    def adopt_table(self) -> int:
        """Take the types of the lake's table for fields this writer has not typed yet
        (so routers sharing a lake agree on types); the number of columns adopted."""
        schema = read_table_schema(self.fs, self.root)
        if schema is None:
            return 0
        before = len(self.column_types)
        self.column_types.restore([name, type_name(t)] for name, t in data_columns(schema))
        return len(self.column_types) - before

    def update_table(self) -> None:
        """Add this writer's columns to the lake's table if it has new ones since the last
        call (``publish`` calls it first, so no file has a column the table lacks)."""
        count = len(self.column_types)
        if count != self._table_columns:
            update_table(self.fs, self.root, self.column_types.items(), self.writer_id)
            self._table_columns = count

    # -- publishing and cleanup ---------------------------------------------------------

    def publish(self, sealed: Sequence[SealedFile], missing_ok: bool = False) -> None:
        """Rename sealed files into their partitions (atomic each) and fsync the
        partition directories.

        Idempotent, for redoing a commit after a crash: a file already at its final
        path and gone from staging is skipped. Raises FileNotFoundError if a file is
        in neither place, unless ``missing_ok`` (a redo after compaction may find a
        published file already rewritten into another).
        """
        if sealed and self.layout.keeps_table_schema:
            self.update_table()
        directories: dict[str, None] = {}
        for file in sealed:
            directory = posixpath.dirname(file.final_path)
            if directory not in directories:
                self.fs.makedirs(directory)
                directories[directory] = None
            if self.fs.exists(file.staging_path):
                self.fs.replace(file.staging_path, file.final_path)
            elif not missing_ok and not self.fs.exists(file.final_path):
                raise FileNotFoundError(f"sealed file lost: neither {file.staging_path} nor {file.final_path}")
        for directory in directories:
            self.fs.sync_dir(directory)

    def discard_staging(self) -> list[str]:
        """Delete this writer's staged files: uncommitted work of a previous run.

        Call at startup *after* redoing committed publishes, before writing.
        """
        if self._files or self._ready:
            raise RuntimeError("discard_staging() with files open or sealed: call it before writing")
        removed = []
        for name in self.fs.list_files(self.staging_dir):
            path = posixpath.join(self.staging_dir, name)
            self.fs.remove(path)
            removed.append(path)
        if removed:
            self.fs.sync_dir(self.staging_dir)
        return removed

    def abort(self) -> None:
        """Drop open files and sealed files not yet handed out, deleting their staged
        data; the caller replays those events (e.g. from its spool)."""
        files, ready = list(self._files.values()), list(self._ready)
        self._files.clear()
        self._ready.clear()
        self._staging_made = False  # whatever broke may have taken the directory with it
        doomed = list(self._orphans)
        for file in files:
            if file.stream is not None:
                for close in (file.writer.close, file.stream.close):  # type: ignore[union-attr]
                    try:
                        close()
                    except Exception:  # noqa: BLE001 - the file is being thrown away (and the
                        pass  # filesystem may be what failed: an HDFS NameNode down)
                doomed.append(file.staging_path)
        doomed.extend(sealed.staging_path for sealed in ready)
        self._orphans = []
        for path in doomed:
            try:
                if self.fs.exists(path):
                    self.fs.remove(path)
            except Exception:  # noqa: BLE001 - retried by the next abort; discard_staging at start
                if len(self._orphans) < 10_000:
                    self._orphans.append(path)

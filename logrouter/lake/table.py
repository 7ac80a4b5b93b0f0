"""The lake's table schema: one schema for the whole lake, kept in the lake, additive only.

Owns two things at the lake root, both kept up to date by every writer (before it
publishes files with a new column) and by compaction:

* ``_schema/<writer_id>.json``: the columns (name, type) each writer has given a typed
  column so far;
* ``_common_metadata``: a zero-row Parquet file (the Parquet "summary file"
  convention) whose schema is the lake's table: ``time``, every data column, ``_extra``
  and the partition columns ``tag`` (string), ``dt`` (string), ``hour`` (int32). Spark
  reads its schema instead of the first file's (``mergeSchema`` not needed), and pyarrow
  reads the whole lake with it in one line::

      ds.dataset(root, partitioning="hive", schema=pq.read_schema(root + "/_common_metadata"))

The table only grows: a column, once in it, keeps its type forever. New columns are
added in a deterministic order: the columns already in the table first, then each
writer file's columns in writer-id order. A name that differs only in case from a
column already there, or a type that differs from the table's, is not added (Spark
resolves names case-insensitively; the values stay readable in the files and, for a
writer that starts after the column is in the table, go to ``_extra``: writers adopt
the table's types when they start).

Several routers may update the table at once: each writes its own file, then merges
every writer file into ``_common_metadata`` (a temporary file renamed over it) and
reads the writer files again; if one appeared meanwhile it merges again, so the last
writer to finish always leaves a table holding every writer's columns.

Synchronous, through the filesystem seam (``logrouter.lake.fs``); no Twisted.
"""

from __future__ import annotations

import io
import json
import posixpath
import secrets
from typing import Any, Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from logrouter.lake.partition import PARTITION_COLUMNS
from logrouter.lake.schema import EXTRA, TIME, TIME_TYPE, TYPE_NAMES

SCHEMA_DIR = "_schema"
COMMON_METADATA = "_common_metadata"

#: How readers type the partition columns (also dataset.PARTITION_SCHEMA).
PARTITION_FIELDS = (pa.field("tag", pa.string()), pa.field("dt", pa.string()), pa.field("hour", pa.int32()))
assert tuple(f.name for f in PARTITION_FIELDS) == PARTITION_COLUMNS

_MERGE_ROUNDS = 20  # bounded: each round means another writer published meanwhile

Columns = list[tuple[str, pa.DataType]]


def type_name(column_type: pa.DataType) -> str:
    """The lake's name of a column type (``int64``, ``double``, …), as config files use."""
    for name, known in TYPE_NAMES.items():
        if known == column_type and name in ("bool", "int64", "double", "string", "binary"):
            return name
    return str(column_type)


def table_schema(columns: Iterable[tuple[str, pa.DataType]]) -> pa.Schema:
    """``time``, the data columns, ``_extra``, then the partition columns."""
    return pa.schema([pa.field(TIME, TIME_TYPE), *(pa.field(n, t) for n, t in columns), pa.field(EXTRA, pa.string()),
                      *PARTITION_FIELDS])


def data_columns(schema: pa.Schema) -> Columns:
    """The data columns of a table schema (without time, _extra and the partition columns)."""
    skip = {TIME, EXTRA, *PARTITION_COLUMNS}
    return [(f.name, f.type) for f in schema if f.name not in skip]


def read_table_schema(fs: Any, root: str) -> pa.Schema | None:
    """The lake's table schema, or None if the lake has no ``_common_metadata`` yet."""
    try:
        data = fs.read_bytes(posixpath.join(root, COMMON_METADATA))
    except FileNotFoundError:
        return None
    return pq.read_schema(io.BytesIO(data))


def merge_columns(base: Sequence[tuple[str, pa.DataType]], *more: Iterable[tuple[str, pa.DataType]]) -> Columns:
    """``base`` plus the columns of ``more`` whose names (ignoring case) are new, in order."""
    merged = list(base)
    folded = {name.casefold() for name, _ in merged}
    for columns in more:
        for name, column_type in columns:
            if name.casefold() not in folded and name not in (TIME, EXTRA) and name.casefold() not in PARTITION_COLUMNS:
                merged.append((name, column_type))
                folded.add(name.casefold())
    return merged


def _write_atomically(fs: Any, path: str, data: bytes) -> None:
    directory = posixpath.dirname(path)
    temporary = posixpath.join(directory, f".{posixpath.basename(path)}.{secrets.token_hex(6)}.tmp")
    stream = fs.open_write(temporary)
    try:
        stream.write(data)
    except BaseException:
        stream.close()
        fs.remove(temporary)
        raise
    fs.sync_close(stream)
    fs.replace(temporary, path)
    fs.sync_dir(directory)


def _encode_columns(columns: Iterable[tuple[str, pa.DataType]]) -> bytes:
    return json.dumps({"version": 1, "columns": [[n, type_name(t)] for n, t in columns]}, indent=1).encode()


def _decode_columns(data: bytes) -> Columns:
    try:
        body = json.loads(data)
        items = body["columns"]
    except (ValueError, KeyError, TypeError):
        return []  # a damaged file adds nothing; its writer rewrites it on its next publish
    columns = []
    for item in items:
        if isinstance(item, list) and len(item) == 2 and item[1] in TYPE_NAMES and isinstance(item[0], str):
            columns.append((item[0], TYPE_NAMES[item[1]]))
    return columns


def writer_columns(fs: Any, root: str) -> Columns:
    """Every writer file's columns merged, in writer-id order."""
    directory = posixpath.join(root, SCHEMA_DIR)
    merged: Columns = []
    for name in fs.list_files(directory):
        if name.endswith(".json") and not name.startswith("."):
            try:
                merged = merge_columns(merged, _decode_columns(fs.read_bytes(posixpath.join(directory, name))))
            except FileNotFoundError:
                continue
    return merged


def _write_common(fs: Any, root: str, columns: Columns) -> None:
    sink = io.BytesIO()
    pq.write_metadata(table_schema(columns), sink)
    _write_atomically(fs, posixpath.join(root, COMMON_METADATA), sink.getvalue())


def update_table(fs: Any, root: str, columns: Iterable[tuple[str, pa.DataType]], writer_id: str | None = None) -> pa.Schema:
    """Add ``columns`` to the lake's table (additively) and return the table schema.

    With ``writer_id`` the columns are also recorded in that writer's own file (what
    makes concurrent updates safe); without it (compaction, tools) they are merged
    straight into ``_common_metadata``.
    """
    columns = list(columns)
    fs.makedirs(root)
    if writer_id is not None:
        fs.makedirs(posixpath.join(root, SCHEMA_DIR))
        _write_atomically(fs, posixpath.join(root, SCHEMA_DIR, f"{writer_id}.json"), _encode_columns(columns))
    current = read_table_schema(fs, root)
    have = data_columns(current) if current is not None else []
    for _ in range(_MERGE_ROUNDS):
        wanted = merge_columns(have, columns, writer_columns(fs, root))
        if wanted == have and current is not None:
            return current
        _write_common(fs, root, wanted)
        # Another writer may have replaced the file between our read and our write with
        # columns we did not see: read back and merge again until nothing is missing.
        current = read_table_schema(fs, root)
        have = data_columns(current) if current is not None else []
        columns = wanted
    return current if current is not None else table_schema(have)


def rebuild_table(fs: Any, root: str, footers: Iterable[pa.Schema]) -> pa.Schema:
    """Add the columns of existing files (their footer schemas) to the table: for lakes
    written before the table schema existed."""
    columns: Columns = []
    for schema in footers:
        columns = merge_columns(columns, [(f.name, f.type) for f in schema if f.name not in (TIME, EXTRA)])
    return update_table(fs, root, columns)

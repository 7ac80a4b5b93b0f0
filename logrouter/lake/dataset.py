"""Reading a lake back with pyarrow: for tests, row-count audits and tools.

Owns the reader's view of the layout: the partition columns with fixed types (so a
tag that looks like a number stays a string) and one schema for all files: the lake's
table schema (``_common_metadata``, kept by the writers: table.py), or, for a lake
without one, the schemas of every file's footer unified.
Plain ``pyarrow.dataset.dataset(root, partitioning="hive")`` takes its schema from
the first file only and infers partition types from the values; both are wrong for
a lake whose files gain columns over time. The one-line fix without logrouter::

    ds.dataset(root, partitioning="hive", schema=pq.read_schema(root + "/_common_metadata"))
 Staged files (``_staging``) are skipped
by pyarrow's default ``ignore_prefixes`` (``.`` and ``_``).
"""

from __future__ import annotations

import io
import posixpath

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from logrouter.lake.table import COMMON_METADATA

#: How readers should type the partition columns (Spark infers ``dt`` as a date).
PARTITION_SCHEMA = pa.schema([("tag", pa.string()), ("dt", pa.string()), ("hour", pa.int32())])


def lake_partitioning() -> ds.Partitioning:
    """Hive partitioning with fixed types and ``%XX`` decoding of values."""
    return ds.partitioning(PARTITION_SCHEMA, flavor="hive")


def arrow_filesystem(url: str) -> tuple[pa.fs.FileSystem | None, str]:
    """A pyarrow filesystem and path for a lake URL: ``(None, path)`` for local paths and
    ``file://``; for ``hdfs://nn:port/path`` hdfs-native's fsspec filesystem wrapped for
    pyarrow (pyarrow's own ``HadoopFileSystem`` needs libhdfs and a JVM)."""
    if url.startswith("file://"):
        return None, url[len("file://") :] or "/"
    if url.startswith(("hdfs://", "viewfs://")):
        from pyarrow.fs import FSSpecHandler, PyFileSystem  # noqa: PLC0415

        import hdfs_native.fsspec  # noqa: PLC0415 - optional dependency

        scheme, rest = url.split("://", 1)
        authority, _, path = rest.partition("/")
        host, _, port = authority.partition(":")
        cls = hdfs_native.fsspec.HdfsFileSystem if scheme == "hdfs" else hdfs_native.fsspec.ViewfsFileSystem
        return PyFileSystem(FSSpecHandler(cls(host=host or None, port=int(port) if port else None))), "/" + path
    return None, url


def lake_dataset(root: str, filesystem: pa.fs.FileSystem | None = None) -> ds.Dataset:
    """The whole lake under ``root`` (a path, ``file://`` or ``hdfs://`` URL) as one
    dataset, schema unified over every file.

    With the lake's ``_common_metadata`` this reads one small file; without it, every
    file's footer, and raises ``pyarrow.ArrowTypeError``/``ArrowInvalid`` if
    two files disagree on a column's type (possible across writers or restarts unless
    the column is declared).
    """
    if filesystem is None:
        filesystem, root = arrow_filesystem(root)
    table = _table_schema(root, filesystem)
    if table is not None:
        return ds.dataset(root, schema=table, format="parquet", partitioning=lake_partitioning(), filesystem=filesystem)
    first = ds.dataset(root, format="parquet", partitioning=lake_partitioning(), filesystem=filesystem)
    schemas = [fragment.physical_schema for fragment in first.get_fragments()]
    if not schemas:
        return first
    schema = pa.unify_schemas([*schemas, PARTITION_SCHEMA])
    return ds.dataset(root, schema=schema, format="parquet", partitioning=lake_partitioning(), filesystem=filesystem)


def _table_schema(root: str, filesystem: pa.fs.FileSystem | None) -> pa.Schema | None:
    path = posixpath.join(root, COMMON_METADATA)
    try:
        if filesystem is None:
            return pq.read_schema(path)
        with filesystem.open_input_file(path) as f:
            return pq.read_schema(io.BytesIO(f.read()))
    except FileNotFoundError:
        return None

"""``logrouter lake import``: a parquet sink's lake registered in an Iceberg table, in place.

Owns moving an existing Hive-partitioned lake (``tag=…/dt=…/hour=…/*.parquet`` plus
``_common_metadata``, see ``logrouter.lake.table``) into Iceberg without rewriting a
byte: each data file is added to the table's metadata where it lies (as pyiceberg's
``add_files`` does), with its column statistics from its footer.

- The table: ``time`` (timestamptz), ``tag``, the lake's typed columns, ``_extra``;
  partitioned like the Iceberg sink's tables, ``day(time)`` (or ``hour(time)``) and
  ``identity(tag)``. The files hold no ``tag`` column: it is an identity partition,
  so readers take its value from each file's partition data, which comes from the
  file's directory. ``day(time)`` comes from the file's ``time`` statistics. The
  ``dt``/``hour`` directory columns are not carried over: filter on ``time``.
- Files carry no Iceberg field ids: the table gets a name mapping
  (``schema.name-mapping.default``) so readers match columns by name.
- Idempotent: a file whose path the table references in any snapshot it still has is
  not added again, so a second run adds nothing (and no snapshot), and a run after the
  lake grew adds only the new files.
- A file that cannot be added as it is is skipped and reported, never half-added: a
  column whose type differs from the table's (the parquet sink keeps such values in the
  file; Iceberg would not read them), a name only the file has, or rows of more than
  one day (hour).

Once imported, the files belong to the table: Iceberg compaction rewrites them and
``expire_snapshots`` then deletes the originals from the lake directory. Stop the
parquet sink's own compaction on that lake first (it would swap files under the table).
"""

from __future__ import annotations

import datetime
import posixpath
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from logrouter.lake.fs import filesystem_for
from logrouter.lake.partition import unescape_value
from logrouter.lake.schema import EXTRA, TIME
from logrouter.lake.table import data_columns, read_table_schema

US_PER_HOUR = 3_600 * 10**6
US_PER_DAY = 24 * US_PER_HOUR
GRANULARITIES = ("day", "hour")
SOURCE_PROPERTY = "logrouter.import-source"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


@dataclass
class ImportReport:
    table: str
    added: list[str] = field(default_factory=list)
    already: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    snapshot_id: int | None = None


@dataclass(frozen=True)
class LakeFile:
    uri: str  # as the table records it
    path: str  # in the lake filesystem
    tag: str | None
    size: int


def _iceberg_type(column_type: pa.DataType) -> Any:
    from pyiceberg import types as t  # noqa: PLC0415

    if pa.types.is_timestamp(column_type):
        return t.TimestamptzType() if column_type.tz else t.TimestampType()
    known = {pa.bool_(): t.BooleanType(), pa.int32(): t.IntegerType(), pa.int64(): t.LongType(),
             pa.float32(): t.FloatType(), pa.float64(): t.DoubleType(), pa.string(): t.StringType(),
             pa.large_string(): t.StringType(), pa.binary(): t.BinaryType()}
    if column_type not in known:
        raise ValueError(f"no Iceberg type for the lake's column type {column_type}")
    return known[column_type]


def table_schema(lake_schema: pa.Schema) -> Any:
    """The Iceberg schema of a lake: time, tag, the typed columns, _extra (all optional)."""
    from pyiceberg.schema import Schema  # noqa: PLC0415
    from pyiceberg.types import NestedField, StringType, TimestamptzType  # noqa: PLC0415

    fields = [NestedField(1, TIME, TimestamptzType(), required=False), NestedField(2, "tag", StringType(), required=False)]
    for name, column_type in data_columns(lake_schema):
        fields.append(NestedField(len(fields) + 1, name, _iceberg_type(column_type), required=False))
    fields.append(NestedField(len(fields) + 1, EXTRA, StringType(), required=False))
    return Schema(*fields)


def partition_spec(schema: Any, granularity: str) -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec  # noqa: PLC0415
    from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform  # noqa: PLC0415

    time_id, tag_id = schema.find_field(TIME).field_id, schema.find_field("tag").field_id
    transform = DayTransform() if granularity == "day" else HourTransform()
    return PartitionSpec(
        PartitionField(source_id=time_id, field_id=1000, transform=transform, name=f"{TIME}_{granularity}"),
        PartitionField(source_id=tag_id, field_id=1001, transform=IdentityTransform(), name="tag"),
    )


def lake_files(fs: Any, root: str, base: str) -> Iterator[LakeFile]:
    """Every data file of the lake, in key order (``base`` + path is its URI)."""
    for tag_dir in fs.list_entries(root):
        if not (tag_dir.is_dir and tag_dir.name.startswith("tag=")):
            continue
        tag = unescape_value(tag_dir.name[len("tag="):])
        tag_path = posixpath.join(root, tag_dir.name)
        for dt in (e for e in fs.list_entries(tag_path) if e.is_dir and e.name.startswith("dt=")):
            for hour in (e for e in fs.list_entries(posixpath.join(tag_path, dt.name)) if e.is_dir and e.name.startswith("hour=")):
                directory = posixpath.join(tag_path, dt.name, hour.name)
                for entry in fs.list_entries(directory):
                    if not entry.is_dir and entry.name.endswith(".parquet") and not entry.name.startswith(("_", ".")):
                        path = posixpath.join(directory, entry.name)
                        yield LakeFile(base + path, path, tag, entry.size)


def _plain(column_type: pa.DataType) -> pa.DataType:
    """Large and plain strings (binaries) are the same Iceberg type."""
    if pa.types.is_large_string(column_type):
        return pa.string()
    if pa.types.is_large_binary(column_type):
        return pa.binary()
    return column_type


def _micros(value: Any) -> int:
    """A timestamp statistic (a datetime, or an integer in microseconds) as microseconds."""
    if isinstance(value, datetime.datetime):
        epoch = EPOCH if value.tzinfo is not None else EPOCH.replace(tzinfo=None)
        return (value - epoch) // datetime.timedelta(microseconds=1)
    return int(value)


def _incompatibility(file_schema: pa.Schema, schema: Any) -> str | None:
    """Why the file's columns cannot be read as the table's, or None."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow  # noqa: PLC0415

    wanted = {f.name: _plain(f.type) for f in schema_to_pyarrow(schema)}
    widening = {(pa.int32(), pa.int64()), (pa.float32(), pa.float64())}
    for column in file_schema:
        if column.name not in wanted:
            return f"column {column.name!r} is not in the table (its values would be unreadable)"
        have, want = _plain(column.type), wanted[column.name]
        if pa.types.is_timestamp(have) and pa.types.is_timestamp(want):
            if have.unit != "us" or bool(have.tz) != bool(want.tz):
                return f"column {column.name!r} is {have}, the table's is {want}"
        elif have != want and (have, want) not in widening:
            return f"column {column.name!r} is {have}, the table's is {want}"
    return None


def _time_bucket(metadata: Any, granularity: str) -> int | None:
    """The one day (hour) since the epoch all the file's rows fall in, or None."""
    unit = US_PER_DAY if granularity == "day" else US_PER_HOUR
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    if TIME not in names:
        return None
    index = names.index(TIME)
    buckets = set()
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max:
            return None
        for value in (stats.min, stats.max):
            buckets.add(_micros(value) // unit)
    return buckets.pop() if len(buckets) == 1 else None


def data_file(lake_file: LakeFile, metadata: Any, table_metadata: Any, granularity: str) -> Any:
    """A pyiceberg ``DataFile`` for a lake file, or a string saying why there is none."""
    from pyiceberg.io.pyarrow import (  # noqa: PLC0415
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat  # noqa: PLC0415
    from pyiceberg.typedef import Record  # noqa: PLC0415

    schema = table_metadata.schema()
    why = _incompatibility(metadata.schema.to_arrow_schema(), schema)
    if why:
        return why
    bucket = _time_bucket(metadata, granularity)
    if bucket is None:
        return f"its rows do not all fall in one {granularity} (or it has no time statistics)"
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(schema, table_metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=lake_file.uri, file_format=FileFormat.PARQUET,
        partition=Record(bucket, lake_file.tag), file_size_in_bytes=lake_file.size, sort_order_id=None,
        spec_id=table_metadata.default_spec_id, equality_ids=None, key_metadata=None, **statistics.to_serialized_dict(),
    )


def _open_or_create(catalog: Any, identifier: str, lake_schema: pa.Schema, granularity: str, source: str) -> Any:
    from pyiceberg.exceptions import NoSuchTableError  # noqa: PLC0415

    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    catalog.create_namespace_if_not_exists(identifier.rsplit(".", 1)[0])
    schema = table_schema(lake_schema)
    return catalog.create_table_if_not_exists(
        identifier, schema=schema, partition_spec=partition_spec(schema, granularity),
        properties={"format-version": "2", "schema.name-mapping.default": schema.name_mapping.model_dump_json(),
                    SOURCE_PROPERTY: source},
    )


def import_lake(lake_url: str, catalog: Any, identifier: str, granularity: str = "day") -> ImportReport:
    """Register the lake's files not yet in the table ``identifier`` (created if missing)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"partition granularity must be one of {GRANULARITIES}, got {granularity!r}")
    fs, root = filesystem_for(lake_url)
    if lake_url.startswith("hdfs://"):
        base = "hdfs://" + lake_url[len("hdfs://"):].split("/", 1)[0]
    else:
        root = posixpath.abspath(root)
        base = "file://"
    lake_schema = read_table_schema(fs, root)
    if lake_schema is None:
        raise ValueError(f"{lake_url}: no table schema ({root}/_common_metadata): run `logrouter lake ddl --rebuild` first")
    table = _open_or_create(catalog, identifier, lake_schema, granularity, lake_url)
    location = table.location().rstrip("/") + "/"
    if (base + root + "/").startswith(location) or location.startswith(base + root + "/"):
        raise ValueError(f"the table's location {location} and the lake {lake_url} overlap: remove_orphan_files would "
                         "delete lake files not yet imported; give the table another warehouse")
    report = ImportReport(identifier)
    known = set(table.inspect.all_data_files().column("file_path").to_pylist()) if table.current_snapshot() else set()
    new_files = []
    for lake_file in lake_files(fs, root, base):
        if lake_file.uri in known:
            report.already += 1
            continue
        with fs.open_read(lake_file.path) as stream:
            metadata = pq.read_metadata(stream)
        made = data_file(lake_file, metadata, table.metadata, granularity)
        if isinstance(made, str):
            report.skipped.append((lake_file.uri, made))
        else:
            new_files.append(made)
    if new_files:
        with table.transaction() as transaction:
            properties = {SOURCE_PROPERTY: lake_url, "logrouter.import-files": str(len(new_files))}
            with transaction.update_snapshot(snapshot_properties=properties).fast_append() as append:
                for made in new_files:
                    append.append_data_file(made)
        report.added = [f.file_path for f in new_files]
        report.snapshot_id = table.current_snapshot().snapshot_id
    return report

"""``logrouter lake ddl``: the lake's table definition for Spark SQL, Hive and Trino.

Owns turning the lake's table schema (``_common_metadata``, table.py) into, per dialect:

- ``spark``: a Spark data source table, ``CREATE TABLE … USING parquet PARTITIONED BY
  (tag, dt, hour) LOCATION …``, which any Spark session takes, with or without Hive
  support (Spark refuses Hive-format DDL without it);
- ``hive``: a Hive table, ``CREATE EXTERNAL TABLE … PARTITIONED BY (…) STORED AS PARQUET
  LOCATION …`` (Hive itself, or Spark with Hive support);
- ``trino``: a Trino Hive-connector ``CREATE TABLE … WITH (external_location …)``;

each followed by the statement that registers the partitions already in the lake.
``--rebuild`` first adds the columns of every file's footer to the table (for lakes
written before the table schema existed).
"""

from __future__ import annotations

import os
import posixpath
import sys
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from logrouter.lake.fs import filesystem_for
from logrouter.lake.partition import PARTITION_COLUMNS
from logrouter.lake.table import data_columns, read_table_schema, rebuild_table

DIALECTS = ("spark", "hive", "trino")

_SPARK_TYPES = {
    pa.bool_(): "BOOLEAN",
    pa.int64(): "BIGINT",
    pa.int32(): "INT",
    pa.float64(): "DOUBLE",
    pa.string(): "STRING",
    pa.binary(): "BINARY",
}
_TRINO_TYPES = {
    pa.bool_(): "boolean",
    pa.int64(): "bigint",
    pa.int32(): "integer",
    pa.float64(): "double",
    pa.string(): "varchar",
    pa.binary(): "varbinary",
}


def _spark_type(column_type: pa.DataType) -> str:
    if pa.types.is_timestamp(column_type):
        return "TIMESTAMP"
    return _SPARK_TYPES.get(column_type, "STRING")


def _trino_type(column_type: pa.DataType) -> str:
    if pa.types.is_timestamp(column_type):
        return "timestamp(6)"
    return _TRINO_TYPES.get(column_type, "varchar")


def _backquoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _double_quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def location_of(url: str) -> str:
    """A URL every engine understands: ``hdfs://…`` as given, local paths as ``file:///…``."""
    if "://" in url and not url.startswith("file://"):
        return url.rstrip("/")
    path = url[len("file://") :] if url.startswith("file://") else url
    return "file://" + os.path.abspath(path)


def create_table(schema: pa.Schema, location: str, table: str = "logs", dialect: str = "spark") -> str:
    """The DDL of a lake table with ``schema`` (a table schema, table.py) at ``location``."""
    partition = {f.name: f.type for f in schema if f.name in PARTITION_COLUMNS}
    data = [f for f in schema if f.name not in PARTITION_COLUMNS]
    if dialect == "trino":
        columns = [f"  {_double_quoted(f.name.lower())} {_trino_type(f.type)}" for f in data]
        columns += [f"  {_double_quoted(name)} {_trino_type(partition.get(name, pa.string()))}" for name in PARTITION_COLUMNS]
        keys = ", ".join(f"'{name}'" for name in PARTITION_COLUMNS)
        return (
            f"CREATE TABLE IF NOT EXISTS {table} (\n" + ",\n".join(columns) + "\n)\n"
            f"WITH (\n  format = 'PARQUET',\n  partitioned_by = ARRAY[{keys}],\n"
            f"  external_location = {_string(location)}\n);\n"
            f"CALL system.sync_partition_metadata(schema_name => CURRENT_SCHEMA, table_name => {_string(table)}, mode => 'ADD');\n"
        )
    if dialect not in ("spark", "hive"):
        raise ValueError(f"unknown dialect {dialect!r} (one of: {', '.join(DIALECTS)})")
    columns = [f"  {_backquoted(f.name)} {_spark_type(f.type)}" for f in data]
    typed_keys = [f"{_backquoted(name)} {_spark_type(partition.get(name, pa.string()))}" for name in PARTITION_COLUMNS]
    # The partitions already in the lake are not in the catalog until this runs (Spark
    # tracks a data source table's partitions in its catalog too).
    repair = f"MSCK REPAIR TABLE {table};\n"
    if dialect == "hive":
        return (
            f"CREATE EXTERNAL TABLE IF NOT EXISTS {table} (\n" + ",\n".join(columns) + "\n)\n"
            f"PARTITIONED BY ({', '.join(typed_keys)})\nSTORED AS PARQUET\nLOCATION {_string(location)};\n" + repair
        )
    # A data source table declares its partition columns with the others and names them
    # in PARTITIONED BY; with a LOCATION it is external (DROP TABLE leaves the lake).
    columns += [f"  {key}" for key in typed_keys]
    keys = ", ".join(_backquoted(name) for name in PARTITION_COLUMNS)
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (\n" + ",\n".join(columns) + "\n)\n"
        f"USING parquet\nPARTITIONED BY ({keys})\nLOCATION {_string(location)};\n" + repair
    )


def _footers(fs: Any, root: str):
    from logrouter.compaction.layout import list_partitions  # noqa: PLC0415

    for partition in list_partitions(fs, root):
        for entry in partition.files:
            with fs.open_read(posixpath.join(root, partition.key, entry.name)) as stream:
                yield pq.ParquetFile(stream).schema_arrow


def add_parser(commands: Any) -> Any:
    """Add ``lake`` and ``lake ddl``; returns ``lake``'s subcommands for more to join."""
    lake = commands.add_parser(
        "lake", help="the lake's table: `lake ddl` (parquet lake), `lake show|engines|import` (Iceberg table)"
    )
    actions = lake.add_subparsers(dest="lake_command", required=True)
    ddl = actions.add_parser("ddl", help="print the table definition of a lake (from its _common_metadata)")
    ddl.add_argument("--config", "-c", default=None, help="config file: the lake of its (first, or --sink) parquet sink")
    ddl.add_argument("--sink", default=None, help="the parquet sink whose lake to describe")
    ddl.add_argument("--path", default=None, help="lake root (path, file://, hdfs://) instead of a config")
    ddl.add_argument("--table", default="logs", help="table name (default: logs)")
    ddl.add_argument(
        "--dialect",
        choices=DIALECTS,
        default="spark",
        help="spark (default: a Spark SQL data source table, USING parquet; any Spark session), "
        "hive (CREATE EXTERNAL TABLE … STORED AS PARQUET: Hive, or Spark with Hive support) "
        "or trino (Hive connector)",
    )
    ddl.add_argument("--location", default=None, help="LOCATION to print (default: the lake URL)")
    ddl.add_argument("--rebuild", action="store_true", help="first add every file's columns to the table (older lakes)")
    return actions


def _lake_url(args: Any, out: TextIO) -> str | None:
    if args.path:
        return args.path
    from logrouter.config.load import DEFAULT_CONFIG, ConfigError, load_file  # noqa: PLC0415

    path = args.config or DEFAULT_CONFIG
    try:
        config = load_file(path)
    except ConfigError as e:
        print(f"{path}: invalid config:", *(f"  {error}" for error in e.errors), sep="\n", file=out)
        return None
    sinks = {name: c for name, c in config.sinks.items() if getattr(c, "type", None) == "parquet"}
    if args.sink:
        if args.sink not in sinks:
            print(f"{path}: no parquet sink {args.sink!r} (parquet sinks: {', '.join(sinks) or 'none'})", file=out)
            return None
        return sinks[args.sink].options["path"]
    if not sinks:
        print(f"{path}: no parquet sink; give --path", file=out)
        return None
    return next(iter(sinks.values())).options["path"]


def run(args: Any, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    url = _lake_url(args, err)
    if url is None:
        return 1
    try:
        fs, root = filesystem_for(url)
        if args.rebuild:
            schema = rebuild_table(fs, root, _footers(fs, root))
        else:
            schema = read_table_schema(fs, root)
    except (ValueError, OSError) as e:
        print(f"{url}: {e}", file=err)
        return 1
    if schema is None:
        print(f"{url}: the lake has no table schema ({root}/_common_metadata) yet: no file was published by this "
              "version; run with --rebuild to make it from the files' footers", file=err)
        return 1
    print(f"-- {len(data_columns(schema))} data columns; partitions tag/dt/hour", file=out)
    print(create_table(schema, args.location or location_of(url), args.table, args.dialect), end="", file=out)
    return 0

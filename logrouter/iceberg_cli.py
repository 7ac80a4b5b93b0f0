"""``logrouter lake show | engines | import``: an Iceberg table seen from the command line.

- ``show``: the table's location, partitioning and columns, its snapshots (operation,
  writer, spool position, files and rows added), its partitions (rows, files, bytes)
  and totals (data files, bytes, mean file size, rows).
- ``engines``: what Spark (``spark-sql`` flags, and ``spark-defaults.conf`` lines), Trino
  (``etc/catalog/<name>.properties``) and DuckDB (statements on the current metadata
  file) need to read the table (``logrouter.lake.iceberg_engines``).
- ``import``: a parquet sink's lake registered into a table without rewriting it
  (``logrouter.lake.iceberg_import``).

The catalog is a pyiceberg SQL catalog: ``--catalog-uri`` (SQLAlchemy URL: SQLite file or
PostgreSQL) and ``--warehouse``, or ``--config`` with an ``iceberg`` sink's settings;
``--property KEY=VALUE`` passes any other catalog property (``py-io-impl`` for HDFS).
"""

from __future__ import annotations

import datetime
import sys
from typing import Any, TextIO

COMMANDS = ("show", "engines", "import")
HDFS_IO = "logrouter.lake.iceberg_hdfs_io.HdfsFileIO"


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        import argparse  # noqa: PLC0415

        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _catalog_arguments(parser: Any) -> None:
    parser.add_argument("--config", "-c", default=None, help="config file: the catalog and table of its (first, or --sink) iceberg sink")
    parser.add_argument("--sink", default=None, help="the iceberg sink whose table to use")
    parser.add_argument("--catalog-uri", default=None, help="SQL catalog: sqlite:///path/catalog.db or postgresql+psycopg2://user:pw@host/db")
    parser.add_argument("--warehouse", default=None, help="where new tables go: a path, file://… or hdfs://namenode:8020/…")
    parser.add_argument("--catalog-name", default="lake", help="the catalog's name, the same for every writer and reader (default: lake)")
    parser.add_argument("--property", action="append", type=_pair, default=[], help="another pyiceberg catalog property KEY=VALUE")
    parser.add_argument("--table", default=None, help="namespace.table (default: the sink's, else logs.events)")


def add_parsers(actions: Any) -> None:
    show = actions.add_parser("show", help="an Iceberg table's snapshots, partitions, file counts and sizes")
    _catalog_arguments(show)
    show.add_argument("--snapshots", type=int, default=20, help="how many of the newest snapshots to list (default: 20)")
    engines = actions.add_parser("engines", help="print the catalog settings Spark, Trino and DuckDB need to read a table")
    _catalog_arguments(engines)
    importer = actions.add_parser("import", help="register a parquet lake's files in an Iceberg table, without rewriting them")
    _catalog_arguments(importer)
    importer.add_argument("--path", required=True, help="the parquet lake's root (path, file://, hdfs://)")
    importer.add_argument("--partition-by", choices=("day", "hour"), default="day", help="time partitioning (default: day)")


def catalog_settings(args: Any, err: TextIO) -> tuple[str, dict[str, str], str] | None:
    """(catalog name, pyiceberg properties, table) from the arguments or the config."""
    properties: dict[str, str] = {}
    name, table = args.catalog_name, args.table
    if args.config or not args.catalog_uri:
        from logrouter.compaction.iceberg import SINK_TYPE, table_of_sink  # noqa: PLC0415
        from logrouter.config.load import ConfigError, load_file  # noqa: PLC0415
        from logrouter.tap import DEFAULT_CONFIG  # noqa: PLC0415

        path = args.config or DEFAULT_CONFIG
        try:
            config = load_file(path)
        except (ConfigError, OSError) as e:
            lines = e.errors if isinstance(e, ConfigError) else [str(e)]
            print(f"{path}: cannot read the catalog from the config (or give --catalog-uri and --warehouse):",
                  *(f"  {line}" for line in lines), sep="\n", file=err)
            return None
        sinks = {n: c for n, c in config.sinks.items() if getattr(c, "type", None) == SINK_TYPE}
        chosen = args.sink or next(iter(sinks), None)
        if chosen not in sinks:
            print(f"{path}: no iceberg sink {chosen or ''!r} (iceberg sinks: {', '.join(sinks) or 'none'}); "
                  "give --catalog-uri and --warehouse", file=err)
            return None
        found = table_of_sink(chosen, sinks[chosen])
        name, properties, table = found.catalog_name, dict(found.properties), table or found.table
    if args.catalog_uri:
        properties["uri"] = args.catalog_uri
    if args.warehouse:
        properties["warehouse"] = args.warehouse
    properties.update(args.property)
    if "uri" not in properties or "warehouse" not in properties:
        print("give --catalog-uri and --warehouse (or --config with an iceberg sink)", file=err)
        return None
    if properties["warehouse"].startswith("hdfs://"):
        properties.setdefault("py-io-impl", HDFS_IO)
    return name, properties, table or "logs.events"


def open_catalog(name: str, properties: dict[str, str]) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog  # noqa: PLC0415

    return SqlCatalog(name, **properties)


def _size(count: float) -> str:
    from logrouter.compaction.tool import human_bytes  # noqa: PLC0415

    return human_bytes(count)


def _when(millis: int) -> str:
    return datetime.datetime.fromtimestamp(millis / 1000, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def show(table: Any, out: TextIO, snapshots: int) -> None:
    metadata = table.metadata
    print(f"table {'.'.join(table.name())}  location {table.location()}  format v{metadata.format_version}", file=out)
    print(f"partitioned by: {', '.join(f'{f.transform}({table.schema().find_column_name(f.source_id)})' for f in table.spec().fields) or 'nothing'}", file=out)
    print(f"columns: {', '.join(f'{f.name} {f.field_type}' for f in table.schema().fields)}", file=out)
    history = table.snapshots()
    current = table.current_snapshot()
    print(f"snapshots: {len(history)} (current {current.snapshot_id if current else 'none'})", file=out)
    for snapshot in history[-snapshots:]:
        summary = snapshot.summary
        extra = summary.additional_properties if summary else {}
        writer = f" writer {extra['logrouter.writer']} position {extra.get('logrouter.spool-position', '?')}" if "logrouter.writer" in extra else ""
        print(f"  {snapshot.snapshot_id}  {_when(snapshot.timestamp_ms)}  {summary.operation.value if summary else '?':<9}"
              f" +{extra.get('added-data-files', 0)} files -{extra.get('deleted-data-files', 0)} files"
              f" +{extra.get('added-records', 0)} rows{writer}", file=out)
    if current is None:
        print("no data yet", file=out)
        return
    files = table.inspect.data_files()
    sizes = files.column("file_size_in_bytes").to_pylist()
    rows = sum(files.column("record_count").to_pylist())
    mean = sum(sizes) / len(sizes) if sizes else 0
    print(f"data files: {len(sizes)}, {_size(sum(sizes))}, mean {_size(mean)}, {rows:,} rows", file=out)
    partitions = table.inspect.partitions().to_pylist()
    print(f"partitions: {len(partitions)}", file=out)
    for p in sorted(partitions, key=lambda p: str(p.get("partition"))):
        values = ", ".join(f"{k}={v}" for k, v in (p.get("partition") or {}).items())
        print(f"  {values or '(unpartitioned)'}  {p['record_count']:,} rows  {p['file_count']} files  "
              f"{_size(p.get('total_data_file_size_in_bytes', 0))}", file=out)


def engines(name: str, properties: dict[str, str], table: Any, out: TextIO) -> None:
    from logrouter.compaction.jars import ICEBERG_RUNTIME, ICEBERG_VERSION, POSTGRESQL_JDBC, SPARK_MINOR, SQLITE_JDBC  # noqa: PLC0415
    from logrouter.lake.iceberg_engines import (  # noqa: PLC0415
        duckdb_statements,
        jdbc_database,
        spark_catalog_conf,
        trino_catalog_properties,
    )

    database = jdbc_database(properties["uri"])
    driver = SQLITE_JDBC if database.is_sqlite else POSTGRESQL_JDBC
    identifier = ".".join(table.name())
    conf = spark_catalog_conf(name, properties)
    print(f"# Spark {SPARK_MINOR}.x with Iceberg {ICEBERG_VERSION} (the runtime is built per Spark minor version)", file=out)
    print(f"spark-sql --packages {ICEBERG_RUNTIME.coordinates},{driver.coordinates} \\", file=out)
    print(" \\\n".join(f"  --conf {key}={value}" for key, value in conf.items()), file=out)
    print(f"# then: SELECT count(*) FROM {name}.{identifier};", file=out)
    print("\n# spark-defaults.conf", file=out)
    for key, value in conf.items():
        print(f"{key} {value}", file=out)
    print(f"\n# Trino: etc/catalog/{name}.properties", file=out)
    if database.is_sqlite:
        print("# Trino ships no SQLite driver and must see the file: use the PostgreSQL catalog for Trino", file=out)
    for key, value in trino_catalog_properties(name, properties).items():
        print(f"{key}={value}", file=out)
    print(f"# then: SELECT count(*) FROM {name}.{identifier};", file=out)
    print("\n# DuckDB (reads the snapshot current now; run again for newer commits; local files only)", file=out)
    for statement in duckdb_statements(table.metadata_location, table.name()[-1]):
        print(statement, file=out)


def run(args: Any, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    settings = catalog_settings(args, err)
    if settings is None:
        return 1
    name, properties, identifier = settings
    try:
        catalog = open_catalog(name, properties)
        if args.lake_command == "import":
            from logrouter.lake.iceberg_import import import_lake  # noqa: PLC0415

            report = import_lake(args.path, catalog, identifier, args.partition_by)
            print(f"{args.path} -> {name}.{identifier}: {len(report.added)} file(s) added"
                  f"{f' (snapshot {report.snapshot_id})' if report.snapshot_id else ''}, {report.already} already in the table, "
                  f"{len(report.skipped)} skipped", file=out)
            for path, why in report.skipped:
                print(f"  skipped {path}: {why}", file=out)
            return 1 if report.skipped else 0
        table = catalog.load_table(identifier)
        if args.lake_command == "show":
            show(table, out, args.snapshots)
        else:
            engines(name, properties, table, out)
    except Exception as e:  # noqa: BLE001 - a CLI: say what went wrong, exit 1
        print(f"{name}.{identifier}: {type(e).__name__}: {e}", file=err)
        return 1
    return 0

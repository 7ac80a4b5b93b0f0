"""``logrouter lake import | show | engines`` and DuckDB, without Spark.

- ``lake import`` registers a parquet lake (three writers, a tag that looks like a number,
  names that need quoting, ``_extra``, a file whose column type differs from the lake's
  table) into a new Iceberg table without rewriting a file: pyiceberg reads exactly the
  rows pyarrow reads from the lake (the conflicting file skipped and reported), the
  files are the lake's own, and a second run adds nothing and makes no snapshot; a file
  published to the lake afterwards is added by the next run, alone.
- ``lake show`` lists snapshots with the writer's keys, partitions, file counts and sizes;
  ``lake engines`` prints Spark, Trino and DuckDB settings that name the same catalog.
- DuckDB with the iceberg extension from PyPI (``duckdb-extension-iceberg``: loaded from
  the package's file, no download) reads the table the statements name.

Spark's read-back of an imported table is in test_iceberg_spark.py.
"""

from __future__ import annotations

import glob
import io
import os
from pathlib import Path

import pytest

from iceberg_spark import events, new_events_table, open_catalog, sqlite_catalog
from logrouter import cli, iceberg_cli
from logrouter.lake.dataset import lake_dataset
from logrouter.lake.writer import LakeWriter

pytest.importorskip("pyiceberg")

T0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z
HOUR = 3600 * 10**9
COLUMNS = ("time", "tag", "n", "msg", "user agent", "a.b", "ok", "_extra")


def write_lake(root: Path) -> None:
    """Writers a and c start before either publishes, so c's ``n`` (a string) stays in its
    file while the table says int64: a file Iceberg cannot take as it is."""
    a = LakeWriter(str(root), "a", 1 << 30, 60)
    c = LakeWriter(str(root), "c", 1 << 30, 60)
    a.write("100", [(T0 + i * 10**6, {"n": i, "msg": f"m{i}", "user agent": "curl", "a.b": i / 4}) for i in range(3)], now=0)
    a.publish(a.seal_all())
    b = LakeWriter(str(root), "b", 1 << 30, 60)
    b.write("web", [(T0 + HOUR + i, {"n": 10 + i, "ok": True, "obj": {"k": i}}) for i in range(4)], now=0)
    b.write("web", [(T0 + 25 * HOUR + i, {"n": 20 + i, "ok": False}) for i in range(2)], now=0)  # the next day
    b.publish(b.seal_all())
    c.write("db", [(T0 + 2 * HOUR, {"n": "not a number"})], now=0)
    c.publish(c.seal_all())


def lake_rows(root: Path) -> list[tuple]:
    """The lake's rows as pyarrow reads them, but for the file Iceberg cannot take."""
    import pyarrow.dataset as ds

    table = lake_dataset(str(root)).to_table(filter=ds.field("tag") != "db")  # pruned: the file is never read
    return sorted(tuple(r[c] for c in COLUMNS) for r in table.to_pylist())


def iceberg_rows(table) -> list[tuple]:
    return sorted(tuple(r[c] for c in COLUMNS) for r in table.scan().to_arrow().to_pylist())


def lake(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    parser_args = cli_args(["lake", *argv])
    code = iceberg_cli.run(parser_args, out, err)
    return code, out.getvalue(), err.getvalue()


def cli_args(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    from logrouter.lake import ddl

    iceberg_cli.add_parsers(ddl.add_parser(commands))
    return parser.parse_args(argv)


def catalog_flags(name: str, properties: dict) -> list[str]:
    return ["--catalog-name", name, "--catalog-uri", properties["uri"], "--warehouse", properties["warehouse"]]


def file_bytes(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*.parquet")}


def test_import_twice_gives_the_same_table(tmp_path):
    root = tmp_path / "parquet"
    write_lake(root)
    before = file_bytes(root)
    name, properties = sqlite_catalog(tmp_path / "iceberg", "lake_import")
    flags = [*catalog_flags(name, properties), "--table", "logs.imported", "--path", str(root)]

    code, out, _ = lake("import", *flags)
    conflicting = [p for p in before if "tag=db" in p]
    assert code == 1  # a file was skipped: said, and the exit status says so
    assert "3 file(s) added" in out and "0 already in the table, 1 skipped" in out, out
    assert f"skipped file://{conflicting[0]}: column 'n' is string, the table's is int64" in out, out
    table = open_catalog(name, properties).load_table("logs.imported")
    assert iceberg_rows(table) == lake_rows(root)
    assert len(iceberg_rows(table)) == 9
    files = sorted(t.file.file_path for t in table.scan().plan_files())
    assert files == sorted("file://" + p for p in before if "tag=db" not in p)  # the lake's own files
    assert file_bytes(root) == before  # not one byte rewritten
    assert [f.name for f in table.schema().fields] == ["time", "tag", "n", "msg", "user agent", "a.b", "ok", "_extra"]
    assert table.scan(row_filter="tag == '100'").to_arrow().num_rows == 3  # partition pruning on the path's tag
    snapshots = len(table.snapshots())

    code, out, _ = lake("import", *flags)
    assert "0 file(s) added, 3 already in the table, 1 skipped" in out, out
    table = open_catalog(name, properties).load_table("logs.imported")
    assert len(table.snapshots()) == snapshots and iceberg_rows(table) == lake_rows(root)

    late = LakeWriter(str(root), "d", 1 << 30, 60)
    late.write("web", [(T0 + HOUR + 99, {"n": 99})], now=0)
    late.publish(late.seal_all())
    code, out, _ = lake("import", *flags)
    assert "1 file(s) added" in out and "3 already in the table" in out, out
    table = open_catalog(name, properties).load_table("logs.imported")
    assert len(table.snapshots()) == snapshots + 1 and iceberg_rows(table) == lake_rows(root)


def test_a_table_inside_the_lake_is_refused(tmp_path):
    root = tmp_path / "parquet"
    write_lake(root)
    name, properties = sqlite_catalog(tmp_path / "iceberg", "lake_inside")
    properties["warehouse"] = f"file://{root}/.."
    code, _, err = lake("import", *catalog_flags(name, properties), "--path", str(root))
    assert code == 1 and "overlap" in err, err


def test_show_and_engines(tmp_path):
    name, properties = sqlite_catalog(tmp_path / "iceberg", "lake_show")
    table = new_events_table(open_catalog(name, properties))
    table.append(events(0, 10), snapshot_properties={"logrouter.writer": "w7", "logrouter.spool-position": "1234"})
    table.append(events(10, 10), snapshot_properties={"logrouter.writer": "w7", "logrouter.spool-position": "2345"})
    code, out, err = lake("show", *catalog_flags(name, properties))
    assert code == 0, err
    assert "partitioned by: day(time), identity(tag)" in out
    assert "snapshots: 2" in out
    assert "append    +4 files -0 files +10 rows writer w7 position 2345" in out, out
    assert "data files: 8," in out and "20 rows" in out
    assert "partitions: 4" in out and "time_day=2024-05-01, tag=web  5 rows  2 files" in out, out

    code, out, err = lake("engines", *catalog_flags(name, properties))
    assert code == 0, err
    db = properties["uri"].removeprefix("sqlite:///")
    assert f"--conf spark.sql.catalog.{name}.uri=jdbc:sqlite:{db}" in out
    assert f"--conf spark.sql.catalog.{name}.jdbc.schema-version=V1" in out
    assert "--packages org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0,org.xerial:sqlite-jdbc:3.50.3.0" in out
    assert f"iceberg.jdbc-catalog.catalog-name={name}" in out and "iceberg.jdbc-catalog.driver-class=org.sqlite.JDBC" in out
    metadata = open_catalog(name, properties).load_table("logs.events").metadata_location.removeprefix("file://")
    assert f"CREATE OR REPLACE VIEW events AS SELECT * FROM iceberg_scan('{metadata}');" in out


def test_the_catalog_comes_from_the_command_line_or_says_what_is_missing(tmp_path):
    code, _, err = lake("show", "--config", str(tmp_path / "missing.toml"))
    assert code == 1 and "give --catalog-uri and --warehouse" in err
    assert main_exit(["lake", "show", "--catalog-uri", f"sqlite:///{tmp_path}/c.db", "--warehouse", str(tmp_path)]) == 1


def main_exit(argv: list[str]) -> int:
    return cli.main(argv)


def duckdb_or_skip():
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed (pip install duckdb)")
    files = []
    for package in ("duckdb_extension_avro", "duckdb_extension_iceberg"):
        try:
            module = __import__(package)
        except ImportError:
            pytest.skip(f"{package.replace('_', '-')} is not installed: DuckDB would download the iceberg extension")
        files += glob.glob(os.path.join(os.path.dirname(module.__file__), "extensions", "*", "*.duckdb_extension"))
    connection = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for path in files:
        try:
            connection.execute(f"LOAD '{path}'")  # signature checked: unsigned extensions are refused
        except duckdb.Error as error:
            pytest.skip(f"the packaged extension does not load into duckdb {duckdb.__version__}: {error}")
    return connection


def test_duckdb_reads_the_table_through_the_printed_statement(tmp_path):
    connection = duckdb_or_skip()
    name, properties = sqlite_catalog(tmp_path / "iceberg", "lake_duck")
    table = new_events_table(open_catalog(name, properties))
    table.append(events(0, 30))
    table.append(events(30, 30))
    code, out, err = lake("engines", *catalog_flags(name, properties))
    assert code == 0, err
    [view] = [line for line in out.splitlines() if line.startswith("CREATE OR REPLACE VIEW")]
    connection.execute(view)
    assert connection.execute("SELECT count(*), count(DISTINCT id), min(id), max(id) FROM events").fetchone() == (60, 60, 0, 59)
    assert connection.execute("SELECT count(*) FROM events WHERE tag = 'app'").fetchone() == (30,)


def test_duckdb_reads_an_imported_lake_with_its_tags(tmp_path):
    connection = duckdb_or_skip()
    root = tmp_path / "parquet"
    write_lake(root)
    name, properties = sqlite_catalog(tmp_path / "iceberg", "lake_duck_import")
    lake("import", *catalog_flags(name, properties), "--table", "logs.imported", "--path", str(root))
    metadata = open_catalog(name, properties).load_table("logs.imported").metadata_location.removeprefix("file://")
    rows = connection.execute(f"SELECT tag, count(*) FROM iceberg_scan('{metadata}') GROUP BY tag ORDER BY tag").fetchall()
    assert rows == [("100", 3), ("web", 6)]

"""The lake's table schema (``_schema/``, ``_common_metadata``) and ``logrouter lake ddl``.

Writers that see different fields each add their columns; the table only grows, keeps
the first type of a column, never holds two names differing only in case; concurrent
updates lose nothing; a writer starting on the lake adopts its types; a plain pyarrow
read with the table's schema (the one line of docs/lake.md) returns every column.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from logrouter.cli import main as cli_main
from logrouter.lake.dataset import lake_dataset
from logrouter.lake.ddl import create_table
from logrouter.lake.fs import LocalFileSystem
from logrouter.lake.table import COMMON_METADATA, data_columns, read_table_schema, update_table
from logrouter.lake.writer import LakeWriter

T0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z


def write(root, writer_id, tag, records, fs=None):
    writer = LakeWriter(str(root), writer_id, 1 << 30, 60, fs=fs)
    writer.adopt_table()
    writer.write(tag, [(T0 + i, r) for i, r in enumerate(records)], now=0)
    writer.publish(writer.seal_all())
    return writer


def test_every_writers_columns_reach_the_table_and_a_plain_read_sees_them(tmp_path):
    root = tmp_path / "lake"
    write(root, "a", "100", [{"x": 1, "s": "one"}])
    write(root, "b", "web", [{"x": 2, "y": 2.5, "raw": b"\x00"}])
    write(root, "c", "web", [{"ok": True}])
    schema = read_table_schema(LocalFileSystem(), str(root))
    assert schema.names == ["time", "x", "s", "y", "raw", "ok", "_extra", "tag", "dt", "hour"]
    assert [str(t) for t in schema.types] == [
        "timestamp[us, tz=UTC]", "int64", "string", "double", "binary", "bool", "string", "string", "string", "int32"]

    # Without the table schema pyarrow takes the first file's columns only …
    # … the docs' one line gives every column, with the partition types right ("100" stays a string).
    table = ds.dataset(str(root), partitioning="hive", schema=pq.read_schema(f"{root}/{COMMON_METADATA}")).to_table()
    rows = sorted(table.to_pylist(), key=lambda r: r["time"])
    assert [(r["tag"], r["x"], r["s"], r["y"], r["raw"], r["ok"], r["hour"]) for r in rows] == [
        ("100", 1, "one", None, None, None, 7), ("web", 2, None, 2.5, b"\x00", None, 7), ("web", None, None, None, None, True, 7)]
    assert lake_dataset(str(root)).schema == schema
    assert lake_dataset(str(root)).to_table().num_rows == 3


def test_the_table_only_grows_and_keeps_first_types(tmp_path):
    root = tmp_path / "lake"
    write(root, "a", "t", [{"n": 1, "Status": "ok"}])
    # another writer (no adoption) sees n as a string and status in lower case: not added
    writer = LakeWriter(str(root), "b", 1 << 30, 60)
    writer.write("t", [(T0, {"n": "one", "status": "fine", "new": 1})], now=0)
    writer.publish(writer.seal_all())
    columns = data_columns(read_table_schema(LocalFileSystem(), str(root)))
    assert columns == [("n", pa.int64()), ("Status", pa.string()), ("new", pa.int64())]
    # a writer that adopts the table puts such values into _extra instead
    adopted = write(root, "c", "t", [{"n": "two", "status": "x"}])
    assert adopted.column_types.get("n") == pa.int64()
    rows = pq.read_table(adopted.fs and sorted((root / "tag=t").rglob("part-c-*.parquet"))[0]).to_pylist()
    assert rows[0]["n"] is None and '"n":"two"' in rows[0]["_extra"] and '"status":"x"' in rows[0]["_extra"]


class RacingFs(LocalFileSystem):
    """Lets another writer publish between this writer's merge and its write."""

    def __init__(self, before_common):
        self.before_common = before_common

    def replace(self, source, target):
        if target.endswith(COMMON_METADATA) and self.before_common is not None:
            hook, self.before_common = self.before_common, None
            hook()
        super().replace(source, target)


def test_concurrent_updates_lose_no_column(tmp_path):
    root = str(tmp_path / "lake")
    update_table(LocalFileSystem(), root, [("base", pa.int64())], "w0")
    racing = RacingFs(lambda: update_table(LocalFileSystem(), root, [("theirs", pa.string())], "w2"))
    update_table(racing, root, [("mine", pa.bool_())], "w1")  # its write lands after w2's, without "theirs"
    assert [n for n, _ in data_columns(read_table_schema(LocalFileSystem(), root))] == ["base", "mine", "theirs"]


def test_ddl_for_spark_hive_and_trino(tmp_path, capsys):
    root = tmp_path / "lake"
    write(root, "a", "t", [{"n": 1, "we`ird": "x", "f": 0.5, "b": True, "raw": b"1"}])
    columns = (
        "  `time` TIMESTAMP,\n  `n` BIGINT,\n  `we``ird` STRING,\n"
        "  `f` DOUBLE,\n  `b` BOOLEAN,\n  `raw` BINARY,\n  `_extra` STRING"
    )
    # spark (the default): a data source table, which Spark takes without Hive support
    assert cli_main(["lake", "ddl", "--path", str(root), "--table", "logs"]) == 0
    out = capsys.readouterr().out
    assert out.endswith(
        f"CREATE TABLE IF NOT EXISTS logs (\n{columns},\n  `tag` STRING,\n  `dt` STRING,\n  `hour` INT\n)\n"
        f"USING parquet\nPARTITIONED BY (`tag`, `dt`, `hour`)\nLOCATION 'file://{root}';\n"
        "MSCK REPAIR TABLE logs;\n"
    ), out
    assert "EXTERNAL" not in out and "STORED AS" not in out
    # hive: Hive's own form (Hive, or Spark with Hive support)
    assert cli_main(["lake", "ddl", "--path", str(root), "--table", "logs", "--dialect", "hive"]) == 0
    out = capsys.readouterr().out
    assert out.endswith(
        f"CREATE EXTERNAL TABLE IF NOT EXISTS logs (\n{columns}\n)\n"
        "PARTITIONED BY (`tag` STRING, `dt` STRING, `hour` INT)\nSTORED AS PARQUET\n"
        f"LOCATION 'file://{root}';\nMSCK REPAIR TABLE logs;\n"
    ), out
    trino = create_table(read_table_schema(LocalFileSystem(), str(root)), "hdfs://nn:8020/logs", "logs", "trino")
    assert "partitioned_by = ARRAY['tag', 'dt', 'hour']" in trino and "external_location = 'hdfs://nn:8020/logs'" in trino
    assert '"hour" integer\n)' in trino and '"n" bigint' in trino


def test_ddl_rebuild_for_a_lake_without_a_table(tmp_path, capsys):
    root = tmp_path / "lake"
    write(root, "a", "t", [{"n": 1}])
    write(root, "b", "u", [{"m": "x"}])
    (root / COMMON_METADATA).unlink()
    assert cli_main(["lake", "ddl", "--path", str(root)]) == 1
    assert "--rebuild" in capsys.readouterr().err
    assert cli_main(["lake", "ddl", "--path", str(root), "--rebuild"]) == 0
    out = capsys.readouterr().out
    assert "`n` BIGINT" in out and "`m` STRING" in out


def test_common_metadata_is_a_parquet_summary_file(tmp_path):
    root = tmp_path / "lake"
    write(root, "a", "t", [{"n": 1}])
    data = (root / COMMON_METADATA).read_bytes()
    assert pq.read_metadata(io.BytesIO(data)).num_rows == 0
    assert not list(root.glob(".*.tmp")) and (root / "_schema" / "a.json").exists()

"""``logrouter lake ddl`` (default dialect ``spark``) in plain Spark SQL: a session without
Hive support (what ``pyspark`` gives by default, which refuses Hive-format DDL) creates
the printed data source table, ``MSCK REPAIR TABLE`` finds the partitions, and the table
reads back every column and every row of both writers; ``DROP TABLE`` leaves the lake.
A plain ``spark.read.parquet(root)`` sees every column too (``_common_metadata``).

Slow (a JVM); skipped, with the reason, when pyspark or java is missing.
"""

from __future__ import annotations

import pytest

from logrouter.cli import main as cli_main
from spark_ddl import COLUMNS, ROWS, execute, read_back, start_spark, write_lake


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = start_spark(tmp_path_factory.mktemp("spark"), hive=False)
    yield session
    session.stop()


def test_plain_spark_creates_the_printed_table_and_reads_every_column_and_row(spark, tmp_path, capsys):
    root = tmp_path / "lake"
    write_lake(root)

    # a plain read: every column, thanks to _common_metadata
    assert set(COLUMNS) <= set(spark.read.parquet(f"file://{root}").columns)

    assert cli_main(["lake", "ddl", "--path", str(root), "--table", "logs"]) == 0
    ddl = capsys.readouterr().out
    execute(spark, ddl)
    partitions = sorted(r[0] for r in spark.sql("SHOW PARTITIONS logs").collect())
    assert partitions == ["tag=100/dt=2024-05-01/hour=07", "tag=web/dt=2024-05-01/hour=08"]
    assert read_back(spark, "logs") == (COLUMNS, ROWS)
    assert spark.sql("SELECT count(*) FROM logs WHERE tag = '100' AND hour = 7").collect()[0][0] == 3
    spark.sql("DROP TABLE logs")  # external: the lake stays
    assert (root / "tag=100").is_dir()


def test_plain_spark_refuses_the_hive_dialect(spark, tmp_path, capsys):
    """Why ``spark`` is not Hive's DDL: this session has no Hive support."""
    root = tmp_path / "lake"
    write_lake(root)
    assert cli_main(["lake", "ddl", "--path", str(root), "--table", "hive_logs", "--dialect", "hive"]) == 0
    with pytest.raises(Exception, match="NOT_SUPPORTED_COMMAND_WITHOUT_HIVE_SUPPORT"):
        execute(spark, capsys.readouterr().out)

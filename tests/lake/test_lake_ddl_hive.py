"""``logrouter lake ddl --dialect hive``: the printed ``CREATE EXTERNAL TABLE … STORED AS
PARQUET`` is accepted by Spark with Hive support (a Derby metastore in a temporary
directory; no real Hive runs here), ``MSCK REPAIR TABLE`` finds the partitions, and the
table reads back every column and every row of both writers. The default ``spark``
dialect works in that session too (a data source table in a Hive metastore).

Slow (a JVM); skipped, with the reason, when pyspark or java is missing.
"""

from __future__ import annotations

import pytest

from logrouter.cli import main as cli_main
from spark_ddl import COLUMNS, ROWS, execute, read_back, start_spark, write_lake


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = start_spark(tmp_path_factory.mktemp("metastore"), hive=True)
    yield session
    session.stop()


@pytest.mark.parametrize("dialect", ["hive", "spark"])
def test_spark_with_hive_support_creates_the_printed_table_and_reads_every_column_and_row(
    spark, tmp_path, capsys, dialect
):
    root = tmp_path / "lake"
    write_lake(root)
    table = f"logs_{dialect}"
    assert cli_main(["lake", "ddl", "--path", str(root), "--table", table, "--dialect", dialect]) == 0
    ddl = capsys.readouterr().out
    assert ("STORED AS PARQUET" in ddl) == (dialect == "hive")
    execute(spark, ddl)
    provider = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").where("col_name = 'Provider'").collect()[0][1]
    assert provider == ("hive" if dialect == "hive" else "parquet")
    partitions = sorted(r[0] for r in spark.sql(f"SHOW PARTITIONS {table}").collect())
    assert partitions == ["tag=100/dt=2024-05-01/hour=07", "tag=web/dt=2024-05-01/hour=08"]
    assert read_back(spark, table) == (COLUMNS, ROWS)
    spark.sql(f"DROP TABLE {table}")  # external: the lake stays
    assert (root / "tag=100").is_dir()

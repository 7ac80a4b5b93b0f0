"""``logrouter lake ddl`` in Spark SQL: the printed CREATE EXTERNAL TABLE is accepted by a
Spark session with Hive support (a Derby metastore in a temporary directory), MSCK
REPAIR finds the partitions, and queries see every column of every writer; a plain
``spark.read.parquet(root)`` sees every column too (``_common_metadata``).

Slow (a JVM); skipped, with the reason, when pyspark or java is missing.
"""

from __future__ import annotations

import os
import shutil

import pytest

from logrouter.lake.ddl import create_table, location_of
from logrouter.lake.fs import LocalFileSystem
from logrouter.lake.table import read_table_schema
from logrouter.lake.writer import LakeWriter

T0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    try:
        import pyspark  # noqa: F401
    except ImportError as error:
        pytest.skip(f"pyspark is not installed: {error}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("java is not installed (no `java` on PATH and no JAVA_HOME)")
    from pyspark.sql import SparkSession

    home = tmp_path_factory.mktemp("metastore")
    session = (
        SparkSession.builder.master("local[1]")
        .appName("logrouter-ddl-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.warehouse.dir", str(home / "warehouse"))
        .config("spark.hadoop.javax.jdo.option.ConnectionURL", f"jdbc:derby:;databaseName={home}/metastore_db;create=true")
        .enableHiveSupport()
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    # the metastore starts on first use: keep Derby's log out of the working directory
    session._jvm.java.lang.System.setProperty("derby.stream.error.file", str(home / "derby.log"))
    yield session
    session.stop()


def test_spark_sql_creates_the_table_from_the_ddl_and_queries_every_column(spark, tmp_path):
    root = tmp_path / "lake"
    first = LakeWriter(str(root), "a", 1 << 30, 60)
    first.write("100", [(T0 + i, {"n": i, "msg": f"m{i}"}) for i in range(3)], now=0)
    first.publish(first.seal_all())
    second = LakeWriter(str(root), "b", 1 << 30, 60)
    second.write("web", [(T0 + 3600 * 10**9 + i, {"lat": i / 2, "ok": True, "obj": {"k": 1}}) for i in range(2)], now=0)
    second.publish(second.seal_all())

    # a plain read: every column, thanks to _common_metadata
    plain = spark.read.parquet(f"file://{root}")
    assert {"n", "msg", "lat", "ok", "_extra", "tag", "dt", "hour"} <= set(plain.columns)

    ddl = create_table(read_table_schema(LocalFileSystem(), str(root)), location_of(str(root)), "logs")
    for statement in filter(None, (s.strip() for s in ddl.split(";\n"))):
        spark.sql(statement.rstrip(";"))
    partitions = sorted(r[0] for r in spark.sql("SHOW PARTITIONS logs").collect())
    assert partitions == ["tag=100/dt=2024-05-01/hour=07", "tag=web/dt=2024-05-01/hour=08"]
    rows = spark.sql("SELECT tag, dt, hour, n, msg, lat, ok, _extra FROM logs ORDER BY time").collect()
    assert [tuple(r) for r in rows] == [
        ("100", "2024-05-01", 7, 0, "m0", None, None, None),
        ("100", "2024-05-01", 7, 1, "m1", None, None, None),
        ("100", "2024-05-01", 7, 2, "m2", None, None, None),
        ("web", "2024-05-01", 8, None, None, 0.0, True, '{"obj":{"k":1}}'),
        ("web", "2024-05-01", 8, None, None, 0.5, True, '{"obj":{"k":1}}'),
    ]
    assert spark.sql("SELECT count(*) FROM logs WHERE tag = '100' AND hour = 7").collect()[0][0] == 3
    spark.sql("DROP TABLE logs")  # external: the lake stays
    assert (root / "tag=100").is_dir()

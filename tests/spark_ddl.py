"""Shared pieces of the ``logrouter lake ddl`` tests that run the printed DDL in Spark:
a Spark session (plain, or with Hive support and a Derby metastore in a temporary
directory), a lake written by two writers, and what reading it back must give.

A session is skipped, with the reason, when pyspark or java is missing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from logrouter.lake.writer import LakeWriter

T0_US = 1_714_546_800 * 10**6  # 2024-05-01T07:00:00Z
HOUR_US = 3600 * 10**6

#: The table's columns in the order the DDL declares them (data columns, then partitions).
COLUMNS = ["time", "n", "msg", "we`ird", "user agent", "a.b", "lat", "ok", "_extra", "tag", "dt", "hour"]
#: Every row, ``time`` in microseconds since the epoch, ordered by time.
ROWS = [
    (T0_US + 0, 0, "m0", "q0", "curl", 0.25, None, None, None, "100", "2024-05-01", 7),
    (T0_US + 1000, 1, "m1", "q1", "curl", 0.5, None, None, None, "100", "2024-05-01", 7),
    (T0_US + 2000, 2, "m2", "q2", "curl", 0.75, None, None, None, "100", "2024-05-01", 7),
    (T0_US + HOUR_US, None, None, None, None, None, 0.0, True, '{"obj":{"k":1}}', "web", "2024-05-01", 8),
    (T0_US + HOUR_US + 1000, None, None, None, None, None, 0.5, True, '{"obj":{"k":1}}', "web", "2024-05-01", 8),
]


def write_lake(root: Path) -> None:
    """Two writers: tag ``100`` (a tag that looks like a number) at 07:00 with columns whose
    names need quoting, and tag ``web`` at 08:00 with other columns and an ``_extra``."""
    first = LakeWriter(str(root), "a", 1 << 30, 60)
    first.write("100", [
        ((T0_US + i * 1000) * 1000, {"n": i, "msg": f"m{i}", "we`ird": f"q{i}", "user agent": "curl", "a.b": (i + 1) / 4})
        for i in range(3)
    ], now=0)
    first.publish(first.seal_all())
    second = LakeWriter(str(root), "b", 1 << 30, 60)
    second.write("web", [
        ((T0_US + HOUR_US + i * 1000) * 1000, {"lat": i / 2, "ok": True, "obj": {"k": 1}}) for i in range(2)
    ], now=0)
    second.publish(second.seal_all())


def start_spark(home: Path, hive: bool):
    try:
        import pyspark  # noqa: F401
    except ImportError as error:
        pytest.skip(f"pyspark is not installed: {error}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("java is not installed (no `java` on PATH and no JAVA_HOME)")
    from pyspark.sql import SparkSession

    # Builder options outlive a stopped session in pyspark, so every one that matters is
    # set here, whatever an earlier session in this process set (Hive or not included).
    builder = (
        SparkSession.builder.master("local[1]")
        .appName("logrouter-ddl-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.caseSensitive", "false")
        .config("spark.sql.warehouse.dir", str(home / "warehouse"))
        .config("spark.sql.catalogImplementation", "hive" if hive else "in-memory")
    )
    if hive:
        url = f"jdbc:derby:;databaseName={home}/metastore_db;create=true"
        builder = builder.config("spark.hadoop.javax.jdo.option.ConnectionURL", url).enableHiveSupport()
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    assert session.conf.get("spark.sql.catalogImplementation") == ("hive" if hive else "in-memory")
    if hive:  # the metastore starts on first use: keep Derby's log out of the working directory
        session._jvm.java.lang.System.setProperty("derby.stream.error.file", str(home / "derby.log"))
    return session


def execute(spark, ddl: str) -> None:
    """Run every statement of a printed DDL (``--`` comment lines dropped)."""
    text = "\n".join(line for line in ddl.splitlines() if not line.startswith("--"))
    for statement in filter(None, (s.strip() for s in text.split(";\n"))):
        spark.sql(statement.rstrip(";"))


def read_back(spark, table: str) -> tuple[list[str], list[tuple]]:
    """Every column and every row of ``table``, ``time`` as microseconds, ordered by it."""
    from pyspark.sql import functions as F

    frame = spark.table(table)
    rows = frame.withColumn("time", F.unix_micros("time")).orderBy("time").collect()
    return frame.columns, [tuple(row) for row in rows]

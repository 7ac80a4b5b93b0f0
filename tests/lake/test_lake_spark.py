"""Spark reads the lake LakeWriter writes: partitions, escaping, types, _staging ignored.

Slow (starts a JVM); skipped, with the reason, when pyspark or java is missing.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from logrouter.lake.partition import HOUR_NS
from logrouter.lake.writer import LakeWriter

T0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z
TAGS = ["app.web", "a/b", "x=y", "100%", "ünï"]


def _spark_or_skip():
    try:
        import pyspark  # noqa: F401
    except ImportError as error:
        pytest.skip(f"pyspark is not installed: {error}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("java is not installed (no `java` on PATH and no JAVA_HOME)")
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[1]")
        .appName("logrouter-lake-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "1")
        # Spark's default reading of partition values, whatever an earlier session in this
        # process (the compaction tests') set: these tests assert what a plain reader sees.
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "true")
        .getOrCreate()
    )


@pytest.fixture(scope="module")
def spark():
    session = _spark_or_skip()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def write_lake(root):
    writer = LakeWriter(root, "spark", 1 << 30, 60, row_group_rows=4)
    expected = []
    for index, tag in enumerate(TAGS):
        batch = []
        for i in range(10):
            time_ns = T0 + (i % 2) * HOUR_NS + index * 1_000_000 + i * 1000
            record = {"seq": i, "msg": f"{tag} {i}", "lat": i / 4, "ok": i % 3 == 0, "raw": bytes([i])}
            if i == 5:
                record["seq"] = "five"  # conflict -> _extra
                record["obj"] = {"nested": [1, 2]}
            batch.append((time_ns, record))
            expected.append((tag, time_ns, record))
        writer.write(tag, batch, now=0)
    writer.publish(writer.seal_all())
    # an uncommitted staged file must stay invisible
    writer.write("app.web", [(T0, {"seq": 99, "msg": "staged", "lat": 0.0, "ok": True, "raw": b""})], now=0)
    assert writer.seal_all()
    return expected


def test_spark_reads_the_lake(spark, tmp_path):
    root = str(tmp_path / "lake")
    expected = write_lake(root)

    frame = spark.read.parquet(root)
    types = dict(frame.dtypes)
    assert types["time"] == "timestamp"
    assert (types["tag"], types["dt"], types["hour"]) == ("string", "date", "int")
    assert (types["seq"], types["lat"], types["ok"], types["raw"], types["_extra"]) == (
        "bigint", "double", "boolean", "binary", "string"
    )
    assert frame.count() == len(expected)

    frame.createOrReplaceTempView("lake")
    rows = spark.sql(
        "SELECT tag, CAST(dt AS STRING) AS dt, hour, unix_micros(time) AS us, seq, msg, lat, ok, raw, _extra "
        "FROM lake"
    ).collect()
    got = {(r["tag"], r["us"]): r for r in rows}
    assert {r["tag"] for r in rows} == set(TAGS)
    for tag, time_ns, record in expected:
        row = got[(tag, time_ns // 1000)]
        assert row["dt"] == "2024-05-01"
        assert row["hour"] == 7 + (time_ns - T0) // HOUR_NS
        assert (row["msg"], row["lat"], row["ok"], bytes(row["raw"])) == (
            record["msg"], record["lat"], record["ok"], record["raw"]
        )
        if record["seq"] == "five":
            assert row["seq"] is None
            assert json.loads(row["_extra"]) == {"seq": "five", "obj": {"nested": [1, 2]}}
        else:
            assert row["seq"] == record["seq"] and row["_extra"] is None

    # partition pruning works on the decoded values
    assert spark.sql("SELECT count(*) AS n FROM lake WHERE tag = 'a/b' AND hour = 8").collect()[0]["n"] == 5


def test_spark_merges_columns_added_by_later_files(spark, tmp_path):
    root = str(tmp_path / "lake")
    writer = LakeWriter(root, "spark", 1 << 30, 60)
    writer.write("app", [(T0, {"a": 1})], now=0)
    writer.publish(writer.seal_all())
    writer.write("app", [(T0 + 1000, {"a": 2, "b": "new"})], now=0)
    writer.publish(writer.seal_all())

    frame = spark.read.option("mergeSchema", "true").parquet(root)
    rows = sorted((r["a"], r["b"]) for r in frame.select("a", "b").collect())
    assert rows == [(1, None), (2, "new")]

"""The Spark compaction job on ``local[1]`` over generated lakes: every value of every
record survives (typed or in ``_extra``), type and case conflicts between files,
columns only some files have, late files, idempotence, and a crash before and after
the commit marker with the real job.

The job's own code (``compact_partition``) runs in this process against one shared
SparkSession built with the job's settings (``start_spark``); the daemon test
(test_compaction_e2e.py) runs it as the separate process the daemon starts.
Slow (a JVM); skipped, with the reason, when pyspark or java is missing.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import pyarrow.parquet as pq
import pytest

from logrouter.compaction import lease as leases
from logrouter.compaction.layout import is_compacted, partition_from_key
from logrouter.compaction.swap import interrupted
from logrouter.lake.extra import encode_extra
from logrouter.lake.fs import LocalFileSystem
from logrouter.lake.partition import HOUR_NS, partition_path, unescape_value
from logrouter.lake.writer import LakeWriter

T0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z
BUCKET = T0 // HOUR_NS


class Crash(BaseException):
    """A simulated kill -9 (not an Exception: the job's cleanup does not see it)."""


@pytest.fixture(scope="module")
def spark():
    try:
        import pyspark  # noqa: F401
    except ImportError as error:
        pytest.skip(f"pyspark is not installed: {error}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("java is not installed (no `java` on PATH and no JAVA_HOME)")
    from logrouter.jobs.compact import start_spark

    session = start_spark("local[1]", {"spark.sql.shuffle.partitions": "1", "spark.sql.caseSensitive": "false"})
    session.sparkContext.setLogLevel("ERROR")
    # the job's correctness settings hold, whatever spark_conf says
    assert session.conf.get("spark.sql.caseSensitive") == "true"
    assert session.conf.get("spark.sql.sources.partitionColumnTypeInference.enabled") == "false"
    assert session.conf.get("spark.sql.parquet.outputTimestampType") == "TIMESTAMP_MICROS"
    yield session
    session.stop()


def compact(spark, root, key, target=256 << 20, **kwargs):
    from logrouter.jobs.compact import Lake, compact_partition

    return compact_partition(lambda: spark, Lake(root), key, target, **kwargs)


def key_of(tag: str) -> str:
    return partition_path(tag, BUCKET)


def write(root, writer_id, tag, records, row_group_rows=10_000, files=1):
    """``records`` [(offset_us, record)] into ``files`` files by one writer."""
    writer = LakeWriter(root, writer_id, 1 << 30, 60, row_group_rows=row_group_rows)
    per_file = -(-len(records) // files)
    for start in range(0, len(records), per_file):
        writer.write(tag, [(T0 + offset * 1000, r) for offset, r in records[start : start + per_file]], now=0)
        writer.publish(writer.seal_all())


def logical_records(root: str, key: str) -> Counter:
    """Every record of a partition as one JSON object of all its fields, typed columns
    and ``_extra`` merged (typed values encoded the way ``_extra`` encodes them), read
    file by file (files may disagree on types before compaction)."""
    found: Counter = Counter()
    directory = os.path.join(root, key)
    tag = unescape_value(key.split("/")[0][len("tag="):])
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".parquet") or name.startswith(("_", ".")):
            continue
        for row in pq.read_table(os.path.join(directory, name)).to_pylist():
            extra = json.loads(row.pop("_extra")) if row["_extra"] else {}
            time = row.pop("time")
            typed = json.loads(encode_extra({k: v for k, v in row.items() if v is not None}))
            assert not typed.keys() & extra.keys(), (typed, extra)
            typed.update(extra)
            found[(tag, time, json.dumps(typed, sort_keys=True))] += 1
    return found


def files_of(root, key):
    return sorted(e.name for e in partition_from_key(LocalFileSystem(), root, key).files)


def mixed_lake(root: str, tag: str) -> int:
    """A partition written by three routers whose files disagree: types, case, columns."""
    a = [(i, {"seq": i, "status": 200 + i % 3, "msg": f"a{i}", "lat": i / 8, "raw": bytes([i % 256, 255])})
         for i in range(0, 300, 3)]
    for offset, record in a[::7]:
        record["obj"] = {"nested": [offset, None]}  # nested -> _extra
        record["big"] = 2**70 + offset  # beyond int64 -> _extra, exact
    for offset, record in a[5::11]:
        record["lat"] = float("nan") if offset % 2 else float("-inf")
    # b: seq is a string (type conflict, fewer rows), Status differs from status by case only,
    # "late" appears only after the first row group (typed in later files, _extra here)
    b = [(i, {"seq": f"s{i}", "Status": "ok", "msg": f"b{i} ü \"q\"\n", "lat": i}) for i in range(1, 300, 3)]
    for offset, record in b[25:]:
        record["late"] = offset * 10
    # c: a column only this writer has, and a float column where others have int
    c = [(i, {"seq": i, "status": 1.5, "only_c": True}) for i in range(2, 300, 3)]
    write(root, "ra", tag, a, files=4)
    write(root, "rb", tag, b, row_group_rows=20, files=3)
    write(root, "rc", tag, c, files=2)
    return len(a) + len(b) + len(c)


def test_compaction_keeps_every_value_and_is_idempotent_and_takes_late_files(spark, tmp_path):
    root = str(tmp_path / "lake")
    tags = ["007", "a/b 100%"]
    counts = {tag: mixed_lake(root, tag) for tag in tags}
    before = {tag: logical_records(root, key_of(tag)) for tag in tags}
    assert len(files_of(root, key_of("007"))) == 9

    # several output files for "007" (a tiny target), one for the other
    first = compact(spark, root, key_of("007"), target=4000)
    second = compact(spark, root, key_of("a/b 100%"))
    for tag, result in (("007", first), ("a/b 100%", second)):
        key = key_of(tag)
        assert result["status"] == "compacted", result
        assert result["rows"] == counts[tag] and result["files_before"] == 9
        assert logical_records(root, key) == before[tag]  # row for row, value for value
        names = files_of(root, key)
        assert all(is_compacted(n) for n in names) and result["files_after"] == len(names)
        # sorted by time, within and across files
        times = [t for n in names for t in pq.read_table(os.path.join(root, key, n), columns=["time"]).column(0).to_pylist()]
        assert times == sorted(times)
        # the type conflict: int64 won (more rows); the strings live on in _extra
        table = pq.read_table(os.path.join(root, key, names[0]))
        assert str(table.schema.field("seq").type) == "int64" and str(table.schema.field("time").type) == "timestamp[us, tz=UTC]"
        assert {"Status", "status"} & set(table.schema.names) == {"status"}  # case variants: one column
        # lat: float64 (ra) ties int64 (rb) on rows, the first file wins; status: int64 (ra) ties
        # "Status" string (rb) and float64 (rc); seq: int64 in 200 rows beats string in 100
        assert result["moved_to_extra"] == ["Status", "lat", "seq", "status"]
        assert str(table.schema.field("lat").type) == "double" and str(table.schema.field("status").type) == "int64"
    assert first["outputs"] > 1 and second["outputs"] == 1
    assert interrupted(LocalFileSystem(), root) == []
    # staging is gone down to the partition level (tag=/dt= directories stay: other partitions share them)
    assert [d for d, _, files in os.walk(os.path.join(root, "_compaction")) if "hour=" in d or files] == []
    lease_state = leases.current(LocalFileSystem(), root, key_of("007"))[1]
    assert lease_state["state"] == "released"

    # again: nothing to do, nothing changes, no Spark
    names = files_of(root, key_of("007"))
    stamps = [os.stat(os.path.join(root, key_of("007"), n)).st_mtime_ns for n in names]

    def no_spark():
        raise AssertionError("Spark was started for a compacted partition")

    from logrouter.jobs.compact import Lake, compact_partition

    again = compact_partition(no_spark, Lake(root), key_of("007"), 4000)
    assert again["status"] == "skipped" and again["reason"] == "already compacted"
    assert files_of(root, key_of("007")) == names
    assert [os.stat(os.path.join(root, key_of("007"), n)).st_mtime_ns for n in names] == stamps

    # a late file arrives in the compacted partition: the next run rewrites it with the compacted file
    late = [(5000 + i, {"seq": f"late{i}", "msg": "late"}) for i in range(5)]
    write(root, "rlate", "a/b 100%", late)
    expected = before["a/b 100%"] + logical_records_of(late, "a/b 100%")
    assert len(files_of(root, key_of("a/b 100%"))) == 2
    third = compact(spark, root, key_of("a/b 100%"))
    assert third["status"] == "compacted" and third["files_before"] == 2 and third["files_after"] == 1
    assert logical_records(root, key_of("a/b 100%")) == expected


def logical_records_of(records, tag) -> Counter:
    from datetime import datetime, timedelta, timezone

    found: Counter = Counter()
    for offset, record in records:
        time = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=T0 // 1000 + offset)
        found[(tag, time, json.dumps(json.loads(encode_extra(record)), sort_keys=True))] += 1
    return found


def small_lake(root: str) -> str:
    write(root, "r1", "app", [(i, {"i": i, "v": f"x{i}"}) for i in range(40)], files=4)
    write(root, "r2", "app", [(100 + i, {"i": str(i)}) for i in range(10)], files=2)
    return key_of("app")


@pytest.mark.parametrize("crash_at", ["audited", "moved 1"])
def test_a_job_killed_before_or_after_its_commit_marker_is_repaired_by_the_next(spark, tmp_path, crash_at):
    root = str(tmp_path / "lake")
    key = small_lake(root)
    before = logical_records(root, key)
    inputs = files_of(root, key)

    def hook(step):
        if step == crash_at:
            raise Crash(step)

    with pytest.raises(Crash):
        compact(spark, root, key, hook=hook)
    assert interrupted(LocalFileSystem(), root) == [key]
    at_rest = files_of(root, key)
    if crash_at == "audited":
        assert at_rest == inputs  # nothing committed: the partition is untouched
    else:
        assert len(at_rest) == len(inputs) + 1  # the window: old and new side by side
    result = compact(spark, root, key)
    if crash_at == "audited":
        assert result["status"] == "compacted" and result["recovered"][0].endswith("rolled back")
    else:
        assert result["status"] == "recovered" and result["recovered"][0].endswith("rolled forward")
    assert logical_records(root, key) == before  # every row exactly once
    assert len(files_of(root, key)) == 1 and interrupted(LocalFileSystem(), root) == []

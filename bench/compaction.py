#!/usr/bin/env python3
"""Throughput of the Spark compaction job on one partition of many small files.

Run by hand::

    .venv/bin/python bench/compaction.py --rows 2000000 --files 1000 --master 'local[*]'

Generates one lake partition of ``--rows`` log-like rows (time, host, level, status,
latency, message, and ``_extra`` JSON on 1 row in 20) spread over ``--files`` small
zstd Parquet files, as routers write them; a quarter of the files come from a "router"
whose ``status`` is a string, so the job also merges a type conflict. Then starts
Spark (timed apart: JVM start is a fixed cost per job) and runs the job's own
``compact_partition`` on it, and prints rows/s, MB/s (input file bytes per second of
compaction), files before/after and the time split. The job audits the row counts
itself; the bench also re-reads the output with pyarrow and checks the count.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from logrouter.lake.dataset import lake_dataset  # noqa: E402
from logrouter.lake.partition import HOUR_NS, partition_path  # noqa: E402

T0_US = 1_714_546_800 * 10**6  # 2024-05-01T07:00:00Z
TAG = "app.web"


def generate(root: str, rows: int, files: int, seed: int = 1) -> tuple[str, int]:
    """The partition key and its bytes on disk."""
    rng = random.Random(seed)
    key = partition_path(TAG, T0_US * 1000 // HOUR_NS)
    directory = os.path.join(root, key)
    os.makedirs(directory)
    per_file = -(-rows // files)
    hosts = [f"web-{i:02d}" for i in range(20)]
    levels = ["info", "info", "info", "warn", "error"]
    written = 0
    for number in range(files):
        count = min(per_file, rows - written)
        if count <= 0:
            break
        start = written
        times = sorted(T0_US + rng.randrange(3_600_000_000) for _ in range(count))
        status = [rng.choice((200, 200, 200, 404, 500)) for _ in range(count)]
        string_status = number % 4 == 3  # another router's files: status is a string there
        columns = {
            "time": pa.array(times, pa.timestamp("us", tz="UTC")),
            "host": pa.array([rng.choice(hosts) for _ in range(count)]),
            "level": pa.array([rng.choice(levels) for _ in range(count)]),
            "status": pa.array([str(s) for s in status] if string_status else status),
            "latency_ms": pa.array([rng.random() * 100 for _ in range(count)]),
            "msg": pa.array([f"GET /api/items/{rng.randrange(10**6)} {s}" for s in status]),
            "seq": pa.array(range(start, start + count), pa.int64()),
            "_extra": pa.array(
                [json.dumps({"trace": rng.getrandbits(64), "tags": ["a", "b"]}) if i % 20 == 0 else None for i in range(count)],
                pa.string(),
            ),
        }
        pq.write_table(pa.table(columns), os.path.join(directory, f"part-bench{number % 4}-1a-{number:06d}.parquet"),
                       compression="zstd")
        written += count
    size = sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))
    return key, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--target-file-bytes", type=int, default=256 << 20)
    parser.add_argument("--conf", action="append", default=[], help="extra Spark setting KEY=VALUE")
    parser.add_argument("--dir", default=None, help="where to build the lake (default: a temporary directory)")
    args = parser.parse_args()

    from logrouter.jobs.compact import Lake, compact_partition, start_spark

    base = args.dir or tempfile.mkdtemp(prefix="logrouter-bench-compaction-")
    root = os.path.join(base, "lake")
    shutil.rmtree(root, ignore_errors=True)
    try:
        started = time.perf_counter()
        key, size = generate(root, args.rows, args.files)
        print(f"generated {args.rows} rows in {args.files} files, {size / 1e6:.1f} MB ({size / args.files / 1e3:.1f} kB/file) "
              f"in {time.perf_counter() - started:.1f}s")
        started = time.perf_counter()
        spark = start_spark(args.master, dict(pair.split("=", 1) for pair in args.conf))
        spark.sparkContext.setLogLevel("ERROR")
        spark_start = time.perf_counter() - started
        started = time.perf_counter()
        result = compact_partition(lambda: spark, Lake(root), key, args.target_file_bytes)
        elapsed = time.perf_counter() - started
        spark.stop()
        assert result["status"] == "compacted", result
        rows = lake_dataset(root).count_rows()
        assert rows == args.rows, (rows, args.rows)
        print(f"master {args.master}, {os.cpu_count()} cores; Spark start {spark_start:.1f}s (not counted below)")
        print(f"compaction: {elapsed:.1f}s, {args.rows / elapsed:,.0f} rows/s, {size / 1e6 / elapsed:.1f} MB/s of input")
        print(f"files: {result['files_before']} -> {result['files_after']}; bytes {result['bytes_before'] / 1e6:.1f} MB -> "
              f"{result['bytes_after'] / 1e6:.1f} MB; columns moved to _extra: {result['moved_to_extra']}")
        print("phases (s):", ", ".join(f"{k} {v:.1f}" for k, v in result["phases"].items()))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

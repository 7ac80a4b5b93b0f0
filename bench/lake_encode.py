#!/usr/bin/env python3
"""Per-event cost of the lake's encoding path (events -> Arrow table -> Parquet), in µs/event.

Run by hand: ``.venv/bin/python bench/lake_encode.py``. Prints the best of several runs
for splitting by hour, building the table (fast path, with conflicts, with nested
fields) and a full write/seal/publish of one file.
"""
import random, shutil, tempfile, time, json
from logrouter.lake.convert import TableBuilder
from logrouter.lake.schema import ColumnTypes, file_schema
from logrouter.lake.writer import LakeWriter
from logrouter.lake.partition import split_by_hour

N = 10_000
T0 = 1_700_000_000_000_000_000
random.seed(1)
events = [(T0 + i * 1000, {"host": "web-%02d" % (i % 20), "level": random.choice(["info", "warn", "error"]),
           "msg": "GET /api/items/%d 200" % random.randrange(10**6), "status": 200,
           "latency_ms": random.random() * 100}) for i in range(N)]
print("avg record bytes (json)", sum(len(json.dumps(r)) for _, r in events) / N)

def best(f, n=15):
    out = []
    for _ in range(n):
        t = time.perf_counter(); f(); out.append(time.perf_counter() - t)
    return min(out) / N * 1e6

types = ColumnTypes()
schema = file_schema(types, [e[1] for e in events])
b = TableBuilder(schema, types)
print("split_by_hour     %.3f us/event" % best(lambda: split_by_hour(events)))
print("build (fast path) %.3f us/event" % best(lambda: b.build(events)))
bad = [(t, dict(r, status="x") if i % 100 == 0 else r) for i, (t, r) in enumerate(events)]
print("build (1%% conflicts in one column) %.3f us/event" % best(lambda: b.build(bad)))
nested = [(t, dict(r, k8s={"pod": "p", "ns": "n"})) for t, r in events]
print("build (every row has a nested field) %.3f us/event" % best(lambda: b.build(nested)))

def full(codec):
    root = tempfile.mkdtemp()
    try:
        w = LakeWriter(root, "bench", 1 << 30, 3600, row_group_rows=N, compression=codec)
        for i in range(0, N, 1000):
            w.write("app.web", events[i:i + 1000], now=0)
        w.publish(w.seal_all())
    finally:
        shutil.rmtree(root)
for codec in ("zstd", "snappy"):
    print("write+seal+publish %-6s %.3f us/event" % (codec, best(lambda: full(codec), 10)))

def steady(codec, total=200_000, batch=500):
    root = tempfile.mkdtemp()
    evs = [(T0 + i * 1000, events[i % N][1]) for i in range(total)]
    try:
        w = LakeWriter(root, "bench", 1 << 30, 3600, row_group_rows=10_000, compression=codec)
        t = time.perf_counter()
        for i in range(0, total, batch):
            w.write("app.web", evs[i:i + batch], now=0)
        w.publish(w.seal_all())
        return (time.perf_counter() - t) / total * 1e6
    finally:
        shutil.rmtree(root)
for codec in ("zstd", "snappy"):
    print("steady 200k events, batches of 500, %-6s %.3f us/event" % (codec, min(steady(codec) for _ in range(3))))
import cProfile, pstats
cProfile.run("steady('zstd')", "/tmp/lakebench/p3.out")
pstats.Stats("/tmp/lakebench/p3.out").sort_stats("tottime").print_stats(8)

"""Beats events from the received window bytes to the lake's Arrow table, native vs Python.

What each path does with ``--windows`` Lumberjack windows of ``--events`` Filebeat 8
events each (``native_decode.filebeat``, ~1 KB of JSON; each window one ``W`` frame and
one ``C`` frame of ``J`` frames, as Filebeat sends them), making one row group:

- ``python``: what runs without the extension: the codec inflates and decodes every
  document (``LumberjackDecoder``), the source makes the idempotency keys
  (``event_keys``, ``auto``) and the batch (``events.batch_builder``, tag
  ``beats.${@metadata.beat}``, times from ``@timestamp``), then the lake picks the
  file's schema (``schema.file_schema``) and builds the table (``convert.TableBuilder``);
- ``native``: the codec inflates and cuts out the documents, undecoded
  (``keep_documents``), the source's native read (``json_native.NativeReads``: one scan
  gives times, buckets, the tag's and keys' field values and the transcoded entries),
  then schema and table straight from those (``native_table``).

Both give the same table (tests/unit/test_native_documents.py). The paths run in one
process, alternating, ``--repeats`` times each, timed in CPU seconds of the process per
million events; the ratio of each pair of neighbouring runs is the figure to read on a
loaded machine. ``--stages`` also times the native path's parts alone: inflating the
``C`` frames (zlib), the codec's feed (inflate, cut out the documents), the scan with
and without the idempotency keys, the documents made bytes objects, the source's whole
read, the table build, and writing the table as Parquet (zstd).

    .venv/bin/python bench/native_documents.py --repeats 7 --stages

``--against OTHER.so`` times this build's ``scan_documents`` against another build of
the extension (e.g. main's, ``cargo build --release --features extension-module``),
loaded beside it, alternating, ratios pair by pair.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import statistics
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow.parquet as pq  # noqa: E402

from native_decode import filebeat  # noqa: E402
from logrouter.lake.convert import TableBuilder  # noqa: E402
from logrouter.lake.native_table import PendingRows, build_table, file_schema_of  # noqa: E402
from logrouter.lake.schema import ColumnTypes, file_schema  # noqa: E402
from logrouter.native import NATIVE, describe  # noqa: E402
from logrouter.sources import event_keys  # noqa: E402
from logrouter.sources.events import TagTemplate, batch_builder  # noqa: E402
from logrouter.sources.json_native import NativeReads  # noqa: E402
from logrouter.wire import lumberjack as lj  # noqa: E402
from logrouter.wire.json_lazy import DocumentEvents, split_runs  # noqa: E402

TAG = "beats.${@metadata.beat}"
NOW = 1_764_150_000_000_000_000


def windows(count: int, events: int) -> list[bytes]:
    out = []
    for w in range(count):
        docs = [json.dumps(filebeat(w * events + i), separators=(",", ":")).encode() for i in range(events)]
        frames = b"".join(lj.encode_json(i + 1, d) for i, d in enumerate(docs))
        out.append(lj.encode_window(events) + lj.encode_compressed(frames))
    return out


def python_path(data: list[bytes]) -> int:
    decoder = lj.LumberjackDecoder()
    batches = batch_builder(TagTemplate(TAG))
    keys = event_keys.key_maker("auto")
    pending = PendingRows()
    for window in data:
        for message in decoder.feed(window):
            if isinstance(message, lj.Events):
                keys(message.records)
                for batch in batches(message.records, NOW, message.documents):
                    pending.extend(batch.events)
    types = ColumnTypes()
    inferred: dict = {}
    schema = file_schema(types, [record for _, record in pending], inferred)
    return TableBuilder(schema, types).build(pending.events(), inferred).num_rows


def native_path(data: list[bytes]) -> int:
    decoder = lj.LumberjackDecoder(keep_documents=True)
    reads = NativeReads(TagTemplate(TAG), False, "auto")
    pending = PendingRows()
    for window in data:
        for message in decoder.feed(window):
            if isinstance(message, lj.Events):
                assert message.undecoded
                batch, _ = reads.read_runs(message.runs, NOW)
                pending.extend(batch.events)
    return _table(pending).num_rows


def _table(pending: PendingRows):
    types = ColumnTypes()
    schema = file_schema_of(types, pending, {})
    return build_table(TableBuilder(schema, types), pending)


def timed(path, data, rounds: int, events: int) -> float:
    gc.collect()
    start = time.process_time()
    for _ in range(rounds):
        path(data)
    return (time.process_time() - start) / (rounds * events) * 1e6


def stages(data: list[bytes], rounds: int, events: int) -> None:
    """The native path's parts alone, CPU µs per event."""
    blobs = [window[6 + 6 :] for window in data]  # the C frames' zlib streams
    inflated = [zlib.decompress(blob) for blob in blobs]
    kept = [m.runs for window in data for m in lj.LumberjackDecoder(keep_documents=True).feed(window) if isinstance(m, lj.Events)]
    reads = NativeReads(TagTemplate(TAG), False, "auto")
    paths = [tuple(p) for p in reads.paths]
    pending, rewritten = PendingRows(), PendingRows()
    for r in kept:
        read = reads.read_runs(r, NOW)[0].events
        pending.extend(read)
        rewritten.extend(DocumentEvents(read.entries, read.buckets, read.reference))  # no texts
    table = _table(pending)
    parts = {
        "codec feed (inflate, cut out)": lambda: [lj.LumberjackDecoder(keep_documents=True).feed(w) for w in data],
        "  of which inflate (zlib)": lambda: [zlib.decompress(b) for b in blobs],
        "source: scan_runs, no keys": lambda: [NATIVE.scan_runs(r, NOW, False, paths[:1]) for r in kept],
        "source: scan_runs with keys": lambda: [NATIVE.scan_runs(r, NOW, False, paths, reads.key) for r in kept],
        "source: the documents as bytes": lambda: [split_runs(r) for r in kept],
        "source: whole read (batch, keys)": lambda: [reads.read_runs(r, NOW) for r in kept],
        "lake: schema + table build": lambda: _table(pending),
        "  same, _extra all from msgpack": lambda: _table(rewritten),
        "lake: Parquet write (zstd)": lambda: pq.write_table(table, io.BytesIO(), compression="zstd"),
    }
    del inflated
    print("  native path's parts, CPU µs per event (median of 5):")
    for name, work in parts.items():
        runs = []
        for _ in range(5):
            gc.collect()
            start = time.process_time()
            for _ in range(rounds):
                work()
            runs.append((time.process_time() - start) / (rounds * events) * 1e6)
        print(f"    {name:34} {statistics.median(runs):.3f}")


def against(path: str, data: list[bytes], rounds: int, repeats: int) -> None:
    """This build's scan against the one at ``path``, alternating in this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("logrouter_native", path)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)  # type: ignore[union-attr]
    docs = [split_runs(m.runs)[0] for window in data for m in lj.LumberjackDecoder(keep_documents=True).feed(window) if isinstance(m, lj.Events)]
    paths = [tuple(p) for p in NativeReads(TagTemplate(TAG), False, "auto").paths]
    events = sum(map(len, docs))
    runs: dict[str, list[float]] = {"other": [], "this": []}
    for repeat in range(repeats):
        for name in ("other", "this") if repeat % 2 == 0 else ("this", "other"):
            module = other if name == "other" else NATIVE
            gc.collect()
            start = time.process_time()
            for _ in range(rounds):
                for d in docs:
                    module.scan_documents(d, NOW, False, paths)
            runs[name].append((time.process_time() - start) / (rounds * events) * 1e6)
    ratios = [a / b for a, b in zip(runs["other"], runs["this"])]
    print(f"  scan_documents, CPU µs per event: other {statistics.median(runs['other']):.2f}, "
          f"this {statistics.median(runs['this']):.2f}; other / this, pair by pair: median "
          f"{statistics.median(ratios):.2f}x (min {min(ratios):.2f}x, max {max(ratios):.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--events", type=int, default=1000, help="events per window")
    parser.add_argument("--rounds", type=int, default=2, help="row groups per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each path, alternating")
    parser.add_argument("--stages", action="store_true", help="also time the native path's parts alone")
    parser.add_argument("--against", metavar="OTHER.so", help="time scan_documents against this other build")
    args = parser.parse_args()
    if NATIVE is None:
        sys.exit(f"the native extension is not here: {describe()}")
    data = windows(args.windows, args.events)
    total = args.windows * args.events
    assert python_path(data) == native_path(data) == total
    print(f"lumberjack windows -> lake table, filebeat: {args.windows} x {args.events} events per round, "
          f"{sum(map(len, data)) / total:.0f} bytes on the wire per event; {args.rounds} rounds per run, "
          f"{args.repeats} runs of each path, alternating")
    results: dict[str, list[float]] = {"python": [], "native": []}
    ratios = []
    for repeat in range(args.repeats):
        order = ("python", "native") if repeat % 2 == 0 else ("native", "python")
        for name in order:
            results[name].append(timed(python_path if name == "python" else native_path, data, args.rounds, total))
        ratios.append(results["python"][-1] / results["native"][-1])
    for name, runs in results.items():
        print(f"  {name:6}: CPU µs per event: median {statistics.median(runs):.2f} (min {min(runs):.2f}, max {max(runs):.2f})")
    print(f"  python / native, pair by pair: median {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")
    if args.stages:
        stages(data, args.rounds, total)
    if args.against:
        against(args.against, data, args.rounds, args.repeats)


if __name__ == "__main__":
    main()

"""logjam request messages from their ZeroMQ frames to batches and to the lake's Arrow table, native vs Python.

What each path does with ``--messages`` logjam request messages (``request_body``: a
Rails request as the logjam agent reports it, nested, ~1.7 KB of JSON; zlib-compressed
bodies, as agents send them), handed to the ``logjam`` source in chunks of 512 as its
receiver thread hands them over, making one row group:

- ``python``: what runs without the extension: the receiver thread's ``decode``
  decompresses and decodes every body (``json_text.loads``), the reactor side makes a
  record per message (``dict(body)`` plus the metadata fields, the time from
  ``started_ms``) and the batches; then the lake picks the file's schema
  (``schema.file_schema``) and builds the table (``convert.TableBuilder``);
- ``native``: the receiver thread decompresses each body and reads it natively into its
  event's entry (``logjam_native``, ``LogjamReader``), never decoding it in Python;
  the reactor side joins each batch's entries (``join_logjam``); schema and table
  straight from them, the bodies' objects' text spliced into ``_extra``
  (``native_table``).

Both give the same table (tests/unit/test_native_logjam.py). Timed in CPU seconds of the
process per event, the two paths alternating in one process, ``--repeats`` runs each; the
ratio of each pair of neighbouring runs is the figure to read on a loaded machine. Three
spans: frames to the batches the source hands the router (what the receiver thread and
the reactor do, here in one thread); the reactor's side of that alone (what bounds a
source's rate: the receiver thread runs beside it, and the native read in it releases
the GIL); and frames to the lake's Arrow table. ``--stages`` also times the native
path's parts alone.

    .venv/bin/python bench/logjam_decode.py --repeats 7 --stages
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from twisted.internet import defer, task  # noqa: E402

from logrouter.lake.convert import TableBuilder  # noqa: E402
from logrouter.lake.native_table import PendingRows, build_table, file_schema_of  # noqa: E402
from logrouter.lake.schema import ColumnTypes, file_schema  # noqa: E402
from logrouter.native import NATIVE, describe  # noqa: E402
from logrouter.sources.base import SourceContext  # noqa: E402
from logrouter.sources.logjam import LogjamSource  # noqa: E402
from logrouter.sources.zmq_receiver import ROUTER, Received  # noqa: E402
from logrouter.wire import logjam as wire  # noqa: E402

CHUNK = 512


def request_body(i: int) -> dict[str, Any]:
    """A Rails request as the logjam agent reports it (~1.7 KB of JSON)."""
    return {
        "action": "ItemsController#show",
        "code": 200 if i % 5 else 404,
        "process_id": 4000 + i % 8,
        "request_id": "%032x" % (i * 7919),
        "started_at": "2026-11-26T10:%02d:%02d+01:00" % (i // 60 % 60, i % 60),
        "started_ms": 1_764_151_200_000 + i * 37,
        "total_time": 12.5 + i % 17, "view_time": 3.25, "db_time": 4.0 + i % 3, "db_calls": i % 11,
        "gc_time": 0.5, "allocated_objects": 15000 + i, "allocated_bytes": 1_200_000 + i, "heap_growth": 0,
        "host": "app-%02d.example.com" % (i % 3), "ip": "10.0.%d.%d" % (i % 4, i % 250),
        "user_id": i * 13, "caller_id": "", "caller_action": "", "severity": 1,
        "request_info": {
            "method": "GET",
            "url": "/items/%06d?page=%d" % (i, i % 9),
            "headers": {"Accept": "application/json", "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0",
                        "X-Request-Id": "r%d" % i, "Accept-Language": "de-DE,de;q=0.9,en;q=0.5"},
            "query_parameters": {"page": str(i % 9)},
            "body_parameters": {},
        },
        "lines": [
            [1, "2026-11-26T10:00:00.123456", 'Started GET "/items/%06d" for 10.0.0.1' % i],
            [1, "2026-11-26T10:00:00.124000", "Processing by ItemsController#show as JSON"],
            [0, "2026-11-26T10:00:00.130000", '  Item Load (0.4ms)  SELECT "items".* FROM "items" WHERE "items"."id" = $1 LIMIT $2'],
            [0, "2026-11-26T10:00:00.133000", '  User Load (0.2ms)  SELECT "users".* FROM "users" WHERE "users"."id" = $1'],
            [1, "2026-11-26T10:00:00.140000", "Completed 200 OK in 12ms (Views: 3.2ms | ActiveRecord: 4.0ms)"],
        ],
        "exceptions": [] if i % 5 else ["ActiveRecord::RecordNotFound"],
        "metrics": [{"name": "cache.read", "value": 0.25}, {"name": "redis", "value": 1.5}],
    }


def messages(count: int) -> list[list[bytes]]:
    out = []
    for i in range(count):
        body = json.dumps(request_body(i), separators=(",", ":")).encode()
        meta = wire.Meta(wire.ZLIB_COMPRESSION, 1, 1_764_151_200_000 + i, i + 1)
        out.append([b"", b"shop-production", b"logs.shop", zlib.compress(body), wire.encode_meta(meta)])
    return out


class Router:
    def __init__(self) -> None:
        self.batches: list[Any] = []

    def ingest(self, batch: Any, key: Any = None, **_: Any) -> defer.Deferred:
        self.batches.append(batch)
        return defer.Deferred()


class Receiver:
    def send(self, index: int, frames: list[bytes]) -> None:
        pass

    def done(self) -> None:
        pass


def source_of(native: bool) -> tuple[LogjamSource, Router]:
    router = Router()
    clock = task.Clock()
    clock.advance(1_764_151_200)
    options = {key: option.default for key, option in LogjamSource.OPTIONS.items()}
    options["listen_router"] = "tcp://127.0.0.1:*"
    source = LogjamSource("jam", options, SourceContext(router=router, reactor=clock, errors=None, state_dir=""))
    source.receiver = Receiver()  # type: ignore[assignment]
    source.batches.native = native  # the codec leaves bodies to the extension's read, or not
    return source, router


def chunks(source: LogjamSource, data: list[list[bytes]]) -> list[list[Received]]:
    """What the receiver thread hands the reactor: ``data`` decoded in chunks."""
    return [
        [Received(0, b"id", source.decode(ROUTER, frames), 0) for frames in data[start : start + CHUNK]]
        for start in range(0, len(data), CHUNK)
    ]


def scanned_chunks(data: list[list[bytes]]) -> list[list[Any]]:
    return [[item.decoded.decoded for item in chunk] for chunk in chunks(source_of(True)[0], data)]


def batches(data: list[list[bytes]], native: bool) -> list[Any]:
    """The source's receiver thread and reactor side over ``data``: the batches it stores."""
    source, router = source_of(native)
    for chunk in chunks(source, data):
        source.received(chunk)
    return router.batches


def reactor_side(data: list[list[bytes]], native: bool) -> Any:
    """The reactor side alone, timed over chunks the receiver decoded before (a work
    that returns the time spent)."""
    source, router = source_of(native)
    ready = chunks(source, data)

    def work() -> None:
        for chunk in ready:
            source.received(chunk)

    return work


def table(found: list[Any]) -> int:
    pending = PendingRows()
    for batch in found:
        pending.extend(batch.events)
    types = ColumnTypes()
    if pending.packed() is not None:
        return build_table(TableBuilder(file_schema_of(types, pending, {}), types), pending).num_rows
    inferred: dict = {}
    schema = file_schema(types, [record for _, record in pending], inferred)
    return TableBuilder(schema, types).build(pending.events(), inferred).num_rows


def timed(work: Any, rounds: int, events: int) -> float:
    gc.collect()
    start = time.process_time()
    for _ in range(rounds):
        work()
    return (time.process_time() - start) / (rounds * events) * 1e6


def stages(data: list[list[bytes]], rounds: int, events: int) -> None:
    found = batches(data, True)
    bodies = [zlib.decompress(frames[3]) for frames in data]
    packed = [batch.packed for batch in found]
    infos = [info for p in packed for info in p[2]]
    reader = NATIVE.LogjamReader("logjam_", ["started_ms", "started_at"])
    pieces = [[m.piece for m in chunk] for chunk in scanned_chunks(data)]
    parts = {
        "receiver: zlib inflate": lambda: [zlib.decompress(frames[3]) for frames in data],
        "receiver: LogjamReader.read per body": lambda: [reader.read(body, *info) for body, info in zip(bodies, infos)],
        "reactor: join_logjam per batch": lambda: [NATIVE.join_logjam(p) for p in pieces],
        "replay: scan_logjam per batch": lambda: [NATIVE.scan_logjam(p[1], p[2], p[3], p[4]) for p in packed],
        "lake: schema + table build": lambda: table(found),
    }
    print("  native path's parts, CPU µs per event (median of 5):")
    for name, work in parts.items():
        runs = [timed(work, rounds, events) for _ in range(5)]
        print(f"    {name:36} {statistics.median(runs):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=1, help="row groups per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each path, alternating")
    parser.add_argument("--stages", action="store_true", help="also time the native path's parts alone")
    args = parser.parse_args()
    if NATIVE is None:
        sys.exit(f"the native extension is not here: {describe()}")
    data = messages(args.messages)
    python_batches, native_batches = batches(data, False), batches(data, True)
    assert all(b.packed is None for b in python_batches) and all(b.packed is not None for b in native_batches)
    assert table(python_batches) == table(native_batches) == args.messages
    del python_batches, native_batches  # not kept alive through the runs (the GC would walk them)
    body_bytes = sum(len(zlib.decompress(frames[3])) for frames in data) / args.messages
    print(f"logjam messages -> batches -> lake table: {args.messages} request messages per round, {body_bytes:.0f} bytes "
          f"of JSON each (zlib); {args.rounds} rounds per run, {args.repeats} runs of each path, alternating")
    spans = {
        "receiver thread + reactor -> batches": lambda native: lambda: batches(data, native),
        "the reactor side alone": lambda native: reactor_side(data, native),
        "receiver thread + reactor + lake table": lambda native: lambda: table(batches(data, native)),
    }
    for span, make in spans.items():
        results: dict[str, list[float]] = {"python": [], "native": []}
        ratios = []
        for repeat in range(args.repeats):
            for name in ("python", "native") if repeat % 2 == 0 else ("native", "python"):
                results[name].append(timed(make(name == "native"), args.rounds, args.messages))
            ratios.append(results["python"][-1] / results["native"][-1])
        print(f"  {span}:")
        for name, runs in results.items():
            print(f"    {name:6}: CPU µs per event: median {statistics.median(runs):.2f} (min {min(runs):.2f}, max {max(runs):.2f})")
        print(f"    python / native, pair by pair: median {statistics.median(ratios):.2f}x "
              f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")
    if args.stages:
        stages(data, args.rounds, args.messages)


if __name__ == "__main__":
    main()

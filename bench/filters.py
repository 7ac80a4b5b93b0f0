#!/usr/bin/env python3
"""Per-event cost of each filter and of condition evaluation, in µs/event.

Run by hand: ``.venv/bin/python bench/filters.py``. Each line is the best of 20 runs of
``process`` over 100 batches of 1000 events (realistic small records: host, level, a
message, a nested http table), divided by the event count; the input is built once and
never changed by the filters, so every run sees the same data.

``bench/filters.py --packed``: CPU time per event of forward entries through
``grep`` + ``set`` + ``remove`` (and ``drop`` + ``sample`` with conditions + ``set``) into
a lake row group's table, the batch kept packed
(native columns, ``logrouter.filters.columnar``) against decoded to records (the
path without the extension), alternating in one process; read the ratios.
"""
import json
import random
import sys
import time

from twisted.internet import task

from logrouter.batch import Batch
from logrouter.conditions import Condition
from logrouter.filters.dedupe import DedupeFilter
from logrouter.filters.drop import DropFilter
from logrouter.filters.fields import SetFilter
from logrouter.filters.grep import GrepFilter
from logrouter.filters.parse import ParseJsonFilter, ParseRegexFilter
from logrouter.filters.parse_time import ParseTimeFilter
from logrouter.filters.route import RouteFilter
from logrouter.filters.sample import SampleFilter
from logrouter.filters.throttle import ThrottleFilter

BATCH, BATCHES = 1000, 100
N = BATCH * BATCHES
T0 = 1_700_000_000 * 10**9
random.seed(1)
LEVELS = ["info"] * 6 + ["debug"] * 3 + ["error"]
PATHS = ["/api/items", "/api/users", "/health", "/static/app.js"]


def record(i):
    return {
        "host": "web-%02d" % (i % 20),
        "level": random.choice(LEVELS),
        "message": "GET /api/items/%d 200" % random.randrange(10**6),
        "http": {"path": random.choice(PATHS), "status": random.choice([200, 200, 200, 404, 503])},
    }


def batches(make_record):
    return [Batch("app.web", [(T0 + (b * BATCH + i) * 1000, make_record(b * BATCH + i)) for i in range(BATCH)]) for b in range(BATCHES)]


PLAIN = batches(record)
AS_JSON = batches(lambda i: {"message": json.dumps(record(i)), "host": "web-01"})
ACCESS = batches(lambda i: {"message": '10.0.%d.%d - - [14/Nov/2023:22:%02d:%02d +0000] "GET /api/items/%d HTTP/1.1" %d %d'
                            % (i % 256, i % 100, i // 60 % 60, i % 60, i, random.choice([200, 404]), random.randrange(10**5))})
TIMES = batches(lambda i: {"time": "2023-11-14T22:%02d:%02d.%09dZ" % (i // 60 % 60, i % 60, i)})
EPOCHS = batches(lambda i: {"ts": 1_700_000_000 + i / 1000})


def options(cls, **given):
    for key, option in cls.OPTIONS.items():
        if key not in given and not option.required:
            given[key] = option.default
    return given


def errors(*args):
    pass


def best(f, data, runs=20):
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        for b in data:
            f(b)
        out.append(time.perf_counter() - t)
    return min(out) / (len(data) * BATCH) * 1e6


def bench(name, cls, data=PLAIN, **given):
    kwargs = {"clock": task.Clock()} if cls is ThrottleFilter else {}
    f = cls("bench", options(cls, **given), errors, **kwargs)
    if cls is ThrottleFilter:
        clock = kwargs["clock"]

        def run(b):
            clock.advance(1)
            f.process(b)

        print("%-44s %6.3f µs/event" % (name, best(run, data)))
        return
    print("%-44s %6.3f µs/event" % (name, best(f.process, data)))


def condition(name, text):
    test = Condition(text).test

    def run(b):
        for event in b.events:
            test(event[1])

    def loop(b):
        for event in b.events:
            pass

    print("%-44s %6.3f µs/event" % ("condition: " + name, best(run, PLAIN) - best(loop, PLAIN)))


def packed_pipeline(label, make_pipeline, rounds=5):
    import msgpack

    from logrouter.filters.fields import RemoveFilter
    from logrouter.lake.convert import TableBuilder
    from logrouter.lake.native_table import PendingRows, build_table, file_schema_of
    from logrouter.lake.schema import ColumnTypes, file_schema
    from logrouter.native import NATIVE
    from logrouter.wire.forward_lazy import PackedEvents, lazy_events
    from logrouter.wire.forward_packed import decode_entries

    if NATIVE is None:
        sys.exit("logrouter_native is not installed (or LOGROUTER_NATIVE=0): nothing to compare")
    blobs = [b"".join(msgpack.packb([msgpack.ExtType(0, (t // 10**9).to_bytes(4, "big") + (t % 10**9).to_bytes(4, "big")), r])
                      for t, r in b.events) for b in PLAIN]
    pipeline = make_pipeline(RemoveFilter)

    def through(batch):
        for f in pipeline:
            batch = f.process(batch)
        return batch

    def packed():
        kept = 0
        for blob in blobs:
            out = through(Batch("app.web", lazy_events(blob, None), "forward"))
            assert type(out.events) is PackedEvents and out.events._events is None
            pending = PendingRows()
            pending.extend(out.events)
            types = ColumnTypes({})
            kept += build_table(TableBuilder(file_schema_of(types, pending, {}), types), pending).num_rows
        return kept

    def records():
        kept = 0
        for blob in blobs:
            events, _ = decode_entries(blob, None)
            out = through(Batch("app.web", events, "forward"))
            types, inferred = ColumnTypes({}), {}
            schema = file_schema(types, [r for _, r in out.events], inferred)
            kept += TableBuilder(schema, types).build(out.events, inferred).num_rows
        return kept

    assert packed() == records()
    print("%s into a row group's table, %d batches of %d events, CPU µs per event in:" % (label, BATCHES, BATCH))
    ratios = []
    for _ in range(rounds):
        times = []
        for run in (records, packed):
            t = time.process_time()
            run()
            times.append((time.process_time() - t) / N * 1e6)
        ratios.append(times[0] / times[1])
        print("  records %.3f  packed %.3f  records/packed %.1fx" % (times[0], times[1], ratios[-1]))
    ratios.sort()
    print("median records/packed: %.1fx (%.1f-%.1fx)" % (ratios[len(ratios) // 2], ratios[0], ratios[-1]))


if "--packed" in sys.argv:
    packed_pipeline("grep + set + remove", lambda RemoveFilter: [
        GrepFilter("g", options(GrepFilter, field="level", include="^(error|info)$"), errors),
        SetFilter("s", options(SetFilter, fields={"env": "prod", "source": "${tag}"}), errors),
        RemoveFilter("r", options(RemoveFilter, fields=["host"]), errors),
    ])
    packed_pipeline("drop (condition) + sample (condition) + set", lambda _: [
        DropFilter("d", options(DropFilter, condition='$.http.path =~ "^/health" or $.http.status == 404'), errors),
        SampleFilter("s", options(SampleFilter, rate=10, condition='level == "debug"'), errors),
        SetFilter("e", options(SetFilter, fields={"env": "prod"}), errors),
    ])
    sys.exit(0)

print("batches of %d events, best of 20 runs over %d events" % (BATCH, N))
condition('level == "debug"', 'level == "debug"')
condition("$.http.status >= 500", "$.http.status >= 500")
condition('path regex', '$.http.path =~ "^/(health|ready)"')
condition("3 tests and/or/not", 'level == "debug" or ($.http.status >= 500 and not exists($.http.error))')
bench('drop level == "debug"', DropFilter, condition='level == "debug"')
bench("drop health checks (nested regex)", DropFilter, condition='$.http.path =~ "^/(health|ready)$"')
bench('grep condition (level in [..])', GrepFilter, condition='level in ["error", "info"]')
bench("grep field/include (for comparison)", GrepFilter, field="level", include="^(error|info)$")
bench("sample 1 in 10", SampleFilter, rate=10)
bench("sample 1 in 10, keyed by host", SampleFilter, rate=10, key=["host"])
bench('sample 1 in 10 where level == "debug"', SampleFilter, rate=10, condition='level == "debug"')
bench("parse_json (merge, ~150-byte objects)", ParseJsonFilter, AS_JSON)
bench("parse_json into target", ParseJsonFilter, AS_JSON, target="parsed")
bench("parse_regex (access log, int status)", ParseRegexFilter, ACCESS,
      pattern=r'^(?P<client>\S+) \S+ (?P<user>\S+) \[(?P<ts>[^\]]+)\] "(?P<method>\S+) (?P<path>\S+) [^"]*" (?P<status>\d{3}) (?P<bytes>\d+)',
      types={"status": "int"})
bench("parse_time rfc3339 (ns)", ParseTimeFilter, TIMES)
bench("parse_time strptime (cached per text)", ParseTimeFilter, batches(lambda i: {"time": "14/Nov/2023:22:%02d:%02d +0000" % (i // 60 % 60, i % 60)}),
      formats=["%d/%b/%Y:%H:%M:%S %z"])
bench("parse_time epoch float", ParseTimeFilter, EPOCHS, field="ts", formats=["epoch"])
bench("throttle unkeyed (1 slice per batch)", ThrottleFilter, rate=500)
bench("throttle keyed by host", ThrottleFilter, rate=20, key=["host"])
bench("dedupe by message (all unique)", DedupeFilter, fields=["message"], max_keys=10_000)
bench("dedupe by host+level (mostly repeats)", DedupeFilter, fields=["host", "level"])
bench("set (for comparison)", SetFilter, fields={"env": "prod"})
bench("route: 2 routes + _unmatched", RouteFilter, routes={"failed": 'level == "error"', "slow": "$.http.status >= 500"})
bench("route: 2 routes, first_match", RouteFilter, routes={"failed": 'level == "error"', "slow": "$.http.status >= 500"},
      first_match=True)

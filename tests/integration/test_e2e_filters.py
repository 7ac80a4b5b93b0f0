"""End to end: the real daemon runs a pipeline built from the issue #16 filters, fed by the
real fluent-logger, into a ``file`` sink (and the parse failures into a dead-letter file).

JSON app logs are parsed, access-log lines parsed by regex with their time read by a
strptime pattern, health checks dropped, debug logs sampled, a noisy tag throttled,
error-level logs routed to a lake path of their own, and everything that failed to parse
(JSON or access line) sent to a dead-letter file.
"""

from __future__ import annotations

import json
import os
import socket

import msgpack
from fluent import sender

from daemon import Daemon
from helpers import lake_column, read_lake, wait_until
from fixtures.forward_encode import encode_packed_forward

CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[filters.apps]
type = "match"
inputs = ["forward"]
tag = "app.**"

[filters.json]
type = "parse_json"
inputs = ["apps"]
on_error = "error"

[filters.web]
type = "match"
inputs = ["forward"]
tag = "nginx.access"

[filters.access]
type = "parse_regex"
inputs = ["web"]
on_error = "error"
pattern = '^(?P<client>\\S+) \\S+ (?P<user>\\S+) \\[(?P<ts>[^\\]]+)\\] "(?P<method>\\S+) (?P<path>\\S+) [^"]*" (?P<status>\\d{3}) (?P<bytes>\\d+|-)'
types = { status = "int" }

[filters.access_time]
type = "parse_time"
inputs = ["access"]
field = "ts"
formats = ["%d/%b/%Y:%H:%M:%S %z"]
remove_field = true

[filters.no_health]
type = "drop"
inputs = ["json", "access_time"]
condition = 'path =~ "^/health" or $.http.path == "/health"'

[filters.less_debug]
type = "sample"
inputs = ["no_health"]
rate = 10
condition = 'level == "debug"'

[filters.quiet]
type = "throttle"
inputs = ["less_debug"]
tag = "app.noisy"
rate = 1
burst = 5

[filters.by_level]
type = "route"
inputs = ["quiet"]
routes = { failures = 'level == "error"' }

[sinks.out]
type = "file"
inputs = ["by_level._unmatched"]
path = "out"
roll_secs = 3600

[sinks.error_lake]
type = "parquet"
inputs = ["by_level.failures"]
path = "error_lake"
roll_secs = 0.5

[sinks.dead]
type = "file"
inputs = ["json.errors", "access.errors"]
path = "dead"
roll_secs = 3600
"""

T0 = 1_700_000_000
LINE = '10.0.0.{i} - - [10/Oct/2000:13:55:{s:02d} -0700] "GET {path} HTTP/1.1" {status} 512'


def sink_events(daemon, name):
    return sum(v for k, v in daemon.metrics().items() if k.startswith("logrouter_sink_events_in_total{") and f'sink="{name}"' in k)


def lines(directory):
    out = []
    for path in sorted(directory.glob("*.jsonl")):
        out.extend(json.loads(line) for line in path.read_text().splitlines())
    return out


def test_a_parsing_dropping_sampling_throttling_pipeline_into_a_file_sink(tmp_path):
    with Daemon(tmp_path, CONFIG) as daemon:
        daemon.start()
        port = daemon.port("forward")
        app = sender.FluentSender("app", host="127.0.0.1", port=port, nanosecond_precision=True)
        sent = 0
        for i in range(100):  # app logs as JSON text; every tenth a health check
            path = "/health" if i % 10 == 0 else f"/api/{i}"
            assert app.emit_with_time("web", T0 + i, {"message": json.dumps({"level": "info", "n": i, "http": {"path": path}})})
            sent += 1
        for i in range(200):  # debug logs: sampled 1 in 10
            assert app.emit_with_time("worker", T0 + i + 0.5, {"message": json.dumps({"level": "debug", "d": i})})
            sent += 1
        for i in range(50):  # a noisy tag: throttled to a burst of 5 and 1/s
            assert app.emit_with_time("noisy", T0, {"message": json.dumps({"level": "warn", "x": i})})
            sent += 1
        for i in range(3):  # not JSON: to json.errors, the dead-letter file
            assert app.emit_with_time("web", T0, {"message": f"plain text {i}"})
            sent += 1
        for i in range(5):  # errors: routed to a lake path of their own
            assert app.emit_with_time("web", T0 + i, {"message": json.dumps({"level": "error", "e": i})})
            sent += 1
        app.close()
        nginx = sender.FluentSender("nginx", host="127.0.0.1", port=port)
        for i in range(20):
            path = "/healthz" if i % 4 == 0 else f"/p/{i}"
            assert nginx.emit("access", {"message": LINE.format(i=i, s=i, path=path, status=200 + i % 2 * 304)})
            sent += 1
        assert nginx.emit("access", {"message": "not an access line"})  # to access.errors
        sent += 1
        nginx.close()
        wait_until(lambda: daemon.metrics().get("logrouter_events_in_total", 0) >= sent, 30, f"{sent} events in")
        # Events count as in before the spool has them; a last one, stored after all of
        # them, reaching the dead-letter sink says every one has been routed.
        last = sender.FluentSender("app", host="127.0.0.1", port=port)
        assert last.emit("web", {"message": "the last one"})
        last.close()
        wait_until(lambda: sink_events(daemon, "dead") >= 5, 30, "the last event at the dead-letter sink")
        daemon.stop_gracefully()

    out = lines(tmp_path / "out")
    by_tag: dict[str, list[dict]] = {}
    for line in out:
        by_tag.setdefault(line["tag"], []).append(line)

    web = by_tag["app.web"]
    assert sorted(e["record"]["n"] for e in web) == [i for i in range(100) if i % 10]
    assert all(e["record"]["level"] == "info" and "message" in e["record"] for e in web)

    worker = by_tag["app.worker"]
    assert 5 <= len(worker) <= 50, len(worker)  # about 20 of 200
    assert len({e["record"]["d"] for e in worker}) == len(worker)

    noisy = by_tag["app.noisy"]
    assert 5 <= len(noisy) <= 15, len(noisy)  # the burst, plus 1/s while sending

    access = by_tag["nginx.access"]
    assert sorted(e["record"]["client"] for e in access) == sorted(f"10.0.0.{i}" for i in range(20) if i % 4)
    first = next(e for e in access if e["record"]["client"] == "10.0.0.1")
    assert first["time"] == "2000-10-10T20:55:01.000000000Z" and "ts" not in first["record"]
    assert first["record"]["status"] == 504 and first["record"]["method"] == "GET"

    assert "app.unparsed" not in by_tag and len(out) == len(web) + len(worker) + len(noisy) + len(access)
    dead = lines(tmp_path / "dead")
    assert len(dead) == 5
    assert sorted(json.dumps(d["record"], sort_keys=True).count("plain text") for d in dead) == [0, 0, 1, 1, 1]
    assert {d["record"]["component"] for d in dead} == {"json", "access"}
    assert any(d["record"]["event"].get("message") == "not an access line" for d in dead)
    errors = lake_column(tmp_path / "error_lake", "e")
    assert sorted(errors) == [0, 1, 2, 3, 4]
    assert not any(e["record"].get("level") == "error" for e in out)
    assert not list((tmp_path / "out" / "_staging").rglob("*.jsonl"))


# --- a pathological regex value (issue 28) -----------------------------------------------------

BACKTRACKING_CONFIG = """
[router]
workers = 1

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[filters.words]
type = "parse_regex"
inputs = ["forward"]
pattern = '^(?P<word>(a+)+)$'

[sinks.lake]
type = "parquet"
inputs = ["words"]
path = "lake"
roll_secs = 0.5
"""


def _send_chunk(sock, chunk_id, records):
    events = [(T0 * 10**9 + i, r) for i, r in enumerate(records)]
    sock.sendall(encode_packed_forward("words", events, {"size": len(events), "chunk": chunk_id}))


def _ack_of(sock):
    unpacker = msgpack.Unpacker(raw=False)
    while True:
        data = sock.recv(4096)  # the socket's timeout bounds the wait
        assert data, "connection closed without an ack"
        unpacker.feed(data)
        for reply in unpacker:
            return reply["ack"]


def test_a_value_that_makes_a_regex_backtrack_costs_nothing_and_stops_no_one(tmp_path):
    # Python's re takes ~2**40 steps on it; in RE2 it is one linear pass.
    evil = "a" * 40 + "b"
    with Daemon(tmp_path, BACKTRACKING_CONFIG) as daemon:
        daemon.start()
        port = daemon.port("forward")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as bad, \
                socket.create_connection(("127.0.0.1", port), timeout=30) as good:
            _send_chunk(bad, "evil", [{"message": evil}])
            for i in range(3):  # a normal sender on the same (only) worker, after it
                _send_chunk(good, f"good-{i}", [{"message": "a" * (i + 1)}, {"message": f"hello {i}"}])
                assert _ack_of(good) == f"good-{i}"
            assert _ack_of(bad) == "evil"
        daemon.stop_gracefully()
    rows = read_lake(tmp_path / "lake")
    by_message = {row["message"]: row for row in rows}
    assert len(rows) == 7 and len(by_message) == 7
    assert by_message[evil]["_parse_error"] == "parse_regex: the pattern does not match"
    assert [by_message["a" * n]["word"] for n in (1, 2, 3)] == ["a", "aa", "aaa"]
    assert all(by_message[f"hello {i}"]["_parse_error"] for i in range(3))


# --- dedupe: real duplicates dropped, live and after a kill -9 (issue 28) -----------------------

DEDUPE_CONFIG = """
[router]
workers = 1

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[filters.unique]
type = "dedupe"
inputs = ["forward"]
fields = ["message"]

[sinks.lake]
type = "parquet"
inputs = ["unique"]
path = "lake"
row_group_rows = 1
roll_bytes = 20000   # a padded event fills a file: published at once
roll_secs = 3600     # a small one's file stays open: the cursor stays at its record
"""


def _forward(sock, tag, chunk_id, events):
    sock.sendall(encode_packed_forward(tag, events, {"size": len(events), "chunk": chunk_id}))
    assert _ack_of(sock) == chunk_id


def _messages(path):
    counts: dict[str, int] = {}
    for row in read_lake(path):
        counts[row["message"]] = counts.get(row["message"], 0) + 1
    return counts


def test_dedupe_drops_an_event_sent_twice_and_a_resent_batch_also_after_a_kill_9(tmp_path):
    pad = os.urandom(40_000).hex()  # incompressible enough to fill a file
    event = (T0 * 10**9, {"message": "disk full", "pad": pad})
    batch = [(T0 * 10**9 + i, {"message": f"b{i}", "pad": pad}) for i in range(3)]
    with Daemon(tmp_path, DEDUPE_CONFIG) as daemon:
        daemon.start()
        with socket.create_connection(("127.0.0.1", daemon.port("forward")), timeout=30) as sock:
            _forward(sock, "dup.big", "c1", [event])
            _forward(sock, "dup.big", "c2", batch)
            # Its file stays open: the lake's cursor stays here, before the resends.
            _forward(sock, "dup.hold", "c3", [(T0 * 10**9, {"message": "hold"})])
            _forward(sock, "dup.big", "c4", [event])  # the same event again, its own message, same second
            _forward(sock, "dup.big", "c5", batch)  # the batch resent under a new chunk id
            _forward(sock, "dup.fence", "c6", [(T0 * 10**9, {"message": "fence", "pad": pad})])
        # The lake writes in spool order: once the last record's file is out, every one was decided.
        lake = tmp_path / "lake"
        wait_until(lambda: lake.exists() and "fence" in _messages(lake), 60, "the fence row")
        assert _messages(lake) == {"disk full": 1, "b0": 1, "b1": 1, "b2": 1, "fence": 1}
        daemon.kill()
    # The restart replays the spool from the cursor (the hold record): the resends again.
    with Daemon(tmp_path, DEDUPE_CONFIG) as daemon:
        daemon.start()
        daemon.wait_for(r"sink lake: resuming from spool position")
        daemon.stop_gracefully()
    assert _messages(lake) == {"disk full": 1, "b0": 1, "b1": 1, "b2": 1, "fence": 1, "hold": 1}

"""End to end: forward PackedForward messages through ``grep`` + ``set`` + ``remove`` (and a
``route`` splitting them) into ``parquet`` sinks, in the real daemon on loopback: the lakes
hold exactly the rows the filters keep, changed as they change them (with the extension installed the batch stays
packed through the filters into the lake's columns: tests/unit/test_filters_columnar.py).
"""

from __future__ import annotations

import socket

import msgpack

from daemon import Daemon
from fixtures.forward_encode import encode_packed_forward
from helpers import read_lake, recv_exactly, wait_until

CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[filters.errors_only]
type = "grep"
inputs = ["forward"]
field = "level"
include = "^(error|fatal)$"
exclude = "^fat"

[filters.stamp]
type = "set"
inputs = ["errors_only"]
fields = { env = "prod", source_tag = "${tag}" }

[filters.private]
type = "remove"
inputs = ["stamp"]
fields = ["password", "level"]

[filters.split]
type = "route"
inputs = ["private"]
routes = { late = 'n >= 100 and not (msg == "event 1")' }

[sinks.lake]
type = "parquet"
inputs = ["private"]
path = "lake"
roll_secs = 0.5

[sinks.late]
type = "parquet"
inputs = ["split.late"]
path = "late"
roll_secs = 0.5
"""

T0 = 1_700_000_000 * 10**9


def rows_of(path):
    try:
        return read_lake(path)
    except Exception:  # noqa: BLE001 - no file committed yet
        return []


def test_forward_through_grep_set_remove_lands_the_right_rows(tmp_path):
    levels = ["info", "error", "debug", "fatal", "error"]
    with Daemon(tmp_path, CONFIG) as daemon:
        daemon.start()
        port = daemon.port("forward")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            for message in range(3):
                events = [
                    (T0 + (message * 100 + i) * 1000, {"n": message * 100 + i, "level": levels[i % 5], "password": "x", "msg": f"event {i}"})
                    for i in range(40)
                ]
                conn.sendall(encode_packed_forward("app.web", events, {"chunk": f"c{message}"}))
                ack = msgpack.unpackb(recv_exactly(conn, len(msgpack.packb({"ack": f"c{message}"}))))
                assert ack == {"ack": f"c{message}"}
        kept = sorted(m * 100 + i for m in range(3) for i in range(40) if levels[i % 5] == "error")
        late = [n for n in kept if n >= 100 and n % 100 != 1]
        wait_until(lambda: len(rows_of(tmp_path / "lake")) >= len(kept), 60, f"{len(kept)} rows in the lake")
        wait_until(lambda: len(rows_of(tmp_path / "late")) >= len(late), 60, f"{len(late)} rows in the late lake")
        daemon.stop_gracefully()
    rows = rows_of(tmp_path / "lake")
    assert sorted(row["n"] for row in rows) == kept
    assert all(row["env"] == "prod" and row["source_tag"] == "app.web" for row in rows)
    assert "password" not in rows[0] and "level" not in rows[0]
    assert sorted(row["n"] for row in rows_of(tmp_path / "late")) == late
    assert {row["msg"] for row in rows} == {f"event {i}" for i in range(40) if levels[i % 5] == "error"}

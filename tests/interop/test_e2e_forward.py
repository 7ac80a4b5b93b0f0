"""End to end: the real daemon, real fluent clients, Parquet read back with pyarrow.

Each test starts ``twistd -n logrouter`` on loopback with a temporary config, sends
events, stops the daemon with SIGTERM (a graceful stop commits every open file) and
reads the lake back.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess

import msgpack
import pytest
from fluent import sender

from daemon import TWISTD, Daemon
from helpers import read_lake, recv_exactly, wait_until

CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[filters.app]
type = "match"
inputs = ["forward"]
tag = "app.**"

[filters.stamp]
type = "set"
inputs = ["app"]
fields = { via = "logrouter" }

[sinks.lake]
type = "parquet"
inputs = ["stamp"]
path = "lake"
roll_secs = 3600
"""

T0 = 1_700_000_000  # 2023-11-14T22:13:20Z


def event_time(seconds: int, nanos: int) -> msgpack.ExtType:
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanos))


def packed_forward(tag: str, entries: list, chunk: str) -> bytes:
    """What fluentd's out_forward sends: entries as binary msgpack inside a str32."""
    blob = b"".join(msgpack.packb(e) for e in entries)
    head = msgpack.packb(tag)
    options = msgpack.packb({"size": len(entries), "compressed": "text", "chunk": chunk})
    return b"\x93" + head + b"\xdb" + struct.pack(">I", len(blob)) + blob + options


def wait_for_events(daemon: Daemon, count: int, timeout: float = 30) -> None:
    """Until the router has taken in ``count`` events (bounded by ``timeout``)."""
    wait_until(lambda: daemon.metrics().get("logrouter_events_in_total", 0) >= count, timeout, f"{count} events")


def test_forward_events_land_in_parquet(tmp_path):
    with Daemon(tmp_path, CONFIG) as daemon:
        daemon.start()
        port = daemon.port("forward")

        # The official Python client (Message mode, EventTime with nanoseconds).
        client = sender.FluentSender("app", host="127.0.0.1", port=port, nanosecond_precision=True)
        for i in range(50):
            assert client.emit_with_time("web", T0 + i + 0.25, {"msg": f"hello {i}", "n": i, "ok": i % 2 == 0})
        client.close()

        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            # out_forward's PackedForward with a chunk id ending in a newline: the ack echoes it.
            chunk = "p8n9gmxTQVC8/nh2wlKKeQ==\n"
            entries = [[event_time(T0 + 3600, i), {"message": f"packed {i}", "seq": i}] for i in range(200)]
            sock.sendall(packed_forward("app.packed", entries, chunk))
            expected_ack = b"\x81\xa3ack\xb9" + chunk.encode()
            assert recv_exactly(sock, len(expected_ack)) == expected_ack

            # Forward mode with the ext8 EventTime encoding, then a nil heartbeat.
            ext8 = msgpack.ExtType(0, struct.pack(">II", T0, 5))
            forward = [
                "app.fwd",
                [[ext8, {"k": "v1"}], [T0, {"k": "v2", "bin": b"\xff\x00"}]],
                {"chunk": "c2"},
            ]
            sock.sendall(msgpack.packb(forward) + b"\xc0")
            ack = msgpack.packb({"ack": "c2"})
            assert recv_exactly(sock, len(ack)) == ack

            # A tag the match filter drops is still acknowledged (it was stored).
            sock.sendall(msgpack.packb(["other.tag", T0, {"x": 1}, {"chunk": "c3"}]))
            ack = msgpack.packb({"ack": "c3"})
            assert recv_exactly(sock, len(ack)) == ack

        # The single-event JSON form, acked in JSON.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(json.dumps(["app.json", T0, {"j": 1}, {"chunk": "j1"}]).encode())
            reply = json.loads(recv_exactly(sock, len('{"ack":"j1"}')).decode())
            assert reply == {"ack": "j1"}

        wait_for_events(daemon, 50 + 200 + 2 + 1 + 1)
        daemon.stop_gracefully()

    rows = read_lake(tmp_path / "lake")
    by_tag: dict[str, list[dict]] = {}
    for row in rows:
        by_tag.setdefault(row["tag"], []).append(row)
    assert sorted(by_tag) == ["app.fwd", "app.json", "app.packed", "app.web"]

    web = sorted(by_tag["app.web"], key=lambda r: r["n"])
    assert [r["msg"] for r in web] == [f"hello {i}" for i in range(50)]
    assert [r["ok"] for r in web] == [i % 2 == 0 for i in range(50)]
    assert all(r["via"] == "logrouter" for r in rows)
    assert web[0]["time"].timestamp() == pytest.approx(T0 + 0.25)
    assert str(web[0]["dt"]) == "2023-11-14" and int(web[0]["hour"]) == 22

    packed = sorted(by_tag["app.packed"], key=lambda r: r["seq"])
    assert [r["message"] for r in packed] == [f"packed {i}" for i in range(200)]
    assert int(packed[0]["hour"]) == 23

    fwd = sorted(by_tag["app.fwd"], key=lambda r: r["k"])
    assert [r["k"] for r in fwd] == ["v1", "v2"]
    assert fwd[0]["time"].timestamp() == pytest.approx(T0)
    assert by_tag["app.json"][0]["j"] == 1
    # Nothing is left half-written: no staging files remain, every file was published.
    assert not list((tmp_path / "lake").glob("_staging/**/*.parquet"))


def test_bad_input_closes_only_that_connection(tmp_path):
    with Daemon(tmp_path, CONFIG) as daemon:
        daemon.start()
        port = daemon.port("forward")
        good = socket.create_connection(("127.0.0.1", port), timeout=10)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as bad:
            bad.sendall(b"\x93\xa3app\xc1garbage")  # 0xc1 is never valid msgpack
            assert bad.recv(100) == b""  # closed by the server
        line = daemon.wait_for(r"fluent_forward 127\.0\.0\.1:\d+: .*closing connection")
        assert line
        # The other connection and the daemon carry on.
        good.sendall(msgpack.packb(["app.after", T0, {"still": "works"}, {"chunk": "a1"}]))
        ack = msgpack.packb({"ack": "a1"})
        assert recv_exactly(good, len(ack)) == ack
        good.close()
        daemon.stop_gracefully()
    rows = read_lake(tmp_path / "lake")
    assert [r["still"] for r in rows] == ["works"]


def test_bad_config_refused_with_exit_status_1(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[sources.f]\ntype = "fluent_forward"\nlisten = "tcp:nope"\n[sinks.s]\ntype = "parquet"\ninputs = ["g"]\npath = "x"\n')
    result = subprocess.run(
        [str(TWISTD), "--nodaemon", "--pidfile=", "logrouter", "--config", str(config)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "sources.f.listen: bad endpoint 'tcp:nope'" in result.stderr
    assert "sinks.s.inputs[0]: unknown input 'g'" in result.stderr


def test_graceful_stop_lets_a_lagging_sink_catch_up_first(tmp_path):
    # A tiny queue bound keeps the sink reading from the spool (never fed live), so at
    # SIGTERM it is behind: the stop must let it catch up before it commits.
    config = CONFIG.replace("roll_secs = 3600", "roll_secs = 3600\nmax_queue_bytes = 1024\nhold_sources_secs = 0")
    chunks = 200
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        send_chunks_of_500(daemon, "lag", chunks)
        daemon.stop_gracefully()
        # (with 100,000 events the sink is still behind at SIGTERM: the stop waits for it)
        print("sink caught up during the stop:", "catching up with the spool first" in daemon.output)
    assert_each_event_once(tmp_path, chunks)


def test_a_sink_slower_than_its_sender_holds_the_sender_and_every_event_lands_once(tmp_path):
    # One chunk fills this queue: the source stops reading until the sink has written it,
    # so the sender waits (TCP pushes back) and the sink stays fed live.
    config = CONFIG.replace("roll_secs = 3600", "roll_secs = 3600\nmax_queue_bytes = 4096")
    chunks = 100
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        send_chunks_of_500(daemon, "slow", chunks)
        metrics = daemon.metrics()
        labels = '{sink="lake",type="parquet"}'
        assert metrics[f"logrouter_sink_holds_total{labels}"] >= 1
        assert metrics[f"logrouter_sink_held_seconds_total{labels}"] > 0
        daemon.stop_gracefully()
    assert_each_event_once(tmp_path, chunks)


def send_chunks_of_500(daemon: Daemon, name: str, chunks: int) -> None:
    """``chunks`` PackedForward chunks of 500 events sent back to back, then every ack read."""
    with socket.create_connection(("127.0.0.1", daemon.port("forward")), timeout=30) as sock:
        for n in range(chunks):
            entries = [[event_time(T0, i), {"n": n, "i": i}] for i in range(500)]
            sock.sendall(packed_forward(f"app.{name}", entries, f"{name}-{n}"))
        for n in range(chunks):
            ack = msgpack.packb({"ack": f"{name}-{n}"})
            assert recv_exactly(sock, len(ack)) == ack


def assert_each_event_once(tmp_path, chunks: int) -> None:
    rows = read_lake(tmp_path / "lake")
    assert len(rows) == chunks * 500
    assert len({(r["n"], r["i"]) for r in rows}) == chunks * 500

"""A chain of two real daemons: router A (``fluent_forward`` source → ``lumberjack`` sink)
feeds router B (``lumberjack`` source → ``parquet`` sink) over TLS, B requiring and verifying
A's client certificate and A verifying B's certificate and host name.

A client sends PackedForward chunks to A and waits for every ack (durable in A's spool);
A is stopped gracefully (its sink drains: everything handed over is acknowledged by B, so
durable in B's spool), then B (its lake is committed). B's lake must hold every event
exactly once, with its tag, time (to the microsecond) and fields.
"""

from __future__ import annotations

import base64
import json
import socket
import struct

import msgpack

from daemon import Daemon
from fixtures.pki import make_pki
from logrouter.lake.dataset import lake_dataset

T0 = 1_700_000_000
CONNECTIONS = 2
CHUNKS = 12
EVENTS_PER_CHUNK = 250  # 6,000 events in windows of at most 700


def config_a(port: int, pki) -> str:
    return f"""
[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.next]
type = "lumberjack"
inputs = ["forward"]
hosts = ["localhost:{port}"]
window_size = 700
tls = true
ca_file = {json.dumps(str(pki.ca))}
client_cert = {json.dumps(str(pki.client_cert))}
client_key = {json.dumps(str(pki.client_key))}
"""


def config_b(pki) -> str:
    return f"""
[spool]
path = "spool"

[sources.beats]
type = "lumberjack"
listen = {json.dumps(pki.ssl_endpoint())}
ssl_client_authentication = "required"
ca_file = {json.dumps(str(pki.ca))}
tag = "${{@metadata.tag:-untagged}}"
keep_metadata = false

[sinks.lake]
type = "parquet"
inputs = ["beats"]
path = "lake"
roll_secs = 3600
"""


def event(n: int) -> tuple[msgpack.ExtType, dict]:
    nanos = (n % 1000) * 1000 + 7000  # whole microseconds: the chain keeps them exactly
    record = {"n": n, "msg": f"GET /items/{n} 200", "host": f"web-{n % 7}", "ünï": "cödé"}
    if n % 10 == 0:
        record["raw"] = bytes([n % 256, 0xFF])  # msgpack bin → base64 in the JSON
    if n % 15 == 0:
        record["ctx"] = {"user": n, "tags": ["a", "b"]}
    return msgpack.ExtType(0, struct.pack(">II", T0 + n, nanos)), record


def packed_forward(tag: str, numbers: range, chunk: str) -> bytes:
    blob = b"".join(msgpack.packb([*event(n)]) for n in numbers)
    options = msgpack.packb({"size": len(numbers), "compressed": "text", "chunk": chunk})
    return b"\x93" + msgpack.packb(tag) + b"\xdb" + struct.pack(">I", len(blob)) + blob + options


def send_all(port: int) -> dict[int, str]:
    """Every chunk sent and acked by A; returns event number → tag."""
    sent: dict[int, str] = {}
    n = 0
    for c in range(CONNECTIONS):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            unpacker = msgpack.Unpacker()
            waiting = set()
            for k in range(CHUNKS):
                tag = "app.web" if k % 3 else "app.db"
                numbers = range(n, n + EVENTS_PER_CHUNK)
                n += EVENTS_PER_CHUNK
                chunk = f"c{c}-{k}"
                sock.sendall(packed_forward(tag, numbers, chunk))
                waiting.add(chunk)
                sent.update((i, tag) for i in numbers)
            while waiting:  # bounded by the socket timeout
                data = sock.recv(65536)
                assert data, f"A closed the connection with chunks {sorted(waiting)} unacked"
                unpacker.feed(data)
                for reply in unpacker:
                    waiting.discard(reply["ack"])
    return sent


def test_forward_to_lumberjack_chain_over_mutual_tls_exactly_once(tmp_path):
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with Daemon(tmp_path / "b", config_b(pki)) as b:
        b.start()
        with Daemon(tmp_path / "a", config_a(b.port("beats"), pki)) as a:
            a.start()
            sent = send_all(a.port("forward"))
            a.wait_for(r"lumberjack sink next: connected to localhost:\d+ over TLS")
            a.stop_gracefully()
            assert "lumberjack sink next failed" not in a.output, a.output
            assert "not acknowledged" not in a.output, a.output
        b.stop_gracefully()
        assert "TLS handshake failed" not in b.output, b.output

    rows = lake_dataset(str(tmp_path / "b" / "lake")).to_table().to_pylist()
    numbers = [r["n"] for r in rows]
    assert len(numbers) == len(sent) == CONNECTIONS * CHUNKS * EVENTS_PER_CHUNK
    assert sorted(numbers) == sorted(sent)  # every event, exactly once
    for row in rows:
        n = row["n"]
        assert row["tag"] == sent[n]
        assert row["msg"] == f"GET /items/{n} 200" and row["host"] == f"web-{n % 7}" and row["ünï"] == "cödé"
        expected_us = (T0 + n) * 1_000_000 + (n % 1000) + 7
        stamp = row["time"]
        assert int(stamp.timestamp()) * 1_000_000 + stamp.microsecond == expected_us
        extra = json.loads(row["_extra"]) if row.get("_extra") else {}
        assert "@metadata" not in extra  # keep_metadata = false on B
        if n % 10 == 0:
            raw = row["raw"] if row.get("raw") is not None else extra["raw"]
            assert base64.b64decode(raw) == bytes([n % 256, 0xFF])
        if n % 15 == 0:
            assert extra["ctx"] == {"user": n, "tags": ["a", "b"]}


def test_tls_refusals_keep_events_in_the_spool_until_a_good_restart(tmp_path):
    """A trusting the wrong CA, then A without a client certificate: both fail (logged,
    retried) and nothing reaches B; the acked events wait in A's spool. A restarted with
    the right settings delivers them all, once."""
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    numbers = range(0, 300)
    with Daemon(tmp_path / "b", config_b(pki)) as b:
        b.start()
        port = b.port("beats")
        good = config_a(port, pki)
        wrong_ca = good.replace(json.dumps(str(pki.ca)), json.dumps(str(pki.rogue_ca)))
        no_cert = "\n".join(line for line in good.splitlines() if not line.startswith("client_"))
        for stage, (text, reason) in enumerate(((wrong_ca, "certificate verify failed"), (no_cert, "certificate required"))):
            with Daemon(tmp_path / "a", text) as a:
                a.start()
                with socket.create_connection(("127.0.0.1", a.port("forward")), timeout=30) as sock:
                    chunk = f"stage-{stage}"
                    sock.sendall(packed_forward("app.web", numbers if stage == 0 else range(300, 400), chunk))
                    reply = msgpack.unpackb(recv_reply(sock))
                    assert reply == {"ack": chunk}  # durable in A's spool
                a.wait_for(rf"lumberjack sink next failed: connection to localhost:{port} lost .*{reason}.*retrying from spool position 0")
                a.stop_gracefully()
        b.wait_for(r"TLS handshake failed: client certificate required but none was sent")
        with Daemon(tmp_path / "a", good) as a:
            a.start()
            a.wait_for(r"sink next: resuming from spool position 0 \(\d+ bytes to replay\)")
            a.stop_gracefully()  # drains: everything acked by B
            assert "failed" not in a.output, a.output
        b.stop_gracefully()
    rows = lake_dataset(str(tmp_path / "b" / "lake")).to_table().to_pylist()
    assert sorted(r["n"] for r in rows) == list(range(400))


def recv_reply(sock: socket.socket) -> bytes:
    """One msgpack reply (the forward source's {"ack": …})."""
    unpacker = msgpack.Unpacker()
    while True:
        data = sock.recv(4096)
        assert data, "closed before the ack"
        unpacker.feed(data)
        for reply in unpacker:
            return msgpack.packb(reply)

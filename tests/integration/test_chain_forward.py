"""Chained routers, end to end: A (forward source → ``fluent_forward`` sink) feeds
B (forward source → parquet), both real daemons on loopback, with mutual TLS, the
shared-key handshake and gzip between them.

1. Events sent to A land in B's lake exactly once after both stop gracefully.
2. A is killed with SIGKILL mid-stream (chunks in flight from the client to A and from A
   to B) and restarted; its sink state is even rewound to cursor 0, as if it had never
   saved progress, so A resends everything its spool holds. Because chunk ids derive
   from spool positions (and the events), B recognises every resent chunk (counted in
   ``logrouter_duplicates_total``) and its lake holds every acked event exactly once.
3. B is killed with SIGKILL mid-stream and restarted on the same port while A keeps
   taking events: A marks it down, backs off, retries, resends what B never acked
   (same ids), and B's lake again holds every event exactly once.

Bounds: CHUNKS chunks of EVENTS_PER_CHUNK events, every wait time-limited, loopback only;
every daemon is stopped by the test (or killed by ``Daemon.__exit__``).
"""

from __future__ import annotations

import collections
import json
import socket
from pathlib import Path

import msgpack
import pytest

from helpers import wait_until
from daemon import Daemon
from logrouter.lake.dataset import lake_dataset
from fixtures.forward_encode import encode_packed_forward

CHUNKS = 300
EVENTS_PER_CHUNK = 20
T0 = 1_700_000_000 * 10**9


def config_b(pki, port: int = 0) -> str:
    return f"""
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.from_a]
type = "fluent_forward"
listen = '{pki.ssl_endpoint(port)}'
verify_client = true
ca_file = '{pki.ca}'
shared_key = "chain-key"
self_hostname = "router-b.test"

[sinks.lake]
type = "parquet"
inputs = ["from_a"]
path = "lake"
roll_secs = 3600
"""


def config_a(pki, b_port: int, heartbeat: str, segment_bytes: int = 65536) -> str:
    return f"""
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"
segment_bytes = {segment_bytes}

[sources.clients]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.to_b]
type = "fluent_forward"
inputs = ["clients"]
servers = [{{ host = "127.0.0.1", port = {b_port} }}]
tls = true
ca_file = '{pki.ca}'
client_cert = '{pki.client_cert}'
client_key = '{pki.client_key}'
shared_key = "chain-key"
self_hostname = "router-a.test"
compress = "gzip"
heartbeat_type = "{heartbeat}"
ack_response_timeout_secs = 20
retry_initial_secs = 0.2
retry_max_secs = 1
"""


def sink_lag(daemon: Daemon) -> float:
    return daemon.metrics()['logrouter_sink_lag_bytes{sink="to_b",type="fluent_forward"}']


def chunk(n: int) -> tuple[bytes, bytes]:
    events = [
        (T0 + n * 1000 + i, {"id": f"{n}-{i}", "n": n, "i": i, "msg": "chained " * 4, "bin": b"\x00\xff"})
        for i in range(EVENTS_PER_CHUNK)
    ]
    chunk_id = f"client-{n:05d}"
    return encode_packed_forward(f"chain.t{n % 3}", events, {"size": EVENTS_PER_CHUNK, "chunk": chunk_id}), chunk_id.encode()


class Client:
    """A forward client with chunk ids, like out_forward: one chunk at a time, or a burst."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.unpacker = msgpack.Unpacker(raw=True)

    def send_and_wait(self, numbers: range) -> None:
        for n in numbers:
            message, chunk_id = chunk(n)
            self.sock.sendall(message)
            reply = None
            while reply is None:
                data = self.sock.recv(4096)
                assert data, "connection closed by the router"
                self.unpacker.feed(data)
                reply = next(iter(self.unpacker), None)
            assert reply == {b"ack": chunk_id}, reply

    def burst(self, numbers: range) -> None:
        self.sock.sendall(b"".join(chunk(n)[0] for n in numbers))

    def close(self) -> None:
        self.sock.close()


def lake_ids(path: Path) -> list[str]:
    return lake_dataset(str(path)).to_table(columns=["id"]).column("id").to_pylist()


def assert_exactly_once(path: Path, chunks: int) -> None:
    ids = lake_ids(path)
    counts = collections.Counter(ids)
    doubled = {k: v for k, v in counts.items() if v > 1}
    assert not doubled, f"{len(doubled)} events stored more than once, e.g. {list(doubled.items())[:5]}"
    expected = {f"{n}-{i}" for n in range(chunks) for i in range(EVENTS_PER_CHUNK)}
    missing = expected - set(counts)
    assert not missing, f"{len(missing)} events missing, e.g. {sorted(missing)[:5]}"
    assert len(ids) == len(expected)


def test_chain_tls_shared_key_gzip_exactly_once(tmp_path, pki):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with Daemon(tmp_path / "b", config_b(pki)) as b:
        b.start()
        with Daemon(tmp_path / "a", config_a(pki, b.port("from_a"), "udp")) as a:
            a.start()
            client = Client(a.port("clients"))
            client.send_and_wait(range(100))
            client.close()
            wait_until(lambda: sink_lag(a) == 0, 60, "A to forward everything to B")
            sent = a.metrics()
            a.stop_gracefully()
        assert "to_b: connected to 127.0.0.1" in a.output and "over TLS, handshake done with 'router-b.test'" in a.output
        assert sent['logrouter_sink_events_in_total{sink="to_b",type="fluent_forward"}'] == 100 * EVENTS_PER_CHUNK
        b.stop_gracefully()

    assert_exactly_once(tmp_path / "b" / "lake", 100)
    rows = lake_dataset(str(tmp_path / "b" / "lake")).to_table().to_pylist()
    first = min(rows, key=lambda r: (r["n"], r["i"]))
    assert first["tag"] == "chain.t0" and first["msg"] == "chained " * 4 and first["bin"] == b"\x00\xff"
    assert first["time"].timestamp() == pytest.approx(T0 / 1e9)
    assert sorted({r["tag"] for r in rows}) == ["chain.t0", "chain.t1", "chain.t2"]


def test_chain_survives_kill_9_of_the_forwarder(tmp_path, pki):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with Daemon(tmp_path / "b", config_b(pki)) as b:
        b.start()
        a_config = config_a(pki, b.port("from_a"), "tcp", segment_bytes=64 << 20)
        with Daemon(tmp_path / "a", a_config) as a:
            a.start()
            client = Client(a.port("clients"))
            client.send_and_wait(range(150))
            wait_until(lambda: b.metrics()["logrouter_events_in_total"] >= 20 * EVENTS_PER_CHUNK, 30, "B to receive")
            client.burst(range(150, 200))  # in flight from the client to A, and from A to B
            a.kill()
            client.close()

        # As if A had crashed before ever saving its cursor: everything is replayed.
        state_path = tmp_path / "a" / "spool" / "sinks" / "to_b.json"
        state = json.loads(state_path.read_text())
        assert len(state["spool_id"]) == 32  # the cursor it saved (at most once a second) is dropped
        state_path.write_text(json.dumps({"cursor": 0, "spool_id": state["spool_id"]}))

        with Daemon(tmp_path / "a", a_config) as a:
            a.start()
            assert a.wait_for(r"sink to_b: resuming from spool position \d+ \((\d+) bytes to replay\)")
            client = Client(a.port("clients"))
            client.send_and_wait(range(150, CHUNKS))  # the client resends what it has no ack for
            client.close()
            wait_until(lambda: sink_lag(a) == 0, 60, "A to forward everything to B")
            a.stop_gracefully()
        duplicates = b.metrics()["logrouter_duplicates_total"]
        assert duplicates > 0, "A's replay should have resent chunks B already had"
        b.stop_gracefully()
    print(f"B recognised {duplicates:.0f} resent chunk(s)")
    assert_exactly_once(tmp_path / "b" / "lake", CHUNKS)


def test_chain_survives_kill_9_of_the_receiver(tmp_path, pki):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with Daemon(tmp_path / "b", config_b(pki)) as b:
        b.start()
        b_port = b.port("from_a")
        with Daemon(tmp_path / "a", config_a(pki, b_port, "tcp")) as a:
            a.start()
            client = Client(a.port("clients"))
            client.send_and_wait(range(100))
            wait_until(lambda: b.metrics()["logrouter_events_in_total"] >= 30 * EVENTS_PER_CHUNK, 30, "B to receive")
            b.kill()
            client.send_and_wait(range(100, 200))  # A stores and acks; its sink waits for B
            a.wait_for(rf"sink to_b: server 127\.0\.0\.1:{b_port} is down")
            a.wait_for(r"fluent_forward sink to_b failed: no server available")
            with Daemon(tmp_path / "b", config_b(pki, b_port)) as b2:
                b2.start()
                client.send_and_wait(range(200, 250))
                client.close()
                wait_until(lambda: sink_lag(a) == 0, 60, "A to forward everything to the restarted B")
                a.stop_gracefully()
                b2.stop_gracefully()
    assert_exactly_once(tmp_path / "b" / "lake", 250)

"""Interop: our ``fluent_forward`` sink sending to a forward server written by others.

The server is npm ``@fluent-org/logger``'s ``FluentServer`` (``tests/interop/
fluent_org_server.js``), which acks every chunk and prints each event it receives as a
JSON line. The real daemon (forward source → ``fluent_forward`` sink) forwards what a
client sends it; the events must arrive with their tags, records and nanosecond
EventTimes. Checked: plain TCP; TLS + shared key + user auth + gzip with TCP heartbeats
over TLS; mutual TLS (the server asks for our client certificate); and a wrong shared
key, refused by the server's PONG and logged by the sink.

Skipped (with the reason) only when node or the npm module is missing. Every wait is
time-limited; the Node process exits when its stdin closes (and on a watchdog).
"""

from __future__ import annotations

import base64
import json
import os
import queue
import subprocess
import threading
import time
import urllib.request


from daemon import Daemon
from fixtures.forward_encode import encode_packed_forward
from test_interop_fluent_node import INTEROP, NODE, require

T0 = 1_700_000_000 * 10**9
EVENTS = 60


class NodeServer:
    """``fluent_org_server.js`` in a child process; its JSON lines read by a thread."""

    def __init__(self, settings: dict) -> None:
        env = dict(os.environ, NODE_PATH=str(INTEROP / "node_modules"))
        self.process = subprocess.Popen(
            [NODE, str(INTEROP / "fluent_org_server.js"), json.dumps({"timeoutMs": 120000, **settings})],
            cwd=INTEROP,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.process.stderr), daemon=True).start()
        self.port = self.next(timeout=30)["listening"]

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def next(self, timeout: float) -> dict:
        try:
            item = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output from the node server within {timeout}s; stderr: {''.join(self.stderr)}") from None
        if item is None:
            raise AssertionError(f"node server exited ({self.process.poll()}): {''.join(self.stderr)}")
        return item

    def events(self, count: int, timeout: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout
        got = []
        while len(got) < count:
            got.append(self.next(max(0.1, deadline - time.monotonic())))
        return got

    def rest(self, timeout: float = 30) -> list[dict]:
        """Stop the server and return every line it printed that was not read yet."""
        self.stop()
        lines = []
        deadline = time.monotonic() + timeout
        while (item := self.lines.get(timeout=max(0.1, deadline - time.monotonic()))) is not None:
            lines.append(item)
        return lines

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def __enter__(self) -> "NodeServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def router_config(port: int, sink_options: str) -> str:
    return f"""
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.clients]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.node]
type = "fluent_forward"
inputs = ["clients"]
servers = [{{ host = "127.0.0.1", port = {port} }}]
retry_initial_secs = 0.2
retry_max_secs = 1
{sink_options}
"""


def metrics(daemon: Daemon) -> dict[str, float]:
    port = int(daemon.wait_for(r"metrics listening on \S+ port (\d+)").group(1))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))}


def send_to_router(daemon: Daemon, label: str) -> None:
    import socket

    import msgpack

    events = [
        (T0 + i * 1_000_000_007, {"seq": i, "msg": f"{label} {i}", "bin": b"\x01\x02", "nested": {"k": [i, "v"]}})
        for i in range(EVENTS)
    ]
    with socket.create_connection(("127.0.0.1", daemon.port("clients")), timeout=30) as sock:
        unpacker = msgpack.Unpacker(raw=True)
        for start in range(0, EVENTS, 20):  # three chunks: three records, three messages to the server
            chunk = f"{label}-{start}"
            sock.sendall(encode_packed_forward(f"interop.{label}", events[start : start + 20], {"chunk": chunk}))
            reply = None
            while reply is None:
                data = sock.recv(4096)
                assert data, "router closed the connection"
                unpacker.feed(data)
                reply = next(iter(unpacker), None)
            assert reply == {b"ack": chunk.encode()}


def check_events(received: list[dict], label: str) -> None:
    assert len(received) == EVENTS
    by_seq = {e["record"]["seq"]: e for e in received}
    assert sorted(by_seq) == list(range(EVENTS))  # each once
    first = by_seq[1]
    assert first["tag"] == f"interop.{label}"
    assert first["record"]["msg"] == f"{label} 1" and first["record"]["nested"] == {"k": [1, "v"]}
    assert base64.b64decode(first["record"]["bin"]["$bytes"]) == b"\x01\x02"
    seconds, nanos = divmod(T0 + 1_000_000_007, 10**9)
    assert first["time"] == [seconds, nanos]  # EventTime with its nanoseconds


def forward_through_router(tmp_path, server: NodeServer, sink_options: str, label: str) -> Daemon:
    daemon = Daemon(tmp_path, router_config(server.port, sink_options))
    daemon.start()
    send_to_router(daemon, label)
    check_events(server.events(EVENTS), label)
    lag = 'logrouter_sink_lag_bytes{sink="node",type="fluent_forward"}'
    deadline = time.monotonic() + 30
    while metrics(daemon)[lag] != 0:  # acked: the cursor reached the spool's end
        assert time.monotonic() < deadline, "the sink's cursor did not reach the end"
        time.sleep(0.05)
    return daemon


def test_plain_tcp(tmp_path):
    require("@fluent-org/logger")
    with NodeServer({}) as server:
        with forward_through_router(tmp_path, server, 'heartbeat_type = "tcp"', "plain") as daemon:
            daemon.stop_gracefully()
    assert "sink node: connected to 127.0.0.1" in daemon.output


def test_tls_shared_key_user_auth_gzip(tmp_path, pki):
    require("@fluent-org/logger")
    settings = {
        "tls": {"key": str(pki.server_key), "cert": str(pki.server_cert)},
        "security": {"serverHostname": "node-server.test", "sharedKey": "interop-key", "users": {"alice": "alice-pw"}},
    }
    sink = f"""
tls = true
ca_file = '{pki.ca}'
shared_key = "interop-key"
self_hostname = "router.test"
username = "alice"
password = "alice-pw"
compress = "gzip"
heartbeat_type = "tcp"
heartbeat_interval_secs = 0.2
"""
    with NodeServer(settings) as server:
        with forward_through_router(tmp_path, server, sink, "secure") as daemon:
            daemon.stop_gracefully()
    assert "over TLS, handshake done with 'node-server.test'" in daemon.output


def test_mutual_tls(tmp_path, pki):
    require("@fluent-org/logger")
    settings = {
        "tls": {"key": str(pki.server_key), "cert": str(pki.server_cert), "ca": str(pki.ca), "requestCert": True},
        "security": {"serverHostname": "node-server.test", "sharedKey": "k"},
    }
    sink = f"""
tls = true
ca_file = '{pki.ca}'
client_cert = '{pki.client_cert}'
client_key = '{pki.client_key}'
shared_key = "k"
self_hostname = "router.test"
"""
    with NodeServer(settings) as server:
        with forward_through_router(tmp_path, server, sink, "mtls") as daemon:
            daemon.stop_gracefully()


def test_wrong_shared_key_is_refused_and_logged(tmp_path):
    require("@fluent-org/logger")
    settings = {"security": {"serverHostname": "node-server.test", "sharedKey": "right"}}
    sink = 'shared_key = "wrong"\nself_hostname = "router.test"\nheartbeat_type = "none"\n'
    with NodeServer(settings) as server:
        with Daemon(tmp_path, router_config(server.port, sink)) as daemon:
            daemon.start()
            send_to_router(daemon, "refused")  # stored and acked by the router; held in its spool
            daemon.wait_for(
                rf"sink node: server 127\.0\.0\.1:{server.port} is down: handshake failed: "
                r"authentication failed \(shared key mismatch\)"
            )
            daemon.wait_for(r"fluent_forward sink node failed: no server available .*retrying from spool position 0")
            daemon.stop_gracefully()
        assert server.rest() == []  # nothing got through

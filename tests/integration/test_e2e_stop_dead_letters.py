"""A graceful stop delivers the dead letters of what it acked: the real daemon, a
``parse_json`` filter whose failures go to a ``file`` sink, a client that waits for its
ack, SIGTERM at once. The dead letters are then still on their way into the spool (long
records: storing them takes a while); the dead-letter file must hold every one after that
stop, not only after the next start. (A stop while sinks catch up, which reports failures
during the stop itself, is tested on the router in ``test_dead_letters.py``.)

Bounds: one chunk of EVENTS events, every wait time-limited, the daemon stopped."""

from __future__ import annotations

import json
import socket

import msgpack

from daemon import Daemon
from fixtures.forward_encode import encode_packed_forward

EVENTS = 100
PAD = "x" * 200_000
T0 = 1_700_000_000 * 10**9

CONFIG = """
[router]
workers = 1

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[filters.json]
type = "parse_json"
inputs = ["forward"]
on_error = "error"

[sinks.out]
type = "file"
inputs = ["json"]
path = "out"
roll_secs = 3600

[sinks.dead]
type = "file"
inputs = ["json.errors"]
path = "dead"
roll_secs = 3600
"""


def send_acked(port: int) -> None:
    """One chunk, every other event long and not JSON; returns once it is acked."""
    events = [(T0 + n, {"message": json.dumps({"n": n}) if n % 2 == 0 else f"plain {n} " + PAD}) for n in range(EVENTS)]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(encode_packed_forward("app.web", events, {"size": EVENTS, "chunk": "c-1"}))
        unpacker = msgpack.Unpacker(raw=True)
        reply = None
        while reply is None:
            data = sock.recv(4096)
            assert data, "connection closed before the ack"
            unpacker.feed(data)
            reply = next(iter(unpacker), None)
    assert reply == {b"ack": b"c-1"}


def lines(directory) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]


def test_dead_letters_of_acked_events_are_in_the_file_sink_right_after_a_graceful_stop(tmp_path):
    with Daemon(tmp_path, CONFIG) as daemon:
        daemon.start()
        send_acked(daemon.port("forward"))
        daemon.stop_gracefully()
    assert sorted(line["record"]["n"] for line in lines(tmp_path / "out")) == list(range(0, EVENTS, 2))
    dead = lines(tmp_path / "dead")
    assert sorted(line["record"]["event"]["message"] for line in dead) == sorted(f"plain {n} " + PAD for n in range(1, EVENTS, 2))
    assert {line["record"]["component"] for line in dead} == {"json"}

"""A reload removes a source while the sink it fed is held back (its staging directory
is blocked, so it fails, retries and catches up from the spool): every event the source
had acked still reaches that sink through the route it had (its filter included), once,
also when the daemon is restarted after the reload, before the sink got them.

Bounds: CHUNKS chunks of EVENTS_PER_CHUNK events, every wait time-limited, every daemon
stopped."""

from __future__ import annotations

import json
import shutil
import signal
import socket

import msgpack
import pytest

from chunk_client import EVENTS_PER_CHUNK, chunk_message
from daemon import Daemon
from helpers import wait_until

CHUNKS = 20

CONFIG = """
[router]
workers = 1

[spool]
path = "spool"

[sources.keep]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"
{gone}
[sinks.out]
type = "file"
inputs = [{inputs}]
path = "out"
roll_secs = 0.5
retry_initial_secs = 0.1
retry_max_secs = 0.5
"""
GONE = """
[sources.gone]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[filters.mark]
type = "set"
inputs = ["gone"]
fields = { via = "mark" }
"""
BEFORE = CONFIG.format(gone=GONE, inputs='"keep", "mark"')
AFTER = CONFIG.format(gone="", inputs='"keep"')


def send_acked(port: int, chunks: range) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        unpacker = msgpack.Unpacker(raw=True)
        for chunk_no in chunks:
            message, chunk_id = chunk_message(chunk_no)
            sock.sendall(message)
            reply = None
            while reply is None:
                data = sock.recv(4096)
                assert data, "connection closed before the ack"
                unpacker.feed(data)
                reply = next(iter(unpacker), None)
            assert reply == {b"ack": chunk_id}


def records(tmp_path) -> list[dict]:
    return [json.loads(line)["record"] for path in (tmp_path / "out").glob("*.jsonl") for line in path.read_text().splitlines()]


def block(tmp_path):
    """The sink's staging directory becomes a file: it cannot open a file until unblocked."""
    staging = tmp_path / "out" / "_staging" / "out"
    shutil.rmtree(staging)
    staging.write_text("not a directory")
    return staging


@pytest.mark.parametrize("restart", [False, True], ids=["reload", "reload-then-restart"])
def test_a_removed_sources_acked_events_reach_the_held_sink(tmp_path, restart):
    expected = sorted(f"{c}-{i}" for c in range(CHUNKS) for i in range(EVENTS_PER_CHUNK))
    with Daemon(tmp_path, BEFORE) as daemon:
        daemon.start()
        blocker = block(tmp_path)
        send_acked(daemon.port("gone"), range(CHUNKS))
        daemon.wait_for(r"file sink out failed")
        daemon.config.write_text(AFTER)
        daemon.process.send_signal(signal.SIGHUP)
        summary = daemon.wait_for(r"config reloaded: .*").group(0)
        assert "sources stopped: gone" in summary and "gone → out (until spool position" in summary, summary
        if restart:
            daemon.stop_gracefully()  # the sink is still behind the removed source's events
            assert records(tmp_path) == []
        else:
            blocker.unlink()
            wait_until(lambda: len(records(tmp_path)) >= len(expected), 60, "the removed source's events in the sink")
            daemon.stop_gracefully()
    if restart:
        blocker.unlink()
        with Daemon(tmp_path, AFTER) as daemon:
            daemon.start()
            wait_until(lambda: len(records(tmp_path)) >= len(expected), 60, "the removed source's events in the sink")
            daemon.wait_for(r"removed sources gone: every sink passed their stored batches")
            daemon.stop_gracefully()
    got = records(tmp_path)
    assert sorted(r["id"] for r in got) == expected  # every one, once
    assert all(r["via"] == "mark" for r in got)

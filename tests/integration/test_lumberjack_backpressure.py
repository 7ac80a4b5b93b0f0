"""A stalled pipeline gives Beats keepalive ACKs, not a client timeout: the real daemon.

The parquet sink is broken (its staging directory is a plain file), so the spool backlog
passes `spool.max_bytes` and the sources pause while a Beats-style client is in the middle
of a large window. The client must keep receiving ACK 0 every `keepalive_secs` (Beats
reconnects and resends after 30 s without one). Once the sink is repaired the rest of the
window is read, acknowledged, and lands once.

Bounds: one window of EVENTS events; every wait is time-limited; loopback only.
"""

from __future__ import annotations

import socket
import threading

from daemon import Daemon
from helpers import lake_column, wait_until
from logrouter.wire import lumberjack as lj

EVENTS = 6000

CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"
max_bytes = 262144
segment_bytes = 131072

[sources.beats]
type = "lumberjack"
listen = "tcp:0:interface=127.0.0.1"
keepalive_secs = 1

[sinks.lake]
type = "parquet"
inputs = ["beats"]
path = "lake"
writer_id = "lj"
roll_secs = 0.5
retry_initial_secs = 0.1
retry_max_secs = 0.5
"""


def test_paused_mid_window_keeps_beats_alive_with_ack_0(tmp_path):
    with Daemon(tmp_path, CONFIG) as daemon:
        daemon.start()
        blocker = tmp_path / "lake" / "_staging" / "lj"
        blocker.parent.mkdir(parents=True)
        blocker.write_text("the sink cannot stage files until this is removed")

        sock = socket.create_connection(("127.0.0.1", daemon.port("beats")), timeout=30)
        frames = b"".join(
            lj.encode_json(i + 1, {"message": f"line {i} " + "z" * 150, "i": i}) for i in range(EVENTS)
        )
        sender = threading.Thread(target=sock.sendall, args=(lj.encode_window(EVENTS) + frames,), daemon=True)
        sender.start()

        decoder = lj.AckDecoder()
        acks: list[int] = []

        def read_acks() -> None:
            data = sock.recv(4096)
            assert data, "the daemon closed the connection"
            acks.extend(a.seq for a in decoder.feed(data))

        wait_until(lambda: daemon.metrics().get("logrouter_sources_paused") == 1, 60, "sources to pause")
        partial = max(acks, default=0)
        keepalives = 0
        while keepalives < 3:  # three keepalive intervals while paused
            before = len(acks)
            read_acks()
            keepalives += sum(1 for seq in acks[before:] if seq == 0)
        assert max(acks) < EVENTS  # the window is not complete yet
        assert partial <= max(acks)

        blocker.unlink()
        while not acks or acks[-1] != EVENTS:  # bounded by the socket timeout
            read_acks()
        sender.join(30)
        sock.close()
        daemon.stop_gracefully()

    ids = lake_column(tmp_path / "lake", "i")
    assert sorted(ids) == list(range(EVENTS))

"""A stop that comes while the router is still starting never writes a row twice.

The router reads its dedupe window back and its sinks replay the spool from their
cursors before it listens (both lake sinks: ``parquet`` and ``iceberg``). A SIGTERM in that window used to start the graceful stop
alongside the start: sinks that had not yet read their commit record were fed the spool
from position 0 and committed it again, so every acked event landed twice.
"""

from __future__ import annotations

import collections
import socket
import threading
import time

import pytest
from twisted.internet import defer

from chunk_client import EVENTS_PER_CHUNK, chunk_message, expected_ids
from daemon import Daemon
from helpers import recv_exactly, spin
from lake_sinks import KINDS, column, with_sink
from logrouter.config.load import load_string
from logrouter.router import Router
from logrouter.wire.fluent_forward import encode_ack

CHUNKS = 60

CONFIG = """
[spool]
path = "{root}/spool"
segment_bytes = 8388608        # one segment: what was committed is still in the spool

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "{root}/lake"
roll_secs = 3600               # nothing is sealed while the chunks arrive
"""


@pytest.fixture
def reactor(threaded_reactor):
    return threaded_reactor


def run(reactor, d: defer.Deferred, timeout: float = 60):
    return spin(reactor, d, timeout)


def send_chunks(port: int, chunks: range) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for n in chunks:
            message, chunk_id = chunk_message(n)
            sock.sendall(message)
            ack = encode_ack(chunk_id)
            assert recv_exactly(sock, len(ack)) == ack


@pytest.mark.parametrize("sink", KINDS)
@pytest.mark.parametrize("stop_at", ["loading_dedupe", "sinks_replaying"])
def test_a_stop_during_start_writes_nothing_twice(tmp_path, stop_at, reactor, sink):
    config_text = with_sink(CONFIG.format(root=tmp_path), sink)
    # Half the chunks committed to the lake by a graceful stop, half acked and then lost
    # to a kill, so a start has a spool to replay and a commit record to respect.
    with Daemon(tmp_path, config_text) as daemon:
        daemon.start()
        send_chunks(daemon.port("forward"), range(CHUNKS // 2))
        daemon.stop_gracefully()
    with Daemon(tmp_path, config_text) as daemon:
        daemon.start()
        send_chunks(daemon.port("forward"), range(CHUNKS // 2, CHUNKS))
        daemon.kill()
    (tmp_path / "spool" / "dedupe.msgpack").unlink(missing_ok=True)  # no snapshot: read back from the spool

    router = Router(load_string(config_text), reactor)
    # Reading the dedupe window back takes long on a big spool (1.5M events in the report):
    # a gate holds it until the stop has had every chance to run alongside the start.
    gate = threading.Event()
    load_ids = router.snapshots.load_ids
    router.snapshots.load_ids = lambda stopping: (gate.wait(30), load_ids(stopping))
    starting = router.start()
    if stop_at == "sinks_replaying":
        gate.set()
        run(reactor, starting)
        assert any(feed.reading is not None or not feed.live for feed in router.feeds.values())
    stopped = router.stop()
    deadline = time.monotonic() + 2
    while not stopped.called and time.monotonic() < deadline:
        reactor.iterate(0.01)
    gate.set()
    run(reactor, stopped)
    run(reactor, starting)

    with Daemon(tmp_path, config_text) as daemon:
        daemon.start()
        daemon.stop_gracefully()
    ids = column(sink, tmp_path / "lake", "id")
    doubled = [i for i, c in collections.Counter(ids).items() if c > 1]
    assert not doubled, f"{len(doubled)} ids landed more than once, e.g. {doubled[:5]}"
    assert set(ids) == expected_ids(range(CHUNKS))
    assert len(ids) == CHUNKS * EVENTS_PER_CHUNK

"""Backpressure end to end: a failing sink fills the spool, sources pause, memory stays
bounded; once the sink recovers everything stored is delivered, once.

The sink (``parquet`` or ``iceberg``) is broken the way a full or broken disk breaks it:
its staging directory is replaced by a plain file, so every attempt to open a Parquet
file fails. It retries with
backoff; when the blocker is removed the next retry catches up from the spool.

Bounds: CHUNKS chunks of EVENTS_PER_CHUNK events, every wait time-limited, loopback only.
"""

from __future__ import annotations

import collections
import socket
import threading

import msgpack
import pytest

from daemon import Daemon
from helpers import rss_mib, wait_until
from lake_sinks import KINDS, column, with_sink
from fixtures.forward_encode import encode_packed_forward

CHUNKS = 120
EVENTS_PER_CHUNK = 1000
MAX_SPOOL_BYTES = 3 << 20
T0 = 1_700_000_000 * 10**9

CONFIG = f"""
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"
max_bytes = {MAX_SPOOL_BYTES}
segment_bytes = 1048576

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
writer_id = "bp"
roll_secs = 0.5
retry_initial_secs = 0.1
retry_max_secs = 0.5
max_queue_bytes = 1048576
"""


class Sender(threading.Thread):
    """Sends every chunk, each waiting for its ack, like out_forward with require_ack_response."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.acked = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=120) as sock:
                unpacker = msgpack.Unpacker(raw=True)
                for n in range(CHUNKS):
                    chunk = f"bp-{n}"
                    events = [(T0 + i, {"id": f"{n}-{i}", "msg": "y" * 60}) for i in range(EVENTS_PER_CHUNK)]
                    sock.sendall(encode_packed_forward("bp.test", events, {"chunk": chunk}))
                    reply = None
                    while reply is None:
                        data = sock.recv(4096)
                        assert data, "connection closed"
                        unpacker.feed(data)
                        reply = next(iter(unpacker), None)
                    assert reply == {b"ack": chunk.encode()}
                    self.acked += 1
        except BaseException as e:  # reported by the test
            self.error = e


def staging(tmp_path, sink: str):
    return tmp_path / "lake" / ("_staging" if sink == "parquet" else "logs/events/_staging") / "bp"


@pytest.mark.parametrize("sink", KINDS)
def test_stalled_sink_pauses_sources_then_everything_lands(tmp_path, sink):
    with Daemon(tmp_path, with_sink(CONFIG, sink)) as daemon:
        daemon.start()
        blocker = staging(tmp_path, sink)
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_text("not a directory: the sink cannot stage files")

        sender = Sender(daemon.port("forward"))
        sender.start()
        wait_until(lambda: daemon.metrics().get("logrouter_sources_paused") == 1, 60, "sources to pause")
        daemon.wait_for(r"sources paused")
        stalled = daemon.metrics()
        assert stalled[f'logrouter_sink_failures_total{{sink="lake",type="{sink}"}}'] >= 1
        assert stalled["logrouter_spool_backlog_bytes"] > MAX_SPOOL_BYTES
        assert sender.acked < CHUNKS  # the sender is held back by the paused source
        # Memory stays bounded: what is not delivered waits on disk, not in the process.
        assert rss_mib(daemon.process.pid) < 400

        blocker.unlink()
        sender.join(120)
        assert not sender.is_alive() and sender.error is None, (sender.error, daemon.metrics(), daemon.output[-3000:])
        assert sender.acked == CHUNKS
        wait_until(lambda: daemon.metrics().get("logrouter_sources_paused") == 0, 60, "sources to resume")
        resumed = daemon.metrics()
        assert resumed["logrouter_sources_paused_seconds_total"] > 0
        # Segments every sink is done with are deleted: the spool holds about one segment
        # of the ~10 MB that went through it, not all of it.
        wait_until(lambda: daemon.metrics()["logrouter_spool_size_bytes"] < 3 << 20, 30, "the spool to be trimmed")
        assert resumed["logrouter_sources_pauses_total"] >= 1
        daemon.stop_gracefully()
        assert "sources resumed" in daemon.output

    ids = column(sink, tmp_path / "lake", "id")
    counts = collections.Counter(ids)
    assert len(ids) == CHUNKS * EVENTS_PER_CHUNK
    assert max(counts.values()) == 1


TWO_SINKS = CONFIG + """
[sinks.healthy]
type = "parquet"
inputs = ["forward"]
path = "lake2"
roll_secs = 0.5
"""


@pytest.mark.parametrize("sink", KINDS)
def test_one_failing_sink_does_not_stall_the_other(tmp_path, sink):
    """The failing sink is a ``sink`` one, the healthy one a ``parquet`` sink."""
    with Daemon(tmp_path, with_sink(TWO_SINKS, sink)) as daemon:
        daemon.start()
        blocker = staging(tmp_path, sink)
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_text("blocks the first sink")
        sender = Sender(daemon.port("forward"))
        sender.start()
        wait_until(lambda: daemon.metrics().get("logrouter_sources_paused") == 1, 60, "sources to pause")
        healthy = 'logrouter_sink_cursor_bytes{sink="healthy",type="parquet"}'
        broken = f'logrouter_sink_cursor_bytes{{sink="lake",type="{sink}"}}'
        # The healthy sink commits what the spool holds (its files roll every 0.5 s).
        wait_until(lambda: daemon.metrics()[healthy] > MAX_SPOOL_BYTES * 0.5, 30, "the healthy sink to commit")
        stalled = daemon.metrics()
        # The healthy sink went on committing up to what the spool holds; only the
        # broken one holds the backlog (and so the sources) back.
        assert stalled[broken] == 0
        assert stalled["logrouter_sources_paused"] == 1
        assert stalled['logrouter_sink_rows_published_total{sink="healthy",type="parquet"}'] > 0
        blocker.unlink()
        sender.join(120)
        assert sender.error is None and sender.acked == CHUNKS
        daemon.stop_gracefully()
    for lake, kind in (("lake", sink), ("lake2", "parquet")):
        ids = column(kind, tmp_path / lake, "id")
        assert len(ids) == len(set(ids)) == CHUNKS * EVENTS_PER_CHUNK, lake

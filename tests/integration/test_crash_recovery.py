"""Crash safety end to end: ``kill -9`` at random moments loses and doubles nothing.

A client streams PackedForward chunks with ``chunk`` ids to the real daemon and, like
out_forward, resends every chunk it has no ack for after reconnecting. The daemon is
killed with SIGKILL at random moments (after a random number of acks plus a random
delay, so kills land during appends, fsyncs, Parquet writes and commits; at a random
moment of its start-up replay; in the middle of a graceful stop) or stopped with
SIGTERM while it starts, restarted, and at the end the lake must hold every
acknowledged event exactly once. The kill cycles of the ``iceberg`` sink are in
``test_iceberg_e2e.py``; the other tests here run against both lake sinks.

Bounds: len(CYCLE_ENDINGS) cycles, at most MAX_CHUNKS_PER_CYCLE chunks of EVENTS_PER_CHUNK
events each per cycle, every wait time-limited; loopback only.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import socket

import pytest

from chunk_client import EVENTS_PER_CHUNK, Client, chunk_message
from crash_cycles import finish, run_cycles
from daemon import Daemon
from helpers import lake_column, recv_exactly
from lake_sinks import KINDS, column, with_sink
from logrouter.wire.fluent_forward import encode_ack

MAX_CHUNKS_PER_CYCLE = 400

CONFIG = """
[spool]
path = "spool"
segment_bytes = 65536          # many segments, so trimming runs while we kill

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
roll_secs = 0.2                # commits all the time, so kills land inside them
roll_bytes = 200000
row_group_rows = 500
"""


# How each cycle ends: a kill under load, a kill or a SIGTERM while the daemon starts
# (spool open, dedupe window read back, sinks replaying from their cursors), and a kill
# in the middle of a graceful stop (sources draining, sinks committing).
CYCLE_ENDINGS = ("load", "start_kill", "load", "start_term", "stop_kill", "load", "start_kill", "stop_kill")


def test_kill_9_at_random_moments_loses_and_doubles_nothing(tmp_path):
    rng = random.Random(int(os.environ.get("LOGROUTER_CRASH_SEED", "20261122")))
    client = Client()
    outputs: list[str] = []
    kills = run_cycles(tmp_path, CONFIG, CYCLE_ENDINGS, client, rng, MAX_CHUNKS_PER_CYCLE, outputs=outputs)
    last = finish(tmp_path, CONFIG, client)
    # Kills left work to replay: some start resumed a sink from the spool. Not necessarily
    # the last one: a kill in the middle of a graceful stop may come after the stop
    # committed everything.
    assert any("resuming from spool position" in output for output in outputs + [last.output])

    assert kills == len(CYCLE_ENDINGS)
    print(f"{kills} kills, {len(client.acked)} chunks acked ({len(client.acked) * EVENTS_PER_CHUNK} events), "
          f"{client.resent} resent after a kill")
    ids = lake_column(tmp_path / "lake", "id")
    counts = collections.Counter(ids)
    doubled = [i for i, c in counts.items() if c > 1]
    expected = {f"{c}-{i}" for c in client.acked for i in range(EVENTS_PER_CHUNK)}
    assert not doubled, f"{len(doubled)} ids landed more than once, e.g. {doubled[:5]}"
    assert set(ids) == expected, f"missing {len(expected - set(ids))}, unexpected {len(set(ids) - expected)}"
    assert len(client.acked) >= CYCLE_ENDINGS.count("load") * 3
    assert not list((tmp_path / "lake" / "_staging").rglob("*.parquet"))


@pytest.mark.parametrize("sink", KINDS)
def test_retransmitted_chunk_is_acked_but_stored_once_across_a_restart(tmp_path, sink):
    message, chunk_id = chunk_message(7)
    ack = encode_ack(chunk_id)
    for _ in range(2):
        with Daemon(tmp_path, with_sink(CONFIG, sink)) as daemon:
            daemon.start()
            with socket.create_connection(("127.0.0.1", daemon.port("forward")), timeout=10) as sock:
                for _ in range(3):  # the same chunk three times on one connection
                    sock.sendall(message)
                    assert recv_exactly(sock, len(ack)) == ack
            daemon.stop_gracefully()
    assert sorted(column(sink, tmp_path / "lake", "id")) == sorted(f"7-{i}" for i in range(EVENTS_PER_CHUNK))


@pytest.mark.parametrize("sink", KINDS)
@pytest.mark.parametrize("flip_at", ["header", "payload"])
def test_corrupt_spool_record_is_quarantined_and_the_rest_replayed(tmp_path, flip_at, sink):
    """A record damaged on disk before a sink committed it: startup goes on, the rest lands."""
    config = with_sink(CONFIG.replace("roll_secs = 0.2", "roll_secs = 3600"), sink)
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        with socket.create_connection(("127.0.0.1", daemon.port("forward")), timeout=10) as sock:
            for n in range(3):
                message, chunk_id = chunk_message(n)
                sock.sendall(message)
                ack = encode_ack(chunk_id)
                assert recv_exactly(sock, len(ack)) == ack
        daemon.process.send_signal(signal.SIGKILL)  # nothing committed to the lake yet
        assert daemon.process.wait(30) == -signal.SIGKILL
    segment = sorted((tmp_path / "spool").glob("*.seg"))[0]
    data = bytearray(segment.read_bytes())
    # Damage the second record (chunk 1): its header, or a byte inside its payload.
    from logrouter.spool.segment import HEADER_SIZE, walk

    second = list(walk(bytes(data)))[1]
    data[second.offset + (5 if flip_at == "header" else HEADER_SIZE + 50)] ^= 0xFF
    segment.write_bytes(bytes(data))
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        daemon.wait_for(r"moved aside to .*quarantine")
        daemon.stop_gracefully()
    ids = column(sink, tmp_path / "lake", "id")
    assert sorted(ids) == sorted(f"{c}-{i}" for c in (0, 2) for i in range(EVENTS_PER_CHUNK))
    assert len(list((tmp_path / "spool" / "quarantine").glob("*.bad"))) == 1

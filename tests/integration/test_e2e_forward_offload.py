"""Big forward messages decoded in parts, in the real daemon on loopback: small chunks
are acked while a 210 MiB message is worked on, and a ``kill -9`` between the parts of a
big message stores each event once when the client resends it. (The parts themselves,
step by step on a StringTransport: tests/unit/test_forward_source_offload.py.)
"""

from __future__ import annotations

import select
import socket
import time
import zlib

import msgpack

from source_fakes import T0

DAEMON_CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

# Nothing reaches the sink: this measures the source and the spool, not Parquet.
[filters.none]
type = "match"
inputs = ["forward"]
tag = "nothing.**"

[sinks.lake]
type = "parquet"
inputs = ["none"]
path = "lake"
"""

BIG_INFLATED_MIB = 210
MAX_SMALL_ACK_SECS = 2.0  # before: 17.6 s behind a 50 MiB message, ~96 s behind 250 MiB


def bomb_like_message(chunk: str) -> tuple[bytes, int]:
    """A ~1 MB CompressedPackedForward that inflates to BIG_INFLATED_MIB MiB of real entries."""
    entry = msgpack.packb([msgpack.ExtType(0, (T0).to_bytes(4, "big") + bytes(4)), {"message": "m" * 60, "level": "info"}])
    block = entry * ((1 << 20) // len(entry))
    blocks = (BIG_INFLATED_MIB << 20) // len(block)
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
    blob = b"".join(compressor.compress(block) for _ in range(blocks)) + compressor.flush()
    count = blocks * (len(block) // len(entry))
    options = {"compressed": "gzip", "chunk": chunk, "size": count}
    return msgpack.packb(["app.big", blob, options], use_bin_type=True), count


def test_a_small_chunk_is_acked_while_a_huge_message_is_worked_on(tmp_path):
    from daemon import Daemon
    from helpers import recv_exactly, rss_mib, wait_until

    big, count = bomb_like_message("big-1")
    big_ack = msgpack.packb({"ack": "big-1"})
    with Daemon(tmp_path, DAEMON_CONFIG) as daemon:
        daemon.start()
        port = daemon.port("forward")
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sender, socket.create_connection(
            ("127.0.0.1", port), timeout=10
        ) as small:
            started = time.monotonic()
            sender.sendall(big)
            latencies: list[float] = []
            rss: list[float] = []
            while not select.select([sender], [], [], 0)[0]:
                assert time.monotonic() - started < 240, "the big message was not acked within 240 s"
                n = len(latencies)
                sent = time.monotonic()
                small.sendall(msgpack.packb(["app.small", T0, {"n": n}, {"chunk": f"s{n}"}]))
                ack = msgpack.packb({"ack": f"s{n}"})
                assert recv_exactly(small, len(ack)) == ack
                latencies.append(time.monotonic() - sent)
                rss.append(rss_mib(daemon.process.pid))
            assert recv_exactly(sender, len(big_ack)) == big_ack
            big_secs = time.monotonic() - started
            print(
                f"{BIG_INFLATED_MIB} MiB message ({len(big)} bytes on the wire, {count} events) acked after "
                f"{big_secs:.1f}s; {len(latencies)} small chunks acked meanwhile, slowest {max(latencies) * 1000:.0f} ms, "
                f"median {sorted(latencies)[len(latencies) // 2] * 1000:.1f} ms; daemon RSS up to {max(rss):.0f} MiB"
            )
            assert len(latencies) >= 3 and max(latencies) < MAX_SMALL_ACK_SECS
            wait_until(lambda: daemon.metrics().get("logrouter_events_in_total", 0) >= count, 30, "the big message's events")
            stored = daemon.metrics()["logrouter_events_in_total"]
            assert stored == count + len(latencies)

            # Sent again (its ack lost, say): every part is recognised, nothing is stored twice.
            sender.sendall(big)
            assert recv_exactly(sender, len(big_ack)) == big_ack
            metrics = daemon.metrics()
            assert metrics["logrouter_events_in_total"] == stored
            assert metrics["logrouter_duplicates_total"] >= BIG_INFLATED_MIB // 9  # parts of ~8 MiB
        daemon.stop_gracefully()


KILL_CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:{port}:interface=127.0.0.1"
offload_part_bytes = 1048576

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
"""


def numbered_message(chunk: str, count: int) -> bytes:
    """A gzip CompressedPackedForward of ``count`` events with ids 0..count-1."""
    entries = b"".join(
        msgpack.packb([msgpack.ExtType(0, (T0).to_bytes(4, "big") + bytes(4)), {"id": i, "message": "m" * 40}])
        for i in range(count)
    )
    options = {"compressed": "gzip", "chunk": chunk, "size": count}
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
    blob = compressor.compress(entries) + compressor.flush()
    return msgpack.packb(["app.parts", blob, options], use_bin_type=True)


def test_a_kill_9_between_the_parts_of_a_big_message_stores_each_event_once(tmp_path):
    """Parts stored before the kill are recognised by their keys when the client resends."""
    from daemon import Daemon
    from helpers import lake_column, recv_exactly

    count = 300_000  # ~20 MiB of entries: about 20 parts of 1 MiB
    message = numbered_message("parts-1", count)
    ack = msgpack.packb({"ack": "parts-1"})
    with socket.socket() as probe:  # the restarted router listens where the client reconnects
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = KILL_CONFIG.format(port=port)
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sender:
            sender.sendall(message)
            deadline = time.monotonic() + 60
            stored = 0
            while stored == 0 and time.monotonic() < deadline:
                stored = daemon.metrics().get("logrouter_events_in_total", 0)
            daemon.kill()
    assert 0 < stored < count, f"the kill did not land between parts ({stored} of {count} stored)"
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sender:
            sender.sendall(message)  # no ack came: out_forward sends the chunk again
            assert recv_exactly(sender, len(ack)) == ack
        daemon.stop_gracefully()
    ids = lake_column(tmp_path / "lake", "id")
    assert len(ids) == count and set(ids) == set(range(count)), f"{len(ids)} rows for {count} events"

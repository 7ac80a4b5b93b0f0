"""End to end: gzip bombs of invalid entries cost their senders only, and a stop is not
held up by a message being decoded in parts (the real daemon, one worker, loopback).

Two clients each send a 245 KB gzip blob that inflates to 250 MiB of msgpack zeros (262
million invalid entries), a third a legitimate 2 MiB PackedForward chunk: the bombs'
connections are closed with the reason logged and nothing acked, the chunk is acked. Then
a fourth client sends thirty real 210 MiB messages (seconds of decoding each in the
pure-Python decoder, which this daemon runs) and the daemon gets SIGTERM while they are worked on: it stops gracefully, within its
own ``shutdown_timeout_secs``, leaving them unacked for the client to resend.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import zlib

import msgpack

from daemon import Daemon
from helpers import recv_exactly, wait_until
from repo_paths import REPO
from test_e2e_forward_offload import bomb_like_message

T0 = 1_700_000_000

CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"
workers = 1

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

# Nothing reaches the sink: this is about the source, not Parquet.
[filters.none]
type = "match"
inputs = ["forward"]
tag = "nothing.**"

[sinks.lake]
type = "parquet"
inputs = ["none"]
path = "lake"
"""


def zeros_bomb(chunk: str) -> bytes:
    """The reported bomb: 250 MiB of b"\\0" (each the msgpack int 0) gzipped at level 9."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    blob = b"".join(compressor.compress(block) for _ in range(250)) + compressor.flush()
    return msgpack.packb(["app.bomb", blob, {"compressed": "gzip", "chunk": chunk}], use_bin_type=True)


def legit_chunk(chunk: str) -> tuple[bytes, int]:
    """A ~2 MiB PackedForward (Fluent Bit's chunk size) of real events, with ``chunk``."""
    entry_time = msgpack.ExtType(0, T0.to_bytes(4, "big") + bytes(4))
    entries = [msgpack.packb([entry_time, {"n": i, "message": "m" * 120}]) for i in range(15_000)]
    blob = b"".join(entries)
    options = {"chunk": chunk, "size": len(entries)}
    return msgpack.packb(["app.legit", blob, options], use_bin_type=True), len(entries)


HUGE_MESSAGES = 30


def send_all(sock: socket.socket, message: bytes, count: int) -> None:
    """Send ``message`` ``count`` times, until the peer closes the connection."""
    try:
        for _ in range(count):
            sock.sendall(message)
    except OSError:
        pass  # closed by the stop, as the test wants


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def until_closed(sock: socket.socket) -> bytes:
    """What ``sock`` receives until the peer closes it (its timeout bounds each read)."""
    data = b""
    try:
        while part := sock.recv(65536):
            data += part
    except ConnectionResetError:
        pass
    return data


def source_metric(daemon: Daemon, name: str) -> float:
    return sum(v for k, v in daemon.metrics().items() if k.startswith(f"logrouter_source_{name}{{"))


def test_bombs_are_refused_a_chunk_is_acked_and_a_stop_does_not_wait_for_long_work(tmp_path):
    bombs = [zeros_bomb("bomb-1"), zeros_bomb("bomb-2")]
    assert all(len(bomb) < 300_000 for bomb in bombs)
    chunk, count = legit_chunk("legit-1")
    assert len(chunk) > 2_000_000
    huge, _ = bomb_like_message("huge-1")
    ack = msgpack.packb({"ack": "legit-1"})
    huge_ack = msgpack.packb({"ack": "huge-1"})
    # The pure-Python decoder: the huge messages below take it seconds each, so the stop
    # lands while one is being decoded. The native one keeps their parts packed and goes
    # through one in ~0.2 s here, so whether a stop found one under way was a matter of
    # timing (the drain may end between two messages).
    env = dict(os.environ, PYTHONPATH=str(REPO), LOGROUTER_NATIVE="0")
    with Daemon(tmp_path, CONFIG, env=env) as daemon:
        daemon.start()
        port = daemon.port("forward")
        senders = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(3)]
        try:
            for sender, bomb in zip(senders, bombs):
                sender.sendall(bomb)
            senders[2].sendall(chunk)
            # The chunk is acked; the bombs' connections are closed without an ack, their
            # peers and the reason logged. (Before: minutes of a core per bomb, the chunk
            # waiting behind both.)
            assert recv_exactly(senders[2], len(ack)) == ack
            for sender in senders[:2]:
                peer = "127.0.0.1:%d" % sender.getsockname()[1]
                daemon.wait_for(rf"fluent_forward {peer}: message refused as a bomb: .*; closing connection", 30)
                assert closed_by_peer(sender)
            wait_until(lambda: daemon.metrics().get("logrouter_events_in_total", 0) >= count, 30, "the chunk's events")
            assert daemon.metrics()["logrouter_events_in_total"] == count
            assert source_metric(daemon, "bombs_refused_total") == 2
            assert source_metric(daemon, "decode_errors_total") == 2
        finally:
            for sender in senders:
                sender.close()

        # A stop while a long message is decoded in parts does not wait for it.
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sender:
            # More than any box finishes in the drain (natively decoded, a few a second):
            # sent from a thread, as the daemon reads them only one after the other.
            sending = threading.Thread(target=send_all, args=(sender, huge, HUGE_MESSAGES), daemon=True)
            sending.start()
            wait_until(lambda: source_metric(daemon, "offloaded_parts_total") >= 1, 60, "a part of the huge message")
            started = time.monotonic()
            daemon.stop_gracefully(timeout=60)
            stop_secs = time.monotonic() - started
            # A message finished within the drain is acked; the one being worked on is not.
            acks = until_closed(sender)
            assert acks in [huge_ack * n for n in range(HUGE_MESSAGES)], acks
        sending.join(60)
        daemon.wait_for(r"closing \(stopping\) while a message of tag app.big was decoded in parts: abandoned", 1)
        assert "did not finish within shutdown_timeout_secs" not in daemon.output
        print(f"stopped in {stop_secs:.1f}s with 210 MiB messages being decoded")

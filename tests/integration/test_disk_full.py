"""A full spool disk: acks are withheld, nothing acked is lost or doubled, and the router
recovers by itself once space is back (also across a SIGTERM while the disk is full).

The spool lives on a small tmpfs mounted for the test; where the test may not mount
one (no root, no CAP_SYS_ADMIN), it is skipped with the reason.
"""

from __future__ import annotations

import collections
import errno
import os
import subprocess
import time

import socket

import pytest

from chunk_client import T0, Client, expected_ids
from daemon import Daemon
from helpers import lake_column
from fixtures.forward_encode import encode_forward

CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "{spool}"
segment_bytes = 1048576

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
roll_secs = 0.5
retry_initial_secs = 0.2
retry_max_secs = 1
"""


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "spoolfs"
    mount_point.mkdir()
    try:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
            capture_output=True, text=True, timeout=30,
        )
    except OSError as e:
        pytest.skip(f"cannot run mount for a small tmpfs ({e}); the disk-full test needs one")
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({result.stderr.strip()}); the disk-full test needs one")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


def fill(directory) -> str:
    """Take every free byte of the filesystem holding ``directory``; the filler's path."""
    path = os.path.join(directory, "filler")
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            block = b"\0" * size
            for _ in range(1 << 16):  # bounded; a 16 MiB disk fills long before
                try:
                    f.write(block)
                except OSError as e:
                    assert e.errno == errno.ENOSPC
                    break
    return path


def flood(port: int, total_bytes: int, seconds: float) -> int:
    """Send big messages that ask for no ack (as fluent-logger does by default), reconnecting
    whenever the router drops the connection; the bytes it managed to send."""
    message = encode_forward("flood", [(T0, {"blob": "x" * 4000})] * 1000)  # about 4 MiB
    sent = 0
    held = 0  # connections in a row the router stopped reading from: it holds senders off
    deadline = time.monotonic() + seconds
    while sent < total_bytes and held < 3 and time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                while sent < total_bytes and time.monotonic() < deadline:
                    sock.sendall(message)
                    sent += len(message)
                    held = 0
        except TimeoutError:
            held += 1
        except OSError:
            pass  # dropped because its batch could not be stored: go on
    return sent


def send_until(client: Client, port: int, done, seconds: float) -> None:
    """Run the client in short connections until ``done()`` or the time is up."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        client.run(port, 10, deadline, timeout=2)


def test_a_full_spool_disk_withholds_acks_and_recovers_by_itself(tmp_path, small_disk):
    config = CONFIG.format(spool=small_disk / "spool")
    client = Client()
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        port = daemon.port("forward")
        send_until(client, port, lambda: len(client.acked) >= 20, 60)
        assert len(client.acked) >= 20

        filler = fill(small_disk)
        before = len(client.acked)
        send_until(client, port, lambda: bool(client.unacked), 30)
        daemon.wait_for(r"spool write failed|could not be stored", timeout=30)
        assert client.unacked, "a chunk was acked although the spool disk is full"
        metrics = daemon.metrics()
        assert metrics["logrouter_spool_write_errors_total"] >= 1
        acked_while_full = len(client.acked) - before  # those fitted before the disk was full
        # Senders without acks keep writing into the full disk: far more than the spool's
        # bound for bytes waiting to be written (64 MiB) fails, and none of it may stick.
        flood(port, 96 << 20, 30)

        os.remove(filler)  # space is back: no restart, no operator action
        target = len(client.acked) + 30
        send_until(client, port, lambda: len(client.acked) >= target and not client.unacked, 90)
        assert len(client.acked) >= target and not client.unacked, daemon.output[-3000:]
        daemon.wait_for(r"spool writes succeed again", timeout=10)

        # A stop while the disk is full again: bounded, and nothing acked is lost.
        filler = fill(small_disk)
        send_until(client, port, lambda: bool(client.unacked), 30)
        daemon.stop(timeout=60)
        assert "Unhandled" not in daemon.output, daemon.output[-3000:]
    os.remove(filler)

    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        send_until(client, daemon.port("forward"), lambda: not client.unacked, 60)
        assert not client.unacked
        daemon.stop_gracefully()

    print(f"{len(client.acked)} chunks acked, {acked_while_full} acked after the disk filled, {client.resent} resent")
    ids = lake_column(tmp_path / "lake", "id")
    ids = [i for i in ids if i is not None]  # the flood's rows carry no id
    doubled = [i for i, c in collections.Counter(ids).items() if c > 1]
    assert not doubled, f"{len(doubled)} ids landed more than once, e.g. {doubled[:5]}"
    assert set(ids) == expected_ids(client.acked)

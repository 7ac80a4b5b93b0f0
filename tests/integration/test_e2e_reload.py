"""Reloading the config of the real daemon (SIGHUP and ``POST /reload``) while a client
sends: unchanged sources keep their connections, changed ones stop gracefully, sinks
come and go with their cursors, a bad config is refused and changes nothing, and every
acked event is in the lake exactly once (with ``parquet`` sinks, and with ``iceberg`` ones)."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from chunk_client import Client, expected_ids
from daemon import REPO, Daemon
from helpers import wait_until
from lake_sinks import KINDS, column, with_sink

pytestmark = pytest.mark.timeout(240)

TOKEN = "reload-test-token-0123456789"

BASE = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"
reload_token = "reload-test-token-0123456789"

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:{port}:interface=127.0.0.1"
{forward_extra}
{extra_sources}
[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
roll_secs = {roll}
{extra_sinks}
"""


def base_config(port: int = 0, roll: float = 0.5, forward_extra: str = "", extra_sources: str = "", extra_sinks: str = "") -> str:
    return BASE.format(port=port, roll=roll, forward_extra=forward_extra, extra_sources=extra_sources, extra_sinks=extra_sinks)


def reload_count(daemon: Daemon) -> int:
    return sum("config reloaded:" in line for line in daemon.lines)


def post_reload(daemon: Daemon) -> tuple[int, str]:
    port = int(daemon.wait_for(r"metrics listening on \S+ port (\d+)").group(1))
    request = urllib.request.Request(f"http://127.0.0.1:{port}/reload", method="POST", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Sender:
    """The chunk client in a thread, reconnecting whenever its connection ends."""

    def __init__(self, port: int) -> None:
        self.client = Client()
        self.port = port
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 180
        while not self.stop.is_set() and time.monotonic() < deadline:
            self.connections += 1
            self.client.run(self.port, 1_000_000, deadline, timeout=5, stop=self.stop)
            if self.stop.is_set():
                break

    def acked(self) -> int:
        return len(self.client.acked)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sink", KINDS)
def test_reload_under_load_keeps_connections_and_loses_nothing(tmp_path, sink) -> None:
    workdir = tmp_path
    port = free_port()

    def config(*args, **kwargs) -> str:  # the lake, and the copy a reload adds, of one kind
        text = with_sink(base_config(*args, **kwargs), sink)
        return with_sink(text, sink, "copy") if "[sinks.copy]" in text else text

    with Daemon(workdir, config(port)) as daemon:
        daemon.start()
        assert daemon.port("forward") == port
        sender = Sender(port)
        try:
            wait_until(lambda: sender.acked() >= 20, 60, "20 chunks acked")
            # 1. A new source and a new sink; the forward source and the lake unchanged.
            daemon.config.write_text(
                config(
                    port,
                    extra_sources='[sources.beats]\ntype = "lumberjack"\nlisten = "tcp:0:interface=127.0.0.1"\n',
                    extra_sinks='[sinks.copy]\ntype = "parquet"\ninputs = ["forward", "beats"]\npath = "copy"\nroll_secs = 0.5\n',
                )
            )
            daemon.process.send_signal(signal.SIGHUP)
            wait_until(lambda: reload_count(daemon) >= 1, 60, "the first reload")
            assert sender.connections == 1, "a source whose config did not change kept its connection"
            daemon.port("beats")
            before = sender.acked()
            wait_until(lambda: sender.acked() >= before + 20, 60, "acks after the first reload")

            # 2. A bad config is refused and changes nothing (here by `logrouter reload`, which
            #    also refuses to send a config it cannot load itself).
            daemon.config.write_text(config(port, roll=-1))
            cli = subprocess.run(
                [sys.executable, "-m", "logrouter", "reload", "--config", str(daemon.config)],
                capture_output=True, text=True, timeout=60, cwd=workdir, env=dict(os.environ, PYTHONPATH=str(REPO)),
            )
            assert cli.returncode == 1 and "sinks.lake.roll_secs" in cli.stderr, cli.stderr
            status, text = post_reload(daemon)
            assert status == 409 and "sinks.lake.roll_secs" in text, text
            before = sender.acked()
            wait_until(lambda: sender.acked() >= before + 10, 60, "acks after the refused reload")

            # 3. The forward source and the lake change (both restart), the copy goes.
            daemon.config.write_text(config(port, roll=0.7, forward_extra="max_connections = 512"))
            metrics_port = daemon.wait_for(r"metrics listening on \S+ port (\d+)").group(1)
            cli = subprocess.run(
                [sys.executable, "-m", "logrouter", "reload", "--config", str(daemon.config),
                 "--url", f"http://127.0.0.1:{metrics_port}"],
                capture_output=True, text=True, timeout=120, cwd=workdir, env=dict(os.environ, PYTHONPATH=str(REPO)),
            )
            assert cli.returncode == 0, cli.stderr
            text = cli.stdout
            assert "sources stopped: forward" in text and "sinks stopped: lake, copy" in text, text
            before = sender.acked()
            wait_until(lambda: sender.acked() >= before + 20, 60, "acks after the second reload")
        finally:
            sender.finish()
        # whatever the client still has unacked is resent before the stop
        last = Client()
        last.unacked = sender.client.unacked
        last.acked = sender.client.acked
        last.next_chunk = sender.client.next_chunk
        deadline = time.monotonic() + 60
        while last.unacked and time.monotonic() < deadline:
            last.run(port, len(last.unacked), deadline, timeout=5)
        assert not last.unacked
        daemon.stop_gracefully()
    ids = column(sink, workdir / "lake", "id")
    doubled = [i for i, c in collections.Counter(ids).items() if c > 1]
    assert not doubled, f"{len(doubled)} ids landed more than once, e.g. {doubled[:5]}"
    assert set(ids) == expected_ids(last.acked)
    copied = column(sink, workdir / "copy", "id")
    assert copied and not [i for i, c in collections.Counter(copied).items() if c > 1]

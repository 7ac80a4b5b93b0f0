"""The pravega source end to end with the official client (PyPI ``pravega``): the real
daemon on loopback, writers in their own processes (``pravega_writer.py``).

Every event carries a sequence number; the lake must hold each exactly once: with two
writers on one stream of three segments, and across a ``kill -9`` of the router while a
writer writes (the client reconnects to the restarted router, is told what is stored and
resends the rest).
"""

from __future__ import annotations

import collections
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from daemon import Daemon
from helpers import lake_column, wait_until
from repo_paths import TESTS

pytestmark = pytest.mark.timeout(300)

WRITER = TESTS / "pravega_writer.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(store_port: int = 0, controller_port: int = 0) -> str:
    return f"""
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.pv]
type = "pravega"
listen = "tcp:{store_port}:interface=127.0.0.1"
controller_listen = "tcp:{controller_port}:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["pv"]
path = "lake"
roll_secs = 0.5
"""


def controller_uri(daemon: Daemon) -> str:
    port = daemon.wait_for(r"pravega source pv controller listening on port (\d+)").group(1)
    return f"tcp://127.0.0.1:{port}"


class Writer:
    """One ``pravega_writer.py`` process; its stdout lines are collected by a thread."""

    def __init__(self, uri: str, **options: object) -> None:
        argv = [sys.executable, str(WRITER), "--controller", uri]
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                argv.append(flag)
            elif value is False:
                argv.append("--no-" + key.replace("_", "-"))
            else:
                argv += [flag, str(value)]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.progress = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            if line.startswith("wrote "):
                self.progress.set()

    def wait(self, timeout: float = 120) -> None:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError("writer did not finish:\n" + "".join(self.lines[-30:]))
        assert code == 0, f"writer exited {code}:\n" + "".join(self.lines[-30:])
        assert any(line.startswith("flushed ") for line in self.lines)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def assert_exactly_once(lake: Path, wanted: set[int]) -> None:
    seqs = lake_column(lake, "seq")
    doubled = sorted(s for s, c in collections.Counter(seqs).items() if c > 1)
    assert not doubled, f"{len(doubled)} events landed more than once, e.g. {doubled[:10]}"
    missing = sorted(wanted - set(seqs))
    assert not missing, f"{len(missing)} events missing, e.g. {missing[:10]}"


def test_two_writers_on_one_stream_land_exactly_once(tmp_path) -> None:
    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        uri = controller_uri(daemon)
        first = Writer(uri, count=600, first=0, name="a", inflight=100)
        second = Writer(uri, count=400, first=600, name="b", inflight=0)  # one event at a time
        try:
            first.wait()
            second.wait()
        finally:
            first.kill()
            second.kill()
        daemon.stop_gracefully()
    lake = tmp_path / "lake"
    assert_exactly_once(lake, set(range(1000)))
    assert set(lake_column(lake, "tag")) == {"sc.st"}
    assert set(lake_column(lake, "writer")) == {"a", "b"}


def test_kill_9_while_writing_then_restart_keeps_exactly_once(tmp_path) -> None:
    store, controller = free_port(), free_port()
    total = 20_000
    with Daemon(tmp_path, config(store, controller)) as daemon:
        daemon.start()
        writer = Writer(controller_uri(daemon), count=total, inflight=200, keys=30)
        try:
            wait_until(lambda: daemon.metrics().get("logrouter_events_in_total", 0) >= 2000, 60, "2000 events stored")
            daemon.kill()
            with Daemon(tmp_path, config(store, controller)) as again:
                again.start()
                writer.wait(180)
                resent = again.metrics()["logrouter_events_in_total"]
                again.stop_gracefully()
        finally:
            writer.kill()
    # The restarted router took only what the first had not stored (blocks in flight at
    # the kill are sent again; the router's writer table turns away any it had stored).
    assert 0 < resent < total
    assert_exactly_once(tmp_path / "lake", set(range(total)))


def cut_connections(port: int) -> str | None:
    """Abort every client socket connected to 127.0.0.1:``port`` (``ss -K``, the kernel's
    sock_destroy); None if done, else why it cannot be done here."""
    import shutil

    if shutil.which("ss") is None:
        return "ss (iproute2) is not installed"
    result = subprocess.run(
        ["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{port}"], capture_output=True, text=True, timeout=10
    )
    if result.returncode != 0:
        return f"ss -K failed: {result.stderr.strip()}"
    return None


def test_a_writer_whose_connections_are_cut_resumes_without_duplicates(tmp_path) -> None:
    total = 20_000
    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        store = daemon.port("pv")
        writer = Writer(controller_uri(daemon), count=total, inflight=200, keys=30)
        try:
            cuts = 0
            for level in (2000, 8000, 14000):
                wait_until(lambda: daemon.metrics().get("logrouter_events_in_total", 0) >= level, 60, f"{level} events")
                why = cut_connections(store)
                if why is not None:
                    pytest.skip(f"cannot cut TCP connections here: {why}")
                cuts += 1
            writer.wait(180)
            closed = sum(v for k, v in daemon.metrics().items() if k.startswith("logrouter_source_connections_total"))
            daemon.stop_gracefully()
        finally:
            writer.kill()
    assert closed > 1, "the writer never had to reconnect"
    assert_exactly_once(tmp_path / "lake", set(range(total)))

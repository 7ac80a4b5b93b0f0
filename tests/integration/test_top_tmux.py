"""``logrouter top`` in a real terminal: tmux runs it against the real daemon, with two
workers under a supervisor (whose /metrics sums them), while a client sends a bounded
stream of forward events; the pane is captured twice and its numbers have moved.

The tmux server is the test's own (a socket in the test's directory), so nothing else
on the machine is touched; the test kills that server (and with it ``logrouter top``),
stops the load and stops the daemon. Skipped, saying so, where tmux is not installed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time

import msgpack
import pytest

from daemon import REPO, Daemon
from helpers import wait_until

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"),
]

CONFIG = """
[router]
workers = 2
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[filters.keep]
type = "grep"
inputs = ["forward"]
field = "n"
include = "."

[sinks.lake]
type = "parquet"
inputs = ["keep"]
path = "lake"
roll_secs = 1
"""

NUMBER = r"[\d,]+"


def send_load(port: int, stop: threading.Event, deadline: float) -> None:
    """Batches of 20 events every 20 ms (about 1,000 events/s), until ``stop`` or ``deadline``."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        n = 0
        while not stop.is_set() and time.monotonic() < deadline:
            now = int(time.time())
            sock.sendall(msgpack.packb(["load.test", [[now, {"n": n + i, "msg": "x" * 50}] for i in range(20)]]))
            n += 20
            stop.wait(0.02)


class Tmux:
    """A tmux server of the test's own (``-S socket``)."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path

    def __call__(self, *args: str) -> str:
        result = subprocess.run(["tmux", "-S", self.socket_path, *args], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def capture(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def kill(self) -> None:
        subprocess.run(["tmux", "-S", self.socket_path, "kill-server"], capture_output=True, timeout=30)


def numbers(pane: str) -> dict[str, int]:
    """The forward source's and the lake sink's event totals and rates, as the pane shows them."""
    source = re.search(rf"^\s*forward\s+fluent_forward\s+(\d+)\s+({NUMBER})\s+({NUMBER}(?:\.\d)?)/s", pane, re.M)
    sink = re.search(rf"^\s*lake\s+parquet\s+({NUMBER})\s+({NUMBER}(?:\.\d)?)/s", pane, re.M)
    workers = re.search(r"· (\d+) workers \((\d+) up\)", pane)
    if not (source and sink and workers):
        return {}
    value = lambda text: int(text.replace(",", ""))  # noqa: E731
    return {
        "source_events": value(source.group(2)), "source_rate": float(source.group(3).replace(",", "")),
        "sink_events": value(sink.group(1)), "workers": int(workers.group(1)),
    }


def test_top_shows_a_loaded_routers_numbers_moving(tmp_path):
    stop = threading.Event()
    tmux = Tmux(str(tmp_path / "tmux.sock"))
    with Daemon(tmp_path, CONFIG) as daemon:
        daemon.start()
        url = "http://127.0.0.1:" + daemon.wait_for(r"metrics listening on 127\.0\.0\.1 port (\d+)").group(1)
        load = threading.Thread(target=send_load, args=(daemon.port("forward"), stop, time.monotonic() + 120), daemon=True)
        load.start()
        top_pid = None
        try:
            # COLUMNS and LINES in the pane's environment (80 and 24 when tmux is started from
            # pytest here) would win over the pane's real size in rich.
            command = (f"unset COLUMNS LINES; PYTHONPATH={shlex.quote(str(REPO))} "
                       f"exec {shlex.quote(sys.executable)} -m logrouter.cli top --url {url}")
            tmux("new-session", "-d", "-s", "top", "-x", "160", "-y", "40", command)
            top_pid = int(tmux("display-message", "-p", "-t", "top", "#{pane_pid}").strip())
            panes: list[dict[str, int]] = []
            last = [""]

            def moving() -> bool:
                last[0] = tmux.capture()
                seen = numbers(last[0])
                if seen and seen["source_rate"] > 0 and (not panes or seen["source_events"] > panes[-1]["source_events"]):
                    panes.append(seen)
                return len(panes) >= 2

            try:
                wait_until(moving, 60, "two captures of the pane with growing numbers")
            except AssertionError as e:
                size = tmux("display-message", "-p", "-t", "top", "#{pane_width}x#{pane_height}")
                raise AssertionError(f"{e}; the pane ({size.strip()}) last showed:\n{last[0]}") from None
            first, second = panes[:2]
            assert first["workers"] == second["workers"] == 2
            assert second["source_events"] > first["source_events"] > 0 and second["source_rate"] > 0
            wait_until(lambda: numbers(tmux.capture()).get("sink_events", 0) > first["sink_events"], 30,
                       "the sink's events to move as well")
        finally:
            tmux.kill()
            stop.set()
            load.join(30)
            if top_pid is not None:
                wait_until(lambda: not _alive(top_pid), 30, "logrouter top to exit with its tmux server")
        assert not load.is_alive()
        daemon.stop_gracefully()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone but for its parent (the tmux server, killed): not running.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_pane_of_numbers_is_read_as_shown():
    pane = (
        "logrouter top · http://127.0.0.1:1 · 2 workers (2 up) · in 1,000/s · spool backlog 0 B, on disk 1.0 MiB\n"
        " forward   fluent_forward   1   12,345   1,000/s   97.7 KiB/s   0\n"
        " lake   parquet   12,000   990/s   0 B   0.5 s   live   no   1 s ago\n"
    )
    assert numbers(pane) == {"source_events": 12345, "source_rate": 1000, "sink_events": 12000, "workers": 2}
    assert numbers("logrouter top · u\nconnecting …") == {}

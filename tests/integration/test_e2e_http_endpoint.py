"""The HTTP endpoint of the real daemon: loopback only unless told otherwise, reload only
with the token and never for a web page, and a stuck worker seen by /metrics (quickly)
and /health (503, named) with ``workers = 2``; /health of a single process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from daemon import REPO, Daemon
from helpers import wait_until
from test_e2e_workers import worker_metrics, worker_pids

pytestmark = pytest.mark.timeout(240)

TOKEN = "e2e-reload-token-0123456789abcdef"

CONFIG = """
[router]
workers = {workers}
metrics_listen = "{metrics}"
{token}
[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"
{extra_sources}
[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
roll_secs = 1
{extra_sinks}
"""


def config(workers: int = 2, metrics: str = "tcp:0", token: str = "", extra_sources: str = "", extra_sinks: str = "") -> str:
    return CONFIG.format(workers=workers, metrics=metrics, token=token, extra_sources=extra_sources, extra_sinks=extra_sinks)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_port(daemon: Daemon) -> int:
    return int(daemon.wait_for(r"metrics listening on \S+ port (\d+)").group(1))


def get(port: int, path: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post_reload(port: int, *headers: tuple[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/reload", method="POST", headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on TCP ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(address)
    return found


def reloads(daemon: Daemon) -> int:
    return sum("reloading the config" in line for line in daemon.lines)


def test_reload_needs_the_token_and_the_endpoint_listens_on_loopback_only(tmp_path: Path) -> None:
    token_file = tmp_path / "reload.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    port = free_port()
    token = f'reload_token_file = "{token_file}"'
    with Daemon(tmp_path, config(metrics=f"tcp:{port}", token=token)) as daemon:
        daemon.start()
        assert daemon.wait_for(r"metrics listening on (\S+) port (\d+)").groups() == ("127.0.0.1", str(port))
        assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1 only, not 0.0.0.0

        daemon.config.write_text(config(metrics=f"tcp:{port}", token=token, extra_sinks='[sinks.out]\ntype = "blackhole"\ninputs = ["forward"]\n'))
        status, text = post_reload(port)
        assert status == 403 and "Authorization: Bearer" in text, text
        status, text = post_reload(port, ("Authorization", "Bearer not-the-token-0123456789"))
        assert status == 403, text
        status, text = post_reload(port, ("Authorization", f"Bearer {TOKEN}"), ("Origin", "http://evil.example"))
        assert status == 403 and "web pages" in text, text
        assert reloads(daemon) == 0
        assert not any('sink="out"' in key for key in worker_metrics(port, 0)), "reloaded without the token"

        # `logrouter reload` reads the token from the config file it is given
        cli = subprocess.run(
            [sys.executable, "-m", "logrouter", "reload", "--config", str(daemon.config)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        assert cli.returncode == 0, cli.stderr
        assert "worker 0:" in cli.stdout and "worker 1:" in cli.stdout, cli.stdout
        for worker in (0, 1):
            assert any('sink="out"' in key for key in worker_metrics(port, worker))
        status, text = post_reload(port, ("Authorization", f"Bearer {TOKEN}"))
        assert status == 200 and "worker 0:" in text, text
        daemon.stop_gracefully()


def test_reload_over_http_is_off_without_a_token(tmp_path: Path) -> None:
    with Daemon(tmp_path, config(workers=1)) as daemon:
        daemon.start()
        port = metrics_port(daemon)
        assert daemon.wait_for(r"metrics listening on (\S+) port").group(1) == "127.0.0.1"
        assert listening_addresses(port) == {"0100007F"}
        status, text = post_reload(port, ("Authorization", f"Bearer {TOKEN}"))
        assert status == 403 and "reload over HTTP is off" in text and "reload_token_file" in text, text
        assert reloads(daemon) == 0
        cli = subprocess.run(
            [sys.executable, "-m", "logrouter", "reload", "--config", str(daemon.config), "--url", f"http://127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        assert cli.returncode == 1 and "reload over HTTP is off" in cli.stderr, cli.stderr
        daemon.stop_gracefully()


def test_a_stopped_worker_is_marked_down_quickly_and_named_by_health(tmp_path: Path) -> None:
    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        port = metrics_port(daemon)
        assert listening_addresses(port) == {"0100007F"}  # "tcp:0": loopback only
        wait_until(lambda: get(port, "/health")[0] == 200, 30, "/health 200 with both workers running")
        status, text = get(port, "/health")
        document = json.loads(text)
        assert document["status"] == "ok" and [w["state"] for w in document["workers"]] == ["running", "running"], text
        assert document["workers"][0]["sources"] == {"forward": {"state": "listening"}}, text
        assert document["workers"][0]["sinks"]["lake"]["state"] in ("live", "catching up"), text
        stopped = worker_pids(daemon.process.pid)[1]
        os.kill(stopped, signal.SIGSTOP)
        try:
            started = time.monotonic()
            status, text = get(port, "/metrics")
            took = time.monotonic() - started
            assert status == 200 and took < 5, f"/metrics took {took:.1f}s with a stopped worker"
            assert 'logrouter_worker_up{worker="1"} 0' in text and 'logrouter_worker_running{worker="1"} 1' in text, text
            assert "logrouter_events_in_total" in text  # what the live worker has
            status, text = get(port, "/health")
            assert status == 503, text
            document = json.loads(text)
            assert document["workers"][1]["state"] == "not answering", text
            assert any(p.startswith("worker 1: did not answer") for p in document["problems"]), text
        finally:
            os.kill(stopped, signal.SIGCONT)
        wait_until(lambda: get(port, "/health")[0] == 200, 30, "/health 200 again after SIGCONT")
        wait_until(lambda: 'logrouter_worker_up{worker="1"} 1' in get(port, "/metrics")[1], 30, "worker 1 up again")
        daemon.stop_gracefully()


def test_a_single_process_health_names_a_source_a_reload_left_out(tmp_path: Path) -> None:
    with Daemon(tmp_path, config(workers=1)) as daemon, socket.socket() as busy:
        daemon.start()
        port = metrics_port(daemon)
        status, text = get(port, "/health")
        document = json.loads(text)
        assert status == 200 and document["status"] == "ok", text
        assert document["sources"] == {"forward": {"state": "listening"}}, text
        assert document["sinks"]["lake"]["state"] in ("live", "catching up"), text
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        more = f'[sources.more]\ntype = "fluent_forward"\nlisten = "tcp:{taken}:interface=127.0.0.1"\n'
        daemon.config.write_text(config(workers=1, extra_sources=more).replace('inputs = ["forward"]', 'inputs = ["forward", "more"]'))
        daemon.process.send_signal(signal.SIGHUP)
        daemon.wait_for(r"source more could not start", timeout=60)
        wait_until(lambda: get(port, "/health")[0] == 503, 30, "/health 503 with the source left out")
        document = json.loads(get(port, "/health")[1])
        assert document["sources"]["more"] == {"state": "left out"}
        assert any(p.startswith("source more: not running") for p in document["problems"]), document
        assert daemon.stop() in (0, -signal.SIGTERM)  # the reload's failure logged a traceback: not stop_gracefully

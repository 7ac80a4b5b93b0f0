"""Reloads of the real daemon that must leave every configured source serving on every
process (issue 27): a changed forward source on two workers, overlapping reloads (two
workers, and one process with SIGHUP), and a worker killed after a refused reload.

Overlapping reloads are made deterministic without sleeps: the first reload changes the
forward source, and a connection the test holds open keeps that source's graceful stop
draining (``stop_quiet_secs`` is long) until the test closes it, so the second reload is
asked while the first one still runs."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from chunk_client import Client, expected_ids
from daemon import Daemon
from helpers import lake_column, wait_until
from test_e2e_workers import addresses_for, connect, send_acked, worker_metrics, worker_pids

pytestmark = pytest.mark.timeout(300)
TOKEN = "reload-workers-token-0123456789"

BASE = """
[router]
workers = {workers}
metrics_listen = "tcp:0:interface=127.0.0.1"
reload_token = "{token}"
shutdown_timeout_secs = 0

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "{listen}"
stop_quiet_secs = {quiet}
stop_drain_secs = {quiet}
{forward_extra}
{extra_sources}
[sinks.lake]
type = "parquet"
inputs = {inputs}
path = "lake"
roll_secs = {roll}
{extra_sinks}
"""


def config(workers: int = 2, listen: str = "tcp:0:interface=127.0.0.1", forward_extra: str = "",
           more: tuple[str, ...] = (), quiet: float = 120, roll: float = 1, extra_sinks: str = "", more_extra: str = "") -> str:
    """``more``: names of extra forward sources on ports of their own, all into the lake.
    ``quiet``: the forward source's stop_quiet_secs and stop_drain_secs (long by default:
    a held connection keeps its stop draining)."""
    extra = "".join(f'[sources.{name}]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n{more_extra}'
                    for name in more)
    inputs = "[" + ", ".join(f'"{name}"' for name in ("forward", *more)) + "]"
    return BASE.format(token=TOKEN, workers=workers, listen=listen, forward_extra=forward_extra, extra_sources=extra, inputs=inputs,
                       quiet=quiet, roll=roll, extra_sinks=extra_sinks)


def metrics_port(daemon: Daemon) -> int:
    return int(daemon.wait_for(r"metrics listening on \S+ port (\d+)").group(1))


def post_reload(port: int) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/reload", method="POST", data=b"",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def in_background(call, *args) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(call(*args)), daemon=True)
    thread.start()
    return thread, result


def count(daemon: Daemon, text: str) -> int:
    return sum(text in line for line in daemon.lines)


def last_port(daemon: Daemon, source: str) -> int:
    """The port of the latest "source <name> listening" line (a source moved by a reload
    is announced again)."""
    pattern = re.compile(rf"source {re.escape(source)} listening on \S+ port (\d+)")
    found = [int(m.group(1)) for line in daemon.lines if (m := pattern.search(line))]
    assert found, f"source {source} never listened:\n{daemon.output}"
    return found[-1]


def heartbeat(port: int) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(10)
        sock.sendto(b"ping", ("127.0.0.1", port))
        return sock.recvfrom(16)[0]


def sources_of(port: int, worker: int) -> set[str]:
    key = "logrouter_source_connections_total{"
    return {k.split('source="')[1].split('"')[0] for k in worker_metrics(port, worker) if k.startswith(key)}


def held_connection(port: int, local: str, chunk: int) -> socket.socket:
    """A connection that has delivered one acked chunk and stays open and quiet: a graceful
    stop of its source drains it until it closes (``stop_quiet_secs`` = 120)."""
    sock = connect(port, local)
    send_acked(sock, [chunk])
    return sock


@pytest.mark.parametrize("change", ["idle_timeout", "certificate"])
def test_a_changed_forward_source_serves_on_every_worker(tmp_path: Path, pki, change: str) -> None:
    """Item 5: the source is stopped and started again in both workers; worker 0 also
    answers its UDP heartbeat. Before the fix the old heartbeat port was still bound when
    the new source started in worker 0, which left the source out there."""
    listen = pki.ssl_endpoint() if change == "certificate" else "tcp:0:interface=127.0.0.1"
    with Daemon(tmp_path, config(listen=listen)) as daemon:
        daemon.start()
        port, metrics = daemon.port("forward"), metrics_port(daemon)
        assert heartbeat(port) == b"\x00"
        if change == "idle_timeout":
            daemon.config.write_text(config(listen=listen, forward_extra="idle_timeout_secs = 120"))
        else:  # the same key and certificate under new names, as a rotation leaves them
            key, cert = tmp_path / "rotated.key", tmp_path / "rotated.crt"
            key.write_bytes(Path(pki.server_key).read_bytes())
            cert.write_bytes(Path(pki.server_cert).read_bytes())
            rotated = listen.replace(str(pki.server_key), str(key)).replace(str(pki.server_cert), str(cert))
            assert rotated != listen
            daemon.config.write_text(config(listen=rotated))
        status, text = post_reload(metrics)
        assert status == 200, text
        assert "could not start" not in text and text.count("sources stopped: forward") == 2, text
        assert heartbeat(port) == b"\x00"
        context = None
        if change == "certificate":
            import ssl

            context = ssl.create_default_context(cafile=str(pki.ca))
        for worker, first in ((0, 0), (1, 10)):
            assert "forward" in sources_of(metrics, worker)
            with connect(port, addresses_for(worker, wanted=1)[0], context) as sock:
                send_acked(sock, [first, first + 1])
        daemon.stop_gracefully()
    assert set(lake_column(tmp_path / "lake", "id")) == expected_ids([0, 1, 10, 11])


class LoadSender:
    """A forward client in a thread, sending acked chunks from one local address (so to
    one worker) and reconnecting whenever its connection ends, until ``finish``."""

    def __init__(self, port: int, local: str, first_chunk: int) -> None:
        self.client = Client()
        self.client.next_chunk = first_chunk
        self.port, self.local = port, local
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 240
        while not self.stop.is_set() and time.monotonic() < deadline:
            self.client.run(self.port, 1_000_000, deadline, timeout=5, stop=self.stop, source=self.local)

    def acked(self) -> int:
        return len(self.client.acked)

    def finish(self) -> set[int]:
        """Stop, then resend what is still unacked; every chunk it sent, all acked."""
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        deadline = time.monotonic() + 60
        while self.client.unacked and time.monotonic() < deadline:
            self.client.run(self.port, len(self.client.unacked), deadline, timeout=5, source=self.local)
        assert not self.client.unacked
        return set(self.client.acked)


def test_reloads_of_every_kind_under_load_leave_every_source_serving_on_every_worker(tmp_path: Path) -> None:
    """Done-when of issue 27: two workers, a sender on each, and reloads that change the
    forward source, add a source and a sink, change the lake sink and remove the source,
    and change nothing: each answers 200, both workers serve every configured source
    (worker 0 the heartbeat too) and every acked event lands in the lake once."""
    with Daemon(tmp_path, config(quiet=0.5)) as daemon:
        daemon.start()
        port, metrics = daemon.port("forward"), metrics_port(daemon)
        senders = [LoadSender(port, addresses_for(worker, wanted=1)[0], 1_000_000 * worker) for worker in (0, 1)]
        copy = '[sinks.copy]\ntype = "parquet"\ninputs = ["forward", "more"]\npath = "copy"\nroll_secs = 1\n'
        steps = [
            ("a forward option", config(quiet=0.5, forward_extra="idle_timeout_secs = 100"), {"forward"}),
            ("a new source and sink", config(quiet=0.5, forward_extra="idle_timeout_secs = 100", more=("more",),
                                             extra_sinks=copy), {"forward", "more"}),
            # no client on it: before the fix its stop returned before its heartbeat port was closed
            ("the new source changed", config(quiet=0.5, forward_extra="idle_timeout_secs = 100", more=("more",),
                                              extra_sinks=copy, more_extra="idle_timeout_secs = 50\n"), {"forward", "more"}),
            ("the lake changed, the source gone", config(quiet=0.5, forward_extra="idle_timeout_secs = 100", roll=0.7),
             {"forward"}),
            ("nothing", config(quiet=0.5, forward_extra="idle_timeout_secs = 100", roll=0.7), {"forward"}),
        ]
        extra = 0
        try:
            for what, body, sources in steps:
                before = [sender.acked() for sender in senders]
                daemon.config.write_text(body)
                status, text = post_reload(metrics)
                assert status == 200 and "could not start" not in text, (what, text)
                for worker in (0, 1):
                    assert sources_of(metrics, worker) == sources, (what, worker)
                assert heartbeat(port) == b"\x00", what
                for sender, had in zip(senders, before):
                    wait_until(lambda: sender.acked() >= had + 5, 60, f"acks after the reload of {what}")
                if "more" in sources:
                    extra += 1
                    for worker in (0, 1):
                        with connect(last_port(daemon, "more"), addresses_for(worker, wanted=1)[0]) as sock:
                            send_acked(sock, [5_000_000 + 10 * extra + worker])
        finally:
            acked = [sender.finish() for sender in senders]
        daemon.stop_gracefully()
    ids = lake_column(tmp_path / "lake", "id")
    assert len(ids) == len(set(ids)), "an event landed twice"
    assert set(ids) == expected_ids(acked[0] | acked[1] | {5_000_000 + 10 * n + w for n in range(1, extra + 1) for w in (0, 1)})


def test_overlapping_reloads_end_with_the_last_file_on_every_process(tmp_path: Path) -> None:
    """Item 6, two workers: a reload asked while one runs waits and then reads the file
    again, so the last file written is what the supervisor and both workers run."""
    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        port, metrics = daemon.port("forward"), metrics_port(daemon)
        hold = held_connection(port, addresses_for(0, wanted=1)[0], 0)
        try:
            # A: the forward source changes (its stop drains the held connection) and gains `first`.
            daemon.config.write_text(config(forward_extra="idle_timeout_secs = 100", more=("first",)))
            first_reload, first_answer = in_background(post_reload, metrics)
            daemon.wait_for(r"reloading the config from", timeout=60)
            # B, written while A runs: `second` instead of `first`.
            daemon.config.write_text(config(forward_extra="idle_timeout_secs = 90", more=("second",)))
            second_reload, second_answer = in_background(post_reload, metrics)
            daemon.wait_for(r"waits for the reload under way", timeout=60)
        finally:
            hold.close()
        first_reload.join(120)
        second_reload.join(120)
        assert first_answer and first_answer[0][0] == 200, first_answer
        assert re.search(r"sources started: [^;]*\bfirst\b", first_answer[0][1]), first_answer
        assert second_answer and second_answer[0][0] == 200, second_answer
        assert re.search(r"sources started: [^;]*\bsecond\b", second_answer[0][1]), second_answer
        for worker in (0, 1):
            assert sources_of(metrics, worker) == {"forward", "second"}, worker
        second = last_port(daemon, "second")
        for worker, first in ((0, 10), (1, 20)):
            with connect(second, addresses_for(worker, wanted=1)[0]) as sock:
                send_acked(sock, [first, first + 1])
        first_port = last_port(daemon, "first")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", first_port), timeout=10).close()
        daemon.stop_gracefully()
    assert set(lake_column(tmp_path / "lake", "id")) == expected_ids([0, 10, 11, 20, 21])


def test_two_quick_sighups_with_one_process_apply_the_last_file(tmp_path: Path) -> None:
    """Item 6, one process: the second SIGHUP's reload waits for the first and then
    applies the file as it is then."""
    with Daemon(tmp_path, config(workers=1)) as daemon:
        daemon.start()
        port = daemon.port("forward")
        hold = held_connection(port, "127.0.0.1", 0)
        try:
            daemon.config.write_text(config(workers=1, forward_extra="idle_timeout_secs = 100", more=("first",)))
            daemon.process.send_signal(signal.SIGHUP)
            daemon.wait_for(r"reloading the config from", timeout=60)
            daemon.config.write_text(config(workers=1, forward_extra="idle_timeout_secs = 90", more=("second",)))
            daemon.process.send_signal(signal.SIGHUP)
            daemon.wait_for(r"waits for the reload under way", timeout=60)
        finally:
            hold.close()
        wait_until(lambda: count(daemon, "config reloaded:") >= 2, 120, "both reloads")
        assert re.search(r"sources started: [^;]*\bsecond\b", [line for line in daemon.lines if "config reloaded:" in line][-1])
        with connect(last_port(daemon, "second"), "127.0.0.1") as sock:
            send_acked(sock, [10, 11])
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", last_port(daemon, "first")), timeout=10).close()
        daemon.stop_gracefully()
    assert set(lake_column(tmp_path / "lake", "id")) == expected_ids([0, 10, 11])


def test_a_worker_killed_after_a_refused_reload_runs_the_accepted_config(tmp_path: Path) -> None:
    """Item 7: the file on disk is bad (its reload was refused); a worker killed with -9
    starts again from the config the supervisor runs, and its clients' events land."""
    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        metrics = metrics_port(daemon)
        daemon.config.write_text(config(more=("more",)))
        status, text = post_reload(metrics)
        assert status == 200, text
        daemon.config.write_text(config(more=("more",)) + '\n[sinks.bad]\ntype = "nope"\n')
        status, text = post_reload(metrics)
        assert status == 409 and "sinks.bad" in text, text
        victim = worker_pids(daemon.process.pid)[1]
        os.kill(victim, signal.SIGKILL)
        daemon.wait_for(r"worker 1 exited \(signal 9\); starting it again", timeout=30)
        daemon.wait_for(r"worker 1 is running again", timeout=60)
        assert sources_of(metrics, 1) == {"forward", "more"}
        local = addresses_for(1, wanted=1)[0]
        with connect(daemon.port("forward"), local) as sock:
            send_acked(sock, [0, 1])
        with connect(last_port(daemon, "more"), local) as sock:
            send_acked(sock, [2, 3])
        daemon.stop_gracefully()
    assert set(lake_column(tmp_path / "lake", "id")) == expected_ids([0, 1, 2, 3])


def test_a_reload_that_leaves_a_source_out_on_a_worker_is_not_200(tmp_path: Path) -> None:
    """Item 10: a new ZeroMQ source (worker 0 only) whose port is taken cannot start; the
    answer says so with 500, and the reload after the port is free starts it (200)."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    taken = busy.getsockname()[1]
    logjam = f'[sources.lj]\ntype = "logjam"\nlisten_pull = "tcp://127.0.0.1:{taken}"\n'
    try:
        with Daemon(tmp_path, config()) as daemon:
            daemon.start()
            metrics = metrics_port(daemon)
            daemon.config.write_text(config() + logjam)
            status, text = post_reload(metrics)
            assert status == 500, text
            assert "worker 0: partly applied:" in text and "sources.lj" in text, text
            busy.close()
            status, text = post_reload(metrics)
            assert status == 200 and re.search(r"worker 0: .*sources started: lj", text), text
            assert "lj" in sources_of_any(metrics, 0)
            # (not stop_gracefully: the failed start was logged with its traceback)
            assert daemon.stop() in (0, -signal.SIGTERM), daemon.output
    finally:
        busy.close()


def sources_of_any(port: int, worker: int) -> set[str]:
    return {k.split('source="')[1].split('"')[0] for k in worker_metrics(port, worker) if 'source="' in k}

"""Start and stop of the real daemon, mostly with ``[router] workers = 2``.

- A router that cannot start exits with status 1, saying why, and leaves no worker
  behind: a taken port (found before the reactor ran: the stop asked then was lost and
  the process served nothing forever), a damaged spool in one process (the same), a
  worker whose spool another process holds.
- What a client without acks (fluent-logger's default) sent is in the lake after a
  graceful stop, or its connect was refused: while the workers start (the supervisor
  does not listen before they run), while a worker restarts (its connections are held
  for it), and in the listener's backlog at the stop.

A worker's start is held where the test wants it by a FIFO in place of its lake
sink's state file (``parquet`` or ``iceberg``): the sink's recovery blocks reading it (in
a thread) until the test writes the state. Nothing sleeps; every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import msgpack
import pytest
from fluent import sender

from daemon import Daemon
from helpers import lake_column, wait_until
from lake_sinks import KINDS, column, with_sink
from logrouter.spool.lock import lock_spool
from logrouter.workers.plan import worker_for

pytestmark = pytest.mark.timeout(300)

EXIT_BOUND_SECS = 60
EVENTS = 200

CONFIG = """
[router]
workers = {workers}
shutdown_timeout_secs = 30

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:{port}:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
roll_secs = 3600
"""


def config(port: int = 0, workers: int = 2) -> str:
    return CONFIG.format(port=port, workers=workers)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def local_address_for(worker: int) -> str:
    """A loopback address whose connections the supervisor passes to ``worker``."""
    return next(f"127.0.0.{n}" for n in range(2, 250) if worker_for(f"127.0.0.{n}", 2) == worker)


def live_processes_of(daemon: Daemon) -> list[int]:
    """Processes still running the daemon's config (the supervisor and its workers)."""
    found = []
    needle = str(daemon.config).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in cmdline and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def worker_pid(daemon: Daemon, index: int) -> int:
    for pid in live_processes_of(daemon):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        if b"--index" in argv and argv[argv.index(b"--index") + 1] == str(index).encode():
            return pid
    raise AssertionError(f"no worker {index} running")


def lake_numbers(workdir: Path) -> list[int]:
    return lake_column(workdir / "lake", "n") if (workdir / "lake").exists() else []


class StateHold:
    """A FIFO where a worker's parquet sink reads its state: that worker's start waits
    until ``release()`` writes the state (the one it had, or an empty spool's)."""

    def __init__(self, spool: Path, worker: int) -> None:
        directory = spool / (f"worker-{worker}" if worker else "") / "sinks"
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "lake.json"
        self.state = self.path.read_bytes() if self.path.exists() else b'{"cursor":0}'
        fifo = directory / "lake.json.fifo"
        os.mkfifo(fifo)
        os.replace(fifo, self.path)
        self.writer: int | None = None

    def wait_until_held(self, timeout: float = 60) -> None:
        def reader_waits() -> bool:
            try:
                self.writer = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: nobody reads it yet
                return False
            return True

        wait_until(reader_waits, timeout, f"a worker to read {self.path}")

    def release(self) -> None:
        if self.writer is None:
            self.wait_until_held()
        os.write(self.writer, self.state)
        os.close(self.writer)
        self.writer = None


def send_without_acks(port: int, worker: int, numbers: range) -> None:
    """Forward message mode, no ``option`` (so no ack), from an address of ``worker``;
    the send returns once the kernel took the bytes, then the client closes."""
    data = b"".join(msgpack.packb(["app", int(time.time()), {"n": n}]) for n in numbers)
    with socket.create_connection(("127.0.0.1", port), timeout=20, source_address=(local_address_for(worker), 0)) as sock:
        sock.sendall(data)


@pytest.mark.parametrize("case", ["port taken, 2 workers", "damaged spool, 1 process"])
def test_a_router_that_cannot_start_exits_1_saying_why(tmp_path: Path, case: str) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    with taken:
        if case.startswith("port"):
            text = config(taken.getsockname()[1], workers=2)
            why = f"sources.forward.listen: cannot listen on 'tcp:{taken.getsockname()[1]}:interface=127.0.0.1': Address already in use"
        else:
            text = config(workers=1)
            (tmp_path / "spool" / ("0" * 20 + ".seg")).mkdir(parents=True)  # a segment that cannot be read
            why = "Is a directory"
        with Daemon(tmp_path, text) as daemon:
            daemon.start(wait_for="")
            status = daemon.process.wait(EXIT_BOUND_SECS)
            assert status == 1, daemon.output
            assert "logrouter could not start: " in daemon.output and why in daemon.output, daemon.output
            assert "already stopping" not in daemon.output
            assert not live_processes_of(daemon)


def test_a_worker_that_cannot_start_ends_the_supervisor_and_the_other_workers(tmp_path: Path) -> None:
    held = lock_spool(str(tmp_path / "spool" / "worker-1"))  # as another router would
    try:
        with Daemon(tmp_path, config()) as daemon:
            daemon.start(wait_for="")
            assert daemon.process.wait(EXIT_BOUND_SECS) == 1, daemon.output
            output = daemon.output
            assert "worker 1: logrouter could not start: spool directory " in output, output
            assert "logrouter could not start: worker 1 exited before it ran (exit status 1)" in output, output
            assert "worker 0 stopped (exit status 0)" in output, output  # stopped, not orphaned or killed
            assert not live_processes_of(daemon)
    finally:
        os.close(held)


@pytest.mark.parametrize("sink", KINDS)
def test_a_client_that_sends_while_the_workers_start_loses_nothing_at_a_stop(tmp_path: Path, sink: str) -> None:
    """The supervisor listened a second or more before its workers ran; a stop then
    reset the connections in its backlog with what they had sent (200 of 200 lost)."""
    port = free_port()
    hold = StateHold(tmp_path / "spool", worker=1)
    with Daemon(tmp_path, with_sink(config(port), sink)) as daemon:
        daemon.start(wait_for="")
        hold.wait_until_held()  # worker 1 is starting, and stays so
        client = sender.FluentSender("app", host="127.0.0.1", port=port, timeout=10)
        sent = [n for n in range(EVENTS) if client.emit("start", {"n": n})]
        refused = client.last_error
        client.close()
        daemon.process.send_signal(signal.SIGTERM)
        daemon.wait_for(r"logrouter stopping: no new connections")
        hold.release()
        daemon.stop_gracefully()
        assert sent or isinstance(refused, ConnectionRefusedError), refused
    landed = sorted(column(sink, tmp_path / "lake", "n")) if sent else []
    assert sorted(landed) == sent, f"{len(set(sent) - set(landed))} of {len(sent)} sent events lost"


def test_a_client_of_a_restarting_worker_and_one_in_the_backlog_at_the_stop_lose_nothing(tmp_path: Path) -> None:
    text = config().replace("[router]", '[router]\nmetrics_listen = "tcp:0:interface=127.0.0.1"')
    with Daemon(tmp_path, text) as daemon:
        daemon.start()
        port = daemon.port("forward")
        supervisor = daemon.process.pid
        # Worker 1 (idle: it writes no state) dies, and its next start is held.
        hold = StateHold(tmp_path / "spool", worker=1)
        os.kill(worker_pid(daemon, 1), signal.SIGKILL)
        daemon.wait_for(r"worker 1 exited \(signal 9\); starting it again")
        send_without_acks(port, 1, range(0, EVENTS))

        def accepted() -> bool:
            metrics = daemon.metrics()
            return sum(metrics.get(key, 0) for key in (
                'logrouter_supervisor_connections_passed_total{source="forward"}',
                'logrouter_supervisor_connections_dropped_total{source="forward"}',
                'logrouter_worker_held_connections{worker="1"}',
            )) == 1

        wait_until(accepted, 30, "the supervisor to accept the connection")
        hold.release()
        daemon.wait_for(r"worker 1 is running again")
        # Connections in the listener's backlog when the SIGTERM comes.
        os.kill(supervisor, signal.SIGSTOP)
        try:
            send_without_acks(port, 0, range(EVENTS, 2 * EVENTS))
            send_without_acks(port, 1, range(2 * EVENTS, 3 * EVENTS))
            os.kill(supervisor, signal.SIGTERM)
        finally:
            os.kill(supervisor, signal.SIGCONT)
        daemon.stop_gracefully()
    landed = lake_numbers(tmp_path)
    missing = sorted(set(range(3 * EVENTS)) - set(landed))
    assert not missing, f"{len(missing)} events lost, first {missing[:5]}"
    assert len(landed) == 3 * EVENTS

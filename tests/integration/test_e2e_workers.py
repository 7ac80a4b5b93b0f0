"""``[router] workers = 2`` on the real daemon: a supervisor and two worker processes.

Clients connect from different loopback addresses (as senders on different hosts do),
so the supervisor spreads them over both workers. Checked: every acked event lands in
the lake exactly once (a chunk resent on a new connection is acked, not stored again),
both workers wrote (their own writer ids), /metrics sums the workers, a worker killed
with -9 is started again and what its clients resend lands once, TLS is done in the
workers, a reload reaches every worker, and a supervisor killed with -9 takes its
workers with it.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import pytest

from chunk_client import chunk_message, expected_ids
from daemon import Daemon
from helpers import lake_column, wait_until
from lake_sinks import KINDS, column, with_sink
from logrouter.workers.plan import worker_for

pytestmark = pytest.mark.timeout(240)

CONFIG = """
[router]
workers = 2
metrics_listen = "tcp:0:interface=127.0.0.1"
reload_token = "workers-test-token-0123456789"
shutdown_timeout_secs = 30

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "{listen}"

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
roll_secs = 1
"""


def addresses_for(worker: int, count: int = 2, wanted: int = 2) -> list[str]:
    """Loopback addresses whose connections the supervisor passes to ``worker``."""
    found = [f"127.0.0.{n}" for n in range(2, 250) if worker_for(f"127.0.0.{n}", count) == worker]
    return found[:wanted]


def connect(port: int, local: str, context: ssl.SSLContext | None = None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20, source_address=(local, 0))
    return context.wrap_socket(sock, server_hostname="localhost") if context is not None else sock


def send_acked(sock: socket.socket, chunks: list[int]) -> None:
    """Send each chunk and wait for its ack (out_forward's require_ack_response)."""
    unpacker = msgpack.Unpacker(raw=True)
    for chunk_no in chunks:
        message, chunk_id = chunk_message(chunk_no)
        sock.sendall(message)
        reply = None
        while reply is None:
            data = sock.recv(4096)
            if not data:
                raise ConnectionError(f"closed before the ack of chunk {chunk_no}")
            unpacker.feed(data)
            for reply in unpacker:
                break
        assert reply == {b"ack": chunk_id}, reply


def worker_pids(supervisor: int) -> dict[int, int]:
    """{worker index: pid} of the supervisor's worker processes."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == supervisor and any(b"logrouter.workers.worker" in arg for arg in argv):
            found[int(argv[argv.index(b"--index") + 1])] = int(entry)
    return found


def worker_metrics(port: int, worker: int, timeout: float = 30) -> dict[str, float]:
    """One worker's own page; asked again (within ``timeout``) while the worker is too late
    to answer (404 after the supervisor's half second: a busy machine)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/workers/{worker}/metrics", timeout=10) as response:
                text = response.read().decode()
            break
        except urllib.error.HTTPError as e:
            if e.code != 404 or time.monotonic() > deadline:
                raise
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and not line.startswith("#")}


def lake_ids(path: Path) -> list[str]:
    return lake_column(path, "id")


def test_connections_are_spread_and_every_acked_event_lands_once(tmp_path: Path) -> None:
    with Daemon(tmp_path, CONFIG.format(listen="tcp:0:interface=127.0.0.1")) as daemon:
        daemon.start()
        port = daemon.port("forward")
        chunks: list[int] = []
        next_chunk = 0
        for worker in (0, 1):
            for local in addresses_for(worker):
                batch = list(range(next_chunk, next_chunk + 3))
                next_chunk += 3
                with connect(port, local) as sock:
                    send_acked(sock, batch)
                chunks += batch
                # The sender reconnects and resends its last chunk (its ack was "lost"):
                # the same address reaches the same worker, whose dedupe window knows it.
                with connect(port, local) as sock:
                    send_acked(sock, batch[-1:])
        metrics = daemon.metrics()
        passed = metrics['logrouter_supervisor_connections_passed_total{source="forward"}']
        assert passed == 8, metrics
        # pin_workers: each worker (every thread of it) on a CPU of its own
        cpus = sorted(os.sched_getaffinity(0))
        for index, pid in worker_pids(daemon.process.pid).items():
            for thread in os.listdir(f"/proc/{pid}/task"):
                try:
                    assert os.sched_getaffinity(int(thread)) == {cpus[index % len(cpus)]}
                except ProcessLookupError:
                    pass  # a thread that ended meanwhile
        assert os.sched_getaffinity(daemon.process.pid) == set(cpus)  # not the supervisor
        key = 'logrouter_source_connections_total{source="forward",type="fluent_forward"}'
        assert metrics[key] == 8, metrics  # summed over the workers
        assert not any("worker=" in k for k in metrics if not k.startswith("logrouter_worker_")), metrics
        metrics_port = int(daemon.wait_for(r"metrics listening on \S+ port (\d+)").group(1))
        for worker in (0, 1):
            assert metrics[f'logrouter_worker_up{{worker="{worker}"}}'] == 1
            own = worker_metrics(metrics_port, worker)
            assert own[key] == 4, own  # each worker's own page
        daemon.stop_gracefully()
    ids = lake_ids(tmp_path / "lake")
    assert len(ids) == len(set(ids)), "an event landed twice"
    assert set(ids) == expected_ids(chunks)
    names = [p.name for p in (tmp_path / "lake").rglob("*.parquet")]
    assert any("-w1" in name for name in names) and any("-w1" not in name for name in names), names
    assert (tmp_path / "spool" / "worker-1").is_dir()


@pytest.mark.parametrize("sink", KINDS)
def test_a_killed_worker_is_started_again_and_resent_chunks_land_once(tmp_path: Path, sink: str) -> None:
    with Daemon(tmp_path, with_sink(CONFIG.format(listen="tcp:0:interface=127.0.0.1"), sink)) as daemon:
        daemon.start()
        port = daemon.port("forward")
        local = addresses_for(1, wanted=1)[0]
        with connect(port, local) as sock:
            send_acked(sock, [0, 1, 2])
            # Chunk 3 is sent and the worker killed before (or after) it stored it: its ack
            # may never come. The client resends it once the worker is back.
            message, _ = chunk_message(3)
            sock.sendall(message)
            victim = worker_pids(daemon.process.pid)[1]
            os.kill(victim, signal.SIGKILL)
        daemon.wait_for(r"worker 1 exited \(signal 9\); starting it again", timeout=30)
        daemon.wait_for(r"worker 1 is running again", timeout=60)
        assert worker_pids(daemon.process.pid)[1] != victim
        with connect(port, local) as sock:
            send_acked(sock, [2, 3, 4])  # 2 was acked before: a duplicate the window catches
        daemon.stop_gracefully()
    ids = column(sink, tmp_path / "lake", "id")
    assert len(ids) == len(set(ids)), "an event landed twice"
    assert set(ids) == expected_ids(range(5))


def test_tls_is_done_in_the_workers(tmp_path: Path, pki) -> None:
    with Daemon(tmp_path, CONFIG.format(listen=pki.ssl_endpoint())) as daemon:
        daemon.start()
        port = daemon.port("forward")
        context = ssl.create_default_context(cafile=str(pki.ca))
        for worker, first in ((0, 0), (1, 10)):
            with connect(port, addresses_for(worker, wanted=1)[0], context) as sock:
                send_acked(sock, [first, first + 1])
        daemon.stop_gracefully()
    assert set(lake_ids(tmp_path / "lake")) == expected_ids([0, 1, 10, 11])


def test_a_reload_reaches_every_worker_and_opens_new_listeners(tmp_path: Path) -> None:
    with Daemon(tmp_path, CONFIG.format(listen="tcp:0:interface=127.0.0.1")) as daemon:
        daemon.start()
        metrics_port = int(daemon.wait_for(r"metrics listening on \S+ port (\d+)").group(1))
        request = urllib.request.Request(f"http://127.0.0.1:{metrics_port}/reload", method="POST",
                                         headers={"Authorization": "Bearer workers-test-token-0123456789"})
        # A new sink and a new TCP source: the supervisor listens for it, the workers take it.
        daemon.config.write_text(
            daemon.config.read_text().replace('inputs = ["forward"]', 'inputs = ["forward", "more"]')
            + '\n[sinks.out]\ntype = "blackhole"\ninputs = ["forward"]\n'
            + '\n[sources.more]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
        assert "worker 0:" in text and "worker 1:" in text, text
        for worker in (0, 1):
            metrics = worker_metrics(metrics_port, worker)
            assert any(key.startswith("logrouter_sink_") and 'sink="out"' in key for key in metrics), metrics
        more = daemon.port("more")
        for worker, first in ((0, 0), (1, 10)):
            with connect(more, addresses_for(worker, wanted=1)[0]) as sock:
                send_acked(sock, [first, first + 1])
        # What only a restart changes is kept as running, and the answer says so.
        daemon.config.write_text(daemon.config.read_text().replace("workers = 2", "workers = 3"))
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
        assert "needs a restart to change (kept as running): router.workers" in text, text
        # A config with errors is refused as a whole.
        daemon.config.write_text(daemon.config.read_text() + "\n[sinks.bad]\ntype = \"nope\"\n")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 409
        daemon.stop_gracefully()
    assert set(lake_ids(tmp_path / "lake")) == expected_ids([0, 1, 10, 11])


def test_a_supervisor_killed_with_9_takes_its_workers_with_it(tmp_path: Path) -> None:
    with Daemon(tmp_path, CONFIG.format(listen="tcp:0:interface=127.0.0.1")) as daemon:
        daemon.start()
        workers = worker_pids(daemon.process.pid)
        assert sorted(workers) == [0, 1]
        daemon.kill()

        def gone() -> bool:
            return not any(os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" for pid in workers.values())

        wait_until(gone, 30, "the workers to die with their supervisor")


@pytest.mark.parametrize("sink", KINDS)
def test_a_spool_left_by_more_workers_is_drained(tmp_path: Path, sink: str) -> None:
    """Going from 2 workers to 1: worker 1's spool still reaches the lake."""
    with Daemon(tmp_path, with_sink(CONFIG.format(listen="tcp:0:interface=127.0.0.1"), sink)) as daemon:
        daemon.start()
        port = daemon.port("forward")
        with connect(port, addresses_for(1, wanted=1)[0]) as sock:
            send_acked(sock, [0, 1])
        # kill -9: acked, in worker 1's spool, maybe not in the lake yet
        workers = worker_pids(daemon.process.pid)
        daemon.kill()
        wait_until(lambda: not any(os.path.exists(f"/proc/{p}") and _state(p) != "Z" for p in workers.values()), 30, "workers gone")
    config = CONFIG.format(listen="tcp:0:interface=127.0.0.1").replace("workers = 2", "workers = 1")
    with Daemon(tmp_path, with_sink(config, sink)) as daemon:
        daemon.start()
        daemon.wait_for(r"worker spool\(s\) left by a router run with more workers", timeout=10)
        daemon.stop_gracefully()
    assert sorted(column(sink, tmp_path / "lake", "id")) == sorted(expected_ids([0, 1]))


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"

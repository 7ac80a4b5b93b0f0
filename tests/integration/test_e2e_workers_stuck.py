"""A worker that stops reading its channel holds up no other worker (the real daemon,
``workers = 2``), and the open files limit is raised to the hard one at start.

A descriptor passed to a worker is in flight until the worker reads it, and Linux caps
a user's descriptors in flight at ``RLIMIT_NOFILE`` unless the sender has
``CAP_SYS_RESOURCE``. The daemon runs here as it does for a non-root user: without
``CAP_SYS_RESOURCE`` and ``CAP_SYS_ADMIN`` (dropped from a root test's bounding set)
and with 1,024 open files, soft and hard, so thousands of connections for a stopped
worker would reach that cap, after which no worker got a connection. Now the stopped
worker has a bounded number in flight and held, the rest is closed and counted; the
other worker is passed every new connection throughout, and the stopped one serves
again once it runs.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import resource
import signal
from pathlib import Path

import pytest

from chunk_client import expected_ids
from daemon import Daemon
from helpers import scrape, wait_until
from test_e2e_workers import CONFIG, addresses_for, connect, lake_ids, send_acked, worker_pids

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux: capabilities and limits in /proc"),
]

PR_CAPBSET_DROP = 24
CAP_SYS_ADMIN = 21
CAP_SYS_RESOURCE = 24
CONNECTIONS = 3000  # for the stopped worker, each closed by its client at once


def limits(soft: int, hard: int):
    """A ``preexec_fn``: the open files limit, and (as root) no privilege past it."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork

    def preexec() -> None:
        if os.geteuid() == 0:
            for capability in (CAP_SYS_ADMIN, CAP_SYS_RESOURCE):
                prctl(PR_CAPBSET_DROP, ctypes.c_ulong(capability), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return preexec


def state(pid: int) -> str:
    """The process's state letter (``T`` stopped, ``Z`` a zombie), ``X`` once it is gone."""
    try:
        return status(pid, "State")[0]
    except (OSError, StopIteration):
        return "X"


def status(pid: int, field: str) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith(field + ":"))


def open_files_limit(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as f:
        soft, hard = next(line for line in f if line.startswith("Max open files")).split()[3:5]
    return int(soft), int(hard)


def test_a_stopped_worker_leaves_the_other_one_served(tmp_path: Path) -> None:
    with Daemon(tmp_path, CONFIG.format(listen="tcp:0:interface=127.0.0.1"), preexec_fn=limits(1024, 1024)) as daemon:
        daemon.start()
        supervisor = daemon.process.pid
        assert not int(status(supervisor, "CapEff"), 16) & (1 << CAP_SYS_RESOURCE | 1 << CAP_SYS_ADMIN)
        assert open_files_limit(supervisor) == (1024, 1024)
        port = daemon.port("forward")
        metrics_port = int(daemon.wait_for(r"metrics listening on \S+ port (\d+)").group(1))
        pids = worker_pids(supervisor)
        (healthy,), (stuck,) = addresses_for(0, wanted=1), addresses_for(1, wanted=1)
        chunks = itertools.count()
        acked: list[int] = []

        def served(local: str) -> None:
            """One chunk acked on a new connection (passed by the supervisor now)."""
            chunk = next(chunks)
            with connect(port, local) as sock:
                send_acked(sock, [chunk])
            acked.append(chunk)

        served(healthy)
        served(stuck)
        os.kill(pids[1], signal.SIGSTOP)
        try:
            wait_until(lambda: state(pids[1]) == "T", 30, "worker 1 stopped")
            for n in range(CONNECTIONS):
                connect(port, stuck).close()
                if n % 100 == 99:
                    served(healthy)
            served(healthy)  # accepted after all of them: the supervisor went past them all
            daemon.wait_for(r"worker 1 does not read its channel", timeout=30)
            values = scrape(metrics_port)
            window = 1024 // (2 * 2)  # half the limit shared by the two workers
            assert values['logrouter_worker_connections_in_flight{worker="1"}'] == window, values
            assert values['logrouter_worker_held_connections{worker="1"}'] == 256, values
            dropped = 'logrouter_worker_connections_dropped_total{worker="1",reason="not_reading"}'
            assert values[dropped] == CONNECTIONS - window - 256, values
            assert values['logrouter_supervisor_connections_dropped_total{source="forward"}'] == values[dropped]
            assert values['logrouter_worker_connections_dropped_total{worker="0",reason="not_reading"}'] == 0
        finally:
            os.kill(pids[1], signal.SIGCONT)
        # It reads what was passed to it, is passed what was held, then new connections.
        daemon.wait_for(r"worker 1 takes connections again \(\d+ closed meanwhile\)", timeout=60)
        served(stuck)
        served(healthy)
        assert daemon.output.count("does not read its channel") == 1, "logged once per episode"
        assert "Too many references" not in daemon.output
        daemon.stop_gracefully()
    assert all(state(pid) in ("X", "Z") for pid in pids.values()), "a worker still runs"
    ids = lake_ids(tmp_path / "lake")
    assert len(ids) == len(set(ids)) and set(ids) == expected_ids(acked)


def test_the_open_files_limit_is_raised_to_the_hard_one(tmp_path: Path) -> None:
    with Daemon(tmp_path, CONFIG.format(listen="tcp:0:interface=127.0.0.1"), preexec_fn=limits(512, 4096)) as daemon:
        daemon.start()
        daemon.wait_for(r"open files limit raised from 512 to 4096 \(the hard limit\)", timeout=10)
        pids = [daemon.process.pid, *worker_pids(daemon.process.pid).values()]
        assert len(pids) == 3
        assert all(open_files_limit(pid) == (4096, 4096) for pid in pids)
        daemon.stop_gracefully()

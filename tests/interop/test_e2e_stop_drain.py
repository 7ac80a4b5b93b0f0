"""A graceful stop keeps what clients had already sent: the real daemon, the real
PyPI ``fluent-logger`` client (which does not ask for acks), SIGTERM right after the
last send returned, then every event must be in the lake.

Before the stop read what connections had delivered, about half such runs lost the
events still in the kernel's buffers, so the test repeats a few runs. Bounds: ITERATIONS
runs of EVENTS events each, every wait time-limited, every daemon stopped.
"""

from __future__ import annotations

import socket
import time

import msgpack
import pytest
from fluent import sender

from daemon import Daemon
from helpers import lake_column
from lake_sinks import KINDS, column, with_sink
from daemon_configs import FORWARD_TO_LAKE

ITERATIONS = 4
EVENTS = 5000

CONFIG = FORWARD_TO_LAKE + """roll_secs = 3600
"""


def test_events_sent_without_acks_just_before_sigterm_are_kept(tmp_path):
    for run in range(ITERATIONS):
        workdir = tmp_path / f"run{run}"
        workdir.mkdir()
        with Daemon(workdir, CONFIG) as daemon:
            daemon.start()
            client = sender.FluentSender("app", host="127.0.0.1", port=daemon.port("forward"), timeout=10)
            try:
                for n in range(EVENTS):
                    assert client.emit("drain", {"run": run, "n": n, "pad": "x" * 100}), client.last_error
                daemon.stop_gracefully(timeout=60)  # SIGTERM while the client is still connected
            finally:
                client.close()
            assert "source stopping: read" in daemon.output
        numbers = lake_column(workdir / "lake", "n")
        missing = sorted(set(range(EVENTS)) - set(numbers))
        assert not missing, f"run {run}: {len(missing)} of {EVENTS} events lost, first {missing[:5]}"
        assert len(numbers) == EVENTS


@pytest.mark.parametrize("sink", KINDS)
def test_events_of_a_connection_closed_just_before_sigterm_are_in_the_lake(tmp_path, sink):
    """The client sent and closed; the SIGTERM came while its batches were still on their
    way into the spool. The stop no longer waited for them (their connection was gone),
    so the sinks committed without them: they reached the lake only at the next start."""
    with Daemon(tmp_path, with_sink(CONFIG, sink)) as daemon:
        daemon.start()
        port = daemon.port("forward")
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            sock.sendall(b"".join(msgpack.packb(["app", int(time.time()), {"n": n}]) for n in range(EVENTS)))
        daemon.stop_gracefully(timeout=60)
    numbers = column(sink, tmp_path / "lake", "n")
    missing = sorted(set(range(EVENTS)) - set(numbers))
    assert not missing, f"{len(missing)} of {EVENTS} events not in the lake, first {missing[:5]}"
    assert len(numbers) == EVENTS

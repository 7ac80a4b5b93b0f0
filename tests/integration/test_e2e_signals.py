"""Signals on the real daemon: a second SIGTERM while the first stop runs (what ``make``
forwards on Ctrl-C, 10-50 ms apart) is quiet, and the stop still completes cleanly."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from daemon import Daemon
from lake_sinks import with_sink
from daemon_configs import FORWARD_TO_LAKE

pytestmark = pytest.mark.timeout(120)

CONFIG = FORWARD_TO_LAKE


@pytest.mark.parametrize(
    "first, gap_secs, sink",
    [(signal.SIGTERM, 0.0, "parquet"), (signal.SIGTERM, 0.02, "parquet"), (signal.SIGINT, 0.05, "parquet"),
     (signal.SIGINT, 0.05, "iceberg")],  # Ctrl-C on `make run`, whose lake is an iceberg table
)
def test_a_second_stop_signal_while_stopping_is_quiet(tmp_path, first: int, gap_secs: float, sink: str) -> None:
    with Daemon(tmp_path, with_sink(CONFIG, sink)) as daemon:
        daemon.start()
        # An open connection makes the stop drain for a while, so the second signal comes
        # while the first stop is still running.
        client = socket.create_connection(("127.0.0.1", daemon.port("forward")))
        try:
            daemon.process.send_signal(first)
            time.sleep(gap_secs)  # the gap between the two signals is what is under test
            daemon.process.send_signal(signal.SIGTERM)
        finally:
            client.close()
        status = daemon.process.wait(60)
        # twistd re-raises the signal that stopped it: the second one, or the first when
        # the stop was over before the second came (a quick stop with workers)
        assert status in (0, -signal.SIGTERM, -first), daemon.output
        daemon.wait_for(r"Server Shut Down", timeout=10)
        assert "ReactorNotRunning" not in daemon.output, daemon.output
        assert "Traceback" not in daemon.output and "Unhandled" not in daemon.output, daemon.output

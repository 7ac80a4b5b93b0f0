"""Running the real daemon (``twistd -n logrouter``) from a test, on loopback.

The daemon's log is read line by line from its stdout by a thread, so a test waits on
the line it needs (with a time bound) instead of sleeping. Every daemon a test starts is
stopped by it: ``stop()`` sends SIGTERM and waits; ``__exit__`` kills what is left.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from process_log import ProcessLog

REPO = Path(__file__).resolve().parent.parent
TWISTD = Path(sys.executable).parent / "twistd"


class Daemon(ProcessLog):
    """``twistd`` is this venv's unless given; ``env`` replaces the environment, whose
    default puts this checkout first on ``PYTHONPATH`` (the code under test);
    ``preexec_fn`` runs in the child before ``twistd`` (limits, capabilities)."""

    LOG_NAME = "daemon"

    def __init__(
        self,
        workdir: Path,
        config_text: str,
        twistd: Path = TWISTD,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.twistd = Path(twistd)
        self.env = dict(os.environ, PYTHONPATH=str(REPO)) if env is None else dict(env)
        self.config = self.workdir / "logrouter.toml"
        self.config.write_text(config_text)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.process: subprocess.Popen | None = None
        self.preexec_fn = preexec_fn

    def start(self, wait_for: str = r"logrouter running", timeout: float = 60) -> "Daemon":
        env = dict(self.env, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [str(self.twistd), "--nodaemon", "--pidfile=", "logrouter", "--config", str(self.config)],
            cwd=self.workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=self.preexec_fn,
        )
        self.follow_output()
        if wait_for:
            self.wait_for(wait_for, timeout)
        return self

    def port(self, source: str) -> int:
        return int(self.wait_for(rf"source {re.escape(source)} listening on \S+ port (\d+)").group(1))

    def metrics(self, timeout: float = 30) -> dict[str, float]:
        """The daemon's /metrics (its config must set ``[router] metrics_listen``). With
        workers, asked again (within ``timeout``) while a running worker was too late to be
        in it (a busy machine): the sums then hold every worker's numbers."""
        from helpers import scrape

        port = int(self.wait_for(r"metrics listening on \S+ port (\d+)").group(1))
        deadline = time.monotonic() + timeout
        while True:
            values = scrape(port)
            late = [k for k, v in values.items() if k.startswith("logrouter_worker_up{") and v == 0
                    and values.get(k.replace("_up{", "_running{")) == 1]
            if not late or time.monotonic() > deadline:
                return values


    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal the daemon and wait; the exit status as ``subprocess`` reports it."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def stop_gracefully(self, timeout: float = 60) -> None:
        """SIGTERM, and check the daemon shut down cleanly.

        twistd re-raises the signal that stopped it once the shutdown is complete, so a
        clean stop exits "killed by SIGTERM" (what systemd expects), never with a traceback.
        """
        status = self.stop(signal.SIGTERM, timeout)
        assert status in (0, -signal.SIGTERM), f"exit status {status}:\n{self.output}"
        self.wait_for(r"Server Shut Down", timeout=10)
        assert "Traceback" not in self.output and "Unhandled" not in self.output, self.output

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

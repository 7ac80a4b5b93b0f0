"""Socket activation: the real daemon adopts a listening socket passed the way systemd
passes it (fd 3, ``LISTEN_FDS=1``, ``LISTEN_FDNAMES`` = the socket unit's name, which
Twisted requires, and ``LISTEN_PID`` = the daemon's own pid), with
``listen = "systemd:domain=INET:index=0"`` as in systemd/logrouter.socket's comment, and
an event from the real fluent-logger client lands in the lake.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

from fluent import sender

from daemon import REPO, TWISTD, Daemon
from helpers import read_lake

# What systemd does between fork and exec: the socket at fd 3, LISTEN_PID set to the pid
# of the process that will run the service (only known in the child, hence this step).
ACTIVATE = (
    "import os, sys; fd = int(os.environ.pop('TEST_LISTEN_FD')); "
    "fd == 3 or (os.dup2(fd, 3), os.close(fd)); "
    "os.environ['LISTEN_PID'] = str(os.getpid()); os.execv(sys.argv[1], sys.argv[1:])"
)

CONFIG = """
[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "systemd:domain=INET:index=0"

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
roll_secs = 1
"""


class ActivatedDaemon(Daemon):
    """``twistd -n logrouter`` started with ``listener`` passed as systemd passes it."""

    def __init__(self, workdir, config_text: str, listener: socket.socket) -> None:
        super().__init__(workdir, config_text)
        self.listener = listener

    def start(self, wait_for: str = r"logrouter running", timeout: float = 60) -> "ActivatedDaemon":
        fd = self.listener.fileno()
        env = dict(
            os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", LISTEN_FDS="1", TEST_LISTEN_FD=str(fd),
            # systemd (>= 227) always names the sockets: FileDescriptorName=, by default the
            # socket unit's name; Twisted ignores LISTEN_FDS without a name for each fd.
            LISTEN_FDNAMES="logrouter.socket",
        )
        env.pop("LISTEN_PID", None)
        self.process = subprocess.Popen(
            [sys.executable, "-c", ACTIVATE, str(TWISTD), "--nodaemon", "--pidfile=", "logrouter", "--config", str(self.config)],
            cwd=self.workdir,
            env=env,
            pass_fds=(fd,),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        if wait_for:
            self.wait_for(wait_for, timeout)
        return self


def test_socket_activated_daemon_adopts_the_socket_and_an_event_lands_in_the_lake(tmp_path):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    with ActivatedDaemon(tmp_path, CONFIG, listener) as daemon:
        daemon.start()
        # Only the daemon holds the socket now: a connection can only be its.
        listener.close()
        assert daemon.port("forward") == port
        logger = sender.FluentSender("test", host="127.0.0.1", port=port)
        try:
            assert logger.emit("hello", {"msg": "hi", "n": 1}), logger.last_error
        finally:
            logger.close()
        daemon.wait_for(r"parquet sink lake committed 1 file\(s\), 1 rows: tag=test\.hello/dt=\S+/hour=\d\d")
        rows = read_lake(tmp_path / "lake")
        assert [(r["tag"], r["msg"], r["n"]) for r in rows] == [("test.hello", "hi", 1)]
        daemon.stop_gracefully()

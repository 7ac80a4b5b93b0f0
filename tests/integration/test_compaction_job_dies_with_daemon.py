"""A compaction job dies with the daemon that started it, even one killed with ``kill -9``.

A helper process starts a stand-in job the way the scheduler does (the real
``TwistedProcessRunner``, the job's environment from ``job_env``); the job leads a
process group of its own, so nothing but the kernel's parent-death signal ends it when
the helper is killed with ``kill -9``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from helpers import wait_until
from logrouter.compaction.command import job_env

HELPER = r"""
import sys
from twisted.internet import reactor
from logrouter.compaction.runner import TwistedProcessRunner

STAND_IN = "import os, signal; print('job', os.getpid(), flush=True); signal.pause()"
pid_file = sys.argv[1]

def on_line(stream, line):
    if line.startswith("job "):
        with open(pid_file + ".tmp", "w") as f:
            f.write(line.split()[1])
        __import__("os").rename(pid_file + ".tmp", pid_file)

TwistedProcessRunner(reactor).spawn([sys.executable, "-c", STAND_IN], dict(__import__("os").environ), None, on_line)
reactor.run()
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


def test_a_job_dies_when_its_daemon_is_killed(tmp_path):
    pid_file = tmp_path / "job.pid"
    helper = subprocess.Popen([sys.executable, "-c", HELPER, str(pid_file)], env=job_env(dict(os.environ), sys.executable),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    job = None
    try:
        wait_until(lambda: pid_file.exists() or helper.poll() is not None, 60, "the stand-in job to start")
        assert pid_file.exists(), helper.stderr.read().decode()
        job = int(pid_file.read_text())
        assert parent_of(job) == helper.pid and os.getpgid(job) == job  # its own group, as the scheduler's jobs
        helper.kill()
        helper.wait(timeout=30)
        wait_until(lambda: not alive(job), 30, "the job to die with the process that started it")
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait(timeout=30)
        helper.stderr.close()
        if job is not None and alive(job):
            os.killpg(job, signal.SIGKILL)

"""How a compaction job starts: a session of its own, the parent-death signal, the check
that its parent is still the daemon, then ``exec`` (``logrouter.parent_death``), all with
fakes; ``TwistedProcessRunner`` starts every job through that shim with the daemon's pid.
The real thing, a daemon killed with ``kill -9``, is
``tests/integration/test_compaction_job_dies_with_daemon.py``.
"""

from __future__ import annotations

import os
import signal

from logrouter.compaction.runner import TwistedProcessRunner
from logrouter.parent_death import EXIT_PARENT_GONE, JOB_SHIM, PR_SET_PDEATHSIG, die_with_parent, exec_with_parent


def test_die_with_parent_sets_the_death_signal_and_stays_while_the_parent_lives():
    calls, exits = [], []
    armed = die_with_parent(7, prctl=lambda *args: calls.append(args) or 0, getppid=lambda: 7, exit=exits.append)
    assert armed and calls == [(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)] and exits == []


def test_die_with_parent_exits_when_the_parent_is_already_gone():
    calls, exits = [], []
    die_with_parent(7, prctl=lambda *args: calls.append(args) or 0, getppid=lambda: 1, exit=exits.append)
    assert len(calls) == 1 and exits == [EXIT_PARENT_GONE]


def test_the_shim_leads_a_session_then_dies_with_the_parent_then_execs():
    steps = []
    exec_with_parent(["123", "spark-submit", "--master", "local[1]"], setsid=lambda: steps.append("setsid"),
                     die=lambda parent: steps.append(("die", parent)),
                     execvp=lambda file, args: steps.append(("exec", file, args)))
    assert steps == ["setsid", ("die", 123), ("exec", "spark-submit", ["spark-submit", "--master", "local[1]"])]


class SpawningReactor:
    def __init__(self) -> None:
        self.spawned = []

    def spawnProcess(self, process_protocol, executable, args, env=None, path=None, childFDs=None):
        self.spawned.append((executable, list(args)))
        return FakeTransport()


class FakeTransport:
    pid = 4242

    def closeStdin(self) -> None:
        pass


def test_every_job_starts_through_the_shim_with_the_daemons_pid():
    reactor = SpawningReactor()
    job = TwistedProcessRunner(reactor, "/venv/bin/python").spawn(["/venv/bin/python", "-m", "job", "--x"], {}, None,
                                                                  lambda stream, line: None)
    assert job.pid == 4242
    assert reactor.spawned == [("/venv/bin/python", ["/venv/bin/python", "-c", JOB_SHIM, str(os.getpid()),
                                                     "/venv/bin/python", "-m", "job", "--x"])]
    assert "exec_with_parent(sys.argv[1:])" in JOB_SHIM

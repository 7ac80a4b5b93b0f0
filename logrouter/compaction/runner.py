"""Running the compaction job as a child process in its own process group.

Owns the small interface the scheduler uses (``ProcessRunner.spawn`` → ``RunningJob``),
so tests can hand the scheduler a fake. The real runner uses
``reactor.spawnProcess``; the child first calls ``setsid()`` (through a one-line Python
shim that then ``exec``s the command, keeping its pid), so the job, spark-submit, the
JVM and everything they start share one process group that ``signal_group`` reaches.
The shim also makes the job die with the daemon (``logrouter.parent_death``): a daemon
killed with ``kill -9`` leaves no job behind. The job's own children follow it: pyspark's
JVM exits when its stdin, a pipe from the job, closes; spark-submit ``exec``s its JVM,
which is then the job itself, and the Python driver it starts loses its gateway.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from twisted.internet import defer, error, protocol

from logrouter.parent_death import JOB_SHIM



@dataclass(frozen=True)
class JobExit:
    """How a job ended: ``exit_code`` (None if killed) and ``signal`` (None if it exited)."""

    exit_code: int | None
    signal: int | None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        return f"exit status {self.exit_code}"


class RunningJob(Protocol):
    pid: int
    #: Fires with a ``JobExit`` when the process has ended (never errbacks).
    ended: defer.Deferred

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the job's whole process group (no-op once it has ended)."""


class ProcessRunner(Protocol):
    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, on_line: Callable[[str, str], None]
    ) -> RunningJob:
        """Start ``argv``; ``on_line("stdout" | "stderr", line)`` for each output line."""


class _JobProtocol(protocol.ProcessProtocol):
    def __init__(self, on_line: Callable[[str, str], None]) -> None:
        self.on_line = on_line
        self.ended: defer.Deferred = defer.Deferred()
        self._buffers = {1: b"", 2: b""}

    def childDataReceived(self, fd: int, data: bytes) -> None:
        if fd not in self._buffers:
            return
        buffer = self._buffers[fd] + data
        *lines, rest = buffer.split(b"\n")
        self._buffers[fd] = rest[-65536:]  # a line longer than that is cut, not hoarded
        for line in lines:
            self._line(fd, line)

    def _line(self, fd: int, line: bytes) -> None:
        self.on_line("stdout" if fd == 1 else "stderr", line.decode("utf-8", "replace").rstrip("\r"))

    def processEnded(self, reason: Any) -> None:
        for fd, rest in self._buffers.items():
            if rest:
                self._line(fd, rest)
        self._buffers = {1: b"", 2: b""}
        value = reason.value
        if isinstance(value, error.ProcessDone):
            result = JobExit(0, None)
        else:
            result = JobExit(getattr(value, "exitCode", None), getattr(value, "signal", None))
        self.ended.callback(result)


class _SpawnedJob:
    def __init__(self, transport: Any, job_protocol: _JobProtocol) -> None:
        self.transport = transport
        self.pid = transport.pid
        self.ended = job_protocol.ended
        self._done = False
        self.ended.addBoth(self._mark_done)

    def _mark_done(self, result: Any) -> Any:
        self._done = True
        return result

    def signal_group(self, sig: int) -> None:
        if self._done or not self.pid:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass  # already gone (the group leader and every member)
        except PermissionError:
            os.kill(self.pid, sig)


class TwistedProcessRunner:
    """Spawns jobs with ``reactor.spawnProcess``, each leading its own process group and
    dying with this process."""

    def __init__(self, reactor: Any, python: str = sys.executable) -> None:
        self.reactor = reactor
        self.python = python

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, on_line: Callable[[str, str], None]
    ) -> RunningJob:
        job_protocol = _JobProtocol(on_line)
        args = [self.python, "-c", JOB_SHIM, str(os.getpid()), *argv]
        transport = self.reactor.spawnProcess(job_protocol, self.python, args, env=dict(env), path=cwd, childFDs={0: "w", 1: "r", 2: "r"})
        transport.closeStdin()
        return _SpawnedJob(transport, job_protocol)

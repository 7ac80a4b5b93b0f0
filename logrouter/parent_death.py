"""Children that die with the process that started them (Linux ``PR_SET_PDEATHSIG``).

Owns ``die_with_parent`` (the supervisor's workers and the compaction jobs call it in the
child) and ``exec_with_parent``, the start of a compaction job: a session of its own (so
a timeout can kill its whole process group), the death signal, the check that the parent
is still the one that forked it, then ``exec`` of the job (the setting survives ``exec``
and the pid stays the same). Without it a job leading its own process group outlives a
daemon killed with ``kill -9``, holding a CPU and, for a parquet lake, a lease.

The kernel sends the signal when the *thread* that forked the child ends: both the
supervisor and the scheduler fork from the reactor's thread, which lives as long as the
process. Imports nothing of logrouter: ``python -c`` runs it before the job starts.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Callable, Sequence

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
#: The exit status of a child whose parent was already gone when it looked.
EXIT_PARENT_GONE = 1


def _libc_prctl() -> Callable[..., int] | None:
    import ctypes  # noqa: PLC0415 - only a child about to exec needs it

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux


def die_with_parent(
    parent: int,
    *,
    prctl: Callable[..., int] | None = None,
    getppid: Callable[[], int] = os.getppid,
    exit: Callable[[int], Any] = os._exit,
) -> bool:
    """Ask the kernel to SIGKILL this process when ``parent`` dies, and exit at once if
    that already happened (between the fork and now: then the process was handed to init
    or a subreaper and ``getppid()`` says so). Whether the kernel took the setting (not on
    other systems: there a dead parent's closed pipes stop the child instead)."""
    call = prctl if prctl is not None else _libc_prctl()
    armed = False
    if call is not None:
        armed = call(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    if getppid() != parent:
        exit(EXIT_PARENT_GONE)
    return armed


def exec_with_parent(
    argv: Sequence[str],
    *,
    setsid: Callable[[], Any] = os.setsid,
    die: Callable[[int], Any] = die_with_parent,
    execvp: Callable[[str, list[str]], Any] = os.execvp,
) -> None:
    """``argv`` is ``[parent pid, command, args…]``: lead a new session, die with the
    parent, become the command."""
    parent, *command = argv
    setsid()
    die(int(parent))
    execvp(command[0], list(command))


#: ``python -c JOB_SHIM <parent pid> <command…>`` (the parent passes its own pid).
JOB_SHIM = "import sys; from logrouter.parent_death import exec_with_parent; exec_with_parent(sys.argv[1:])"

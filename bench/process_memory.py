"""What each process of a daemon's tree holds in memory, read from ``/proc``.

``tree_memory(pid)`` gives one ``ProcessMemory`` per live process of the tree: its role
(the supervisor, worker N, the daemon when it runs alone, or the command's name), its peak RSS (``VmHWM``), its RSS now
(``VmRSS``) split into anonymous memory (heaps: Python's objects, malloc arenas, pyarrow's
pool) and file-backed pages (the interpreter's and the extension modules' code and data
mapped from disk). The benchmarks print it at start-up and after the load.
"""

from __future__ import annotations

import os
import re

FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile")


class ProcessMemory:
    def __init__(self, pid: int, role: str, kib: dict[str, int]) -> None:
        self.pid, self.role = pid, role
        self.peak = kib.get("VmHWM", 0) / 1024
        self.rss = kib.get("VmRSS", 0) / 1024
        self.anon = kib.get("RssAnon", 0) / 1024
        self.file = kib.get("RssFile", 0) / 1024

    def line(self) -> str:
        return (f"    {self.role:<12} pid {self.pid:<7} peak {self.peak:6.0f} MiB  now {self.rss:6.0f} MiB "
                f"(anon {self.anon:5.0f}, file-backed {self.file:4.0f})")


def role(pid: int) -> str:
    """``worker N`` for a worker (its command line has ``--index N``), else the command's name."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "?"
    if b"--index" in argv[:-1]:
        return f"worker {argv[argv.index(b'--index') + 1].decode()}"
    return os.path.basename(argv[0].decode(errors="replace")) or "?"


def status_kib(pid: int) -> dict[str, int]:
    kib: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name = line.split(":", 1)[0]
                if name in FIELDS:
                    kib[name] = int(re.split(r"\s+", line.strip())[1])
    except OSError:  # gone meanwhile
        pass
    return kib


def tree_memory(pid: int, pids: list[int]) -> list[ProcessMemory]:
    """Each of ``pids`` (``pid``'s tree, from ``forward_load.tree_pids``), ``pid`` first."""
    roles = {each: role(each) for each in pids}
    roles[pid] = "supervisor" if any(r.startswith("worker") for r in roles.values()) else "daemon"
    found = [ProcessMemory(each, roles[each], status_kib(each)) for each in [pid] + [p for p in pids if p != pid]]
    return [p for p in found if p.peak]


def table(title: str, processes: list[ProcessMemory]) -> list[str]:
    total_peak = sum(p.peak for p in processes)
    total_now = sum(p.rss for p in processes)
    return ([f"  {title}: peak {total_peak:,.0f} MiB summed, now {total_now:,.0f} MiB"]
            + [p.line() for p in processes])

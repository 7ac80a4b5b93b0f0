"""One process per spool directory: an exclusive ``flock`` on ``<spool>/lock``.

Two routers appending to one spool would interleave frames and overwrite each other's
cursors. The lock is taken before anything is read and held for the life of the process
(the kernel drops it when the process ends, however it ends), and the file says which
process holds it.
"""

from __future__ import annotations

import fcntl
import os

LOCK_NAME = "lock"


class SpoolInUse(RuntimeError):
    """Another live process holds the spool directory."""


def lock_spool(path: str) -> int:
    """Take the lock of the spool directory ``path`` (created if missing); return its fd."""
    os.makedirs(path, exist_ok=True)
    name = os.path.join(path, LOCK_NAME)
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise SpoolInUse(f"spool directory {path} is in use by another logrouter process (pid {holder})") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd

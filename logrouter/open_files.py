"""The process's limit on open files (``RLIMIT_NOFILE``): raised to what it may be at start.

The usual soft limit (1,024) is far below what a router holding thousands of client
connections needs, and on Linux it also caps the file descriptors a user may have in
flight over Unix sockets (what the supervisor passes to its workers) unless the sender
has ``CAP_SYS_RESOURCE``. The hard limit is what the administrator allows (systemd's
``LimitNOFILE=``, ``ulimit -Hn``); raising the soft limit up to it needs no privilege.
Worker processes inherit the raised limit.
"""

from __future__ import annotations

from typing import Any

try:
    import resource
except ImportError:  # not Unix
    resource = None  # type: ignore[assignment]


def raise_to_hard(limits: Any = resource) -> tuple[int, int] | None:
    """Set the soft limit to the hard one; ``(soft before, soft now)``, or None where
    there is no such limit. An unlimited hard limit (not on Linux, where ``nr_open``
    bounds it) leaves the soft limit as it is: no system takes "unlimited" for it."""
    if limits is None:
        return None
    soft, hard = limits.getrlimit(limits.RLIMIT_NOFILE)
    if hard == limits.RLIM_INFINITY or soft == hard:
        return soft, soft
    try:
        limits.setrlimit(limits.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, hard


def soft_limit(limits: Any = resource) -> int | None:
    """The soft limit now (None: unknown or unlimited)."""
    if limits is None:
        return None
    soft = limits.getrlimit(limits.RLIMIT_NOFILE)[0]
    return None if soft == limits.RLIM_INFINITY else soft

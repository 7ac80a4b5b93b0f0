"""Test-only fault injection: named points where the process dies or a call fails.

``LOGROUTER_FAULTS`` (read once) lists ``point=action[@n]`` items, comma-separated:
``action`` is ``kill`` (SIGKILL to this process: a crash at exactly that step) or
``raise`` (an ``InjectedFault``, an OSError: a call whose answer was lost), on the
``n``-th time the point is reached (default 1), once. Without the variable every
``hit`` is one dictionary lookup. Tests of crash safety use it to stop the real daemon
between two steps of a commit; nothing else sets it.
"""

from __future__ import annotations

import os
import signal

ENV = "LOGROUTER_FAULTS"


class InjectedFault(OSError):
    """The failure a ``raise`` fault injects."""


def _parse(text: str) -> dict[str, list]:
    faults: dict[str, list] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        point, _, action = item.partition("=")
        action, _, count = action.partition("@")
        if action not in ("kill", "raise"):
            raise ValueError(f"{ENV}: {item!r}: the action must be kill or raise")
        faults[point] = [action, int(count or 1)]
    return faults


_FAULTS = _parse(os.environ.get(ENV, ""))


def armed(point: str) -> bool:
    """Whether ``LOGROUTER_FAULTS`` names ``point`` (for hooks that cost something to set up)."""
    return point in _FAULTS


def hit(point: str) -> None:
    """Reaching ``point``: die or raise here if ``LOGROUTER_FAULTS`` says so."""
    fault = _FAULTS.get(point)
    if fault is None:
        return
    fault[1] -= 1
    if fault[1] != 0:
        return
    del _FAULTS[point]
    if fault[0] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFault(f"fault injected at {point} ({ENV})")

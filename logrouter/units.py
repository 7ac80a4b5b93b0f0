"""How numbers read by people are written: byte counts and durations.

Shared by the commands and the log lines that report sizes and time (``logrouter
compact``, ``logrouter top``, the progress of long work), so they all read alike.
"""

from __future__ import annotations


def human_bytes(count: float) -> str:
    """``512 B``, ``1.5 KiB``, ``3.0 GiB``: binary units, one decimal past bytes."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"  # not reached


def human_duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``: whole seconds, two units at most."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"

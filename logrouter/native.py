"""Which decode path runs: the native extension (``logrouter_native``) or pure Python.

The extension is built from ``native/`` (Rust, see ``docs/native.md``) and installed
beside logrouter by ``make run`` and ``make test``; ``pip install .`` alone does not
build it. Without it every decode runs in Python, with the same results: the Python
path is the reference the native one is tested against. ``LOGROUTER_NATIVE=0`` in the
environment turns the extension off even when it is installed (for a comparison, or
to rule it out).

``NATIVE`` is the extension module, or None; ``describe()`` says in one line which
path runs and why, for the daemon's start-up log. A leaf module: nothing of
logrouter's is imported here.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["NATIVE", "describe", "why_not"]


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("LOGROUTER_NATIVE", "1").strip().lower() in ("0", "no", "off", "false"):
        return None, "turned off by LOGROUTER_NATIVE"
    try:
        import logrouter_native
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and e.name == "logrouter_native":
            return None, "logrouter_native is not installed (`pip install ./native` builds it)"
        return None, f"logrouter_native cannot be loaded: {e}"  # e.g. built for another platform
    return logrouter_native, ""


NATIVE, why_not = _load()


def describe() -> str:
    """One line: which path decodes forward entries into lake columns, and why."""
    if NATIVE is not None:
        return f"native (logrouter_native {getattr(NATIVE, '__version__', '?')})"
    return f"pure Python: {why_not}"

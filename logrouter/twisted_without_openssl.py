"""Twisted's TLS-aware modules imported without pyOpenSSL, so that a process whose config
has no TLS never loads it.

``twisted.internet.posixbase`` (every reactor), ``twisted.internet.tcp`` and
``twisted.internet.endpoints`` import pyOpenSSL when they are imported, if it is installed,
to offer ``listenSSL``/``connectSSL``, ``startTLS`` and the ``ssl:`` client endpoints:
with cryptography, service_identity and idna that is ~13 MiB of RSS in each process (three
with ``[router] workers = 2``: ``docs/operations/memory.md``). The entry points (``tap``,
the worker's ``main``) call ``import_twisted()`` first: it imports those modules while
``OpenSSL`` cannot be found, then lets it be found again. TLS still works whenever a
config asks for it: ``logrouter.tls`` imports pyOpenSSL on first use and builds TLS over
plain TCP itself (``TLSMemoryBIOFactory``), as those reactor methods would; only
``startTLS`` on a TCP transport (which logrouter never calls) stays unavailable.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys

#: The modules that decide when imported whether TLS exists.
TLS_AWARE = ("twisted.internet.posixbase", "twisted.internet.tcp", "twisted.internet.endpoints")


class HideOpenSSL(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "OpenSSL" or name.startswith("OpenSSL."):
            raise ModuleNotFoundError(f"No module named {name!r} (not yet: no TLS configured)", name=name)
        return None


def import_twisted() -> None:
    """Import ``TLS_AWARE`` without pyOpenSSL. Nothing to do once pyOpenSSL is loaded (a
    test process, or any code that imported it first): they then take it as usual."""
    if "OpenSSL" in sys.modules or all(name in sys.modules for name in TLS_AWARE):
        return
    hide = HideOpenSSL()
    sys.meta_path.insert(0, hide)
    try:
        for name in TLS_AWARE:
            importlib.import_module(name)
    finally:
        sys.meta_path.remove(hide)

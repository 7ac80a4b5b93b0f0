"""Replacing a small file on the local disk atomically and durably: the one way to do it.

``replace_file(path, data)`` writes ``data`` to ``<path>.tmp``, fsyncs it, renames it over
``path`` and fsyncs the directory. After a crash at any instant ``path`` holds either the
old content or the new, never a mix or nothing, and once the call returns the new content
survives a power loss (the rename is durable only once the directory is fsync'd). Every
state file the router keeps is written this way: a sink's cursor and commit record, the
dedupe snapshot, the filters' memory, the saved routes, Pravega's stream table.
``fsync_directory`` is the last step alone, for code that renames files itself.

A leaf module (the standard library only), so any layer may use it. The lake's files go
through ``logrouter.lake.fs`` instead, which does the same on HDFS too.
"""

from __future__ import annotations

import os


def replace_file(path: str, data: bytes | memoryview, *more: bytes | memoryview) -> None:
    """Make ``data`` (followed by ``more``, each written as it is) the content of
    ``path`` atomically and durably (its directory is created if missing)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    temporary = path + ".tmp"
    with open(temporary, "wb") as f:
        f.write(data)
        for part in more:
            f.write(part)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    fsync_directory(directory)


def fsync_directory(path: str) -> None:
    """Make the names in directory ``path`` (a rename, a new or removed file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

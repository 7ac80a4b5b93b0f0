"""The filesystem seam of the lake writer, and its local implementation.

Owns every filesystem call the writer makes, so an ``hdfs://`` adapter is one more
class with these eight methods (for HDFS: ``hsync`` for ``sync_close``, ``rename``
with overwrite for ``replace``, and a no-op ``sync_dir``: the namenode journals
metadata). Paths are POSIX strings in the filesystem's own namespace.

Durability is part of the contract, because the commit protocol relies on it:
``sync_close`` returns once the file's bytes are on stable storage, ``makedirs`` and
``sync_dir`` make directory entries durable.
"""

from __future__ import annotations

import errno
import os
import posixpath
from typing import BinaryIO, Protocol


class LakeFileSystem(Protocol):
    def open_write(self, path: str) -> BinaryIO:
        """A new file for writing; fails if ``path`` exists (names are never reused)."""

    def sync_close(self, stream: BinaryIO) -> None:
        """Flush ``stream`` to stable storage and close it."""

    def makedirs(self, path: str) -> None:
        """Create ``path`` and missing parents, durably; fine if it exists."""

    def replace(self, source: str, target: str) -> None:
        """Rename ``source`` to ``target`` atomically (same filesystem)."""

    def sync_dir(self, path: str) -> None:
        """Make the entries of directory ``path`` durable."""

    def remove(self, path: str) -> None:
        """Delete a file."""

    def exists(self, path: str) -> bool: ...

    def list_files(self, path: str) -> list[str]:
        """Names of the regular files in directory ``path``; [] if it does not exist."""


class LocalFileSystem:
    """The local disk, with fsync for files and the directories that name them."""

    def open_write(self, path: str) -> BinaryIO:
        return open(path, "xb")  # noqa: SIM115 - closed by sync_close

    def sync_close(self, stream: BinaryIO) -> None:
        try:
            stream.flush()
            os.fsync(stream.fileno())
        finally:
            stream.close()

    def makedirs(self, path: str) -> None:
        missing = []
        while path and not os.path.isdir(path):
            missing.append(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        for directory in reversed(missing):
            try:
                os.mkdir(directory)
            except FileExistsError:
                continue  # another writer created it: they sync it
            # A new directory is only durable once its parent's entry is.
            self.sync_dir(os.path.dirname(directory) or ".")

    def replace(self, source: str, target: str) -> None:
        os.replace(source, target)

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        except OSError as error:  # some filesystems refuse fsync on directories
            if error.errno not in (errno.EINVAL, errno.EBADF):
                raise
        finally:
            os.close(fd)

    def remove(self, path: str) -> None:
        os.remove(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_files(self, path: str) -> list[str]:
        try:
            with os.scandir(path) as entries:
                return sorted(entry.name for entry in entries if entry.is_file(follow_symlinks=False))
        except FileNotFoundError:
            return []


def filesystem_for(url: str) -> tuple[LakeFileSystem, str]:
    """The filesystem and root path of a lake URL (a plain path or ``file://…``)."""
    if url.startswith("file://"):
        return LocalFileSystem(), url[len("file://") :] or "/"
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise ValueError(f"no lake filesystem for {scheme}:// yet (supported: local paths, file://)")
    return LocalFileSystem(), url


join = posixpath.join

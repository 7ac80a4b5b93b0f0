"""The filesystem seam of the lake writer, and its local implementation.

Owns every filesystem call the writer makes, so an ``hdfs://`` adapter is one more
class with these eight methods (for HDFS: ``hsync`` for ``sync_close``, ``rename``
with overwrite for ``replace``, and a no-op ``sync_dir``: the namenode journals
metadata). Paths are POSIX strings in the filesystem's own namespace.

Durability is part of the contract, because the commit protocol relies on it:
``sync_close`` returns once the file's bytes are on stable storage, ``makedirs`` and
``sync_dir`` make directory entries durable.

Compaction (``logrouter.compaction``) needs a few more calls, in ``MaintenanceFileSystem``:
listing directories with sizes, reading files, publishing a small file only if its name
is free (leases, commit markers) and removing a directory tree. Both implementations
here have them.

``hdfs://`` goes through ``hdfs-native`` (a maintained native HDFS client: the RPC
protocol spoken directly, no JVM, no libhdfs), imported only when an ``hdfs://`` lake is
used. ``check_lake_url`` tells a config validator what is missing.
"""

from __future__ import annotations

import errno
import importlib.util
import io
import os
import posixpath
import secrets
import shutil
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol


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


@dataclass(frozen=True)
class Entry:
    """One directory entry: its name, whether it is a directory, its size in bytes."""

    name: str
    is_dir: bool
    size: int


class MaintenanceFileSystem(LakeFileSystem, Protocol):
    """The calls compaction makes on top of the writer's."""

    def list_entries(self, path: str) -> list[Entry]:
        """The entries of directory ``path``, sorted by name; [] if it does not exist."""

    def open_read(self, path: str) -> BinaryIO:
        """A seekable binary stream of the file (for Parquet footers)."""

    def read_bytes(self, path: str) -> bytes: ...

    def create_exclusive(self, path: str, data: bytes) -> None:
        """Publish a small file with ``data`` durably at ``path``, only if ``path`` does
        not exist (then raise ``FileExistsError``). Readers never see it partly written."""

    def remove_tree(self, path: str) -> None:
        """Delete a directory and everything in it; fine if it does not exist."""


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

    # -- maintenance (compaction) ---------------------------------------------------------

    def list_entries(self, path: str) -> list[Entry]:
        try:
            with os.scandir(path) as entries:
                found = []
                for entry in entries:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if not is_dir and not entry.is_file(follow_symlinks=False):
                        continue
                    found.append(Entry(entry.name, is_dir, 0 if is_dir else entry.stat(follow_symlinks=False).st_size))
                return sorted(found, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def open_read(self, path: str) -> BinaryIO:
        return open(path, "rb")  # noqa: SIM115 - the caller closes it

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def create_exclusive(self, path: str, data: bytes) -> None:
        directory = os.path.dirname(path) or "."
        temporary = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
        with open(temporary, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temporary, path)  # atomic, and refuses an existing name (rename would not)
        finally:
            os.remove(temporary)
        self.sync_dir(directory)

    def remove_tree(self, path: str) -> None:
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            return
        self.sync_dir(os.path.dirname(path.rstrip("/")) or ".")



class _HdfsWriteStream(io.RawIOBase):
    """An ``hdfs_native`` file writer with ``tell`` (pyarrow and the writer ask for it)."""

    def __init__(self, inner: Any, path: str) -> None:
        self.inner = inner
        self.name = path
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        written = len(memoryview(data))
        self.inner.write(bytes(data))
        self._position += written
        return written

    def tell(self) -> int:
        return self._position

    def hsync(self) -> None:
        self.inner.hsync()

    def close(self) -> None:
        if not self.closed:
            try:
                self.inner.close()
            finally:
                super().close()


@dataclass(frozen=True)
class _WriteOptions:
    """``hdfs_native.WriteOptions``' fields we use (for an injected client)."""

    overwrite: bool = False
    create_parent: bool = True


class HdfsFileSystem:
    """HDFS through ``hdfs_native.Client`` (a thin adapter: one client call per method).

    ``sync_close`` is ``hsync`` + close, ``replace`` a rename with overwrite, ``sync_dir``
    a no-op (the namenode journals metadata before it answers). Cluster settings (HA
    name services, Kerberos) come from ``HADOOP_CONF_DIR`` as the client reads them.
    """

    def __init__(self, url: str, client: Any = None, write_options: Any = None) -> None:
        if client is None:
            import hdfs_native  # noqa: PLC0415 - optional dependency, only for hdfs:// lakes

            client = hdfs_native.Client(url)
            write_options = hdfs_native.WriteOptions
        self.url = url
        self.client = client
        self._write_options = write_options or _WriteOptions

    def open_write(self, path: str) -> BinaryIO:
        try:
            inner = self.client.create(path, self._write_options(overwrite=False))
        except FileNotFoundError:
            raise
        except Exception as error:
            if self.exists(path):
                raise FileExistsError(path) from error
            raise
        return _HdfsWriteStream(inner, path)  # type: ignore[return-value]

    def sync_close(self, stream: BinaryIO) -> None:
        try:
            stream.hsync()  # type: ignore[attr-defined]
        finally:
            stream.close()

    def makedirs(self, path: str) -> None:
        self.client.mkdirs(path, 0o755, True)

    def replace(self, source: str, target: str) -> None:
        self.client.rename(source, target, True)

    def sync_dir(self, path: str) -> None:
        pass  # metadata operations are durable in the namenode's edit log when they return

    def remove(self, path: str) -> None:
        self.client.delete(path, False)

    def exists(self, path: str) -> bool:
        try:
            self.client.get_file_info(path)
        except FileNotFoundError:
            return False
        return True

    def list_files(self, path: str) -> list[str]:
        return [e.name for e in self.list_entries(path) if not e.is_dir]

    def list_entries(self, path: str) -> list[Entry]:
        try:
            statuses = list(self.client.list_status(path, False))
        except FileNotFoundError:
            return []
        return sorted(
            (Entry(posixpath.basename(s.path.rstrip("/")), bool(s.isdir), 0 if s.isdir else int(s.length)) for s in statuses),
            key=lambda e: e.name,
        )

    def open_read(self, path: str) -> BinaryIO:
        return self.client.read(path)

    def read_bytes(self, path: str) -> bytes:
        return bytes(self.client.read(path).read())

    def create_exclusive(self, path: str, data: bytes) -> None:
        directory = posixpath.dirname(path)
        temporary = posixpath.join(directory, f".{posixpath.basename(path)}.{secrets.token_hex(6)}.tmp")
        stream = self.open_write(temporary)
        try:
            stream.write(data)
        finally:
            self.sync_close(stream)
        try:
            self.client.rename(temporary, path, False)  # HDFS refuses an existing target
        except FileNotFoundError:
            raise
        except Exception as error:
            self.remove(temporary)
            if self.exists(path):
                raise FileExistsError(path) from error
            raise

    def remove_tree(self, path: str) -> None:
        try:
            self.client.delete(path, True)
        except FileNotFoundError:
            pass


HDFS_PACKAGE = "hdfs-native"
HDFS_MODULE = "hdfs_native"
LOCAL_SCHEMES = ("file",)


class MissingPackageError(ValueError):
    """A lake URL needs an optional package that is not installed."""


def _split_url(url: str) -> tuple[str, str, str]:
    """``(scheme, authority, path)`` of ``scheme://authority/path``."""
    scheme, rest = url.split("://", 1)
    authority, slash, path = rest.partition("/")
    return scheme.lower(), authority, "/" + path if slash else ""


def check_lake_url(url: str) -> None:
    """Raise ValueError saying what is wrong with a lake URL (or what to install)."""
    if not url:
        raise ValueError("must not be empty")
    if "://" not in url:
        return
    scheme, authority, path = _split_url(url)
    if scheme == "file":
        return
    if scheme == "hdfs":
        if not path or path == "/":
            raise ValueError(f"an hdfs:// lake needs a directory: hdfs://namenode:8020/logs, got {url!r}")
        if importlib.util.find_spec(HDFS_MODULE) is None:
            raise MissingPackageError(
                f"hdfs:// needs the '{HDFS_PACKAGE}' package: pip install {HDFS_PACKAGE}  (or: pip install 'logrouter[hdfs]')"
            )
        return
    raise ValueError(f"filesystem {scheme!r} is not supported (use a local path, file:// or hdfs://)")


def filesystem_for(url: str, hdfs_client: Any = None) -> tuple["LocalFileSystem | HdfsFileSystem", str]:
    """The filesystem and root path of a lake URL: a plain path, ``file://…`` or
    ``hdfs://namenode[:port]/path`` (``hdfs_client``: an injected client, for tests)."""
    if url.startswith("file://"):
        return LocalFileSystem(), url[len("file://") :] or "/"
    if "://" in url:
        scheme, authority, path = _split_url(url)
        if scheme == "hdfs":
            if hdfs_client is None:
                check_lake_url(url)
            return HdfsFileSystem(f"hdfs://{authority}", hdfs_client), path.rstrip("/") or "/"
        raise ValueError(f"no lake filesystem for {scheme}:// (supported: local paths, file://, hdfs://)")
    return LocalFileSystem(), url


join = posixpath.join

"""A pyiceberg ``FileIO`` for ``hdfs://`` tables, over the lake's own HDFS client.

Owns reading, writing and deleting an Iceberg table's files (data files, manifests,
manifest lists, ``*.metadata.json``) on HDFS through ``logrouter.lake.fs.HdfsFileSystem``
(``hdfs-native``: the RPC protocol spoken directly, no JVM, no libhdfs), so the Iceberg
sink, ``logrouter lake`` and the parquet sink share one client and one set of cluster
settings (``HADOOP_CONF_DIR``). Selected with the catalog property
``py-io-impl = logrouter.lake.iceberg_hdfs_io.HdfsFileIO``.

Why not PyPI's ``pyiceberg-hdfs-native`` (0.2.0): it builds one fsspec filesystem per
scheme and strips the authority from every path, so ``hdfs://namenode:8020/…`` goes to
whatever ``fs.defaultFS`` says (and fails with no ``HADOOP_CONF_DIR``), its files are
closed without ``hsync``, and "create, never overwrite" is a check followed by a
truncating open. Here:

- each ``hdfs://authority`` gets its own client (``hdfs:///path`` uses ``fs.defaultFS``);
- ``create(overwrite=False)`` is one NameNode create that refuses an existing name, so
  two writers racing for a metadata file name cannot both win;
- a written file is ``hsync``'d before it is closed: once pyiceberg commits a snapshot
  naming it, its bytes are on the DataNodes' disks, as the parquet sink's files are;
- reads are buffered (manifests are read in small pieces).

Thread-safe: pyiceberg writes data files from a thread pool; hdfs-native's client is
shared by threads. Like every hdfs-native user, a process that has made a client should
not ``fork`` afterwards (see ``tests/hdfs_cluster.py``).
"""

from __future__ import annotations

import io
import threading
from typing import Any
from urllib.parse import urlsplit

from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.typedef import EMPTY_DICT, Properties

from logrouter.lake.fs import HdfsFileSystem

READ_BUFFER = 1 << 20
WRITE_BUFFER = 1 << 20


def split_location(location: str) -> tuple[str, str]:
    """``(authority, path)`` of ``hdfs://authority/path``; ValueError for another scheme."""
    parts = urlsplit(location)
    if parts.scheme.lower() != "hdfs":
        raise ValueError(f"HdfsFileIO handles hdfs:// locations only, got {location!r}")
    return parts.netloc, parts.path or "/"


class _ReadStream(io.RawIOBase):
    """An hdfs-native reader with ``readinto``, so ``io.BufferedReader`` can wrap it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.inner.read(len(view))
        view[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.inner.seek(offset, whence)
        return self.inner.tell()

    def tell(self) -> int:
        return self.inner.tell()


class _DurableWriteStream(io.RawIOBase):
    """A file being written; ``close`` is ``hsync`` then close (``HdfsFileSystem.sync_close``)."""

    def __init__(self, fs: HdfsFileSystem, inner: Any) -> None:
        self.fs = fs
        self.inner = inner

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self.inner.write(data)

    def tell(self) -> int:
        return self.inner.tell()

    def close(self) -> None:
        if not self.closed:
            try:
                self.fs.sync_close(self.inner)
            finally:
                super().close()


class HdfsInputFile(InputFile):
    def __init__(self, location: str, fs: HdfsFileSystem, path: str) -> None:
        super().__init__(location)
        self._fs = fs
        self._path = path

    def __len__(self) -> int:
        return int(self._fs.client.get_file_info(self._path).length)

    def exists(self) -> bool:
        return self._fs.exists(self._path)

    def open(self, seekable: bool = True) -> InputStream:
        try:
            inner = self._fs.open_read(self._path)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"no such file: {self.location}") from error
        return io.BufferedReader(_ReadStream(inner), READ_BUFFER)  # type: ignore[return-value]


class HdfsOutputFile(OutputFile):
    def __init__(self, location: str, fs: HdfsFileSystem, path: str) -> None:
        super().__init__(location)
        self._fs = fs
        self._path = path

    def __len__(self) -> int:
        return int(self._fs.client.get_file_info(self._path).length)

    def exists(self) -> bool:
        return self._fs.exists(self._path)

    def to_input_file(self) -> HdfsInputFile:
        return HdfsInputFile(self.location, self._fs, self._path)

    def create(self, overwrite: bool = False) -> OutputStream:
        """A new file; ``FileExistsError`` if it exists and ``overwrite`` is false (decided
        by the NameNode in the create call itself, never by a separate check)."""
        if overwrite and self._fs.exists(self._path):
            self._fs.remove(self._path)  # pyiceberg overwrites only names it made unique
        try:
            inner = self._fs.open_write(self._path)
        except FileExistsError as error:
            raise FileExistsError(f"Cannot create file, file already exists: {self.location}") from error
        return io.BufferedWriter(_DurableWriteStream(self._fs, inner), WRITE_BUFFER)  # type: ignore[return-value]


class HdfsFileIO(FileIO):
    """``FileIO`` for ``hdfs://`` locations (see the module docstring)."""

    def __init__(self, properties: Properties = EMPTY_DICT) -> None:
        super().__init__(properties=properties)
        self._filesystems: dict[str, HdfsFileSystem] = {}
        self._lock = threading.Lock()

    def filesystem(self, authority: str) -> HdfsFileSystem:
        """The one client of ``hdfs://authority`` (made on first use)."""
        with self._lock:
            fs = self._filesystems.get(authority)
            if fs is None:
                fs = self._filesystems[authority] = HdfsFileSystem(f"hdfs://{authority}")
            return fs

    def _locate(self, location: str) -> tuple[HdfsFileSystem, str]:
        authority, path = split_location(location)
        return self.filesystem(authority), path

    def new_input(self, location: str) -> HdfsInputFile:
        return HdfsInputFile(location, *self._locate(location))

    def new_output(self, location: str) -> HdfsOutputFile:
        return HdfsOutputFile(location, *self._locate(location))

    def delete(self, location: str | InputFile | OutputFile) -> None:
        if isinstance(location, (InputFile, OutputFile)):
            location = location.location
        fs, path = self._locate(location)
        if not fs.exists(path):
            raise FileNotFoundError(f"no such file: {location}")
        fs.remove(path)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its clients (a copy makes its own)."""
        return {"properties": self.properties}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["properties"])  # type: ignore[misc]

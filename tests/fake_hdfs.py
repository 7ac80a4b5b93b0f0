"""An in-memory stand-in for ``hdfs_native.Client``, for testing the HDFS adapter at
the seam: the calls the adapter makes, with HDFS's semantics (create refuses an
existing file without overwrite, rename refuses an existing target without
overwrite, a missing parent fails, errors as hdfs-native raises them)."""

from __future__ import annotations

import io
import posixpath
from dataclasses import dataclass


@dataclass
class FakeStatus:
    path: str
    length: int
    isdir: bool


class FakeWriter:
    def __init__(self, client: "FakeHdfsClient", path: str) -> None:
        self.client = client
        self.path = path
        self.buffer = bytearray()
        self.hsyncs = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        assert not self.closed
        self.buffer += data
        return len(data)

    def hsync(self) -> None:
        self.hsyncs += 1
        self.client.files[self.path] = bytes(self.buffer)

    def close(self) -> None:
        self.closed = True
        self.client.files[self.path] = bytes(self.buffer)
        self.client.calls.append(("close", self.path))


class FakeReader(io.BytesIO):
    def close(self) -> None:  # hdfs_native.FileReader.close is a no-op too
        pass


class FakeHdfsClient:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {"/"}
        self.calls: list[tuple] = []

    def _parent_exists(self, path: str) -> bool:
        return posixpath.dirname(path) in self.dirs

    def get_file_info(self, path: str) -> FakeStatus:
        if path in self.files:
            return FakeStatus(path, len(self.files[path]), False)
        if path in self.dirs:
            return FakeStatus(path, 0, True)
        raise FileNotFoundError(path)

    def list_status(self, path: str, recursive: bool = False):
        if path not in self.dirs:
            raise FileNotFoundError(path)
        prefix = path.rstrip("/") + "/"
        for name in sorted(self.dirs):
            if name.startswith(prefix) and "/" not in name[len(prefix):] and name != path:
                yield FakeStatus(name, 0, True)
        for name, data in sorted(self.files.items()):
            if name.startswith(prefix) and "/" not in name[len(prefix):]:
                yield FakeStatus(name, len(data), False)

    def create(self, path: str, write_options) -> FakeWriter:
        self.calls.append(("create", path, write_options.overwrite))
        if path in self.files and not write_options.overwrite:
            raise RuntimeError(f"AlreadyExists: {path}")
        if not self._parent_exists(path):
            raise FileNotFoundError(posixpath.dirname(path))
        self.files[path] = b""
        return FakeWriter(self, path)

    def read(self, path: str) -> FakeReader:
        if path not in self.files:
            raise FileNotFoundError(path)
        return FakeReader(self.files[path])

    def mkdirs(self, path: str, permission: int = 0o755, create_parent: bool = False) -> None:
        self.calls.append(("mkdirs", path, create_parent))
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            directory = "/" + "/".join(parts[:i])
            if directory in self.files:
                raise RuntimeError(f"ParentNotDirectory: {directory}")
            if directory not in self.dirs and not create_parent and i < len(parts):
                raise FileNotFoundError(directory)
            self.dirs.add(directory)

    def rename(self, src: str, dst: str, overwrite: bool = False) -> None:
        self.calls.append(("rename", src, dst, overwrite))
        if src not in self.files and src not in self.dirs:
            raise FileNotFoundError(src)
        if not self._parent_exists(dst):
            raise FileNotFoundError(posixpath.dirname(dst))
        if (dst in self.files or dst in self.dirs) and not overwrite:
            raise RuntimeError(f"FileAlreadyExistsException: {dst}")
        if src in self.files:
            self.files[dst] = self.files.pop(src)
        else:
            prefix = src.rstrip("/") + "/"
            self.dirs = {dst + d[len(src):] if d == src or d.startswith(prefix) else d for d in self.dirs}
            self.files = {dst + f[len(src):] if f.startswith(prefix) else f: v for f, v in self.files.items()}

    def delete(self, path: str, recursive: bool = False) -> bool:
        self.calls.append(("delete", path, recursive))
        if path in self.files:
            del self.files[path]
            return True
        if path not in self.dirs:
            raise FileNotFoundError(path)
        prefix = path.rstrip("/") + "/"
        inside = [f for f in self.files if f.startswith(prefix)] + [d for d in self.dirs if d.startswith(prefix)]
        if inside and not recursive:
            raise RuntimeError(f"PathIsNotEmptyDirectoryException: {path}")
        for f in [f for f in self.files if f.startswith(prefix)]:
            del self.files[f]
        self.dirs = {d for d in self.dirs if d != path and not d.startswith(prefix)}
        return True

"""A sink's durable state: one small JSON file replaced atomically.

A sink keeps its spool cursor here, and a file sink its commit record (files to
publish, per-partition high-water marks). Replacing the file is the commit point:
write a temporary file, fsync it, rename it over the old one, fsync the directory.
"""

from __future__ import annotations

import json
import os
from typing import Any


class SinkState:
    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> dict[str, Any] | None:
        try:
            with open(self.path, "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None

    def save(self, state: dict[str, Any]) -> None:
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        temporary = self.path + ".tmp"
        with open(temporary, "wb") as f:
            f.write(json.dumps(state, separators=(",", ":")).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

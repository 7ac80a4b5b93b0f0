"""A sink's durable state: one small JSON file replaced atomically.

A sink keeps its spool cursor here, and a file sink its commit record (files to
publish, per-partition high-water marks). Replacing the file is the commit point:
write a temporary file, fsync it, rename it over the old one, fsync the directory.
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.logger import Logger


class SinkState:
    log = Logger(namespace="logrouter.sink.state")

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> dict[str, Any] | None:
        """The saved state; ``None`` if there is none, or if it is unreadable.

        An unreadable file (only disk damage can make one: it is replaced atomically) is
        moved aside with a loud log line rather than stopping startup; the sink then
        starts from the oldest record the spool holds, which may write some rows again
        but loses none.
        """
        try:
            with open(self.path, "rb") as f:
                state = json.loads(f.read())
            if not isinstance(state, dict) or not isinstance(state.get("cursor"), int):
                raise ValueError("no cursor")
            return state
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            aside = self.path + ".damaged"
            os.replace(self.path, aside)
            self.log.error(
                "sink state {path} is unreadable ({error}); moved to {aside}, the sink replays the whole spool",
                path=self.path,
                error=e,
                aside=aside,
            )
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

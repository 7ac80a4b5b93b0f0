"""A sink's durable state: one small JSON file replaced atomically
(``logrouter.atomic_file.replace_file``).

A sink keeps its spool cursor here, and a file sink its commit record (files to
publish, per-partition high-water marks). Replacing the file is the commit point:
write a temporary file, fsync it, rename it over the old one, fsync the directory.
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.logger import Logger

from logrouter.atomic_file import replace_file


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
        replace_file(self.path, json.dumps(state, separators=(",", ":")).encode())


class CursorSaver:
    """A forwarding sink's cursor, saved off the reactor thread.

    One save at a time, at most once per ``interval`` seconds unless forced (on stop);
    a forced save while another runs waits for it and then saves what is newest.
    ``extra()`` adds keys to the saved state, or returns ``None`` while there is nothing
    worth saving yet. The sink provides ``state``, ``cursor``, ``reactor``,
    ``run_blocking`` (a blocking call in a thread, replaceable in tests) and ``log``.
    """

    def __init__(self, sink: Any, interval: float, extra: Any = dict) -> None:
        self.sink = sink
        self.interval = interval
        self.extra = extra
        self.saving: Any = None
        self.saved_cursor = -1
        self.saved_at = float("-inf")

    def loaded(self, cursor: int) -> None:
        """The cursor read back at start counts as saved."""
        self.saved_cursor = cursor
        self.saved_at = self.sink.reactor.seconds()

    def save(self, force: bool = False) -> Any:
        from twisted.internet import defer

        sink = self.sink
        extra = self.extra()
        if sink.state is None or extra is None:
            return defer.succeed(None)
        if self.saving is not None:
            if not force:
                return self.saving
            again: defer.Deferred = defer.Deferred()
            self.saving.addBoth(lambda _: self.save(force=True).chainDeferred(again))
            return again
        now = sink.reactor.seconds()
        cursor = sink.cursor
        if cursor == self.saved_cursor or (not force and now - self.saved_at < self.interval):
            return defer.succeed(None)
        self.saved_at = now
        d = sink.run_blocking(sink.state.save, {"cursor": cursor, **extra})

        def saved(_: Any) -> None:
            self.saving = None
            self.saved_cursor = max(self.saved_cursor, cursor)

        def failed(failure: Any) -> None:
            self.saving = None
            sink.log.failure("{type} sink {name}: saving the cursor failed", failure, type=sink.TYPE, name=sink.name)

        self.saving = d
        d.addCallbacks(saved, failed)
        return d

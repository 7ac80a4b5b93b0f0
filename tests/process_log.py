"""The log of a process a test started: its output read line by line in a thread, and
``wait_for`` a line matching a pattern, bounded in time (shared by ``daemon.Daemon`` and
``fluent_bit.FluentBit``).

A class using it sets ``process`` (a ``subprocess.Popen`` with stdout a text pipe),
``lines`` (a list) and ``_queue`` (a ``queue.Queue``), then calls ``follow_output()``.
``LOG_NAME`` names the process in failures, ``LOG_TAIL`` bounds the output they show;
with ``log_path`` set, every line is also written to that file as it comes."""

from __future__ import annotations

import queue
import re
import threading
import time
from typing import Any


class ProcessLog:
    LOG_NAME = "process"
    LOG_TAIL: int | None = None  # characters of output a failure shows (None: all)
    process: Any
    lines: list[str]
    _queue: queue.Queue
    log_path: Any = None  # a file to copy the output to, line by line (None: none)

    def follow_output(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        log = open(self.log_path, "w") if self.log_path is not None else None
        try:
            for line in self.process.stdout:
                if log is not None:
                    log.write(line)
                    log.flush()
                self.lines.append(line)
                self._queue.put(line)
        finally:
            if log is not None:
                log.close()
            self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match:
        """The first log line (old or new) matching ``pattern``; fails after ``timeout``."""
        regex = re.compile(pattern)
        for line in list(self.lines):
            if m := regex.search(line):
                return m
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"{self.LOG_NAME} exited while waiting for {pattern!r}:\n{self._shown()}")
            if m := regex.search(line):
                return m
        raise AssertionError(f"no {self.LOG_NAME} log line matching {pattern!r} within {timeout}s:\n{self._shown()}")

    def _shown(self) -> str:
        return self.output if self.LOG_TAIL is None else self.output[-self.LOG_TAIL:]

    @property
    def output(self) -> str:
        return "".join(self.lines)

"""A minimal stream source for testing ``logrouter.sources.stream`` on its own.

Its codec frames newline-terminated lines and says how many bytes of an unfinished
line it holds (``pending_bytes``); the line ``BAD`` is a decode error that carries the
lines decoded before it in the same feed (``error.messages``). Each line is stored as
one batch and answered with ``ok <line>`` once durable. The router, the connection and
the clock are those of ``source_fakes``.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import task

import source_fakes
from source_fakes import FakePort, FakeRouter
from logrouter.batch import Batch
from logrouter.sources.stream import StreamProtocol, StreamSource
from logrouter.wire.errors import DecodeError


class LineDecoder:
    def __init__(self) -> None:
        self.buffer = b""

    @property
    def pending_bytes(self) -> int:
        return len(self.buffer)

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        out = []
        for line in lines:
            if line == b"BAD":
                error = DecodeError("bad line")
                error.messages = out  # type: ignore[attr-defined]
                raise error
            out.append(line)
        return out


class LineProtocol(StreamProtocol):
    def make_decoder(self) -> LineDecoder:
        return LineDecoder()

    def handle(self, line: bytes) -> None:
        self.submit(Batch("lines", [(0, {"line": line.decode()})]), lambda: self.send(b"ok " + line + b"\n"))


class LineSource(StreamSource):
    TYPE = "lines"
    protocol_class = LineProtocol


class LineRouter(FakeRouter):
    """The shared fake router; it also lists the stored lines, in order."""

    def lines(self) -> list[str]:
        return [batch.events[0][1]["line"] for batch in self.batches]


def make_source(**overrides: Any) -> tuple[LineSource, LineRouter, task.Clock]:
    source, router, clock = source_fakes.make_source(LineSource, "lines", router=LineRouter(), listen="tcp:0", **overrides)
    source.port = FakePort()
    return source, router, clock

"""A minimal stream source for testing ``logrouter.sources.stream`` on its own.

Its codec frames newline-terminated lines and says how many bytes of an unfinished
line it holds (``pending_bytes``); the line ``BAD`` is a decode error that carries the
lines decoded before it in the same feed (``error.messages``). Each line is stored as
one batch and answered with ``ok <line>`` once durable. The router's ``ingest`` returns
Deferreds fired by hand; time is a ``task.Clock``.
"""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import defer, task
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent, globalLogPublisher

from logrouter.batch import Batch
from logrouter.sources.stream import StreamProtocol, StreamSource
from logrouter.wire.errors import DecodeError

T0 = 1_700_000_000


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


class FakeRouter:
    def __init__(self) -> None:
        self.calls: list[tuple[Batch, defer.Deferred]] = []

    def ingest(self, batch: Batch, key: Any = None) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.calls.append((batch, d))
        return d

    def lines(self) -> list[str]:
        return [batch.events[0][1]["line"] for batch, _ in self.calls]

    def fire_all(self) -> None:
        for _, d in self.calls:
            if not d.called:
                d.callback(None)


class FakePort:
    def __init__(self) -> None:
        self.stopped = False

    def stopListening(self) -> defer.Deferred:
        self.stopped = True
        return defer.succeed(None)


def make_source(**overrides: Any) -> tuple[LineSource, FakeRouter, task.Clock]:
    options = {key: option.default for key, option in LineSource.OPTIONS.items()}
    options["listen"] = "tcp:0"
    options.update(overrides)
    clock = task.Clock()
    clock.advance(T0)
    router = FakeRouter()
    source = LineSource("lines", options, router, clock)
    source.port = FakePort()
    return source, router, clock


class Conn:
    """One client connection to a source, on a StringTransport."""

    def __init__(self, source: LineSource, host: str = "192.0.2.7", port: int = 40000, address: Any = None) -> None:
        self.transport = StringTransport(peerAddress=address or IPv4Address("TCP", host, port))
        self.protocol: LineProtocol = source.factory().buildProtocol(None)  # type: ignore[assignment]
        self.protocol.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def replies(self) -> bytes:
        data = self.transport.value()
        self.transport.clear()
        return data

    @property
    def refused(self) -> bool:
        return self.transport.disconnected  # abortConnection

    @property
    def closed(self) -> bool:
        return self.transport.disconnecting

    def lose(self, reason: Any = None) -> None:
        self.protocol.connectionLost(reason)


@pytest.fixture
def logs():
    lines: list[str] = []

    def observe(event: dict) -> None:
        text = formatEvent(event)
        if text:
            lines.append(text)

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)

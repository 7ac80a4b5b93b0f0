"""Fakes the source unit tests share: a router whose ``ingest`` returns Deferreds fired by
hand, a client connection on a ``StringTransport``, a source built from its class's option
defaults on a ``task.Clock``, a listening port, and the ``log_lines`` fixture.

Protocol-specific reading of replies (acks, ACKNs, msgpack) stays with each test module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from twisted.internet import defer, task
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent, globalLogPublisher

from logrouter.sources.base import SourceContext

T0 = 1_700_000_000  # the clock's start: 2023-11-14T22:13:20Z


@dataclass
class Ingest:
    """One call of ``FakeRouter.ingest``."""

    batch: Any
    key: Any
    writer: Any
    deferred: defer.Deferred
    events: Any = None


class FakeRouter:
    """Records every ``ingest``; each returns a Deferred the test fires (durable) or fails."""

    def __init__(self) -> None:
        self.calls: list[Ingest] = []

    def ingest(self, batch: Any, key: Any = None, *, writer: Any = None, events: Any = None) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.calls.append(Ingest(batch, key, writer, d, events))
        return d

    @property
    def batches(self) -> list[Any]:
        return [call.batch for call in self.calls]

    @property
    def keys(self) -> list[Any]:
        return [call.key for call in self.calls]

    @property
    def pending(self) -> list[defer.Deferred]:
        """The Deferreds not fired yet, oldest first."""
        return [call.deferred for call in self.calls if not call.deferred.called]

    def fire(self, index: int) -> None:
        """Call ``index`` is durable."""
        self.calls[index].deferred.callback(None)

    def fire_pending(self) -> None:
        """Every call made so far is durable; calls made while firing stay pending."""
        for d in self.pending:
            d.callback(None)

    def fire_all(self) -> None:
        """Every call is durable, also those made while firing, until none is pending."""
        for call in self.calls:  # grows while the callbacks run
            if not call.deferred.called:
                call.deferred.callback(None)


class FakePort:
    """A listening port: its address, and whether it was stopped."""

    def __init__(self, address: Any = None) -> None:
        self.address = address
        self.stopped = False

    def getHost(self) -> Any:
        return self.address

    def stopListening(self) -> defer.Deferred:
        self.stopped = True
        return defer.succeed(None)


def make_source(
    source_class: type, name: str, *, router: Any = None, clock: Any = None, **overrides: Any
) -> tuple[Any, Any, Any]:
    """``source_class`` named ``name``, its options the class's defaults with ``overrides``,
    on ``router`` (default: a ``FakeRouter``) and ``clock`` (default: a ``task.Clock``
    started at ``T0``); returns the three."""
    options = {key: option.default for key, option in source_class.OPTIONS.items()}
    options.update(overrides)
    if clock is None:
        clock = task.Clock()
        clock.advance(T0)
    if router is None:
        router = FakeRouter()
    return source_class(name, options, fake_context(router, clock)), router, clock


def fake_context(router: Any, clock: Any) -> SourceContext:
    """What a source is built from, around a fake router and a clock."""
    return SourceContext(router=router, reactor=clock, errors=None, state_dir="")


class Conn:
    """One client connection to a source, on a StringTransport with a peer address."""

    def __init__(self, source: Any, host: str = "192.0.2.7", port: int = 40000, address: Any = None) -> None:
        self.source = source
        self.transport = StringTransport(peerAddress=address or IPv4Address("TCP", host, port))
        self.protocol = source.factory().buildProtocol(None)
        self.protocol.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def replies(self) -> bytes:
        """The bytes written to the client since the last call."""
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
def log_lines():
    """Every non-empty formatted twisted.logger event while the test runs; an event that
    carries a failure ends with the failure's message."""
    lines: list[str] = []

    def observe(event: dict) -> None:
        text = formatEvent(event)
        if event.get("log_failure") is not None:
            text += " " + str(event["log_failure"].getErrorMessage())
        if text:
            lines.append(text)

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


class CursorSink:
    """The cursor half of a test sink (mixed in before ``SinkBase``): starts from its saved
    cursor, moves it as records are handed over, saves it at the stop. Subclasses keep what
    ``write`` is given."""

    def start(self):
        saved = self.state.load() if self.state else None
        self.cursor = saved["cursor"] if saved else 0
        return defer.succeed(self.cursor)

    def advance(self, end):
        self.cursor = end
        self.on_progress()

    def stop(self):
        self.state.save({"cursor": self.cursor})
        return defer.succeed(None)

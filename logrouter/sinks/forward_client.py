"""One connection of a ``fluent_forward`` sink, and the messages it carries.

``ForwardClient`` is one connection to one server: TLS and the v1 handshake as a client,
then PackedForward messages out and acks in, paused while the transport's buffer is full.
It reports to its ``ClientOwner`` (the sink) through that interface's public methods;
policy (which server, when to resend, the cursor) is the owner's. ``Chunk`` is one
encoded message, ``ChunkRecord`` the spool record its events came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from twisted.internet import error, protocol
from twisted.internet.interfaces import IHandshakeListener, IPushProducer
from twisted.python.failure import Failure
from zope.interface import implementer

from logrouter import tls
from logrouter.wire import fluent_client as wire
from logrouter.sinks.forward_servers import Server
from logrouter.wire import fluent_handshake as handshake

# -- bookkeeping -------------------------------------------------------------------------


class ChunkRecord:
    """One spool record handed to the sink: done once ``end`` is known and no chunk is pending."""

    __slots__ = ("position", "end", "pending", "chunks")

    def __init__(self, position: int) -> None:
        self.position = position
        self.end: int | None = None
        self.pending = 0  # chunks not yet acked (or written, without acks)
        self.chunks = 0  # chunks made from this record so far: the next chunk's index


class Chunk:
    """One encoded message, in the queue or in flight on one connection."""

    __slots__ = ("seq", "record", "id", "data", "events", "sent_at", "sends")

    def __init__(self, seq: int, record: ChunkRecord, chunk_id: bytes | None, data: bytes, events: int) -> None:
        self.seq = seq
        self.record = record
        self.id = chunk_id
        self.data = data
        self.events = events
        self.sent_at = 0.0
        self.sends = 0


@dataclass(frozen=True)
class ClientSettings:
    """How every connection of a sink is set up."""

    tls: bool
    shared_key: str  # empty: no handshake
    self_hostname: str
    username: str
    password: str


class ClientOwner(Protocol):
    """What a ``ForwardClient`` reports to (the sink)."""

    reactor: Any
    unknown_acks: int
    handshake_failures: int

    def connection_ready(self, client: "ForwardClient") -> None: ...

    def acked(self, client: "ForwardClient", chunks: list[Chunk]) -> None: ...

    def connection_lost(self, client: "ForwardClient") -> None: ...

    def sending_resumed(self) -> None: ...


# -- one connection ----------------------------------------------------------------------


@implementer(IHandshakeListener, IPushProducer)
class ForwardClient(protocol.Protocol):
    """One connection to one server: TLS, the shared-key handshake, chunks out, acks in.

    States: ``connecting`` → (``tls``) → (``handshake``) → ``ready`` → ``closed``.
    """

    def __init__(self, owner: ClientOwner, settings: ClientSettings, server: Server, epoch: int) -> None:
        self.owner = owner
        self.settings = settings
        self.server = server
        self.epoch = epoch
        self.state = "connecting"
        self.inflight: dict[bytes, Chunk] = {}  # in send order
        self.inflight_bytes = 0
        self.paused = False
        self.closing = False  # we are closing it: not a failure
        self.failed_reason: str | None = None  # why we dropped it (marks the server down)
        self.replies = wire.ReplyReader()
        self.handshake: handshake.ClientHandshake | None = None
        self.connector: Any = None
        self.timeout_call: Any = None

    # -- Twisted callbacks ---------------------------------------------------------

    def connectionMade(self) -> None:
        self.transport.registerProducer(self, True)
        if self.settings.tls:
            self.state = "tls"  # wait for handshakeCompleted
        else:
            self._transport_up()

    def handshakeCompleted(self) -> None:
        if self.state == "tls":
            self._transport_up()

    def _transport_up(self) -> None:
        settings = self.settings
        if settings.shared_key:
            self.handshake = handshake.ClientHandshake(
                settings.self_hostname,
                settings.shared_key,
                username=settings.username,
                password=settings.password,
            )
            self.state = "handshake"  # the server speaks first (HELO)
        else:
            self._ready()

    def _ready(self) -> None:
        self.state = "ready"
        self._cancel_timeout()
        self.owner.connection_ready(self)

    def dataReceived(self, data: bytes) -> None:
        if self.state == "closed" or self.failed_reason is not None:
            return
        problem = None
        try:
            messages = self.replies.feed(data)
        except wire.ReplyError as e:
            # Acks that arrived before the bad bytes still count: those chunks are not resent.
            messages = e.messages
            problem = f"bad reply from server: {e.reason}"
        acked: list[Chunk] = []
        for message in messages:
            if self.state == "handshake":
                if not self._handshake_step(message):
                    return
                continue
            chunk_id = wire.ack_of(message)
            if chunk_id is None:
                if type(message) is list and message and handshake.raw_bytes(message[0]) == b"HELO":
                    problem = "the server sent HELO: it requires the shared-key handshake (set shared_key)"
                else:
                    problem = f"unexpected reply from server: {handshake.shown(message)}"
                break
            chunk = self.inflight.pop(chunk_id, None)
            if chunk is None:
                self.owner.unknown_acks += 1
                continue
            self.inflight_bytes -= len(chunk.data)
            acked.append(chunk)
        if acked:
            self.owner.acked(self, acked)  # before a failure: these are done, the rest is resent
        if problem is not None:
            self.fail(problem)

    def _handshake_step(self, message: Any) -> bool:
        assert self.handshake is not None
        try:
            reply = self.handshake.receive(message)
        except handshake.HandshakeError as e:
            self.owner.handshake_failures += 1
            self.fail(f"handshake failed: {e}")
            return False
        if reply is not None:
            self.transport.write(reply)
        if self.handshake.established:
            self._ready()
        return True

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        previous, self.state = self.state, "closed"
        self._cancel_timeout()
        if self.failed_reason is None and not self.closing:
            self.failed_reason = self._lost_reason(previous, reason)
        self.owner.connection_lost(self)

    def _lost_reason(self, previous: str, reason: Failure) -> str | None:
        """Why an unexpected close is a failure, or None when it is harmless (an idle close)."""
        why = tls.failure_reason(self.transport, reason)
        if why is not None:
            return f"TLS {'handshake' if previous == 'tls' else 'connection'} failed: {why}"
        clean = reason.check(error.ConnectionDone) is not None
        if previous == "tls":
            return "connection closed during the TLS handshake"
        if previous == "handshake":
            return "connection closed during the shared-key handshake"
        if self.inflight:
            how = "closed by the server" if clean else f"lost ({reason.getErrorMessage()})"
            return f"connection {how} with {len(self.inflight)} chunk(s) unacked"
        return None if clean else f"connection lost ({reason.getErrorMessage()})"

    # -- producer (the transport's buffer) -----------------------------------------

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        if self.paused:
            self.paused = False
            self.owner.sending_resumed()

    def stopProducing(self) -> None:
        self.paused = True

    # -- used by the owner ---------------------------------------------------------

    @property
    def can_send(self) -> bool:
        return self.state == "ready" and not self.paused and not self.closing and self.failed_reason is None

    def send(self, chunk: Chunk, now: float, track: bool) -> None:
        chunk.sent_at = now
        chunk.sends += 1
        if track:
            assert chunk.id is not None
            self.inflight[chunk.id] = chunk
            self.inflight_bytes += len(chunk.data)
        self.transport.write(chunk.data)

    def oldest(self) -> Chunk | None:
        return next(iter(self.inflight.values()), None)

    def start_timeout(self, seconds: float) -> None:
        self.timeout_call = self.owner.reactor.callLater(seconds, self._establish_timeout, seconds)

    def _cancel_timeout(self) -> None:
        if self.timeout_call is not None and self.timeout_call.active():
            self.timeout_call.cancel()
        self.timeout_call = None

    def _establish_timeout(self, seconds: float) -> None:
        self.timeout_call = None
        what = {
            "connecting": "TCP connect",
            "tls": "TLS handshake",
            "handshake": "shared-key handshake (no HELO/PONG; does the server have shared_key set?)",
        }.get(self.state, self.state)
        self.fail(f"{what} not done within {seconds:g}s")

    def fail(self, reason: str) -> None:
        """Drop this connection as failed: the sink marks the server down and resends."""
        if self.failed_reason is not None or self.state == "closed":
            return
        self.failed_reason = reason
        self._cancel_timeout()
        if self.transport is not None:
            self.transport.abortConnection()
        elif self.connector is not None:
            self.connector.stopConnecting()  # clientConnectionFailed follows

    def close(self) -> None:
        """Close on purpose (idle, moving back to a primary, stopping): not a failure."""
        if self.state == "closed" or self.closing:
            return
        self.closing = True
        self._cancel_timeout()
        if self.transport is not None:
            self.transport.loseConnection()
        elif self.connector is not None:
            self.connector.stopConnecting()

    def abort(self) -> None:
        """Throw the connection away (the sink gave up; nothing of it matters any more)."""
        self.closing = True
        self._cancel_timeout()
        if self.transport is not None and self.state != "closed":
            self.transport.abortConnection()
        elif self.connector is not None and self.state == "connecting":
            self.connector.stopConnecting()


class ClientFactory(protocol.ClientFactory):
    noisy = False

    def __init__(self, client: ForwardClient) -> None:
        self.client = client

    def buildProtocol(self, addr: Any) -> ForwardClient:
        self.client.factory = self
        return self.client

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        client = self.client
        if client.state != "connecting":
            return
        client.state = "closed"
        client._cancel_timeout()
        if client.failed_reason is None and not client.closing:
            client.failed_reason = f"connect failed: {reason.getErrorMessage()}"
        client.owner.connection_lost(client)


def connect(owner: ClientOwner, settings: ClientSettings, server: Server, epoch: int, timeout: float) -> ForwardClient:
    """Open a connection to ``server``: TCP (TLS with ``settings.tls``), then the handshake,
    all within ``timeout`` seconds."""
    client = ForwardClient(owner, settings, server, epoch)
    factory = ClientFactory(client)
    if settings.tls:
        client.connector = tls.connect(owner.reactor, server.host, server.port, factory, server.tls_options, timeout)
    else:
        client.connector = owner.reactor.connectTCP(server.host, server.port, factory, timeout=timeout)
    client.start_timeout(timeout)
    return client

"""The shared base of every stream (TCP/TLS) source: one protocol instance per connection.

It owns what all stream protocols have in common: connection bookkeeping and caps, the
peer's name for log lines, idle timeouts, feeding bytes to the codec, closing a
connection on bad input (that connection only), handing batches to the router and
sending replies only once the router reports them durable, pausing/resuming reads
for backpressure, and TLS peer information (the verified client certificate, a readable
line when a TLS handshake fails). A protocol module adds its codec and what to do with
each frame; hooks let it speak first (``connection_ready``), choose its listening
endpoint (``endpoint``) and open more ports next to the main one (``port_opened``).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer, endpoints, protocol
from twisted.internet.interfaces import IHandshakeListener
from twisted.logger import Logger
from twisted.protocols.policies import TimeoutMixin
from zope.interface import implementer

from logrouter import tls
from logrouter.batch import Batch
from logrouter.config.endpoints import listen_option
from logrouter.config.options import Option, non_negative, one_of, positive
from logrouter.wire.errors import DecodeError

STREAM_OPTIONS: dict[str, Option] = {
    "durability": Option(
        str,
        "",
        "when this source's acks may be sent: fsync, os or none (empty = the spool's durability)",
        one_of("", "fsync", "os", "none"),
    ),
    "max_connections": Option(int, 1024, "connections beyond this are closed at once", positive),
    "idle_timeout_secs": Option(
        (int, float), 300, "close a connection silent for this long (0 = never)", non_negative
    ),
}


def peer_name(transport: Any) -> str:
    peer = transport.getPeer()
    host, port = getattr(peer, "host", None), getattr(peer, "port", None)
    if host is None:
        return str(peer)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@implementer(IHandshakeListener)
class StreamProtocol(protocol.Protocol, TimeoutMixin):
    """Per-connection glue between a transport, a codec and the router."""

    log = Logger(namespace="logrouter.source")

    def __init__(self, source: "StreamSource") -> None:
        self.source = source
        self.peer = "?"
        self.closing = False
        self.tls_established = False  # set once a TLS handshake completed
        self.tls_peer: str | None = None  # the verified client certificate's subject
        self.pending: set[defer.Deferred] = set()
        self.holds: set[str] = set()  # why reading is paused; reading resumes once none is left
        self.callLater = source.reactor.callLater  # TimeoutMixin schedules through this

    def make_decoder(self) -> Any:
        raise NotImplementedError

    def handle(self, message: Any) -> None:
        """Act on one decoded frame."""
        raise NotImplementedError

    def connection_ready(self) -> None:
        """Called once an accepted connection is set up: protocols that speak first greet here.

        Over TLS this runs before the TLS handshake; what is written is sent once it completes.
        """

    # -- Twisted callbacks ---------------------------------------------------------

    def connectionMade(self) -> None:
        self.peer = peer_name(self.transport)
        self.decoder = self.make_decoder()
        if not self.source.add_connection(self):
            self.log.warn(
                "{protocol} {peer}: connection refused: max_connections ({limit}) reached",
                protocol=self.source.TYPE,
                peer=self.peer,
                limit=self.source.options["max_connections"],
            )
            self.closing = True
            self.transport.abortConnection()
            return
        if self.source.options["idle_timeout_secs"]:
            self.setTimeout(self.source.options["idle_timeout_secs"])
        if self.source.paused:
            self.hold_reading("backpressure")
        self.connection_ready()

    def handshakeCompleted(self) -> None:
        """The TLS handshake is done (``IHandshakeListener``): note the client certificate."""
        # Not logged: out_forward's TCP heartbeat opens a connection every second.
        self.tls_established = True
        self.tls_peer = tls.peer_subject(self.transport)

    def dataReceived(self, data: bytes) -> None:
        if self.closing:
            return
        self.resetTimeout()
        try:
            messages = self.decoder.feed(data)
        except DecodeError as e:
            self.reject(e.reason)
            return
        for message in messages:
            if self.closing:
                break
            self.handle(message)

    def connectionLost(self, reason: Any = None) -> None:
        self.setTimeout(None)
        if not self.closing:
            tls_failure = tls.failure_reason(self.transport, reason)
            if tls_failure is not None:
                self.source.tls_errors += 1
                self.log.warn(
                    "{protocol} {peer}: TLS {phase} failed: {reason}; connection closed",
                    protocol=self.source.TYPE,
                    peer=self.peer,
                    phase="connection" if self.tls_established else "handshake",
                    reason=tls_failure,
                )
        self.closing = True
        self.source.remove_connection(self)

    def timeoutConnection(self) -> None:
        self.log.info(
            "{protocol} {peer}: idle for {secs}s, closing",
            protocol=self.source.TYPE,
            peer=self.peer,
            secs=self.source.options["idle_timeout_secs"],
        )
        self.transport.loseConnection()

    # -- helpers for protocol modules ----------------------------------------------

    def reject(self, reason: str) -> None:
        """Bad input: log it, count it, and close this connection only."""
        self.source.decode_errors += 1
        self.log.warn(
            "{protocol} {peer}: {reason}; closing connection",
            protocol=self.source.TYPE,
            peer=self.peer,
            reason=reason,
        )
        self.closing = True
        self.setTimeout(None)
        self.transport.loseConnection()

    def submit(self, batch: Batch, on_durable: Callable[[], None] | None = None, key: bytes | None = None) -> None:
        """Hand ``batch`` to the router; call ``on_durable`` once it is stored as configured.

        ``key`` is the client's id for the batch, if its protocol has one: a retransmission
        of a stored id is acked without being stored twice.
        """
        batch.source = self.source.name
        d = self.source.router.ingest(batch, key)
        self.pending.add(d)

        def durable(_: Any) -> None:
            self.pending.discard(d)
            if on_durable is not None and not self.closing:
                on_durable()

        def failed(failure: Any) -> None:
            self.pending.discard(d)
            self.log.failure(
                "{protocol} {peer}: batch could not be stored; closing the connection so the client resends",
                failure,
                protocol=self.source.TYPE,
                peer=self.peer,
            )
            if not self.closing and self.transport is not None:
                # Without an ack the client would wait out its whole ack timeout.
                self.closing = True
                self.transport.abortConnection()

        d.addCallbacks(durable, failed)

    def hold_reading(self, reason: str) -> None:
        """Stop reading from this connection until every reason given is released.

        Several parties pause a connection for their own reasons (router backpressure, a
        stop, a message decoded off the reactor): the transport resumes only when the
        last of them lets go, never because one of them did.
        """
        if not self.holds and self.transport is not None:
            self.transport.pauseProducing()
        self.holds.add(reason)

    def release_reading(self, reason: str) -> None:
        if reason not in self.holds:
            return
        self.holds.discard(reason)
        if not self.holds and self.transport is not None and not self.closing:
            self.transport.resumeProducing()

    def send(self, data: bytes) -> None:
        if not self.closing and self.transport is not None:
            self.transport.write(data)


class StreamFactory(protocol.Factory):
    noisy = False  # one log line per connection would drown out the useful ones

    def __init__(self, source: "StreamSource") -> None:
        self.source = source

    def buildProtocol(self, addr: Any) -> StreamProtocol:
        proto = self.source.protocol_class(self.source)
        proto.factory = self
        return proto


class StreamSource:
    """A listening source: its options, its port and its open connections."""

    protocol_class: type[StreamProtocol] = StreamProtocol
    OPTIONS: dict[str, Option] = {"listen": listen_option(None), **STREAM_OPTIONS}
    log = Logger(namespace="logrouter.source")

    def __init__(self, name: str, options: dict[str, Any], router: Any, reactor: Any) -> None:
        self.name = name
        self.options = options
        self.router = router
        self.reactor = reactor
        self.connections: set[StreamProtocol] = set()
        self.paused = False
        self.port: Any = None
        self.decode_errors = 0
        self.connections_total = 0
        self.tls_errors = 0  # TLS handshakes/connections that failed (e.g. a bad client certificate)

    def factory(self) -> protocol.Factory:
        return StreamFactory(self)

    def endpoint(self) -> Any:
        """The endpoint to listen on; sources with their own TLS settings override this."""
        return endpoints.serverFromString(self.reactor, self.options["listen"])

    def port_opened(self, port: Any) -> None:
        """Called once the main port listens, before it is announced; may raise to fail the start."""

    def start(self) -> defer.Deferred:
        endpoint = self.endpoint()
        d = endpoint.listen(self.factory())

        def listening(port: Any) -> None:
            self.port = port
            self.port_opened(port)
            address = port.getHost()
            self.log.info(
                "{type} source {name} listening on {host} port {port}",
                type=self.TYPE,
                name=self.name,
                host=getattr(address, "host", address),
                port=getattr(address, "port", ""),
            )

        return d.addCallback(listening)

    def stop(self) -> defer.Deferred:
        """Stop accepting, let stored-but-unacked batches get their replies, then close."""
        d = defer.maybeDeferred(self.port.stopListening) if self.port is not None else defer.succeed(None)
        for connection in list(self.connections):
            connection.hold_reading("stopping")

        def drain(_: Any) -> defer.Deferred:
            pending = [p for c in self.connections for p in c.pending]
            return defer.DeferredList(pending, consumeErrors=True)

        def close(_: Any) -> None:
            for connection in list(self.connections):
                connection.transport.loseConnection()

        return d.addCallback(drain).addCallback(close)

    def add_connection(self, connection: StreamProtocol) -> bool:
        if len(self.connections) >= self.options["max_connections"]:
            return False
        self.connections.add(connection)
        self.connections_total += 1
        return True

    def remove_connection(self, connection: StreamProtocol) -> None:
        self.connections.discard(connection)

    def pause_reading(self) -> None:
        if not self.paused:
            self.paused = True
            for connection in self.connections:
                connection.hold_reading("backpressure")

    def resume_reading(self) -> None:
        if self.paused:
            self.paused = False
            for connection in self.connections:
                connection.release_reading("backpressure")

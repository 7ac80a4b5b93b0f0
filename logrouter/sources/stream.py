"""The shared base of every stream (TCP/TLS) source: one protocol instance per connection.

It owns the connection's life and what every stream protocol does with its bytes:
feeding them to the codec, closing a connection on bad input (that connection only),
handing batches to the router and sending replies only once the router reports them
durable, pausing/resuming reads for backpressure, closing (let stored batches get their
replies, then close), why each connection was closed (a log line and a count per
reason), the source's listening port and its metric samples. The jobs beside it have
their own modules, mixed into ``StreamProtocol`` and ``StreamSource``:

- ``stream_limits``: the connection caps (in all and per peer address), the peer's name,
  the idle timeout and the deadline of a frame that has begun to arrive;
- ``stream_stop``: the graceful stop (read what connections already delivered first);
- ``stream_tls``: the client-certificate options, the listening endpoint, the verified
  client certificate and a readable line when a TLS handshake fails;
- ``stream_handshake``: the hooks of a protocol whose connections start with a handshake.

A protocol module adds its codec and what to do with each frame; hooks let it speak first
(``connection_ready``), start the connection with a handshake
(``expect_handshake``/``handshake_received``), choose its listening endpoint
(``endpoint``) and open more ports next to the main one (``port_opened``).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer, protocol, tcp
from twisted.logger import Logger
from twisted.protocols.policies import TimeoutMixin

from logrouter.batch import Batch
from logrouter.config.endpoints import listen_option
from logrouter.config.options import Option, one_of
from logrouter.sources.base import SourceContext
from logrouter.sources.stream_handshake import HandshakeFailed, HandshakeHooks
from logrouter.sources.stream_limits import (
    LIMIT_OPTIONS,
    REFUSAL_REASONS,
    ConnectionCaps,
    ConnectionTimeouts,
    peer_address,
    peer_name,
)
from logrouter.sources.stream_stop import STOP_OPTIONS, DrainingConnection, DrainingSource
from logrouter.sources.stream_tls import TLS_OPTIONS, TlsConnection, TlsListener
from logrouter.wire.errors import DecodeError

STREAM_OPTIONS: dict[str, Option] = {
    "durability": Option(
        str,
        "",
        "this source's own `fsync`, `os` or `none`: when its acks may be sent (empty = the spool's `durability`)",
        one_of("", "fsync", "os", "none"),
    ),
    **LIMIT_OPTIONS,
    **STOP_OPTIONS,
}

# Why a connection the source had accepted ended (the reason label of
# logrouter_source_connections_closed_total); refusals are counted apart.
CLOSE_REASONS = (
    "peer",  # the client closed at a frame boundary: the normal end
    "peer_mid_frame",  # the client closed with part of a frame unprocessed
    "idle_timeout",
    "slow_frame",
    "decode_error",
    "tls_error",
    "store_failed",
    "stopping",
    "other",  # a protocol module closed it on its own
)


class StreamProtocol(
    HandshakeHooks, ConnectionTimeouts, DrainingConnection, TlsConnection, protocol.Protocol, TimeoutMixin
):
    """Per-connection glue between a transport, a codec and the router."""

    log = Logger(namespace="logrouter.source")

    def __init__(self, source: "StreamSource") -> None:
        self.source = source
        self.peer = "?"
        self.peer_address: str | None = None
        self.admitted = False  # counted in the source's connections (refused ones are not)
        self.closing = False  # the transport is being closed: nothing more is read or written
        self.finishing = False  # no more input is taken; replies still go out, then the close
        self.close_reason: str | None = None  # one of CLOSE_REASONS, once we decided to close
        self.tls_established = False  # set once a TLS handshake completed
        self.tls_peer: str | None = None  # the verified client certificate's subject
        self.handshaking = False  # bytes go to handshake_received until it is done
        self.pending: set[defer.Deferred] = set()
        self.holds: set[str] = set()  # why reading is paused; reading resumes once none is left
        self.held_since = 0.0
        self.callLater = source.reactor.callLater  # TimeoutMixin schedules through this
        # The frame being received: when it began (shifted by time spent held) and its bytes so far.
        self.frame_started: float | None = None
        self.frame_bytes = 0
        self.frame_call: Any = None
        # The stop's drain.
        self.draining = False
        self.drain_bytes = 0
        self.last_data = 0.0
        self.drain_call: Any = None
        self.closed_waiters: list[defer.Deferred] = []

    def make_decoder(self) -> Any:
        raise NotImplementedError

    def handle(self, message: Any) -> None:
        """Act on one decoded frame."""
        raise NotImplementedError

    def connection_ready(self) -> None:
        """Called once an accepted connection is set up: protocols that speak first greet here.

        Over TLS this runs before the TLS handshake; what is written is sent once it completes.
        A protocol whose connections start with a handshake calls ``expect_handshake`` here.
        """

    def unprocessed_bytes(self) -> int:
        """Bytes received and not yet made into a frame (or a handshake message)."""
        if self.handshaking:
            return self.handshake_pending_bytes()
        return getattr(self.decoder, "pending_bytes", 0)

    # -- Twisted callbacks ---------------------------------------------------------

    def connectionMade(self) -> None:
        self.peer = peer_name(self.transport)
        self.peer_address = peer_address(self.transport)
        self.decoder = self.make_decoder()
        refused = self.source.add_connection(self)
        if refused is not None:
            reason, limit = refused
            self.log.warn(
                "{protocol} {peer}: connection refused: {reason} ({limit}) reached",
                protocol=self.source.TYPE,
                peer=self.peer,
                reason=reason,
                limit=limit,
            )
            self.closing = True
            self.transport.abortConnection()
            return
        self.admitted = True
        if self.source.options["idle_timeout_secs"]:
            self.setTimeout(self.source.options["idle_timeout_secs"])
        if self.source.paused:
            self.hold_reading("backpressure")
        self.connection_ready()

    def dataReceived(self, data: bytes) -> None:
        if self.closing or self.finishing:
            return
        self.resetTimeout()
        received = len(data)
        handshake_done = False
        if self.handshaking:
            step = self.handshake_received(data)
            if step is None:
                self.track_frame(received, False)
                if self.draining:
                    self.drained(received)
                return
            if step.reply:
                self.send(step.reply)
            if isinstance(step, HandshakeFailed):
                self.reject(step.reason)  # closes once the reply is written
                return
            self.handshaking = False
            handshake_done = True
            data = step.rest
        try:
            messages = self.decoder.feed(data) if data else ()
        except DecodeError as e:
            # Frames decoded before the bad one were well-formed: they are stored and
            # acknowledged as usual, so the client does not send them again.
            self.handle_all(getattr(e, "messages", None) or ())
            if not (self.closing or self.finishing):
                self.reject(e.reason)
            return
        self.handle_all(messages)
        if self.closing or self.finishing:
            return
        self.track_frame(received, bool(messages) or handshake_done)
        if self.draining:
            self.drained(received)

    def handle_all(self, messages: Any) -> None:
        for message in messages:
            if self.closing or self.finishing:
                break
            self.handle(message)

    def connectionLost(self, reason: Any = None) -> None:
        self.setTimeout(None)
        self.cancel_timers()
        if self.admitted:
            self.count_close(reason)
        self.closing = True
        self.source.remove_connection(self)
        self.fire_closed()

    def count_close(self, reason: Any) -> None:
        """Log (unless it is the normal end) and count why this connection ended."""
        why = self.close_reason
        if why is None and self.closing:
            why = "other"
        if why is None:
            unprocessed = self.unprocessed_bytes()
            if self.tls_failed(reason):
                why = "tls_error"
            elif unprocessed:
                why = "peer_mid_frame"
                self.log.warn(
                    "{protocol} {peer}: closed by the peer mid-frame; {count} bytes of an incomplete "
                    "frame unprocessed",
                    protocol=self.source.TYPE,
                    peer=self.peer,
                    count=unprocessed,
                )
            else:
                why = "peer"  # not logged: out_forward's heartbeat opens a connection every second
        self.source.closed[why] = self.source.closed.get(why, 0) + 1

    # -- closing -------------------------------------------------------------------

    def finish(self, why: str, level: str, text: str, **fields: Any) -> None:
        """Take no more input, log why, let stored batches get their replies, then close.

        ``why`` is one of ``CLOSE_REASONS``; ``text`` is the log line (a
        ``twisted.logger`` format with ``{protocol}`` and ``{peer}`` filled in).
        """
        if self.closing or self.finishing:
            return
        self.finishing = True
        self.close_reason = why
        self.draining = False
        self.setTimeout(None)
        self.cancel_timers()
        self.hold_reading("closing")
        getattr(self.log, level)(text, protocol=self.source.TYPE, peer=self.peer, **fields)
        if not self.pending:
            self.close_now()
            return
        # The replies' callbacks were added first, so they are written before the close.
        waiting = defer.DeferredList(list(self.pending), consumeErrors=True)
        waiting.addCallback(lambda _: self.close_now())

    def close_now(self) -> None:
        if self.closing:  # already aborted (a failed store) or lost
            return
        self.closing = True
        self.transport.loseConnection()
        self.fire_closed()

    def when_closed(self) -> defer.Deferred:
        """Fires once this connection is closed or closing (its replies written)."""
        d: defer.Deferred = defer.Deferred()
        if self.closing:
            d.callback(None)
        else:
            self.closed_waiters.append(d)
        return d

    def fire_closed(self) -> None:
        waiters, self.closed_waiters = self.closed_waiters, []
        for d in waiters:
            d.callback(None)

    def cancel_timers(self) -> None:
        for name in ("frame_call", "drain_call"):
            call = getattr(self, name)
            if call is not None and call.active():
                call.cancel()
            setattr(self, name, None)

    # -- helpers for protocol modules ----------------------------------------------

    def reject(self, reason: str) -> None:
        """Bad input: log it, count it, and close this connection only.

        Batches already stored still get their replies before the close.
        """
        self.source.decode_errors += 1
        self.finish("decode_error", "warn", "{protocol} {peer}: {reason}; closing connection", reason=reason)

    def submit(
        self, batch: Batch, on_durable: Callable[[], None] | None = None, key: bytes | None = None, events: list | None = None
    ) -> None:
        """Hand ``batch`` to the router; call ``on_durable`` once it is stored as configured.

        ``key`` is the client's id for the batch, if its protocol has one: a retransmission
        of a stored id is acked without being stored twice. ``events``: one idempotency
        key per event instead (``logrouter.sources.event_keys``), for protocols without one.
        """
        batch.source = self.source.name
        if events is None:
            d = self.source.router.ingest(batch, key)
        else:
            d = self.source.router.ingest(batch, key, events=events)
        self.pending.add(d)

        def durable(_: Any) -> None:
            self.pending.discard(d)
            if on_durable is not None and not self.closing:
                on_durable()

        def failed(failure: Any) -> None:
            self.pending.discard(d)
            self.store_failed(failure)

        d.addCallbacks(durable, failed)

    def store_failed(self, failure: Any) -> None:
        """A batch could not be stored: close at once, so the client resends what was not acked."""
        self.log.failure(
            "{protocol} {peer}: batch could not be stored; closing the connection so the client resends",
            failure,
            protocol=self.source.TYPE,
            peer=self.peer,
        )
        if not self.closing and self.transport is not None:
            # Without an ack the client would wait out its whole ack timeout.
            self.close_reason = "store_failed"
            self.closing = True
            self.cancel_timers()
            self.transport.abortConnection()
            self.fire_closed()

    def hold_reading(self, reason: str) -> None:
        """Stop reading from this connection until every reason given is released.

        Several parties pause a connection for their own reasons (router backpressure, a
        stop, a message decoded off the reactor): the transport resumes only when the
        last of them lets go, never because one of them did.
        """
        if not self.holds:
            self.held_since = self.source.reactor.seconds()
            if self.transport is not None:
                self.transport.pauseProducing()
        self.holds.add(reason)

    def release_reading(self, reason: str) -> None:
        if reason not in self.holds:
            return
        self.holds.discard(reason)
        if self.holds or self.closing:
            return
        if self.transport is not None:
            self.transport.resumeProducing()
        self.frame_resumed()

    def send(self, data: bytes) -> None:
        if not self.closing and self.transport is not None:
            write_now(self.transport, data)


def write_now(transport: Any, data: bytes) -> None:
    """Write ``data`` to the socket at once if nothing is waiting to go before it.

    ``transport.write`` only buffers and registers the socket with the reactor, which
    writes in its next turn and then unregisters it: two ``epoll_ctl`` calls and a turn
    for every reply, which is one reply per forward chunk. A reply is small and the
    socket's buffer mostly empty, so a plain TCP connection with nothing buffered gets it
    in one ``send`` (``writeSomeData``: what ``doWrite`` would call), and only what the
    socket did not take is left to ``write``; with anything buffered, a TLS connection or
    an error (``writeSomeData`` hands back the exception), ``write`` does it all, in order."""
    if (
        transport.__class__ is tcp.Server
        and transport.connected
        and not transport.disconnecting
        and not getattr(transport, "_writeDisconnected", True)  # after loseWriteConnection: write drops it
        and not transport.dataBuffer
        and not getattr(transport, "_tempDataLen", 1)  # Twisted's second buffer
    ):
        sent = transport.writeSomeData(data)
        if sent.__class__ is int:
            if sent == len(data):
                return
            data = data[sent:]
    transport.write(data)


class StreamFactory(protocol.Factory):
    noisy = False  # one log line per connection would drown out the useful ones

    def __init__(self, source: "StreamSource") -> None:
        self.source = source

    def buildProtocol(self, addr: Any) -> StreamProtocol:
        proto = self.source.protocol_class(self.source)
        proto.factory = self
        return proto


class StreamSource(ConnectionCaps, DrainingSource, TlsListener):
    """A listening source: its options, its port and its open connections."""

    protocol_class: type[StreamProtocol] = StreamProtocol
    # With [router] workers, whether the supervisor may accept this source's connections
    # and hand each to a worker (see logrouter.workers.plan).
    SHAREABLE = True
    # Not reading pushes back on the senders (TCP's window, then the protocol's): the
    # router may hold this source while a sink drains its queue (logrouter.feeds).
    PUSHES_BACK = True
    OPTIONS: dict[str, Option] = {"listen": listen_option(None), **STREAM_OPTIONS, **TLS_OPTIONS}
    OPTIONS_FAMILY = "sources.stream"  # the docs' table of the options every stream source shares
    log = Logger(namespace="logrouter.source")

    def __init__(self, name: str, options: dict[str, Any], context: SourceContext) -> None:
        self.name = name
        self.options = options
        self.context = context
        self.router = context.router
        self.reactor = context.reactor
        self.connections: set[StreamProtocol] = set()
        self.per_peer: dict[str, int] = {}
        self.paused = False
        self.port: Any = None
        self.decode_errors = 0
        self.connections_total = 0
        self.tls_errors = 0  # TLS handshakes/connections that failed (e.g. a bad client certificate)
        self.refused = dict.fromkeys(REFUSAL_REASONS, 0)
        self.closed = dict.fromkeys(CLOSE_REASONS, 0)

    def factory(self) -> protocol.Factory:
        return StreamFactory(self)

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[str]:
        """Cross-key problems (``key: message``); subclasses add theirs to these."""
        return cls.check_tls_options(options)

    def port_opened(self, port: Any) -> None:
        """Called once the main port listens, before it is announced; may raise to fail the start."""

    def start(self) -> defer.Deferred:
        passed = getattr(self.context, "passed", None)  # test stand-ins may lack it
        port = passed.take(self.name, self.passed_factory) if passed is not None else None
        if port is not None:
            return defer.maybeDeferred(self._taking_passed, port)
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

    def _taking_passed(self, port: Any) -> None:
        self.port = port
        self.port_opened(port)
        address = port.getHost()
        self.log.info(
            "{type} source {name} takes the connections the supervisor accepts on {host} port {port}",
            type=self.TYPE, name=self.name, host=address.host, port=address.port,
        )

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

    # -- metrics (the source contract's samples(), see logrouter.sources.base) -----------

    # Counters this class keeps, as attribute -> help; each is exported as
    # logrouter_source_<attribute>_total. Protocol modules extend it with their own.
    COUNTERS: dict[str, str] = {
        "decode_errors": "connections closed for bad input",
        "tls_errors": "TLS handshakes or connections that failed (e.g. a bad client certificate)",
    }

    def samples(self) -> Any:
        """Connections open and accepted, the declared counters, refusals and closes by reason."""
        labels = {"source": self.name, "type": self.TYPE}
        yield "logrouter_source_connections", "gauge", labels, len(self.connections)
        yield "logrouter_source_connections_total", "counter", labels, self.connections_total
        for attribute in self.COUNTERS:
            yield f"logrouter_source_{attribute}_total", "counter", labels, getattr(self, attribute)
        for reason, count in self.refused.items():
            yield "logrouter_source_connections_refused_total", "counter", {**labels, "reason": reason}, count
        for reason, count in self.closed.items():
            yield "logrouter_source_connections_closed_total", "counter", {**labels, "reason": reason}, count

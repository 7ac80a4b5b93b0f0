"""The shared base of every stream (TCP/TLS) source: one protocol instance per connection.

It owns what all stream protocols have in common: connection bookkeeping and caps (in
all and per peer address), the peer's name for log lines, idle timeouts and the
deadline of a frame that has begun to arrive, feeding bytes to the codec, closing a
connection on bad input (that connection only), handing batches to the router and
sending replies only once the router reports them durable, pausing/resuming reads for
backpressure, the graceful stop (read what connections already delivered, let stored
batches get their replies, then close), why each connection was closed (a log line and
a count per reason), and TLS peer information (the verified client certificate, a
readable line when a TLS handshake fails). A protocol module adds its codec and what
to do with each frame; hooks let it speak first (``connection_ready``), start the
connection with a handshake (``expect_handshake``/``handshake_received``), choose its
listening endpoint (``endpoint``) and open more ports next to the main one
(``port_opened``).
"""

from __future__ import annotations

import ipaddress
from typing import Any, Callable

from twisted.internet import defer, protocol
from twisted.internet.interfaces import IHandshakeListener
from twisted.logger import Logger
from twisted.protocols.policies import TimeoutMixin
from zope.interface import implementer

from logrouter import tls
from logrouter.batch import Batch
from logrouter.config.endpoints import listen_option
from logrouter.config.options import Option, non_negative, one_of, positive
from logrouter.sources.base import SourceContext
from logrouter.wire.errors import DecodeError

STREAM_OPTIONS: dict[str, Option] = {
    "durability": Option(
        str,
        "",
        "this source's own `fsync`, `os` or `none`: when its acks may be sent (empty = the spool's `durability`)",
        one_of("", "fsync", "os", "none"),
    ),
    "max_connections": Option(int, 1024, "connections beyond this are refused: closed at once, logged and counted", positive),
    # A quarter of max_connections: one address can never take more than that, while a
    # real host opens a handful (a Beats worker or Fluent Bit/fluentd flush thread each).
    # Many clients behind one NAT or a proxy share an address: raise it or set 0 there.
    "max_connections_per_peer": Option(
        int, 256, "connections from one IP address beyond this are refused (0 = no per-address cap); behind a NAT or a TCP "
        "proxy every client shares one address, so raise it or set 0 there", non_negative
    ),
    "idle_timeout_secs": Option(
        (int, float), 300, "close a connection silent for this long (0 = never)", non_negative
    ),
    # Apache mod_reqtimeout's body=20,MinRate=500 model: a deadline that grows with each
    # byte received, so a sender dribbling a frame one byte at a time (which an idle
    # timeout never catches) is closed, while a big frame on a slow link keeps going.
    "frame_timeout_secs": Option(
        (int, float),
        30,
        "a frame that has begun to arrive must be complete within this many seconds, plus 1 s for every "
        "`frame_min_bytes_per_sec` bytes of it received (Apache mod_reqtimeout's `body=…,MinRate=…` model); time "
        "reading is paused by the router does not count (0 = no limit)",
        non_negative,
    ),
    "frame_min_bytes_per_sec": Option(
        (int, float), 500, "the receive rate that extends `frame_timeout_secs` (see there)", positive
    ),
    "stop_drain_secs": Option(
        (int, float),
        3,
        "on a graceful stop, how long connections may go on delivering what they had already sent "
        "before they are closed (0 = close at once; at most a tenth of `[router] shutdown_timeout_secs`)",
        non_negative,
    ),
    "stop_quiet_secs": Option(
        (int, float),
        0.5,
        "on a graceful stop, a connection at a frame boundary that received nothing for this long is done",
        positive,
    ),
    "stop_drain_bytes": Option(
        int, 16 << 20, "on a graceful stop, the most bytes read from one connection before it is closed", positive
    ),
}

# One set of server TLS client-certificate options for every stream source (``tls`` has
# the three modes). They only act on an ``ssl:`` listener.
TLS_OPTIONS: dict[str, Option] = {
    "ssl_client_authentication": Option(
        str,
        "none",
        "client certificates on an `ssl:` listener: `none`, `optional` (a certificate, if sent, must be signed "
        "by `ca_file`) or `required` (every client must send one signed by `ca_file`)",
        tls.check_client_cert_mode,
    ),
    "ca_file": Option(
        str,
        "",
        "PEM file of the CA(s) client certificates must be signed by; needed with `ssl_client_authentication` "
        "`optional` or `required`",
        tls.check_ca_file,
    ),
}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


# The stop's reading phase gets at most this share of router.shutdown_timeout_secs: the
# rest is for replies, the spool and the sinks' commits.
STOP_SHARE_OF_SHUTDOWN = 0.1

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
REFUSAL_REASONS = ("max_connections", "max_connections_per_peer")

class HandshakeDone:
    """What ``handshake_received`` returns once the handshake is over.

    ``reply`` is written first (e.g. a PONG, a VERS); ``rest`` (the bytes that followed the
    handshake in the stream) then goes to the codec, as does everything after it. A
    connection whose client turns out to skip the handshake (a legacy client whose first
    message is already data) returns every byte received so far as ``rest``.
    """

    __slots__ = ("rest", "reply")

    def __init__(self, rest: bytes = b"", reply: bytes = b"") -> None:
        self.rest = rest
        self.reply = reply


class HandshakeFailed:
    """What ``handshake_received`` returns when the handshake failed: ``reply`` is written,
    then the connection is closed as bad input (``decode_error``) with ``reason`` logged."""

    __slots__ = ("reason", "reply")

    def __init__(self, reason: str, reply: bytes = b"") -> None:
        self.reason = reason
        self.reply = reply


# Holds that do not mean "this connection has work in progress": the stop's drain may
# end while only these are held.
IDLE_HOLDS = frozenset({"backpressure"})


def peer_name(transport: Any) -> str:
    peer = transport.getPeer()
    host, port = getattr(peer, "host", None), getattr(peer, "port", None)
    if host is None:
        return str(peer)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def peer_address(transport: Any) -> str | None:
    """The peer's IP address, the per-peer cap's key; None for peers without one (unix sockets)."""
    host = getattr(transport.getPeer(), "host", None)
    if not isinstance(host, str) or not host:
        return None
    return normal_ip(host)


def normal_ip(host: str) -> str:
    """An IP address as the per-peer caps and the workers' choice know it."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    # An IPv4 client of a dual-stack listener is the same host as over IPv4.
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


@implementer(IHandshakeListener)
class StreamProtocol(protocol.Protocol, TimeoutMixin):
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

    # -- the protocol's handshake ------------------------------------------------------

    def expect_handshake(self) -> None:
        """This connection starts with a handshake: until ``handshake_received`` says it is
        done, every byte received goes there instead of to the codec.

        Idle timeout, frame deadline (``frame_timeout_secs``, with
        ``handshake_pending_bytes`` as the frame's unprocessed bytes) and the stop's drain
        apply to the handshake as they do to frames.
        """
        self.handshaking = True

    def handshake_received(self, data: bytes) -> "HandshakeDone | HandshakeFailed | None":
        """Take the bytes of one read during the handshake.

        Return None while it is not complete (keep what you need of ``data``),
        ``HandshakeDone(rest, reply)`` once it is (``rest`` goes to the codec; return the
        same bytes when no handshake took place), or ``HandshakeFailed(reason, reply)``.
        """
        raise NotImplementedError

    def handshake_pending_bytes(self) -> int:
        """Bytes of an incomplete handshake message held (the frame deadline's measure)."""
        return 0

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

    def handshakeCompleted(self) -> None:
        """The TLS handshake is done (``IHandshakeListener``): note the client certificate."""
        # Not logged: out_forward's TCP heartbeat opens a connection every second.
        self.tls_established = True
        self.tls_peer = tls.peer_subject(self.transport)

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
            tls_failure = tls.failure_reason(self.transport, reason)
            unprocessed = self.unprocessed_bytes()
            if tls_failure is not None:
                why = "tls_error"
                self.source.tls_errors += 1
                self.log.warn(
                    "{protocol} {peer}: TLS {phase} failed: {reason}; connection closed",
                    protocol=self.source.TYPE,
                    peer=self.peer,
                    phase="connection" if self.tls_established else "handshake",
                    reason=tls_failure,
                )
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

    def timeoutConnection(self) -> None:
        self.finish(
            "idle_timeout",
            "info",
            "{protocol} {peer}: idle for {secs}s, closing",
            secs=self.source.options["idle_timeout_secs"],
        )

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

    # -- the frame deadline ----------------------------------------------------------

    def track_frame(self, received: int, completed: bool) -> None:
        """Start, extend or end the clock of the frame being received.

        A connection resting at a frame boundary is governed by the idle timeout only;
        one holding part of a frame must complete it at the configured rate.
        """
        timeout = self.source.options["frame_timeout_secs"]
        if not timeout:
            return
        unprocessed = self.unprocessed_bytes()
        if not unprocessed:
            self.frame_started = None
            return
        now = self.source.reactor.seconds()
        if completed or self.frame_started is None:
            # A new frame began in this read: its clock starts now.
            self.frame_started = now
            self.frame_bytes = unprocessed
        else:
            self.frame_bytes += received
        if self.frame_call is None and not self.holds:
            self.frame_call = self.source.reactor.callLater(max(0.0, self.frame_deadline() - now), self.check_frame)

    def frame_deadline(self) -> float:
        assert self.frame_started is not None
        options = self.source.options
        return self.frame_started + options["frame_timeout_secs"] + self.frame_bytes / options["frame_min_bytes_per_sec"]

    def check_frame(self) -> None:
        self.frame_call = None
        if self.frame_started is None or self.closing or self.finishing or self.holds:
            return  # no frame, or reading is held: release_reading re-arms the clock
        now = self.source.reactor.seconds()
        deadline = self.frame_deadline()
        if now < deadline:  # bytes arrived since the call was set: the deadline moved
            self.frame_call = self.source.reactor.callLater(deadline - now, self.check_frame)
            return
        self.finish(
            "slow_frame",
            "warn",
            "{protocol} {peer}: {count} bytes of a frame in {secs:.0f}s, slower than frame_timeout_secs "
            "({timeout}s) plus 1 s per frame_min_bytes_per_sec ({rate}) bytes; closing connection",
            count=self.frame_bytes,
            secs=now - self.frame_started,
            timeout=self.source.options["frame_timeout_secs"],
            rate=self.source.options["frame_min_bytes_per_sec"],
        )

    # -- the stop's drain ------------------------------------------------------------

    def start_drain(self) -> None:
        """Keep reading what the client had sent before the stop, until it goes quiet."""
        if self.closing or self.finishing or self.draining:
            return
        self.draining = True
        self.drain_bytes = 0
        self.last_data = self.source.reactor.seconds()
        self.drain_call = self.source.reactor.callLater(self.source.options["stop_quiet_secs"], self.check_quiet)

    def drained(self, received: int) -> None:
        self.drain_bytes += received
        self.last_data = self.source.reactor.seconds()
        if self.drain_bytes >= self.source.options["stop_drain_bytes"]:
            self.end_drain(f"stop_drain_bytes ({self.source.options['stop_drain_bytes']}) read")

    def check_quiet(self) -> None:
        self.drain_call = None
        if not self.draining:
            return
        quiet = self.source.options["stop_quiet_secs"]
        wait = self.last_data + quiet - self.source.reactor.seconds()
        if wait <= 0 and (self.unprocessed_bytes() or self.holds - IDLE_HOLDS):
            # Mid-frame, or a frame is being worked on: give it the rest of the deadline.
            wait = quiet
        if wait > 0:
            self.drain_call = self.source.reactor.callLater(wait, self.check_quiet)
            return
        self.end_drain("")

    def end_drain(self, why: str) -> None:
        if not self.draining:
            return
        unprocessed = self.unprocessed_bytes()
        details = [why] if why else []
        if unprocessed:
            details.append(f"{unprocessed} bytes of an incomplete frame dropped")
        self.finish(
            "stopping",
            "warn" if details else "info",
            "{protocol} {peer}: source stopping: read {count} more bytes{details}; closing connection",
            count=self.drain_bytes,
            details="".join(f", {d}" for d in details),
        )

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
        if self.frame_started is not None and not self.finishing:
            # The client could not send while we held it: that time is not its to answer for.
            now = self.source.reactor.seconds()
            self.frame_started += now - max(self.held_since, self.frame_started)
            if self.frame_call is None:
                self.frame_call = self.source.reactor.callLater(max(0.0, self.frame_deadline() - now), self.check_frame)

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
    # With [router] workers, whether the supervisor may accept this source's connections
    # and hand each to a worker (see logrouter.workers.plan).
    SHAREABLE = True
    # Not reading pushes back on the senders (TCP's window, then the protocol's): the
    # router may hold this source while a sink drains its queue (logrouter.feeds).
    PUSHES_BACK = True
    OPTIONS: dict[str, Option] = {"listen": listen_option(None), **STREAM_OPTIONS, **TLS_OPTIONS}
    OPTIONS_FAMILY = "sources.stream"  # the docs' table of the options every stream source shares
    # Older names of ssl_client_authentication a source still accepts, as
    # {key: {value: the mode it stands for}}; other values of the key say nothing
    # (fluent_forward: {"verify_client": {True: "required"}}). Such keys need their own Option.
    CLIENT_AUTH_ALIASES: dict[str, dict[Any, str]] = {}
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
    def client_authentication(cls, options: dict[str, Any]) -> tuple[str, str, str]:
        """The client-certificate mode in effect, the key that set it, and how it was set
        (for messages: ``ssl_client_authentication is 'required'``, ``verify_client = true``)."""
        mode = options.get("ssl_client_authentication", "none")
        for key, meanings in cls.CLIENT_AUTH_ALIASES.items():
            value = options.get(key)
            if value in meanings:
                return meanings[value], key, f"{key} = {_toml(value)}"
        return mode, "ssl_client_authentication", f"ssl_client_authentication is {mode!r}"

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[str]:
        """Cross-key problems (``key: message``); subclasses add theirs to these."""
        return cls.check_tls_options(options)

    @classmethod
    def check_tls_options(cls, options: dict[str, Any]) -> list[str]:
        """``ssl_client_authentication`` (or an alias of it), ``ca_file`` and ``listen`` together."""
        own = options.get("ssl_client_authentication", "none")
        for key, meanings in cls.CLIENT_AUTH_ALIASES.items():
            value = options.get(key)
            if value in meanings and own not in ("none", meanings[value]):
                # "none" is the default: it cannot be told apart from not given.
                return [
                    f"{key}: {key} = {_toml(value)} means ssl_client_authentication = {meanings[value]!r}, "
                    f"which contradicts ssl_client_authentication = {own!r}; set only ssl_client_authentication"
                ]
        mode, key, setting = cls.client_authentication(options)
        ca_file, listen = options.get("ca_file", ""), options["listen"]
        if mode == "none":
            if ca_file:
                aliases = "".join(
                    f" (or {k} = {_toml(v)})" for k, meanings in cls.CLIENT_AUTH_ALIASES.items() for v in meanings
                )
                return [
                    f"ca_file: only used with ssl_client_authentication 'optional' or 'required'{aliases}; "
                    "set it or remove ca_file"
                ]
            return []
        if tls.endpoint_kind(listen) != "ssl":
            shown = f"{mode!r} " if key == "ssl_client_authentication" else ""
            return [f"{key}: {shown}needs an ssl: listen endpoint, got {listen!r}"]
        if not ca_file:
            return [f"ca_file: required when {setting}"]
        try:
            tls.check_server_endpoint(listen, mode, ca_file)
        except ValueError as e:
            return [f"listen: {e}"]
        return []

    def endpoint(self) -> Any:
        """The endpoint to listen on: the ``listen`` string, asking TLS clients for a
        certificate as ``ssl_client_authentication`` says."""
        mode = self.client_authentication(self.options)[0]
        return tls.server_endpoint(self.reactor, self.options["listen"], mode, self.options.get("ca_file") or None)

    def port_opened(self, port: Any) -> None:
        """Called once the main port listens, before it is announced; may raise to fail the start."""

    def passed_factory(self) -> protocol.Factory:
        """The factory for connections accepted by the supervisor: TLS is done here, in
        the worker, as the ``ssl:`` listener would have."""
        from twisted.protocols.tls import TLSMemoryBIOFactory

        mode = self.client_authentication(self.options)[0]
        context = tls.server_context(self.options["listen"], mode, self.options.get("ca_file") or None)
        factory = self.factory()
        return factory if context is None else TLSMemoryBIOFactory(context, False, factory)

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

    def stop(self) -> defer.Deferred:
        """Stop accepting; read what connections already delivered; let stored batches get
        their replies; then close.

        What a client sent before the stop may still sit in the kernel's buffers, and
        clients that do not wait for acks (fluent-logger's default) count it as sent.
        Each connection goes on being read until it has been quiet at a frame boundary
        for ``stop_quiet_secs`` (nothing in the kernel or on the wire; TCP cannot say
        more precisely what the client still holds, and a half-close would not either),
        or has given ``stop_drain_bytes``, or the drain's deadline passes.
        """
        d = defer.maybeDeferred(self.port.stopListening) if self.port is not None else defer.succeed(None)
        return d.addCallback(lambda _: self.drain())

    def stop_drain_secs(self) -> float:
        limit = float(self.options["stop_drain_secs"])
        config = getattr(self.router, "config", None)
        shutdown = getattr(config, "router", {}).get("shutdown_timeout_secs", 0) if config is not None else 0
        if shutdown:
            limit = min(limit, shutdown * STOP_SHARE_OF_SHUTDOWN)
        return limit

    def drain(self) -> defer.Deferred:
        limit = self.stop_drain_secs()
        connections = list(self.connections)
        for connection in connections:
            connection.start_drain()
            if limit <= 0:
                connection.end_drain("")
        deadline = self.reactor.callLater(limit, self.drain_timed_out) if limit > 0 else None
        waiting = defer.DeferredList([c.when_closed() for c in connections], consumeErrors=True)

        def drained(_: Any) -> None:
            if deadline is not None and deadline.active():
                deadline.cancel()

        return waiting.addCallback(drained)

    def drain_timed_out(self) -> None:
        for connection in list(self.connections):
            connection.end_drain(f"stop_drain_secs ({self.stop_drain_secs():g}s) passed")

    def add_connection(self, connection: StreamProtocol) -> tuple[str, int] | None:
        """Admit ``connection``, or say which cap refuses it: (option, its value)."""
        limit = self.options["max_connections"]
        if len(self.connections) >= limit:
            self.refused["max_connections"] += 1
            return "max_connections", limit
        address = connection.peer_address
        per_peer = self.options["max_connections_per_peer"]
        if address is not None and per_peer:
            if self.per_peer.get(address, 0) >= per_peer:
                self.refused["max_connections_per_peer"] += 1
                return "max_connections_per_peer", per_peer
            self.per_peer[address] = self.per_peer.get(address, 0) + 1
        self.connections.add(connection)
        self.connections_total += 1
        return None

    def remove_connection(self, connection: StreamProtocol) -> None:
        if connection not in self.connections:
            return
        self.connections.discard(connection)
        address = connection.peer_address
        if address is not None and address in self.per_peer:
            left = self.per_peer[address] - 1
            if left > 0:
                self.per_peer[address] = left
            else:
                del self.per_peer[address]

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

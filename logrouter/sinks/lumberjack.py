"""The ``lumberjack`` sink: spool records to a Lumberjack v2 server (Logstash's ``beats`` input).

It is the Beats client side of ``docs/protocols/lumberjack.md``, so logrouter can feed Logstash,
a go-lumber server, or another logrouter's ``lumberjack`` source (a chain of routers).

**Events.** Every event becomes the JSON object of one ``J`` frame: the record's fields as
they are, plus ``@timestamp`` (the event time, RFC 3339 UTC: milliseconds when the time
has no finer part, as Beats writes it, else microseconds) when the record has none, plus
the batch's tag at ``tag_field`` (default ``@metadata.tag``: Logstash keeps it as event
metadata, a logrouter receiver gets it back with ``tag = "${@metadata.tag}"``; an object
already there gets the key added, any other value there is replaced). A record's own
``@timestamp`` is sent as it is. Records are never changed in place. Values JSON has no
form for are spelled as in the lake's ``_extra`` column (``logrouter.lake.extra``):
bytes (msgpack ``bin``) become base64 strings, invalid UTF-8 inside strings is spelled
``\\xNN``, NaN/±Infinity become strings.

**Windows.** Events are sent as Beats sends them: ``W`` N, then one ``C`` frame (zlib at
``compression_level``; 0 = plain ``J`` frames) holding N ``J`` frames numbered 1..N —
sequence numbers restart in every window. A window takes at most ``window_size`` events
of whatever was handed over and not yet sent; up to ``pipelining`` windows are in flight
(Beats' default is 2), so windows grow by themselves when the server is slow and stay
small when it is fast. Windows of ``INLINE_EVENTS`` events or more are encoded (JSON,
zlib) in a worker thread, smaller ones at once; windows are written strictly in order.

**Acks and the cursor.** ACKs match windows in order. A partial ACK k < N acknowledges
events 1..k of the oldest window in flight; the cursor moves past a spool record once
every event of it (and of every record before it) is acknowledged. ACK 0 (the server's
keepalive) only re-arms the timer. ``timeout_secs`` without any ACK while a window is in
flight, an ACK larger than its window, an ACK with no window in flight, anything but a
v2 ``A`` frame, or a lost connection with windows in flight is a failure: the connection
is dropped, everything held is dropped, and after the backoff (``retry_*_secs``) the
router replays the spool from the cursor, to the next host in ``hosts``. A connection the
server closes while nothing is in flight is no failure: the next window reconnects.

**Duplicates.** Lumberjack has no batch ids, so delivery is at least once. The replay
after a failure starts at the cursor, which only passes whole spool records: acknowledged
events of a record not acknowledged in full (a window partly acked, a record spread over
windows) are sent again, and so is a window the server stored while its ACK was lost
with the connection. A crash resends from the cursor last saved (about once a second).
Without failures every event is sent once.

**Hosts.** ``hosts`` lists ``host:port`` (``[v6]:port``; port 5044 when left out). The
sink uses one host at a time, starting with the first, and moves to the next (round
robin) after each failure of the current one; every move waits the backoff.

The events' JSON and the windows' bytes are made in ``lumberjack_json``; the lifecycle
(start, ticks, failure, stop and drain, saving the cursor) is ``ForwardingSink``'s.
Timers use the injected reactor; tests drive the sink with ``task.Clock`` and
``StringTransport`` by replacing ``endpoint_for`` and ``run_blocking``. The state file
(``{"cursor": …}``) is saved in a thread at most about once a second and on stop; a
graceful stop first waits up to ``drain_timeout_secs`` for what was handed over to be
acknowledged.
"""

from __future__ import annotations

import collections
from typing import Any

from twisted.internet import defer, endpoints, protocol
from twisted.python.failure import Failure

from logrouter import registry, tls
from logrouter.batch import Batch, Event
from logrouter.config.options import Option, Problems, non_negative, positive
from logrouter.sinks.base import SINK_OPTIONS
from logrouter.sinks.forwarding import ForwardingSink, host_label
from logrouter.sinks.lumberjack_json import encode_window
from logrouter.wire.errors import DecodeError
from logrouter.wire.lumberjack_acks import AckDecoder

DEFAULT_PORT = 5044  # Beats' default (docs/protocols/lumberjack.md section 1)
INLINE_EVENTS = 64  # windows this small are encoded on the reactor thread (a thread hop costs more)
MAX_PIPELINING = 64


class LumberjackError(Exception):
    """The connection to the next hop failed (protocol error, timeout, lost connection)."""


# -- config ------------------------------------------------------------------------------


def parse_host(text: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port``, or a bare host (port 5044); ``ValueError`` if unusable."""
    if not isinstance(text, str) or not text or text != text.strip() or any(c.isspace() for c in text):
        raise ValueError(f"must be 'host:port', got {text!r}")
    port_text: str | None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not host:
            raise ValueError(f"unclosed '[' in {text!r} (IPv6: '[::1]:5044')")
        if rest and not rest.startswith(":"):
            raise ValueError(f"unexpected {rest!r} after ']' in {text!r}")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:
        raise ValueError(f"IPv6 addresses need brackets, e.g. '[::1]:5044', got {text!r}")
    else:
        host, _, port_text = text.partition(":")
        if not _:
            port_text = None
        if not host:
            raise ValueError(f"no host in {text!r}")
    if port_text is None:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port must be a number from 1 to 65535, got {port_text!r} in {text!r}")
    return host, int(port_text)


def _check_hosts(value: list[Any]) -> None:
    if not value:
        raise ValueError('must list at least one server, e.g. ["logstash:5044"]')
    problems = []
    seen: dict[tuple[str, int], int] = {}
    for i, item in enumerate(value):
        try:
            address = parse_host(item)
        except ValueError as e:
            problems.append(f"[{i}]: {e}")
            continue
        first = seen.setdefault(address, i)
        if first != i:
            problems.append(f"[{i}]: {item!r} is already listed as [{first}]")
    if problems:
        raise Problems(problems)


def _check_compression_level(value: int) -> None:
    if not 0 <= value <= 9:
        raise ValueError(f"must be from 0 (off) to 9, got {value!r}")


def _check_pipelining(value: int) -> None:
    if not 1 <= value <= MAX_PIPELINING:
        raise ValueError(f"must be from 1 to {MAX_PIPELINING}, got {value!r}")


def _check_tag_field(value: str) -> None:
    if value and any(not part for part in value.split(".")):
        raise ValueError(f"must be a field name or a dotted path like '@metadata.tag' (or \"\" for none), got {value!r}")


# -- bookkeeping -------------------------------------------------------------------------


class _Window:
    __slots__ = ("count", "acked", "data", "written", "epoch")

    def __init__(self, count: int, epoch: int) -> None:
        self.count = count
        self.acked = 0
        self.data: bytes | None = None  # encoded, not yet written
        self.written = False
        self.epoch = epoch


class LumberjackClient(protocol.Protocol):
    """One connection to a server: reads ``A`` frames and reports them to the sink."""

    def __init__(self, sink: "LumberjackSink", address: str) -> None:
        self.sink = sink
        self.address = address
        self.decoder = AckDecoder()

    def dataReceived(self, data: bytes) -> None:
        bad = None
        try:
            acks = self.decoder.feed(data)
        except DecodeError as e:
            acks, bad = e.messages, e.reason  # acks before the bad bytes still count
        for ack in acks:
            if self.sink.client is not self:
                return
            if ack.version != 2:
                self.sink._protocol_error(self, f"protocol error from {self.address}: a v{ack.version} ACK on a v2 connection")
                return
            self.sink._ack(self, ack.seq)
        if bad is not None and self.sink.client is self:
            self.sink._protocol_error(self, f"protocol error from {self.address}: {bad}")

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.sink._lost(self, reason)


class _ClientFactory(protocol.Factory):
    noisy = False

    def __init__(self, sink: "LumberjackSink", address: str) -> None:
        self.sink = sink
        self.address = address

    def buildProtocol(self, addr: Any) -> LumberjackClient:
        client = LumberjackClient(self.sink, self.address)
        client.factory = self
        return client


# -- the sink ----------------------------------------------------------------------------


@registry.sink("lumberjack")
class LumberjackSink(ForwardingSink):
    COUNTERS = {
        "windows_sent": "windows written to a server",
        "events_acked": "events a server acknowledged",
        "partial_acks": "ACKs covering part of a window",
        "keepalives": "ACK 0 keepalives received",
        "connections": "connections made to a server",
    }
    OPTIONS = {
        "hosts": Option(list, doc='`["host:port", …]` (`[v6]:port`; port 5044 if left out); one used at a time, the next after each failure', check=_check_hosts),
        "window_size": Option(int, 2048, "most events per window (Beats' `bulk_max_size`)", positive),
        "pipelining": Option(int, 2, "windows in flight before the oldest is acknowledged (1–64)", _check_pipelining),
        "compression_level": Option(int, 3, "zlib level of the `C` frame; `0` sends plain `J` frames", _check_compression_level),
        "timeout_secs": Option(
            (int, float), 30, "longest wait for any ACK (ACK 0 keepalives and partial ACKs count) while a window is in flight", positive
        ),
        "connect_timeout_secs": Option((int, float), 10, "connect (TCP + TLS) must finish within this", positive),
        "drain_timeout_secs": Option(
            (int, float), 10, "on stop, wait this long for what was handed over to be acknowledged", non_negative
        ),
        "tag_field": Option(
            str, "@metadata.tag", "dotted path of the field that carries the batch's tag; `\"\"` = none", _check_tag_field
        ),
        **tls.CLIENT_OPTIONS,
        **SINK_OPTIONS,
    }

    ERROR = LumberjackError

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[str]:
        return tls.check_client_options(options)

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        super().__init__(name, options, errors, reactor)
        self.hosts = [parse_host(h) for h in options["hosts"]]
        self.host_index = 0
        self.tag_path = tuple(options["tag_field"].split(".")) if options["tag_field"] else ()
        self._tls_options: dict[str, Any] = {}
        self.client: LumberjackClient | None = None
        self.client_address = ""
        self.connecting: defer.Deferred | None = None
        self._connect_call: Any = None
        self._timer: Any = None
        # What was handed over and not yet acknowledged, in order.
        self.unsent: collections.deque[tuple[str, list[Event]]] = collections.deque()
        self.unsent_events = 0
        self.inflight: collections.deque[_Window] = collections.deque()
        self.marks: collections.deque[tuple[int, int, int]] = collections.deque()  # (events, end, bytes)
        self.appended = 0  # events handed over since the last reset
        self.acked = 0  # of those, acknowledged
        self._bytes_since_mark = 0
        # counters
        self.windows_sent = 0
        self.events_acked = 0
        self.partial_acks = 0
        self.keepalives = 0
        self.connections = 0

    # -- lifecycle (the steps ForwardingSink leaves to the protocol) ----------------------

    def _log_started(self, cursor: int) -> None:
        self.log.info(
            "lumberjack sink {name}: forwarding to {hosts} (tls {tls}, windows of up to {window} events, "
            "{pipelining} in flight, compression level {compression}); resuming from spool position {cursor}",
            name=self.name,
            hosts=", ".join(host_label(*h) for h in self.hosts),
            tls="on" if self.options["tls"] else "off",
            window=self.options["window_size"],
            pipelining=self.options["pipelining"],
            compression=self.options["compression_level"],
            cursor=cursor,
        )

    def _drained(self) -> bool:
        return self.appended == self.acked

    def _undrained(self) -> str:
        return f"{self.appended - self.acked} event(s) not acknowledged"

    def _log_draining(self, timeout: float) -> None:
        self.log.info(
            "lumberjack sink {name}: stopping; waiting up to {secs:g}s for {events} event(s) to be acknowledged",
            name=self.name,
            secs=timeout,
            events=self.appended - self.acked,
        )

    def _close_output(self, saved: defer.Deferred) -> defer.Deferred:
        self._disconnect(abort=False)
        return saved

    # -- fed by the router ---------------------------------------------------------------

    def write(self, batch: Batch, position: int, size: int) -> None:
        self.appended += self._hold(batch, size)

    def advance(self, end: int) -> None:
        if not self.accepting:
            return
        self.marks.append((self.appended, end, self._bytes_since_mark))
        self._bytes_since_mark = 0
        self._settle()  # silently: on_progress is for callbacks from the network and the ticker
        self._pump()

    def _settle(self) -> bool:
        """Drop the marks of records whose events are all acknowledged; True if the cursor moved."""
        moved = False
        marks = self.marks
        while marks and marks[0][0] <= self.acked:
            _, end, size = marks.popleft()
            self.queued_bytes = max(0, self.queued_bytes - size)
            if end > self.cursor:
                self.cursor = end
            moved = True
        return moved

    def _drop(self) -> None:
        self.unsent.clear()
        self.unsent_events = 0
        self.inflight.clear()
        self.marks.clear()
        self.appended = self.acked = 0
        self._bytes_since_mark = 0
        self.queued_bytes = 0

    # -- sending -------------------------------------------------------------------------

    def _pump(self) -> None:
        """Open windows while fewer than ``pipelining`` are in flight; connect when needed."""
        if self.failing or self.stopped or not self.unsent_events:
            return
        if self.client is None:
            if self.connecting is None and self._connect_call is None:
                # Not from inside the router's feeding loop: a connect that fails at once
                # would call fail() and on_progress() while the router is still handing over.
                self._connect_call = self.reactor.callLater(0, self._connect)
            return
        limit = self.options["pipelining"]
        size = self.options["window_size"]
        while self.unsent_events and len(self.inflight) < limit:
            groups, count = self._take(size)
            window = _Window(count, self.epoch)
            self.inflight.append(window)
            self._arm_timer(restart=False)
            args = (groups, count, self.options["compression_level"], self.tag_path)
            if count < INLINE_EVENTS:
                d = defer.maybeDeferred(encode_window, *args)
            else:
                d = self.run_blocking(encode_window, *args)
            d.addCallbacks(self._encoded, self._encode_failed, callbackArgs=(window,), errbackArgs=(window,))

    def _take(self, limit: int) -> tuple[list[tuple[str, list[Event]]], int]:
        groups = []
        count = 0
        unsent = self.unsent
        while unsent and count < limit:
            tag, events = unsent[0]
            room = limit - count
            if len(events) <= room:
                unsent.popleft()
                groups.append((tag, events))
                count += len(events)
            else:
                groups.append((tag, events[:room]))
                unsent[0] = (tag, events[room:])
                count += room
        self.unsent_events -= count
        return groups, count

    def _encoded(self, data: bytes, window: _Window) -> None:
        if window.epoch != self.epoch or self.failing:
            return
        window.data = data
        client = self.client
        if client is None:
            return
        for w in self.inflight:  # write every encoded window up to the first still being encoded
            if w.written:
                continue
            if w.data is None:
                break
            client.transport.write(w.data)
            w.data = None
            w.written = True
            self.windows_sent += 1

    def _encode_failed(self, failure: Failure, window: _Window) -> None:
        if window.epoch != self.epoch or self.failing:
            return
        self.log.failure("lumberjack sink {name}: encoding a window failed", failure, name=self.name)
        self._broken(f"encoding a window failed: {failure.getErrorMessage()}")

    # -- connecting ----------------------------------------------------------------------

    def endpoint_for(self, host: str, port: int) -> Any:
        """The client endpoint of one host (tests replace this)."""
        endpoint: Any = endpoints.HostnameEndpoint(
            self.reactor, host, port, timeout=float(self.options["connect_timeout_secs"])
        )
        if self.options["tls"]:
            creator = self._tls_options.get(host)
            if creator is None:
                creator = self._tls_options[host] = tls.client_tls_options(host, self.options)
            endpoint = tls.ClientEndpoint(creator, endpoint)
        return endpoint

    def _connect(self) -> None:
        self._connect_call = None
        if self.client is not None or self.connecting is not None or self.failing or self.stopped:
            return
        if not self.unsent_events:
            return
        host, port = self.hosts[self.host_index]
        address = host_label(host, port)
        try:
            d = self.endpoint_for(host, port).connect(_ClientFactory(self, address))
        except Exception as e:  # a TLS option that cannot be built, …
            d = defer.fail(e)
        self.connecting = d
        # The connection must be up in time (HostnameEndpoint also bounds the TCP part).
        self._arm_timer(restart=True, seconds=float(self.options["connect_timeout_secs"]))
        d.addCallbacks(self._connected, self._connect_failed, callbackArgs=(d, address), errbackArgs=(d, address))

    def _connected(self, client: LumberjackClient, d: defer.Deferred, address: str) -> None:
        if self.connecting is not d or self.failing or self.stopped:
            client.transport.abortConnection()  # given up on (timeout, failure, stop) meanwhile
            return
        self.connecting = None
        self._disarm_timer()
        self.client = client
        self.client_address = address
        self.connections += 1
        self.log.info(
            "lumberjack sink {name}: connected to {address}{tls}",
            name=self.name,
            address=address,
            tls=" over TLS" if self.options["tls"] else "",
        )
        self._pump()

    def _connect_failed(self, failure: Failure, d: defer.Deferred, address: str) -> None:
        if self.connecting is not d:
            return  # given up on (cancelled) meanwhile
        self.connecting = None
        self._broken(f"cannot connect to {address}: {failure.getErrorMessage()}")

    def _disconnect(self, abort: bool = True) -> None:
        client, self.client = self.client, None
        if client is not None:
            if abort:
                client.transport.abortConnection()
            else:
                client.transport.loseConnection()
        connecting, self.connecting = self.connecting, None
        if connecting is not None:
            connecting.cancel()
        if self._connect_call is not None and self._connect_call.active():
            self._connect_call.cancel()
        self._connect_call = None
        self._disarm_timer()

    # -- what the connection reports -----------------------------------------------------

    def _ack(self, client: LumberjackClient, value: int) -> None:
        inflight = self.inflight
        head = inflight[0] if inflight else None
        if head is None or not head.written:
            if value == 0:
                return  # a keepalive between windows
            self._broken(f"protocol error from {client.address}: ACK {value} with no window in flight")
            return
        if value > head.count:
            self._broken(f"protocol error from {client.address}: ACK {value} for a window of {head.count} event(s)")
            return
        self._arm_timer(restart=True)  # any ACK, 0 included, proves the server alive
        if value <= head.acked:
            if value == 0:
                self.keepalives += 1
            return
        self.acked += value - head.acked
        self.events_acked += value - head.acked
        head.acked = value
        if value < head.count:
            self.partial_acks += 1
        else:
            inflight.popleft()
            self.succeeded()
            if not inflight:
                self._disarm_timer()
        if self._settle():
            self._notify()
        self._check_drained()
        self._pump()

    def _protocol_error(self, client: LumberjackClient, reason: str) -> None:
        if client is self.client:
            self._broken(reason)

    def _lost(self, client: LumberjackClient, reason: Failure) -> None:
        if client is not self.client:
            return
        self.client = None
        why = tls.failure_reason(client.transport, reason) or reason.getErrorMessage()
        if self.inflight and not self.failing:
            self._broken(
                f"connection to {client.address} lost with {len(self.inflight)} window(s) not acknowledged: {why}"
            )
            return
        self._disarm_timer()
        self.log.info(
            "lumberjack sink {name}: connection to {address} closed with nothing in flight ({why})",
            name=self.name,
            address=client.address,
            why=why,
        )
        self._pump()  # reconnects if there is something to send

    def _drop_connections(self) -> None:
        self._disconnect(abort=True)
        if len(self.hosts) > 1:
            self.host_index = (self.host_index + 1) % len(self.hosts)

    # -- timers --------------------------------------------------------------------------

    def _arm_timer(self, restart: bool, seconds: float | None = None) -> None:
        seconds = float(self.options["timeout_secs"]) if seconds is None else seconds
        timer = self._timer
        if timer is not None and timer.active():
            if restart:
                timer.reset(seconds)
            return
        self._timer = self.reactor.callLater(seconds, self._timed_out)

    def _disarm_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self.client is None:
            host, port = self.hosts[self.host_index]
            self._broken(
                f"cannot connect to {host_label(host, port)}: no connection within "
                f"connect_timeout_secs ({float(self.options['connect_timeout_secs']):g}s)"
            )
            return
        self._broken(
            f"no ACK from {self.client.address} within timeout_secs ({float(self.options['timeout_secs']):g}s); "
            f"{len(self.inflight)} window(s) not acknowledged"
        )

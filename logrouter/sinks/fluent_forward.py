"""The ``fluent_forward`` sink: spool records to Fluentd forward servers (out_forward's job).

It makes routers chainable: router A's ``fluent_forward`` sink feeds router B's
``fluent_forward`` source (or fluentd's in_forward, Fluent Bit, any forward server).

**Messages.** Every batch the router hands over becomes one or more PackedForward
messages ``[tag, entries, {"size", "compressed", "chunk"}]`` (one tag per message; entries
``[EventTime, record]`` in a str32 like out_forward, gzip members with ``compress =
"gzip"``), split so no message holds more than ``max_chunk_bytes`` of entries (a single
larger event goes alone). Messages never merge events of different spool records: a
message's content then depends only on the spool, never on timing, which is what lets a
replay after a crash rebuild exactly the messages sent before it (see chunk ids).
Sources that batch (out_forward, Fluent Bit, PackedForward clients) give big messages;
one-event records give one-event messages, pipelined up to ``max_in_flight_bytes``.

**Chunk ids and exactly-once chains.** A message's ``chunk`` id is 16 bytes (BLAKE2b,
base64) derived from a random id kept in this sink's state (created once per spool),
the sink's name, the spool position of the record, the message's index within the
record, and the message's tag and packed events. A message resent after a lost
connection, an ack timeout, a failure, or a crash and replay therefore carries the same
id with the same events. A logrouter receiver recognises ids it already stored
(``Router.ingest(batch, key)``; its ``spool.dedupe_window`` must hold more ids than
this sink sends in a few seconds), so a chain of routers stores every event exactly
once. Should the events at a position differ on a resend (``max_chunk_bytes`` or a
filter changed in between, a ``sample`` filter), the id differs too: stored again
rather than dropped as a duplicate. A fluentd receiver does not deduplicate: for it
this is at-least-once, like out_forward; so is a resend to a *different* server after
a failover (each receiver has its own window).

**Cursor.** With ``require_ack_response`` (the default) a message waits for
``{"ack": id}``; acks may come in any order, and the cursor moves past a spool record
once every message of it, and of every record before it, was acked. A connection that
breaks, or a server silent for ``ack_response_timeout_secs`` on its oldest message, is
dropped, the server is marked down, and its unacked messages are resent (same ids) to
the next live server. Without acks the cursor moves once a message is written to the
transport: what the kernel or the network then lose is lost (at-most-once).

**Memory.** Messages waiting to be sent plus messages sent and not acked are counted
in ``queued_bytes`` (encoded bytes, what is really held); sending stops while
``max_in_flight_bytes`` are unacked or the transport's buffer is full, and the router
stops feeding the sink past its ``max_queue_bytes`` (it reads the spool later instead).

**Servers.** ``servers`` lists ``{host, port, weight, standby}`` tables. Messages are
spread over the live non-standby servers by smooth weighted round-robin (a server with
twice the weight gets exactly twice the messages); standby servers are used only while
every primary is down, and traffic moves back as soon as a primary is live again. A
server is marked down when a connect, TLS or handshake fails, a connection breaks with
messages unacked, or an ack times out. Heartbeats (``heartbeat_type``): ``"tcp"``
connects (with TLS when ``tls``) and closes, ``"udp"`` sends ``0x00`` and expects
``0x00`` back (in_forward's UDP heartbeat; IPv4, names resolved each time); ``heartbeat_misses`` missed in a row mark a
server down, one answer at least ``recover_wait_secs`` after it went down marks it live.
With ``"none"`` a down server is tried again after ``recover_wait_secs``. When no server
is left, the sink fails: it drops what it holds, backs off (``retry_*_secs``), tries
every server again and is fed again from its cursor.

**Security.** ``tls`` connects with TLS (server certificate checked against ``ca_file``,
or the system's roots; its name checked unless ``verify_hostname = false``; a client
certificate with ``client_cert``/``client_key``). ``shared_key`` runs the v1 handshake
as a client: HELO in, PING out (``self_hostname``, salt, digest, and ``username``/
``password`` when the server asks), PONG checked (auth result, the server's digest, and
a server answering with our own hostname is refused, as out_forward does).

Every timer runs on the injected reactor, so tests drive the sink with ``task.Clock``,
``MemoryReactor`` and ``StringTransport``. Encoding (msgpack, gzip) is done on the
reactor thread per record; the state file (``{"cursor", "spool_id"}``) is saved in a
thread at most about once a second and on stop.
"""

from __future__ import annotations

import collections
import os
import socket
from typing import Any

from twisted.internet import defer, task
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.python.failure import Failure

from logrouter import registry, tls
from logrouter.batch import Batch
from logrouter.config.options import Option, Problems, non_negative, one_of, positive
from logrouter.serial import defer_to_thread
from logrouter.sinks.base import SINK_OPTIONS, SinkBase
from logrouter.sinks.state import CursorSaver
from logrouter.sinks.forward_client import (  # noqa: F401 - tests reach the factories through this module
    ForwardClient,
    Server,
    _Chunk,
    _ClientFactory,
    _Record,
    _TcpHeartbeatProbe,
    _UdpHeartbeat,
)
from logrouter.wire import fluent_client as wire

DEFAULT_PORT = 24224
DEFAULT_WEIGHT = 60  # out_forward's default
SERVER_KEYS = ("host", "port", "weight", "standby")
HEARTBEAT_TYPES = ("tcp", "udp", "none")
STATE_SAVE_SECS = 1.0


class NoServerAvailable(Exception):
    """Every configured server is down."""


# -- config ------------------------------------------------------------------------------


def _describe(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "table"}
    return f"{names.get(type(value), type(value).__name__)} {value!r}"


def server_problems(value: list[Any]) -> list[str]:
    """Every problem of a ``servers`` array, each starting with its path (``[1].port: …``)."""
    problems: list[str] = []
    if not value:
        return ['must list at least one server, e.g. [{ host = "127.0.0.1", port = 24224 }]']
    seen: dict[tuple[str, int], int] = {}
    for i, item in enumerate(value):
        where = f"[{i}]"
        if not isinstance(item, dict):
            shape = "{ host = …, port = …, weight = …, standby = … }"
            problems.append(f"{where}: must be a table {shape}, got {_describe(item)}")
            continue
        for key in item:
            if key not in SERVER_KEYS:
                problems.append(f"{where}.{key}: unknown key (allowed: {', '.join(sorted(SERVER_KEYS))})")
        host = item.get("host")
        if host is None:
            problems.append(f"{where}.host: required key is missing")
        elif not isinstance(host, str) or not host or any(c.isspace() for c in host):
            problems.append(f"{where}.host: must be a host name or IP address, got {_describe(host)}")
        port = item.get("port", DEFAULT_PORT)
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            problems.append(f"{where}.port: must be an integer from 1 to 65535, got {_describe(port)}")
        weight = item.get("weight", DEFAULT_WEIGHT)
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            problems.append(f"{where}.weight: must be an integer of 1 or more, got {_describe(weight)}")
        standby = item.get("standby", False)
        if not isinstance(standby, bool):
            problems.append(f"{where}.standby: must be a boolean, got {_describe(standby)}")
        if isinstance(host, str) and isinstance(port, int):
            first = seen.setdefault((host, port), i)
            if first != i:
                problems.append(f"{where}: {host}:{port} is already listed as [{first}]")
    if not problems and all(item.get("standby", False) for item in value):
        problems.append("every server is a standby: at least one must have standby = false")
    return problems


def _check_servers(value: list[Any]) -> None:
    problems = server_problems(value)
    if problems:
        raise Problems(problems)




# -- the sink ----------------------------------------------------------------------------


@registry.sink("fluent_forward")
class FluentForwardSink(SinkBase):
    COUNTERS = {
        "chunks_sent": "forward messages written to a server, resends included",
        "chunks_acked": "forward messages a server acknowledged",
        "chunks_resent": "forward messages sent again after their server went down",
        "ack_timeouts": "servers marked down for not acknowledging within ack_response_timeout_secs",
        "server_downs": "times a server was marked down",
        "handshake_failures": "handshakes with a server that failed",
        "unknown_acks": "acks for no message in flight",
    }
    OPTIONS = {
        "servers": Option(list, doc="array of `{ host, port = 24224, weight = 60, standby = false }`; at least one must not be a standby", check=_check_servers),
        "require_ack_response": Option(bool, True, "ask for and wait for `{\"ack\": chunk}` before a record counts as done"),
        "ack_response_timeout_secs": Option(
            (int, float), 60, "a server silent this long on its oldest unacked message is marked down and its messages are resent "
            "(out_forward uses 190)", positive
        ),
        "max_chunk_bytes": Option(
            int, 1 << 20, "packed entries per message before compression; larger batches are split", positive
        ),
        "max_in_flight_bytes": Option(int, 8 << 20, "sent and not yet acked, over all servers", positive),
        "compress": Option(str, "text", "`\"gzip\"` sends CompressedPackedForward, `\"text\"` PackedForward", one_of(*wire.COMPRESSIONS)),
        "compress_level": Option(int, 6, "gzip level, 1 (fast) to 9 (small)", one_of(*range(1, 10))),
        "connect_timeout_secs": Option((int, float), 10, "TCP connect, TLS and the handshake must all finish within this", positive),
        "heartbeat_type": Option(str, "tcp", "`tcp`: connect and close (with a TLS handshake when `tls`); `udp`: send `0x00`, expect `0x00`; `none`", one_of(*HEARTBEAT_TYPES)),
        "heartbeat_interval_secs": Option((int, float), 1, "time between heartbeats to each server", positive),
        "heartbeat_misses": Option(int, 3, "this many missed in a row mark a server down", positive),
        "recover_wait_secs": Option((int, float), 10, "a down server is trusted again no sooner than this", non_negative),
        **tls.CLIENT_OPTIONS,
        "shared_key": Option(str, "", "run the v1 handshake with this key on every connection (empty = no handshake)"),
        "self_hostname": Option(str, "", "hostname sent in PING (empty = the host's name)"),
        "username": Option(str, "", "user for servers with user authentication (needs `shared_key`)"),
        "password": Option(str, "", "password of `username`"),
        "drain_timeout_secs": Option((int, float), 10, "on a graceful stop, wait this long for acks of what was sent", non_negative),
        **SINK_OPTIONS,
    }

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[str]:
        problems = tls.check_client_options(options)
        if (options["username"] or options["password"]) and not options["shared_key"]:
            problems.append("username: user authentication is part of the handshake; set shared_key too")
        elif options["password"] and not options["username"]:
            problems.append("password: set username too")
        return problems

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        super().__init__(name, options, errors, reactor)
        self.servers = [
            Server(s["host"], s.get("port", DEFAULT_PORT), s.get("weight", DEFAULT_WEIGHT), s.get("standby", False))
            for s in options["servers"]
        ]
        self.ack = bool(options["require_ack_response"])
        self.use_tls = bool(options["tls"])
        self.self_hostname = options["self_hostname"] or socket.gethostname()
        if self.use_tls:
            for server in self.servers:
                server.tls_options = tls.client_tls_options(server.host, options)
        self.spool_id = b""
        self.records: collections.deque[_Record] = collections.deque()
        self.queue: collections.deque[_Chunk] = collections.deque()
        self.inflight_bytes = 0
        self.fed_end = 0
        self.started = False
        self.stopping = False
        self.stopped = False  # drained and closed: nothing is sent any more
        self._seq = 0
        self._pumping = False
        self._pump_again = False
        self._drain_waiters: list[defer.Deferred] = []
        self.saver = CursorSaver(
            self, STATE_SAVE_SECS, lambda: {"spool_id": self.spool_id.decode("ascii")} if self.spool_id else None
        )
        self.ticker = task.LoopingCall(self._tick)
        self.ticker.clock = reactor
        self.heartbeats = task.LoopingCall(self._heartbeat)
        self.heartbeats.clock = reactor
        self.udp_port: Any = None
        # counters
        self.chunks_sent = 0
        self.chunks_acked = 0
        self.chunks_resent = 0
        self.events_out = 0
        self.unknown_acks = 0
        self.handshake_failures = 0
        self.ack_timeouts = 0
        self.server_downs = 0

    # Blocking calls (the state file's fsync) run here; tests replace it with a direct call.
    run_blocking = staticmethod(defer_to_thread)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> defer.Deferred:
        d = self.run_blocking(self._load_state)

        def started(cursor: int) -> int:
            self.cursor = self.fed_end = cursor
            self.saver.loaded(cursor)
            self.started = True
            self.ticker.start(self._tick_secs(), now=False)
            if self.options["heartbeat_type"] == "udp":
                self.udp_port = self.reactor.listenUDP(0, _UdpHeartbeat(self))
            if self.options["heartbeat_type"] != "none":
                self.heartbeats.start(float(self.options["heartbeat_interval_secs"]), now=True)
            self.log.info(
                "fluent_forward sink {name}: forwarding to {servers} (acks {acks}, tls {tls}, handshake {handshake}, "
                "compress {compress}); resuming from spool position {cursor}",
                name=self.name,
                servers=", ".join(s.label + (" (standby)" if s.standby else "") for s in self.servers),
                acks="on" if self.ack else "off",
                tls="on" if self.use_tls else "off",
                handshake="on" if self.options["shared_key"] else "off",
                compress=self.options["compress"],
                cursor=cursor,
            )
            return cursor

        return d.addCallback(started)

    def _tick_secs(self) -> float:
        return min(STATE_SAVE_SECS, float(self.options["ack_response_timeout_secs"]) / 4)

    def _load_state(self) -> int:
        """The cursor to resume from; the spool id is created (and saved) on the first start."""
        state = (self.state.load() if self.state is not None else None) or {}
        cursor = int(state.get("cursor", 0))
        spool_id = state.get("spool_id")
        if not isinstance(spool_id, str) or not spool_id:
            spool_id = os.urandom(16).hex()
            if self.state is not None:
                # Saved before any chunk id is derived from it.
                self.state.save({"cursor": cursor, "spool_id": spool_id})
        self.spool_id = spool_id.encode("ascii")
        return cursor

    def stop(self) -> defer.Deferred:
        self.stopping = True
        self.cancel_retry()
        if self.heartbeats.running:
            self.heartbeats.stop()
        d = self._drained()
        timeout = float(self.options["drain_timeout_secs"])
        timer = self.reactor.callLater(timeout, self._drain_timed_out, d) if not d.called else None

        def drained(_: Any) -> defer.Deferred:
            self.stopped = True
            self.cancel_retry()  # a failure while draining must not schedule work after the stop
            if timer is not None and timer.active():
                timer.cancel()
            if self.ticker.running:
                self.ticker.stop()
            for server in self.servers:
                if server.connection is not None:
                    server.connection.close()
            if self.udp_port is not None:
                port, self.udp_port = self.udp_port, None
                port.stopListening()
            return self._save(force=True)

        return d.addCallback(drained)

    def _drained(self) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self._drain_waiters.append(d)
        self._check_drained()
        return d

    def _check_drained(self) -> None:
        if self._drain_waiters and (self.failing or not self.started or (not self.queue and not self.inflight_bytes)):
            waiters, self._drain_waiters = self._drain_waiters, []
            for d in waiters:
                d.callback(None)

    def _drain_timed_out(self, d: defer.Deferred) -> None:
        if d.called:
            return
        unacked = len(self.queue) + sum(len(s.connection.inflight) for s in self.servers if s.connection)
        self.log.warn(
            "fluent_forward sink {name}: stopping with {count} chunk(s) not acked after {secs:g}s; "
            "they stay in the spool and are resent (same chunk ids) on the next start",
            name=self.name,
            count=unacked,
            secs=float(self.options["drain_timeout_secs"]),
        )
        if d in self._drain_waiters:
            self._drain_waiters.remove(d)
        d.callback(None)

    # -- fed by the router ---------------------------------------------------------------

    def write(self, batch: Batch, position: int, size: int) -> None:
        if self.failing or not self.started:
            return  # the replay from the cursor brings it again
        self.events_in += len(batch.events)
        record = self._record_at(position)
        max_bytes = self.options["max_chunk_bytes"]
        compress, level = self.options["compress"], self.options["compress_level"]
        for count, entries in wire.pack_entries(batch.events, max_bytes):
            index = record.chunks
            record.chunks += 1
            chunk_id = wire.chunk_id(self.spool_id, self.name, position, index, batch.tag, entries) if self.ack else None
            data = wire.encode_chunk(batch.tag, entries, count, chunk_id, compress, level)
            self._seq += 1
            record.pending += 1
            self.queue.append(_Chunk(self._seq, record, chunk_id, data, count))
            self.queued_bytes += len(data)
        self._pump()

    def _record_at(self, position: int) -> _Record:
        if self.records:
            last = self.records[-1]
            if last.position == position and last.end is None:
                return last
            if last.end is None:
                last.end = position  # advance() was not called between records
        record = _Record(position)
        self.records.append(record)
        return record

    def advance(self, end: int) -> None:
        if self.failing:
            return  # what was handed over is dropped; the replay starts at the cursor
        if self.records and self.records[-1].end is None:
            self.records[-1].end = end
        self.fed_end = end
        self._settle()

    def _settle(self) -> bool:
        """Drop finished records from the front; move the cursor. True if it moved."""
        records = self.records
        while records and records[0].end is not None and records[0].pending == 0:
            records.popleft()
        cursor = records[0].position if records else self.fed_end
        if cursor > self.cursor:
            self.cursor = cursor
            return True
        return False

    def reset(self) -> None:
        """After a failure's backoff: every server gets another try; the router replays."""
        for server in self.servers:
            server.down = False
            server.missed = 0
        self.records.clear()
        self.queue.clear()
        self.fed_end = self.cursor

    # -- sending -------------------------------------------------------------------------

    def _tier(self) -> list[Server]:
        """The servers to send to: live primaries, or live standbys when no primary is."""
        now = self.reactor.seconds()
        retry_down = self.options["heartbeat_type"] == "none"
        live = []
        for server in self.servers:
            if server.down and retry_down and now - server.down_at >= self.options["recover_wait_secs"]:
                server.down = False  # no heartbeats: trust it again after recover_wait and try
            if not server.down:
                live.append(server)
        primaries = [s for s in live if not s.standby]
        return primaries or live

    def _pump(self) -> None:
        """Send what the window allows; connect to the servers that should be in use."""
        if self._pumping:
            self._pump_again = True
            return
        self._pumping = True
        try:
            self._pump_again = True
            while self._pump_again and not self.failing and self.started and not self.stopped:
                self._pump_again = False
                self._pump_once()
        finally:
            self._pumping = False

    def _pump_once(self) -> None:
        tier = self._tier()
        if not tier:
            if self.queue:
                self._give_up()
            return
        for server in self.servers:
            connection = server.connection
            if connection is not None and server not in tier and not connection.inflight and not self.stopping:
                connection.close()  # idle, and no longer where traffic goes (back from a standby)
        if not self.queue:
            return
        for server in tier:
            if server.connection is None:
                self._connect(server)
        ready = [s for s in tier if s.connection is not None and s.connection.can_send]
        limit = self.options["max_in_flight_bytes"]
        now = self.reactor.seconds()
        while self.queue and ready:
            chunk = self.queue[0]
            if self.ack and self.inflight_bytes and self.inflight_bytes + len(chunk.data) > limit:
                break
            server = self._choose(ready)
            assert server.connection is not None
            self.queue.popleft()
            server.chunks_sent += 1
            self.chunks_sent += 1
            if chunk.sends:
                self.chunks_resent += 1
            if self.ack:
                self.inflight_bytes += len(chunk.data)
            server.connection.send(chunk, now, self.ack)
            if not self.ack:
                self._done([chunk])
            if not server.connection.can_send:
                ready.remove(server)

    @staticmethod
    def _choose(servers: list[Server]) -> Server:
        """Smooth weighted round-robin (nginx's): exact shares, evenly interleaved."""
        total = 0
        best: Server | None = None
        for server in servers:
            server.current += server.weight
            total += server.weight
            if best is None or server.current > best.current:
                best = server
        assert best is not None
        best.current -= total
        return best

    def _connect(self, server: Server) -> None:
        client = ForwardClient(self, server, self.epoch)
        server.connection = client
        factory = _ClientFactory(client)
        timeout = float(self.options["connect_timeout_secs"])
        if self.use_tls:
            client.connector = self.reactor.connectSSL(
                server.host, server.port, factory, server.tls_options, timeout=timeout
            )
        else:
            client.connector = self.reactor.connectTCP(server.host, server.port, factory, timeout=timeout)
        client.start_timeout(timeout)

    # -- what connections report ---------------------------------------------------------

    def _connection_ready(self, client: ForwardClient) -> None:
        if client.epoch != self.epoch:
            client.abort()
            return
        server = client.server
        if not server.announced:
            server.announced = True
            self.log.info(
                "fluent_forward sink {name}: connected to {server}{standby}{tls}{handshake}",
                name=self.name,
                server=server.label,
                standby=" (standby)" if server.standby else "",
                tls=" over TLS" if self.use_tls else "",
                handshake=f", handshake done with {client.handshake.server_hostname!r}" if client.handshake else "",
            )
        self._pump()

    def _acked(self, client: ForwardClient, chunks: list[_Chunk]) -> None:
        if client.epoch != self.epoch:
            return
        for chunk in chunks:
            self.inflight_bytes -= len(chunk.data)
        client.server.chunks_acked += len(chunks)
        self._done(chunks)
        self._pump()

    def _done(self, chunks: list[_Chunk]) -> None:
        """Chunks acked (or written, without acks): free them, maybe move the cursor."""
        for chunk in chunks:
            self.queued_bytes -= len(chunk.data)
            chunk.record.pending -= 1
            self.events_out += chunk.events
        self.chunks_acked += len(chunks) if self.ack else 0
        self.queued_bytes = max(self.queued_bytes, 0)
        self._settle()
        self.succeeded()
        self._check_drained()
        self.on_progress()

    def _connection_lost(self, client: ForwardClient) -> None:
        server = client.server
        if server.connection is client:
            server.connection = None
        if client.epoch != self.epoch:
            return
        if client.inflight:
            self._requeue(client)
        if client.failed_reason is not None and not self.failing:
            self._mark_down(server, client.failed_reason)
        if not self.stopping or self.queue:
            self._pump()
        self._check_drained()

    def _requeue(self, client: ForwardClient) -> None:
        chunks = list(client.inflight.values())
        client.inflight.clear()
        self.inflight_bytes -= client.inflight_bytes
        client.inflight_bytes = 0
        self.queue = collections.deque(sorted([*chunks, *self.queue], key=lambda c: c.seq))

    def _mark_down(self, server: Server, reason: str) -> None:
        now = self.reactor.seconds()
        if not server.down:
            server.down = True
            server.downs += 1
            self.server_downs += 1
            server.announced = False
            self.log.warn(
                "fluent_forward sink {name}: server {server} is down: {reason}{resend}",
                name=self.name,
                server=server.label,
                reason=reason,
                resend=f"; {len(self.queue)} chunk(s) to send elsewhere or later" if self.queue else "",
            )
        server.down_at = now
        server.down_reason = reason

    def _give_up(self) -> None:
        """No server is left: drop everything, back off, then replay from the cursor."""
        reasons = "; ".join(f"{s.label}: {s.down_reason or 'down'}" for s in self.servers)
        clients = [s.connection for s in self.servers if s.connection is not None]
        for server in self.servers:
            server.connection = None
        # fail() bumps the epoch first, so whatever these connections still report is ignored.
        self.fail(Failure(NoServerAvailable(f"no server available ({reasons})")))
        for client in clients:
            client.abort()
        self.queue.clear()
        self.records.clear()
        self.inflight_bytes = 0
        self.fed_end = self.cursor
        self._check_drained()
        self.on_progress()

    # -- timers --------------------------------------------------------------------------

    def _tick(self) -> None:
        """Ack timeouts, and saving the cursor (at most about once a second)."""
        now = self.reactor.seconds()
        timeout = float(self.options["ack_response_timeout_secs"])
        for server in self.servers:
            client = server.connection
            oldest = client.oldest() if client is not None else None
            if oldest is not None and now - oldest.sent_at >= timeout:
                self.ack_timeouts += 1
                client.fail(f"no ack within {timeout:g}s ({len(client.inflight)} chunk(s) unacked)")
        self._save()

    def _save(self, force: bool = False) -> defer.Deferred:
        return self.saver.save(force)

    def _heartbeat(self) -> None:
        kind = self.options["heartbeat_type"]
        interval = float(self.options["heartbeat_interval_secs"])
        for server in self.servers:
            probe = server.probe
            if probe is not None:
                server.probe = None
                probe.give_up()  # no answer within one interval: missed
            if server.heartbeat_pending:  # UDP
                server.heartbeat_pending = False
                self._heartbeat_missed(server)
            if self.stopped:
                return
            if kind == "tcp":
                probe = server.probe = _TcpHeartbeatProbe(self, server, self.use_tls)
                if self.use_tls:
                    probe.connector = self.reactor.connectSSL(
                        server.host, server.port, probe, server.tls_options, timeout=interval
                    )
                else:
                    probe.connector = self.reactor.connectTCP(server.host, server.port, probe, timeout=interval)
            else:
                server.heartbeat_pending = True
                self._send_udp_heartbeat(server)

    def _send_udp_heartbeat(self, server: Server) -> None:
        if isIPAddress(server.host) or isIPv6Address(server.host):
            self._udp_send(server, server.host)
            return
        d = self.reactor.resolve(server.host)
        d.addCallbacks(lambda ip: self._udp_send(server, ip), lambda _: None)  # unresolved: counted as missed

    def _udp_send(self, server: Server, ip: str) -> None:
        if self.udp_port is None:
            return
        server.udp_address = (ip, server.port)
        try:
            self.udp_port.write(wire.HEARTBEAT_REQUEST, server.udp_address)
        except Exception:  # unreachable, an IPv6 address on the IPv4 socket …: the missing answer counts
            pass

    def _udp_reply(self, address: Any) -> None:
        host, port = address[0], address[1]
        for server in self.servers:
            if server.udp_address == (host, port) and server.heartbeat_pending:
                server.heartbeat_pending = False
                self._heartbeat_answered(server)

    def _heartbeat_answered(self, server: Server) -> None:
        if server.probe is not None and server.probe.done:
            server.probe = None
        server.missed = 0
        if server.down and self.reactor.seconds() - server.down_at >= self.options["recover_wait_secs"]:
            server.down = False
            self.log.info(
                "fluent_forward sink {name}: server {server} answers heartbeats again; back in use",
                name=self.name,
                server=server.label,
            )
            if self.started and not self.stopping:
                self._pump()

    def _heartbeat_missed(self, server: Server) -> None:
        if server.probe is not None and server.probe.done:
            server.probe = None
        if self.stopped:
            return
        server.missed += 1
        if server.missed >= self.options["heartbeat_misses"] and not server.down:
            self._mark_down(server, f"{server.missed} heartbeats missed")
            if server.connection is not None:
                server.connection.fail(f"{server.missed} heartbeats missed")
            elif self.started and not self.stopping:
                self._pump()

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

The lifecycle (start, ticks, failure, stop and drain, saving the cursor) is
``ForwardingSink``'s; the servers' state and weighted choice are in ``forward_servers``,
one connection in ``forward_client``, heartbeats in ``forward_heartbeats``. Every timer
runs on the injected reactor, so tests drive the sink with ``task.Clock``,
``MemoryReactor`` and ``StringTransport``. Encoding (msgpack, gzip) is done on the
reactor thread per record; the state file (``{"cursor", "spool_id"}``) is saved in a
thread at most about once a second and on stop.
"""

from __future__ import annotations

import collections
import os
import socket
from typing import Any

from twisted.python.failure import Failure

from logrouter import registry, tls
from logrouter.batch import Batch
from logrouter.config.options import Option, non_negative, one_of, positive
from logrouter.sinks.base import SINK_OPTIONS
from logrouter.sinks.forward_client import Chunk, ChunkRecord, ClientSettings, ForwardClient, connect
from logrouter.sinks.forward_heartbeats import HeartbeatProber
from logrouter.sinks.forward_servers import Server, check_servers, choose, in_use
from logrouter.sinks.forwarding import STATE_SAVE_SECS, ForwardingSink
from logrouter.wire import fluent_client as wire

HEARTBEAT_TYPES = ("tcp", "udp", "none")


class NoServerAvailable(Exception):
    """Every configured server is down."""


@registry.sink("fluent_forward")
class FluentForwardSink(ForwardingSink):
    HEARTBEAT_AT_START = True
    RESENT = "resent (same chunk ids)"
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
        "servers": Option(list, doc="array of `{ host, port = 24224, weight = 60, standby = false }`; at least one must not be a standby", check=check_servers),
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
        self.servers = [Server.from_option(s) for s in options["servers"]]
        self.ack = bool(options["require_ack_response"])
        self.use_tls = bool(options["tls"])
        self.self_hostname = options["self_hostname"] or socket.gethostname()
        if self.use_tls:
            for server in self.servers:
                server.tls_options = tls.client_tls_options(server.host, options)
        self.client_settings = ClientSettings(
            self.use_tls, options["shared_key"], self.self_hostname, options["username"], options["password"]
        )
        self.prober = HeartbeatProber(
            self, self.servers, reactor, options["heartbeat_type"], float(options["heartbeat_interval_secs"]), self.use_tls
        )
        self.spool_id = b""
        self.records: collections.deque[ChunkRecord] = collections.deque()
        self.queue: collections.deque[Chunk] = collections.deque()
        self.inflight_bytes = 0
        self.fed_end = 0
        self._seq = 0
        self._pumping = False
        self._pump_again = False
        # counters
        self.chunks_sent = 0
        self.chunks_acked = 0
        self.chunks_resent = 0
        self.events_out = 0
        self.unknown_acks = 0
        self.handshake_failures = 0
        self.ack_timeouts = 0
        self.server_downs = 0

    # -- lifecycle (the steps ForwardingSink leaves to the protocol) ----------------------

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

    def _state_extra(self) -> dict[str, Any] | None:
        return {"spool_id": self.spool_id.decode("ascii")} if self.spool_id else None

    def _resume(self, cursor: int) -> int:
        self.fed_end = cursor
        self.prober.open()
        return cursor

    def _tick_secs(self) -> float:
        return min(STATE_SAVE_SECS, float(self.options["ack_response_timeout_secs"]) / 4)

    def _heartbeat_secs(self) -> float | None:
        return None if self.options["heartbeat_type"] == "none" else float(self.options["heartbeat_interval_secs"])

    def _log_started(self, cursor: int) -> None:
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

    def _stop_begins(self) -> None:
        if self.heartbeats.running:
            self.heartbeats.stop()

    def _drained(self) -> bool:
        return not self.queue and not self.inflight_bytes

    def _undrained(self) -> str:
        unacked = len(self.queue) + sum(len(s.connection.inflight) for s in self.servers if s.connection)
        return f"{unacked} chunk(s) not acked"

    def _close_output(self, saved: Any) -> Any:
        for server in self.servers:
            if server.connection is not None:
                server.connection.close()
        self.prober.close()
        return saved

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
            self.queue.append(Chunk(self._seq, record, chunk_id, data, count))
            self.queued_bytes += len(data)
        self._pump()

    def _record_at(self, position: int) -> ChunkRecord:
        if self.records:
            last = self.records[-1]
            if last.position == position and last.end is None:
                return last
            if last.end is None:
                last.end = position  # advance() was not called between records
        record = ChunkRecord(position)
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
        self._drop()

    def _drop(self) -> None:
        self.queue.clear()
        self.records.clear()
        self.inflight_bytes = 0
        self.fed_end = self.cursor

    def _drop_connections(self) -> None:
        for server in self.servers:
            client, server.connection = server.connection, None
            if client is not None:
                client.abort()

    # -- sending -------------------------------------------------------------------------

    def _tier(self) -> list[Server]:
        # Without heartbeats a down server is trusted again after recover_wait and tried.
        retry_down = self.options["recover_wait_secs"] if self.options["heartbeat_type"] == "none" else None
        return in_use(self.servers, self.reactor.seconds(), retry_down)

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
            server = choose(ready)
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

    def _connect(self, server: Server) -> None:
        timeout = float(self.options["connect_timeout_secs"])
        server.connection = connect(self, self.client_settings, server, self.epoch, timeout)

    # -- what connections report (ClientOwner) ------------------------------------------

    def connection_ready(self, client: ForwardClient) -> None:
        """``client`` is connected (TLS and handshake done): send on it."""
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

    def acked(self, client: ForwardClient, chunks: list[Chunk]) -> None:
        """The server acked ``chunks`` (before any failure of the same read)."""
        if client.epoch != self.epoch:
            return
        for chunk in chunks:
            self.inflight_bytes -= len(chunk.data)
        client.server.chunks_acked += len(chunks)
        self._done(chunks)
        self._pump()

    def _done(self, chunks: list[Chunk]) -> None:
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

    def connection_lost(self, client: ForwardClient) -> None:
        """``client`` is closed or never connected; ``failed_reason`` says whether it failed."""
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

    def sending_resumed(self) -> None:
        """A transport's buffer drained: send what waits."""
        self._pump()

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
        self._fail_and_drop(Failure(NoServerAvailable(f"no server available ({reasons})")))

    # -- timers --------------------------------------------------------------------------

    def _on_tick(self) -> None:
        """Ack timeouts (the cursor is saved after this, at most about once a second)."""
        now = self.reactor.seconds()
        timeout = float(self.options["ack_response_timeout_secs"])
        for server in self.servers:
            client = server.connection
            oldest = client.oldest() if client is not None else None
            if oldest is not None and now - oldest.sent_at >= timeout:
                self.ack_timeouts += 1
                client.fail(f"no ack within {timeout:g}s ({len(client.inflight)} chunk(s) unacked)")

    def _heartbeat(self) -> None:
        self.prober.probe()

    # -- what heartbeats report (HeartbeatOwner) ------------------------------------------

    def heartbeat_answered(self, server: Server) -> None:
        """``server`` answered a heartbeat: live again once it has been down long enough."""
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

    def heartbeat_missed(self, server: Server) -> None:
        """``server`` missed a heartbeat: down after ``heartbeat_misses`` in a row."""
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

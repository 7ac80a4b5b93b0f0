"""The ``fluent_forward`` source: Fluentd's forward protocol (in_forward's server side).

Each decoded message becomes one batch (a big one several, see below). When the client asked for an ack (option
``chunk``), ``{"ack": chunk}`` is sent with the chunk's bytes exactly as received, and
only after the batch is durable in the spool.

With ``shared_key`` set, every connection starts with the v1 handshake: the server sends
HELO, checks the client's PING (shared key digest, and the user digest when ``users``
are configured) and answers PONG; nothing the client sends is accepted before that. A
failed PING gets in_forward's failure PONG and the connection is closed after it.

``ssl_client_authentication`` (the stream sources' shared TLS option; ``verify_client =
true``, in_forward's name, is kept as an alias of ``"required"``) asks TLS clients for a
certificate signed by ``ca_file``. When the
listener is a TCP/TLS port, a UDP socket on the same interface and port answers
heartbeat datagrams with one ``0x00`` byte, as in_forward does.

The ``size`` option is a hint: a message whose entry count differs is stored whole, the
mismatch is counted (``size_mismatches``) and logged once per connection.

Big messages are decoded off the reactor (``offload_bytes``): a message whose entries
pass that size (a long Forward array, a big PackedForward blob, one that inflates beyond
it) is inflated and unpacked in the source's own worker threads (``offload_threads``),
in parts of about ``offload_part_bytes`` of entries, while that connection's reading is
held; its later messages wait behind it in order, other connections go on. Each part is
one batch, so neither memory nor one spool record holds the whole message, and the next
part is only built once the one before the previous is durable and the router is not
pushing back. The ack goes out once every part is durable. A part's dedupe key is the
chunk id for part 0 and ``chunk + b"\\0part N"`` after it: a message resent after a crash
between parts is split the same way, so the parts already stored are recognised and only
the rest is stored (changing ``offload_bytes`` or ``offload_part_bytes`` between the two
sends can store such a message twice). A message found bad in the worker (a compression
bomb, corrupt data) closes its connection like any bad input, before any of it is stored. The work is
done in steps of at most about a MiB of entries, and connections take turns a step at a
time (``offload.OffloadPool``), so a message waits at most one step of each other one.

A message whose entries are mostly invalid is refused as a bomb (the rule is in
``wire.forward_entries``): its connection is closed like any bad input and counted in
``bombs_refused``; nothing of it is acked (parts stored before the rule tripped stay, and
a resend recognises them). Messages decoded on the reactor follow the same rule.

A connection that stops taking input (a graceful stop's drain ended, at the latest after
``stop_drain_secs``; an idle timeout; a close) abandons the message being worked on after
the step being built: no ack, so the client resends it; parts already stored stay. A
message finished within the drain is acked as usual.
"""

from __future__ import annotations

import collections
import socket
from typing import Any

from twisted.internet import defer, error, protocol
from twisted.internet.address import IPv4Address, IPv6Address

from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.endpoints import listen_option
from logrouter.config.options import Option, non_negative, positive
from logrouter.sources.offload import IteratorRun, OffloadPool
from logrouter.sources.stream import StreamProtocol, StreamSource
from logrouter.sources.stream_handshake import HandshakeDone, HandshakeFailed
from logrouter.spool import formats
from logrouter.wire import fluent_forward as wire
from logrouter.wire import fluent_handshake as handshake
from logrouter.wire.forward_lazy import lazy_events

HEARTBEAT_REPLY = b"\x00"
MAX_PART_BYTES = 128 << 20  # a part is one spool record, and the spool caps those at 256 MiB
OFFLOAD_HOLD = "offload"  # the hold_reading reason while a connection's message is worked on


def events_of_entries(entries: bytes, now: int | None) -> list:
    """The events of a stored PackedForward entries blob (inflated) whose time-0 entries
    got the clock reading ``now``: ``wire.decode_entries``, which must keep giving the
    same events for the same bytes (else the format needs a new name). Kept packed where
    the native extension takes them (``wire.forward_lazy``: the lake builds its columns
    from the bytes; the events, if read, are the same); decoded now otherwise, which
    raises for bad ones."""
    return lazy_events(entries, now) or wire.decode_entries(entries, now)[0]


# A PackedForward message's entries are stored as received (``Batch.packed``).
FORWARD_ENTRIES = formats.register("forward", ("entries", "now"), events_of_entries).name


def part_key(chunk: bytes | None, index: int) -> bytes | None:
    """The dedupe key of part ``index`` of a message: a resend splits the same way."""
    if chunk is None or index == 0:
        return chunk
    return chunk + b"\0part %d" % index


class Offload:
    """The bookkeeping of one message being decoded in parts for one connection."""

    __slots__ = ("run", "tag", "chunk", "size", "parts", "entries", "invalid", "unacked", "finished", "room")

    def __init__(self) -> None:
        self.run: IteratorRun | None = None
        self.tag = ""
        self.chunk: bytes | None = None
        self.size: Any = None
        self.parts = 0
        self.entries = 0
        self.invalid = 0
        self.unacked = 0  # parts handed to the router and not durable yet
        self.finished = False  # every part has been handed out
        self.room: defer.Deferred | None = None  # fires when the next part may be built


class ForwardProtocol(StreamProtocol):
    handshake: handshake.ServerHandshake | None = None
    client_hostname = ""  # from the PING, once the handshake succeeded
    username = ""
    size_warned = False

    def __init__(self, source: "FluentForwardSource") -> None:
        super().__init__(source)
        self.offload: Offload | None = None  # the message being decoded in parts, if any
        self.waiting: collections.deque[Any] = collections.deque()  # frames decoded after it
        # In ``pending`` while this connection has offloaded work, so a graceful stop
        # (which waits for ``pending``) lets it finish before closing the connection.
        self.busy: defer.Deferred | None = None

    def make_decoder(self) -> wire.ForwardDecoder:
        offload_bytes = self.source.options["offload_bytes"]
        return BombCountingDecoder(
            self.source,
            max_message_bytes=self.source.options["max_message_bytes"],
            max_decompressed_bytes=self.source.options["max_decompressed_bytes"],
            # A handshake session is msgpack throughout (in_forward, section 4).
            allow_json=self.source.security is None,
            offload_bytes=offload_bytes or None,
        )

    def connection_ready(self) -> None:
        if self.source.security is not None:
            self.handshake = handshake.ServerHandshake(self.source.security)
            self.expect_handshake()
            self.send(self.handshake.helo())

    def handshake_received(self, data: bytes) -> HandshakeDone | HandshakeFailed | None:
        assert self.handshake is not None
        result = self.handshake.feed(data)
        if result is None:
            return None  # the PING is not complete yet
        if not result.ok:
            self.source.auth_failures += 1
            return HandshakeFailed(f"handshake failed: {result.describe()}", result.pong)  # closed after the PONG
        self.handshake = None  # established (not logged: one per out_forward heartbeat)
        self.client_hostname = result.client_hostname
        self.username = result.username
        return HandshakeDone(result.rest, result.pong)

    def handshake_pending_bytes(self) -> int:
        return self.handshake.pending_bytes if self.handshake is not None else 0

    def handle(self, message: Any) -> None:
        if self.offload is not None:
            self.waiting.append(message)  # in order, after the message being worked on
            return
        if isinstance(message, wire.DeferredMessage):
            self.start_offload(message)
            return
        if isinstance(message, wire.Heartbeat):
            return
        self.note_invalid(message.invalid, message.tag)
        size = message.options.get("size")
        if size is not None:
            self.check_size(size, len(message.events) + message.invalid, message.tag)
        chunk = message.chunk
        if not message.events:
            # Nothing to store (all invalid, or empty): fluentd still acks such a chunk.
            self.ack(chunk)
            return
        on_durable = None if chunk is None else (lambda: self.ack(chunk))
        # packed: the entries as received, which the spool stores instead of encoding the
        # events. The codec already kept the events themselves packed where the native
        # extension takes them (wire.forward_lazy), for the lake to build its columns from.
        packed = message.packed
        if packed is not None:
            packed = (FORWARD_ENTRIES, *packed)
        self.submit(Batch(message.tag, message.events, packed=packed), on_durable, chunk)

    def ack(self, chunk: bytes | None) -> None:
        if chunk is not None:
            self.send(wire.encode_ack(chunk, self.decoder.json_mode))

    def note_invalid(self, count: int, tag: str) -> None:
        if count:
            self.source.invalid_events += count
            self.log.warn(
                "fluent_forward {peer}: skipped {count} invalid event(s) in tag {tag}",
                peer=self.peer,
                count=count,
                tag=tag,
            )

    def check_size(self, size: Any, entries: int, tag: str) -> None:
        """``size`` is a hint (in_forward only passes it on): a mismatch is counted, never dropped."""
        if type(size) is int and size == entries:
            return
        self.source.size_mismatches += 1
        if not self.size_warned:
            self.size_warned = True
            self.log.warn(
                "fluent_forward {peer}: option size={size!r} but the message holds {entries} entries "
                "(tag {tag}); size is a hint, every event is kept "
                "(further mismatches on this connection are only counted)",
                peer=self.peer,
                size=size,
                entries=entries,
                tag=tag,
            )

    # -- big messages, decoded in parts off the reactor -----------------------------------

    def start_offload(self, message: wire.DeferredMessage) -> None:
        self.hold_reading(OFFLOAD_HOLD)
        if self.busy is None:
            self.busy = defer.Deferred()
            self.pending.add(self.busy)
        offload = self.offload = Offload()
        offload.tag = message.tag or ""  # for the log if it is abandoned before its first part
        self.source.offloaded_messages += 1
        steps = message.steps(self.source.options["offload_part_bytes"])
        offload.run = IteratorRun(self.source.offload_pool, steps, lambda part: self.take_part(offload, part))
        offload.run.start().addCallbacks(lambda _: self.offload_done(offload), lambda f: self.offload_failed(offload, f))

    def take_part(self, offload: Offload, part: wire.EventMessage) -> defer.Deferred | None:
        if self.closing:  # aborted (a store failed): the client resends what was not acked
            self.abandon_offload()
            return None
        index = offload.parts
        offload.parts += 1
        if index == 0:
            offload.tag, offload.chunk, offload.size = part.tag, part.chunk, part.options.get("size")
        offload.entries += len(part.events) + part.invalid
        offload.invalid += part.invalid
        if part.events:
            offload.unacked += 1
            self.source.offloaded_parts += 1
            # A part kept packed (the native extension) is stored as its entries, as a whole message is.
            packed = None if part.packed is None else (FORWARD_ENTRIES, *part.packed)
            batch = Batch(part.tag, part.events, packed=packed)
            self.submit(batch, lambda: self.part_durable(offload), part_key(part.chunk, index))
        return self.wait_for_room(offload)

    def has_room(self, offload: Offload) -> bool:
        # At most two parts wait for the disk while a third is built, and none is built
        # while the router pushes back: memory stays a few parts, whatever the message.
        return offload.unacked <= 1 and not self.source.paused

    def wait_for_room(self, offload: Offload) -> defer.Deferred | None:
        if self.has_room(offload):
            return None
        offload.room = defer.Deferred()
        return offload.room

    def check_room(self) -> None:
        """Let a waiting message go on once it has room (a part got durable, the router resumed)."""
        offload = self.offload
        if offload is not None and offload.room is not None and self.has_room(offload):
            room, offload.room = offload.room, None
            room.callback(None)

    def part_durable(self, offload: Offload) -> None:
        offload.unacked -= 1
        if offload.finished:
            if not offload.unacked:
                self.ack(offload.chunk)
        else:
            self.check_room()

    def offload_done(self, offload: Offload) -> None:
        self.offload = None
        offload.finished = True
        self.note_invalid(offload.invalid, offload.tag)
        if offload.size is not None:
            self.check_size(offload.size, offload.entries, offload.tag)
        if not offload.unacked:
            self.ack(offload.chunk)  # nothing was stored, or every part is durable already
        self.release_reading(OFFLOAD_HOLD)
        # A connection that is finishing takes no more input, as for frames of one read.
        while self.waiting and self.offload is None and not (self.closing or self.finishing):
            self.handle(self.waiting.popleft())
        if self.offload is None:
            self.offload_idle()

    def offload_failed(self, offload: Offload, failure: Any) -> None:
        self.offload = None
        self.waiting.clear()
        if failure.check(wire.ForwardDecodeError):
            if failure.check(wire.EntryBombError) and not (self.closing or self.finishing):
                self.source.bombs_refused += 1
            self.reject(failure.value.reason)  # a no-op if the connection is already closing
        elif not self.closing:
            self.log.failure(
                "fluent_forward {peer}: decoding a message in parts failed; closing the connection",
                failure,
                peer=self.peer,
            )
            self.closing = True
            self.cancel_timers()
            self.transport.abortConnection()
            self.fire_closed()
        self.offload_idle()

    def offload_idle(self) -> None:
        """No offloaded work is left: ``busy`` fires once what it submitted is durable."""
        busy, self.busy = self.busy, None
        if busy is None:
            return
        others = [d for d in self.pending if d is not busy]

        def fire(_: Any) -> None:
            self.pending.discard(busy)
            busy.callback(None)

        defer.DeferredList(others, consumeErrors=True).addCallback(fire)

    def abandon_offload(self) -> None:
        """Drop the message being worked on (after the step being built) and what waits behind it."""
        offload, self.offload = self.offload, None
        if offload is not None and offload.run is not None:
            offload.run.cancel()
        self.waiting.clear()
        self.offload_idle()

    def finish(self, why: str, level: str, text: str, **fields: Any) -> None:
        """A connection that takes no more input leaves the message being worked on (a
        stop is then not held up by it): only what is already durable gets its reply."""
        if self.offload is not None and not (self.closing or self.finishing):
            self.log.warn(
                "fluent_forward {peer}: closing ({why}) while a message of tag {tag} was decoded in parts: "
                "abandoned after {parts} part(s), not acked (the client resends it)",
                peer=self.peer,
                why=why,
                tag=self.offload.tag or "?",
                parts=self.offload.parts,
            )
            self.abandon_offload()
        super().finish(why, level, text, **fields)

    def connectionLost(self, reason: Any = None) -> None:
        super().connectionLost(reason)
        self.abandon_offload()


class BombCountingDecoder(wire.ForwardDecoder):
    """The forward decoder, counting the messages it refuses as bombs in ``source.bombs_refused``."""

    def __init__(self, source: "FluentForwardSource", **options: Any) -> None:
        super().__init__(**options)
        self.source = source

    def feed(self, data: bytes) -> list[Any]:
        try:
            return super().feed(data)
        except wire.EntryBombError:
            self.source.bombs_refused += 1
            raise


class HeartbeatProtocol(protocol.DatagramProtocol):
    """in_forward's UDP heartbeat: every datagram is answered with a single ``0x00``."""

    noisy = False

    def __init__(self, source: "FluentForwardSource") -> None:
        self.source = source

    def datagramReceived(self, data: bytes, addr: Any) -> None:
        self.source.heartbeats += 1
        try:
            self.transport.write(HEARTBEAT_REPLY, addr)
        except (OSError, error.MessageLengthError):
            pass  # the sender is gone or unreachable: nothing to answer


def check_users(value: list[Any]) -> None:
    seen: set[str] = set()
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f"item {i} must be a table {{username = …, password = …}}")
        unknown = sorted(set(item) - {"username", "password"})
        if unknown:
            raise ValueError(f"item {i}: unknown key(s) {', '.join(unknown)} (allowed: password, username)")
        for key in ("username", "password"):
            if key not in item:
                raise ValueError(f"item {i}: {key} is missing")
            if not isinstance(item[key], str):
                raise ValueError(f"item {i}: {key} must be a string")
        if not item["username"]:
            raise ValueError(f"item {i}: username must not be empty")
        if item["username"] in seen:
            raise ValueError(f"item {i}: username {item['username']!r} is listed twice")
        seen.add(item["username"])


@registry.source("fluent_forward")
class FluentForwardSource(StreamSource):
    protocol_class = ForwardProtocol
    COUNTERS = {"invalid_events": "events skipped (bad time, record not a map)", **StreamSource.COUNTERS, "auth_failures": "failed handshakes (also counted in decode_errors)", "size_mismatches": "messages whose size option differs from their entry count", "heartbeats": "UDP heartbeats answered", "offloaded_messages": "messages decoded in worker threads", "offloaded_parts": "parts of offloaded messages stored", "bombs_refused": "messages refused for their invalid entries (also counted in decode_errors)"}  # noqa: E501
    OPTIONS = {
        **StreamSource.OPTIONS,
        "listen": listen_option("tcp:24224"),
        "max_message_bytes": Option(int, 64 << 20, "largest forward message accepted; a larger one closes the connection", positive),
        "max_decompressed_bytes": Option(int, 256 << 20, "largest inflated CompressedPackedForward payload; a larger one closes the connection", positive),
        "offload_bytes": Option(
            int,
            1 << 20,
            "a message whose entries pass this size is inflated and decoded in worker threads, in parts, while "
            "its connection waits (0 = decode every message on the reactor thread)",
            non_negative,
        ),
        "offload_part_bytes": Option(
            int, 8 << 20, "entries per part of an offloaded message; each part is stored as one batch", positive
        ),
        "offload_threads": Option(int, 2, "worker threads decoding big messages, shared by all connections of the source", positive),
        "shared_key": Option(str, "", "enables the Fluentd v1 handshake (HELO/PING/PONG): every connection must prove it knows this key before "
            "anything it sends is accepted (empty = off)"),
        "self_hostname": Option(str, "", "the name this source answers the handshake with (empty = the host's name); it must differ from the "
            "client's own name (clients refuse \"same hostname\")"),
        "users": Option(list, [], "`{ username = \"…\", password = \"…\" }` tables; when non-empty the handshake also checks a user (needs "
            "`shared_key`)", check_users),
        "verify_client": Option(
            bool,
            False,
            'in_forward\'s name for `ssl_client_authentication = "required"`: `true` is the same (refused together '
            'with `ssl_client_authentication = "optional"`); `false` leaves `ssl_client_authentication` in charge',
        ),
        "udp_heartbeat": Option(bool, True, "also listen on UDP on the same interface and port as a `tcp:`/`ssl:` listener and answer every datagram "
            "with one `0x00` byte (in_forward's heartbeat)"),
    }

    CLIENT_AUTH_ALIASES = {"verify_client": {True: "required"}}

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[str]:
        problems = []
        if options["users"] and not options["shared_key"]:
            problems.append("users: user authentication is part of the handshake; set shared_key too")
        problems.extend(super().check_options(options))  # TLS: ssl_client_authentication / verify_client, ca_file
        if options["offload_part_bytes"] > MAX_PART_BYTES:
            problems.append(
                f"offload_part_bytes: at most {MAX_PART_BYTES} (a part is one spool record), "
                f"got {options['offload_part_bytes']}"
            )
        return problems

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.options
        self.security: handshake.Security | None = None
        if options.get("shared_key"):
            self.security = handshake.Security(
                shared_key=options["shared_key"],
                self_hostname=options.get("self_hostname") or socket.gethostname(),
                users={user["username"]: user["password"] for user in options.get("users", [])},
            )
        self.invalid_events = 0
        self.auth_failures = 0  # failed handshakes (also counted in decode_errors)
        self.size_mismatches = 0
        self.heartbeats = 0
        self.offloaded_messages = 0
        self.offloaded_parts = 0
        self.bombs_refused = 0
        self.udp_port: Any = None
        self.offload_pool = OffloadPool(self.reactor, options.get("offload_threads", 2), f"logrouter-{self.name}-decode")

    def port_opened(self, port: Any) -> None:
        address = port.getHost()
        if not self.options.get("udp_heartbeat", True):
            return
        if not isinstance(address, (IPv4Address, IPv6Address)) or address.type != "TCP":
            return  # unix sockets and the like have no UDP twin
        if getattr(self.context, "worker", 0) != 0:
            return  # with several workers, worker 0 answers the port's heartbeats
        try:
            self.udp_port = self.reactor.listenUDP(address.port, HeartbeatProtocol(self), interface=address.host)
        except error.CannotListenError:
            port.stopListening()
            raise
        self.log.info(
            "{type} source {name} answering UDP heartbeats on {host} port {port}",
            type=self.TYPE,
            name=self.name,
            host=address.host,
            port=address.port,
        )

    def stop(self) -> defer.Deferred:
        """The stream source's stop, done only once the heartbeat's UDP port is closed too:
        a reload starts the changed source again on the same port right after (a passed
        TCP port is released at once, so nothing else would wait for it)."""
        udp_port, self.udp_port = self.udp_port, None
        released = defer.maybeDeferred(udp_port.stopListening) if udp_port is not None else defer.succeed(None)
        d = super().stop()  # waits for offloaded messages too (they are in ``pending``)
        d.addBoth(lambda result: released.addBoth(lambda _: result))
        return d.addBoth(lambda result: self.offload_pool.stop().addCallback(lambda _: result))

    def resume_reading(self) -> None:
        super().resume_reading()
        for connection in list(self.connections):
            connection.check_room()

"""The ``fluent_forward`` source: Fluentd's forward protocol (in_forward's server side).

Each decoded message becomes one batch. When the client asked for an ack (option
``chunk``), ``{"ack": chunk}`` is sent with the chunk's bytes exactly as received, and
only after the batch is durable in the spool.

With ``shared_key`` set, every connection starts with the v1 handshake: the server sends
HELO, checks the client's PING (shared key digest, and the user digest when ``users``
are configured) and answers PONG; nothing the client sends is accepted before that. A
failed PING gets in_forward's failure PONG and the connection is closed after it.

``verify_client`` asks TLS clients for a certificate signed by ``ca_file``. When the
listener is a TCP/TLS port, a UDP socket on the same interface and port answers
heartbeat datagrams with one ``0x00`` byte, as in_forward does.

The ``size`` option is a hint: a message whose entry count differs is stored whole, the
mismatch is counted (``size_mismatches``) and logged once per connection.
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet import defer, error, protocol
from twisted.internet.address import IPv4Address, IPv6Address

from logrouter import registry, tls
from logrouter.batch import Batch
from logrouter.config.endpoints import listen_option
from logrouter.config.options import Option, positive
from logrouter.sources.stream import StreamProtocol, StreamSource
from logrouter.wire import fluent_forward as wire
from logrouter.wire import fluent_handshake as handshake

HEARTBEAT_REPLY = b"\x00"


class ForwardProtocol(StreamProtocol):
    handshake: handshake.ServerHandshake | None = None
    client_hostname = ""  # from the PING, once the handshake succeeded
    username = ""
    size_warned = False

    def make_decoder(self) -> wire.ForwardDecoder:
        return wire.ForwardDecoder(
            max_message_bytes=self.source.options["max_message_bytes"],
            max_decompressed_bytes=self.source.options["max_decompressed_bytes"],
            # A handshake session is msgpack throughout (in_forward, section 4).
            allow_json=self.source.security is None,
        )

    def connection_ready(self) -> None:
        if self.source.security is not None:
            self.handshake = handshake.ServerHandshake(self.source.security)
            self.send(self.handshake.helo())

    def dataReceived(self, data: bytes) -> None:
        if self.handshake is not None:
            if self.closing:
                return
            self.resetTimeout()
            result = self.handshake.feed(data)
            if result is None:
                return  # the PING is not complete yet
            self.send(result.pong)
            if not result.ok:
                self.source.auth_failures += 1
                self.reject(f"handshake failed: {result.describe()}")  # closes after the PONG is written
                return
            self.handshake = None  # established (not logged: one per out_forward heartbeat)
            self.client_hostname = result.client_hostname
            self.username = result.username
            data = result.rest
            if not data:
                return
        super().dataReceived(data)

    def handle(self, message: Any) -> None:
        if isinstance(message, wire.Heartbeat):
            return
        if message.invalid:
            self.source.invalid_events += message.invalid
            self.log.warn(
                "fluent_forward {peer}: skipped {count} invalid event(s) in tag {tag}",
                peer=self.peer,
                count=message.invalid,
                tag=message.tag,
            )
        size = message.options.get("size")
        if size is not None:
            self.check_size(size, message)
        chunk = message.chunk
        on_durable = None if chunk is None else (lambda: self.send(wire.encode_ack(chunk, self.decoder.json_mode)))
        if not message.events:
            # Nothing to store (all invalid, or empty): fluentd still acks such a chunk.
            if on_durable is not None:
                on_durable()
            return
        self.submit(Batch(message.tag, message.events), on_durable, chunk)

    def check_size(self, size: Any, message: wire.EventMessage) -> None:
        """``size`` is a hint (in_forward only passes it on): a mismatch is counted, never dropped."""
        entries = len(message.events) + message.invalid
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
                tag=message.tag,
            )


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
    OPTIONS = {
        **StreamSource.OPTIONS,
        "listen": listen_option("tcp:24224"),
        "max_message_bytes": Option(int, 64 << 20, "largest forward message accepted", positive),
        "max_decompressed_bytes": Option(int, 256 << 20, "largest inflated CompressedPackedForward payload", positive),
        "shared_key": Option(str, "", "shared key of the v1 handshake; set = every connection must pass it"),
        "self_hostname": Option(str, "", "hostname this source answers the handshake with (empty = the host's name)"),
        "users": Option(list, [], "{username, password} tables; non-empty = the handshake also checks a user", check_users),
        "verify_client": Option(bool, False, "ssl: listeners only: require a client certificate signed by ca_file"),
        "ca_file": Option(str, "", "PEM file of the CA(s) client certificates must be signed by", tls.check_ca_file),
        "udp_heartbeat": Option(bool, True, "answer UDP heartbeats on the listener's interface and port"),
    }

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[str]:
        problems = []
        if options["users"] and not options["shared_key"]:
            problems.append("users: user authentication is part of the handshake; set shared_key too")
        verify, ca_file, listen = options["verify_client"], options["ca_file"], options["listen"]
        if verify:
            if tls.endpoint_kind(listen) != "ssl":
                problems.append(f"verify_client: needs an ssl: listen endpoint, got {listen!r}")
            elif not ca_file:
                problems.append("ca_file: required when verify_client = true")
            else:
                try:
                    tls.check_server_endpoint(listen, "required", ca_file)
                except ValueError as e:
                    problems.append(f"listen: {e}")
        elif ca_file:
            problems.append("ca_file: only used with verify_client = true; set verify_client = true or remove ca_file")
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
        self.udp_port: Any = None

    def endpoint(self) -> Any:
        if self.options.get("verify_client"):
            return tls.server_endpoint(self.reactor, self.options["listen"], "required", self.options["ca_file"])
        return super().endpoint()

    def port_opened(self, port: Any) -> None:
        address = port.getHost()
        if not self.options.get("udp_heartbeat", True):
            return
        if not isinstance(address, (IPv4Address, IPv6Address)) or address.type != "TCP":
            return  # unix sockets and the like have no UDP twin
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
        udp_port, self.udp_port = self.udp_port, None
        if udp_port is not None:
            udp_port.stopListening()
        return super().stop()

"""Heartbeats of a ``fluent_forward`` sink: probing each server, as out_forward does.

``HeartbeatProber.probe`` runs once per ``heartbeat_interval_secs``: a probe still
unanswered from the last round counts as missed, then every server gets a new one.
``tcp`` connects (and completes the TLS handshake with ``tls``) and closes; ``udp``
sends ``0x00`` from one IPv4 socket and expects ``0x00`` back from the server's address
(names resolved each time). The prober only says, per server, "answered" or "missed";
what that means (down after ``heartbeat_misses``, live again after ``recover_wait_secs``)
is the sink's policy, reported through ``HeartbeatOwner``.
"""

from __future__ import annotations

from typing import Any, Protocol

from twisted.internet import error, protocol
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.interfaces import IHandshakeListener
from twisted.python.failure import Failure
from zope.interface import implementer

from logrouter import tls
from logrouter.sinks.forward_servers import Server
from logrouter.wire import fluent_client as wire


class HeartbeatOwner(Protocol):
    """What the prober reports to (the sink)."""

    stopped: bool

    def heartbeat_answered(self, server: Server) -> None: ...

    def heartbeat_missed(self, server: Server) -> None: ...


@implementer(IHandshakeListener)
class _TcpHeartbeat(protocol.Protocol):
    def __init__(self, probe: "TcpHeartbeatProbe") -> None:
        self.probe = probe

    def connectionMade(self) -> None:
        self.probe.transport = self.transport
        if not self.probe.tls:
            self.probe.answered()

    def handshakeCompleted(self) -> None:
        self.probe.answered()

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.probe.unanswered()


class TcpHeartbeatProbe(protocol.ClientFactory):
    """One TCP heartbeat: a connect (and TLS handshake, with TLS), closed at once.

    Answered once connected (handshake done); missed on a failed connect, a close before
    that, or when the next heartbeat is due first (``give_up``).
    """

    noisy = False

    def __init__(self, owner: HeartbeatOwner, server: Server, tls_on: bool) -> None:
        self.owner = owner
        self.server = server
        self.tls = tls_on
        self.done = False
        self.connector: Any = None
        self.transport: Any = None

    def buildProtocol(self, addr: Any) -> _TcpHeartbeat:
        return _TcpHeartbeat(self)

    def answered(self) -> None:
        if not self.done:
            self.done = True
            self.transport.loseConnection()
            self.owner.heartbeat_answered(self.server)

    def unanswered(self) -> None:
        if not self.done:
            self.done = True
            self.owner.heartbeat_missed(self.server)

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        self.unanswered()

    def give_up(self) -> None:
        if self.done:
            return
        if self.transport is not None:
            self.transport.abortConnection()
        elif self.connector is not None:
            try:
                self.connector.stopConnecting()
            except error.NotConnectingError:
                pass
        self.unanswered()


class UdpHeartbeat(protocol.DatagramProtocol):
    noisy = False

    def __init__(self, prober: "HeartbeatProber") -> None:
        self.prober = prober

    def datagramReceived(self, data: bytes, addr: Any) -> None:
        if data == wire.HEARTBEAT_REPLY:
            self.prober.udp_reply(addr)


class HeartbeatProber:
    """Probes ``servers`` once per round (``probe``); ``kind`` is ``tcp`` or ``udp``."""

    def __init__(
        self, owner: HeartbeatOwner, servers: list[Server], reactor: Any, kind: str, interval: float, use_tls: bool
    ) -> None:
        self.owner = owner
        self.servers = servers
        self.reactor = reactor
        self.kind = kind
        self.interval = interval
        self.use_tls = use_tls
        self.udp_port: Any = None

    def open(self) -> None:
        if self.kind == "udp":
            self.udp_port = self.reactor.listenUDP(0, UdpHeartbeat(self))

    def close(self) -> None:
        if self.udp_port is not None:
            port, self.udp_port = self.udp_port, None
            port.stopListening()

    def probe(self) -> None:
        for server in self.servers:
            probe = server.probe
            if probe is not None:
                server.probe = None
                probe.give_up()  # no answer within one interval: missed
            if server.heartbeat_pending:  # UDP
                server.heartbeat_pending = False
                self.owner.heartbeat_missed(server)
            if self.owner.stopped:
                return
            if self.kind == "tcp":
                probe = server.probe = TcpHeartbeatProbe(self.owner, server, self.use_tls)
                if self.use_tls:
                    probe.connector = tls.connect(
                        self.reactor, server.host, server.port, probe, server.tls_options, self.interval
                    )
                else:
                    probe.connector = self.reactor.connectTCP(server.host, server.port, probe, timeout=self.interval)
            else:
                server.heartbeat_pending = True
                self._send_udp(server)

    def _send_udp(self, server: Server) -> None:
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

    def udp_reply(self, address: Any) -> None:
        host, port = address[0], address[1]
        for server in self.servers:
            if server.udp_address == (host, port) and server.heartbeat_pending:
                server.heartbeat_pending = False
                self.owner.heartbeat_answered(server)

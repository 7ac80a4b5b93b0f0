"""The limits a stream source puts on its connections, and the peer names they are counted by.

It owns ``LIMIT_OPTIONS`` (the caps on connections in all and per peer address, the idle
timeout, the deadline of a frame that has begun to arrive and the receive rate that extends
it), the peer's name for log lines and its normalised IP address (also the workers' key
for choosing a worker), admitting and refusing connections against the caps
(``ConnectionCaps``, mixed into ``StreamSource``), and the idle timeout and frame deadline
of one connection (``ConnectionTimeouts``, mixed into ``StreamProtocol``).
"""

from __future__ import annotations

import ipaddress
from typing import Any, Callable

from logrouter.config.options import Option, non_negative, positive

LIMIT_OPTIONS: dict[str, Option] = {
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
}

# Why a connection was refused (the reason label of logrouter_source_connections_refused_total).
REFUSAL_REASONS = ("max_connections", "max_connections_per_peer")


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


class ConnectionCaps:
    """The source's side: admit a connection or say which cap refuses it, and forget it
    once it is gone. Mixed into ``StreamSource``, which holds the state."""

    options: dict[str, Any]
    connections: set[Any]
    per_peer: dict[str, int]
    refused: dict[str, int]
    connections_total: int

    def add_connection(self, connection: Any) -> tuple[str, int] | None:
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

    def remove_connection(self, connection: Any) -> None:
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


class ConnectionTimeouts:
    """The connection's side: the idle timeout (through ``TimeoutMixin``) and the clock of
    the frame being received. Mixed into ``StreamProtocol``, which calls ``track_frame``
    after each read and ``frame_resumed`` when reading resumes."""

    source: Any
    closing: bool
    finishing: bool
    holds: set[str]
    held_since: float
    frame_started: float | None
    frame_bytes: int
    frame_call: Any
    finish: Callable[..., None]
    unprocessed_bytes: Callable[[], int]

    def timeoutConnection(self) -> None:
        self.finish(
            "idle_timeout",
            "info",
            "{protocol} {peer}: idle for {secs}s, closing",
            secs=self.source.options["idle_timeout_secs"],
        )

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

    def frame_resumed(self) -> None:
        """Reading resumed after ``held_since``: move the frame's clock on by the time held."""
        if self.frame_started is not None and not self.finishing:
            # The client could not send while we held it: that time is not its to answer for.
            now = self.source.reactor.seconds()
            self.frame_started += now - max(self.held_since, self.frame_started)
            if self.frame_call is None:
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

"""The ``servers`` of a ``fluent_forward`` sink: the option's check, each server's state,
and which servers get the next message.

``Server`` is one configured server: address, weight, standby or not, down or live (and
why, since when), its connection, its heartbeat state and its counters. ``in_use`` says
which servers are in use (the live primaries, or the live standbys while every primary
is down); ``choose`` spreads messages over them by smooth weighted round-robin.
"""

from __future__ import annotations

from typing import Any

from logrouter.config.options import Problems
from logrouter.sinks.forwarding import host_label

DEFAULT_PORT = 24224
DEFAULT_WEIGHT = 60  # out_forward's default
SERVER_KEYS = ("host", "port", "weight", "standby")


# -- the option --------------------------------------------------------------------------


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


def check_servers(value: list[Any]) -> None:
    problems = server_problems(value)
    if problems:
        raise Problems(problems)


# -- the servers -------------------------------------------------------------------------


class Server:
    """One configured server: its address and weight, whether it is down, its connection."""

    def __init__(self, host: str, port: int, weight: int, standby: bool) -> None:
        self.host = host
        self.port = port
        self.weight = weight
        self.standby = standby
        self.label = host_label(host, port)
        self.down = False
        self.down_at = 0.0
        self.down_reason = ""
        self.connection: Any = None  # its ForwardClient, while one is open
        self.current = 0  # smooth weighted round-robin state
        self.announced = False  # "connected" logged since it last went down
        self.tls_options: Any = None
        # heartbeats
        self.missed = 0
        self.heartbeat_pending = False  # a UDP heartbeat is out and unanswered
        self.probe: Any = None  # the TCP heartbeat under way
        self.udp_address: tuple[str, int] | None = None
        # counters
        self.chunks_sent = 0
        self.chunks_acked = 0
        self.downs = 0

    @classmethod
    def from_option(cls, item: dict[str, Any]) -> "Server":
        return cls(item["host"], item.get("port", DEFAULT_PORT), item.get("weight", DEFAULT_WEIGHT), item.get("standby", False))

    def __repr__(self) -> str:
        return f"Server({self.label}{', standby' if self.standby else ''}{', down' if self.down else ''})"


def in_use(servers: list[Server], now: float, retry_down_after: float | None) -> list[Server]:
    """The servers to send to: live primaries, or live standbys when no primary is.

    Without heartbeats (``retry_down_after`` set) a down server is trusted again once it
    has been down that long, and tried.
    """
    live = []
    for server in servers:
        if server.down and retry_down_after is not None and now - server.down_at >= retry_down_after:
            server.down = False
        if not server.down:
            live.append(server)
    primaries = [s for s in live if not s.standby]
    return primaries or live


def choose(servers: list[Server]) -> Server:
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

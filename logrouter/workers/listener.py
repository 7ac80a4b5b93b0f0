"""A shared source's listening socket in the supervisor: bound at start, listening only
once the workers can take connections, emptied before it closes.

The socket is bound early, so a taken or forbidden address fails the start before any
worker runs, but ``listen()`` is called only by ``start()``, once every worker reported
that its router runs: until then a client's connect is refused (the kernel answers a
bound socket that does not listen with a reset), instead of completing into a backlog
nobody reads and that a stop would reset after the client counted its events as sent.

At a graceful stop ``take_backlog()`` accepts what the kernel already completed and
hands it to the workers before the socket closes: closing a listening socket resets
every connection still in its backlog, with whatever the client had already written.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from twisted.internet import endpoints
from twisted.internet.interfaces import IReadDescriptor
from twisted.logger import Logger
from zope.interface import implementer

from logrouter.config.endpoints import listen_address

ACCEPTS_PER_TURN = 64
BACKLOG = 1024
# At a stop: the backlog, and what completes while it is being emptied (bounded).
ACCEPTS_AT_STOP = BACKLOG + ACCEPTS_PER_TURN


@implementer(IReadDescriptor)
class Listener:
    """Accepts for one shared source and hands each connection to
    ``supervisor.accepted(listener, peer_host, connection)``, which owns it from then on."""

    log = Logger(namespace="logrouter.source")

    def __init__(self, supervisor: Any, name: str, source_type: str, listen: str) -> None:
        self.supervisor = supervisor
        self.name = name
        self.type = source_type
        self.listen = listen
        self.sock: socket.socket | None = None
        self.address: tuple[str, int] = ("", 0)
        self.listening = False
        self.passed = 0
        self.dropped = 0

    def bind(self) -> tuple[str, int]:
        """Bind (not listen yet); the address bound, its port chosen if the config says 0."""
        _, port, interface = listen_address(self.listen)  # type: ignore[misc]
        kind = endpoints._parseServer(self.listen, None)[0]
        family = socket.AF_INET6 if kind == "TCP6" or ":" in interface else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((interface or ("::" if family == socket.AF_INET6 else ""), port))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sock = sock
        self.address = sock.getsockname()[:2]
        return self.address

    def start(self) -> None:
        """Listen and accept. Raises ``OSError`` if the address was taken since the bind
        (only by a socket that also set ``SO_REUSEADDR`` and did not listen yet)."""
        if self.sock is None or self.listening:
            return
        self.sock.listen(BACKLOG)
        self.listening = True
        self.supervisor.reactor.addReader(self)

    def take_backlog(self) -> None:
        """Accept every connection the kernel completed (at a stop, before ``close``)."""
        if self.listening:
            self._accept(ACCEPTS_AT_STOP)

    def close(self) -> None:
        if self.sock is not None:
            if self.listening:
                self.supervisor.reactor.removeReader(self)
            self.sock.close()
            self.sock = None
            self.listening = False

    # IReadDescriptor
    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def doRead(self) -> None:
        self._accept(ACCEPTS_PER_TURN)

    def _accept(self, limit: int) -> None:
        for _ in range(limit):
            if self.sock is None:
                return
            try:
                connection, address = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.log.warn("source {name}: cannot accept ({error})", name=self.name, error=e.strerror)
                return
            self.supervisor.accepted(self, address[0], connection)

    def connectionLost(self, reason: Any) -> None:
        self.close()

    def logPrefix(self) -> str:
        return f"listener-{self.name}"

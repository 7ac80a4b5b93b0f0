"""The Unix socket between the supervisor and one worker, and the connections it carries.

A ``SOCK_SEQPACKET`` socket pair: every message is one JSON object, sent whole or not at
all, and may carry file descriptors (``SCM_RIGHTS``). The supervisor sends
``{"op": "connection", "source": name}`` with the accepted socket, and requests
(``metrics``, ``health``, ``reload``) that the worker answers with the same ``id``; the
worker sends ``{"op": "ready"}`` once its router runs and, after each turn that read
connections, ``{"op": "taken", "count": n}``: how many connection messages it has read
since it started (what bounds those in flight to it: ``passing.py``). The supervisor's
``{"op": "stop"}`` comes behind the connections passed before it, so a worker adopts them all before it
stops (a worker stopping by itself sends ``{"op": "stopping"}`` and adopts what is waiting).

Both ends are non-blocking and read on the reactor a bounded number of messages per
turn; a message that does not fit in the socket's buffer right now is not sent (a passed
connection is then closed: its client reconnects).
"""

from __future__ import annotations

import errno
import json
import os
import socket
from typing import Any, Callable

from twisted.internet import defer
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import IReadDescriptor
from twisted.logger import Logger
from zope.interface import implementer

MAX_MESSAGE = 1 << 22  # the largest reply (a worker's metrics page)
BUFFER_BYTES = 1 << 23
MAX_FDS = 8
MESSAGES_PER_TURN = 64
MESSAGES_AT_STOP = 1 << 16  # more than the channel's buffer holds connection messages


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """(supervisor end, worker end), the supervisor's non-blocking; the worker end is
    inherited by the worker process and made non-blocking there."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in (ours, theirs):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
    ours.setblocking(False)
    return ours, theirs


@implementer(IReadDescriptor)
class Channel:
    """One end of the channel on the reactor: ``on_message(message, fds)`` for each message
    (the callee owns the fds), ``after_read()`` after each turn that handled any,
    ``on_closed()`` once the other end is gone."""

    log = Logger(namespace="logrouter.workers")

    def __init__(self, reactor: Any, sock: socket.socket, on_message: Callable[[dict, list[int]], None],
                 on_closed: Callable[[], None], after_read: Callable[[], None] | None = None) -> None:
        self.reactor = reactor
        self.sock = sock
        sock.setblocking(False)
        self.on_message = on_message
        self.on_closed = on_closed
        self.after_read = after_read
        self.closed = False
        reactor.addReader(self)

    def send(self, message: dict, fds: list[int] | tuple[int, ...] = ()) -> bool:
        """Send ``message`` (with ``fds``) now, or say it could not be."""
        if self.closed:
            return False
        data = json.dumps(message, separators=(",", ":")).encode()
        try:
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:
            self.log.warn("worker channel: cannot send ({error})", error=e)
            if e.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.close()  # the other end is gone
            return False
        return True

    # IReadDescriptor
    def fileno(self) -> int:
        return -1 if self.closed else self.sock.fileno()

    def doRead(self) -> None:
        self._read(MESSAGES_PER_TURN)

    def drain(self, limit: int = MESSAGES_AT_STOP) -> None:
        """Handle every message already waiting (up to ``limit``), now: a worker that
        stops adopts first the connections passed to it before the stop."""
        if not self.closed:
            self._read(limit)

    def _read(self, limit: int) -> None:
        if self._read_messages(limit) and self.after_read is not None and not self.closed:
            self.after_read()

    def _read_messages(self, limit: int) -> int:
        """Handle up to ``limit`` messages; how many were read."""
        read = 0
        while read < limit and not self.closed:
            try:
                data, fds, flags, _ = socket.recv_fds(self.sock, MAX_MESSAGE, MAX_FDS)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self.log.warn("worker channel: cannot read ({error})", error=e)
                self.close()
                break
            if not data and not fds:
                self.close()
                break
            read += 1
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                _close_all(fds)
                self.log.warn("worker channel: a message was cut short; dropped")
                continue
            try:
                message = json.loads(data)
            except ValueError:
                message = None
            if type(message) is not dict:
                _close_all(fds)
                self.log.warn("worker channel: a message is not a JSON object; dropped")
                continue
            try:
                self.on_message(message, fds)  # from here on the fds are the callee's
            except Exception:
                self.log.failure("worker channel: handling {op!r} failed", op=message.get("op"))
        return read

    def connectionLost(self, reason: Any) -> None:
        self.close()

    def logPrefix(self) -> str:
        return "worker-channel"

    def close(self) -> None:
        if self.closed:
            return
        self.reactor.removeReader(self)
        self.closed = True
        self.sock.close()
        self.on_closed()


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class PassedPort:
    """What a source holds instead of a listening port when the supervisor accepts for it."""

    def __init__(self, registry: "PassedConnections", name: str, address: Any) -> None:
        self.registry = registry
        self.name = name
        self.address = address

    def getHost(self) -> Any:
        return self.address

    def stopListening(self) -> defer.Deferred:
        self.registry.release(self.name)
        return defer.succeed(None)


class PassedConnections:
    """The worker's side: which sources take passed connections, and their factories.

    ``addresses`` maps each shared source to the ``(host, port)`` the supervisor listens
    on. A source that is not taking (not started yet, stopped, or stopping) gets no
    connection: it is closed, and its client reconnects.
    """

    log = Logger(namespace="logrouter.workers")

    def __init__(self, reactor: Any, addresses: dict[str, tuple[str, int]]) -> None:
        self.reactor = reactor
        self.addresses = addresses
        self.factories: dict[str, Any] = {}
        self.adopted = 0
        self.refused = 0

    def take(self, name: str, make_factory: Callable[[], Any]) -> PassedPort | None:
        if name not in self.addresses:
            return None
        host, port = self.addresses[name]
        self.factories[name] = make_factory()
        address = (IPv6Address if ":" in host else IPv4Address)("TCP", host, port)
        return PassedPort(self, name, address)

    def release(self, name: str) -> None:
        self.factories.pop(name, None)

    def adopt(self, name: str, fds: list[int]) -> None:
        factory = self.factories.get(name)
        for fd in fds:
            try:
                if factory is None:
                    self.refused += 1
                    continue
                probe = socket.socket(fileno=fd)
                family = probe.family
                probe.detach()  # the fd stays open: closed below
                self.reactor.adoptStreamConnection(fd, family, factory)
                self.adopted += 1
            except OSError as e:
                self.refused += 1
                self.log.warn("source {name}: a passed connection could not be taken ({error})", name=name, error=e)
            finally:
                os.close(fd)  # adoptStreamConnection made its own copy

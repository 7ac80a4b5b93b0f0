"""A TCP relay on loopback that can lose a server's replies, for tests of lost acks.

A client connects to ``AckGate.port``; each connection is relayed to ``127.0.0.1:target``
(set and changed by the test: a restarted server listens on another port). While
``hold()`` is on, what the server writes back (its acks) is read and thrown away: the
server has stored and acknowledged, the client never hears it, which is what a server
killed just after writing its acks looks like to the client. ``cut()`` closes every
relayed connection; ``release()`` lets replies through again.

One thread accepts, two per connection pump; every blocking call has a timeout and every
loop ends when the gate closes or a side does, so ``close()`` leaves no thread behind.
"""

from __future__ import annotations

import select
import socket
import threading

POLL = 0.2


class AckGate:
    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL)
        self.port: int = self._listener.getsockname()[1]
        self.target: int | None = None
        self.held = threading.Event()
        self.dropped_bytes = 0
        self.dropped = b""  # what was thrown away since the last hold(), its first 64 KiB
        self.connections = 0
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._start(self._accept)

    def _start(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def hold(self) -> None:
        self.dropped = b""
        self.held.set()

    def release(self) -> None:
        self.held.clear()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            target = self.target
            try:
                if target is None:
                    raise OSError("no server to relay to")
                server = socket.create_connection(("127.0.0.1", target), timeout=5)
            except OSError:
                client.close()  # the server is down: the client retries, as against a dead server
                continue
            self.connections += 1
            for sock in (client, server):
                sock.settimeout(None)  # a slow reader (backpressure) must not break the relay; cut() ends a send
            with self._lock:
                self._sockets |= {client, server}
            self._start(self._pump, client, server, False)
            self._start(self._pump, server, client, True)

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while not self._closed.is_set():
                ready, _, _ = select.select([source], [], [], POLL)
                if not ready:
                    continue
                data = source.recv(65536)
                if not data:
                    break
                if replies and self.held.is_set():
                    self.dropped_bytes += len(data)
                    if len(self.dropped) < 65536:
                        self.dropped += data
                    continue
                sink.sendall(data)
        except (OSError, ValueError):  # ValueError: select on a socket cut() closed
            pass
        finally:
            self._close_pair(source, sink)

    def _close_pair(self, *socks: socket.socket) -> None:
        for sock in socks:
            with self._lock:
                self._sockets.discard(sock)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def cut(self) -> None:
        """Close every relayed connection (both sides)."""
        with self._lock:
            socks = list(self._sockets)
        self._close_pair(*socks)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self.cut()
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> "AckGate":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

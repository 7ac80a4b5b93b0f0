"""A Log Courier client for tests, speaking as the Go shipper does: HELO first, EVNT when
VERS allows it (else JDAT), several payloads in flight, each kept until its full ACKN,
and after a reconnect the unacknowledged ones resent with the same nonce."""

from __future__ import annotations

import collections
import socket
import ssl

from logrouter.wire import log_courier as lc


class CourierClient:
    def __init__(self, max_pending: int = 10) -> None:
        self.max_pending = max_pending
        self.unacked: collections.OrderedDict[bytes, list[dict]] = collections.OrderedDict()
        self.acked: list[bytes] = []
        self.payloads_sent = 0
        self.resent = 0
        self.sent_once: set[bytes] = set()

    def connect(self, port: int, context: ssl.SSLContext | None = None, timeout: float = 10) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname="localhost")
        return sock

    def run(self, port: int, payloads, context: ssl.SSLContext | None = None, timeout: float = 10) -> bool:
        """Send ``payloads`` (an iterator of (nonce, events)) after what is still unacked;
        True once everything was acked, False when the connection broke."""
        try:
            sock = self.connect(port, context, timeout)
        except OSError:
            return False
        replies = lc.AcknDecoder()
        try:
            sock.sendall(lc.encode_helo())
            evnt = False
            while True:
                data = sock.recv(65536)
                if not data:
                    return False
                frames = replies.feed(data)
                if frames:
                    evnt = isinstance(frames[0], lc.Vers) and frames[0].supports_evnt
                    break
            encode = lc.encode_evnt if evnt else lc.encode_jdat
            backlog = collections.deque(self.unacked.items())
            in_flight: set[bytes] = set()
            fresh = iter(payloads)
            while True:
                while len(in_flight) < self.max_pending:
                    if backlog:
                        nonce, events = backlog.popleft()
                    else:
                        item = next(fresh, None)
                        if item is None:
                            break
                        nonce, events = item
                        self.unacked[nonce] = events
                    if nonce in self.sent_once:
                        self.resent += 1
                    self.sent_once.add(nonce)
                    sock.sendall(encode(nonce, events))
                    self.payloads_sent += 1
                    in_flight.add(nonce)
                if not in_flight:
                    return True
                data = sock.recv(65536)
                if not data:
                    return False
                for frame in replies.feed(data):
                    if isinstance(frame, lc.Ackn) and frame.nonce in in_flight:
                        if frame.sequence >= len(self.unacked[frame.nonce]):
                            in_flight.discard(frame.nonce)
                            del self.unacked[frame.nonce]
                            self.acked.append(frame.nonce)
        except OSError:
            return False
        finally:
            sock.close()

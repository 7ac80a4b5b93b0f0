"""A forward client that sends numbered chunks with ids and resends what was not acked.

Like out_forward: one chunk at a time, each waits for its ack, and after a reconnect
the oldest unacked chunk goes first. Used by the crash and disk-full tests, which then
check that the lake holds every acked event exactly once.
"""

from __future__ import annotations

import collections
import socket
import threading
import time

import msgpack

from fixtures.forward_encode import encode_packed_forward

EVENTS_PER_CHUNK = 100
T0 = 1_700_000_000 * 10**9


def chunk_message(chunk_no: int) -> tuple[bytes, bytes]:
    chunk_id = f"chunk-{chunk_no:06d}\n".encode()
    events = [
        # Spread over two hours so every chunk touches two partitions.
        (T0 + (chunk_no % 2) * 3600 * 10**9 + i, {"id": f"{chunk_no}-{i}", "n": i, "msg": "x" * 40})
        for i in range(EVENTS_PER_CHUNK)
    ]
    message = encode_packed_forward("crash.test", events, {"size": EVENTS_PER_CHUNK, "chunk": chunk_id.decode()})
    return message, chunk_id


class Client:
    """Sends chunks one at a time, waits for each ack, resends unacked ones after a reconnect."""

    def __init__(self) -> None:
        self.next_chunk = 0
        self.unacked: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.acked: set[int] = set()
        self.acked_this_cycle = 0
        self.resent = 0  # chunks sent again because their ack never came
        self.sent_once: set[int] = set()
        self.progress = threading.Condition()

    def run(self, port: int, max_chunks: int, deadline: float, timeout: float = 10, stop: threading.Event | None = None,
            source: str | None = None) -> None:
        """Until the connection breaks (the daemon was killed), or the bounds are hit, or
        ``stop`` is set (checked between chunks). ``source``: the local address to connect from."""
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                            source_address=(source, 0) if source else None)
        except OSError:
            return
        unpacker = msgpack.Unpacker(raw=True)
        try:
            sent = 0
            while sent < max_chunks and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
                if self.unacked:
                    chunk_no = next(iter(self.unacked))  # oldest unacked first, as out_forward retries
                else:
                    chunk_no = self.next_chunk
                    self.next_chunk += 1
                    self.unacked[chunk_no] = None
                message, chunk_id = chunk_message(chunk_no)
                if chunk_no in self.sent_once:
                    self.resent += 1
                self.sent_once.add(chunk_no)
                sock.sendall(message)
                sent += 1
                reply = None
                while reply is None:
                    data = sock.recv(4096)
                    if not data:
                        return
                    unpacker.feed(data)
                    for reply in unpacker:
                        break
                assert reply == {b"ack": chunk_id}, reply
                del self.unacked[chunk_no]
                with self.progress:
                    self.acked.add(chunk_no)
                    self.acked_this_cycle += 1
                    self.progress.notify_all()
        except OSError:
            return
        finally:
            sock.close()


def expected_ids(chunks) -> set[str]:
    return {f"{c}-{i}" for c in chunks for i in range(EVENTS_PER_CHUNK)}

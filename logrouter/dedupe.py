"""Recognising client retransmissions by their ids, so a batch is stored only once.

A forward ``chunk`` id (and later a Log Courier nonce or a Pravega writer id + event
number) arrives again when the client did not see the ack. If the first copy is durable
the retransmission is acked at once without storing it again; if the first copy is still
being stored, the retransmission's ack waits for it.

The window is bounded (oldest ids fall out first) and survives a restart: ids travel in
the spool records themselves, and a snapshot of the window is saved so the spool can be
trimmed without forgetting them. On start the router loads the snapshot, then adds the
ids of every spool record after the snapshot's position.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Iterable

import msgpack
from twisted.internet import defer

Key = tuple[str, bytes]


class DedupeWindow:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.done: OrderedDict[Key, int] = OrderedDict()  # id -> spool position
        self.pending: dict[Key, list[defer.Deferred]] = {}

    def lookup(self, key: Key) -> defer.Deferred | None:
        """A Deferred for the ack of a retransmitted id, or ``None`` for a new one."""
        if key in self.done:
            self.done.move_to_end(key)
            return defer.succeed(None)
        waiting = self.pending.get(key)
        if waiting is not None:
            d: defer.Deferred = defer.Deferred()
            waiting.append(d)
            return d
        return None

    def begin(self, key: Key) -> None:
        self.pending[key] = []

    def finish(self, key: Key, position: int) -> None:
        for d in self.pending.pop(key, ()):
            d.callback(None)
        self.add(key, position)

    def abandon(self, key: Key, failure: Any) -> None:
        for d in self.pending.pop(key, ()):
            d.errback(failure)

    def add(self, key: Key, position: int) -> None:
        self.done[key] = position
        self.done.move_to_end(key)
        while len(self.done) > self.capacity:
            self.done.popitem(last=False)

    def add_all(self, entries: Iterable[tuple[Key, int]]) -> None:
        for key, position in entries:
            self.add(key, position)


def save_snapshot(path: str, entries: list[tuple[Key, int]], position: int) -> None:
    """Write ``entries`` (and the spool position they cover up to) atomically."""
    data = msgpack.packb([1, position, [[source, chunk, pos] for (source, chunk), pos in entries]])
    temporary = path + ".tmp"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def load_snapshot(path: str) -> tuple[list[tuple[Key, int]], int]:
    """The saved entries and the spool position they cover; nothing if there is no snapshot."""
    try:
        with open(path, "rb") as f:
            version, position, rows = msgpack.unpackb(f.read(), raw=False)
    except FileNotFoundError:
        return [], 0
    except (ValueError, msgpack.UnpackException):
        return [], 0  # a damaged snapshot only weakens deduplication; the spool scan still runs
    if version != 1:
        return [], 0
    return [((source, bytes(chunk)), pos) for source, chunk, pos in rows], position

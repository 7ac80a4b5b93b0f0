"""Recognising client retransmissions by their ids, so a batch is stored only once.

Two kinds of idempotency key, both scoped by the source's name:

* a **batch id** ``(source, id)``: a forward ``chunk``, a Log Courier nonce. The same id
  again is the same batch again.
* a **writer sequence** ``(source, writer, event_number)``: a sender that numbers its
  events (a Pravega writer id and the number of the batch's last event). A batch whose
  number is not above the highest one stored for its writer was stored before; the
  router can say, after any restart, the last event number stored for a writer.

A key seen again is acked at once if its first copy is durable; if the first copy is
still being stored, the retransmission's ack waits for it.

The window is bounded (oldest ids fall out first) and survives a restart: ids travel in
the spool records themselves, and a snapshot of the window is saved so the spool can be
trimmed without forgetting them. On start the router loads the snapshot, then adds the
ids of every spool record after the snapshot's position.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable

import msgpack
from twisted.internet import defer

from logrouter.atomic_file import replace_file

Key = tuple  # (source, batch id) or (source, writer, event number)
BatchKey = tuple[str, bytes]
WriterId = tuple[str, bytes]


def is_writer_key(key: Key) -> bool:
    return len(key) == 3


class DedupeWindow:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.done: OrderedDict[BatchKey, int] = OrderedDict()  # id -> spool position
        self.pending: dict[BatchKey, list[defer.Deferred]] = {}
        # Writers: the highest event number stored, and numbers being stored with their waiters.
        self.writers: OrderedDict[WriterId, int] = OrderedDict()
        self.writer_pending: dict[WriterId, dict[int, list[defer.Deferred]]] = {}

    def last_event_number(self, source: str, writer: bytes) -> int | None:
        """The number of the last event stored for ``writer`` (of ``source``), if any."""
        return self.writers.get((source, writer))

    def lookup(self, key: Key) -> defer.Deferred | None:
        """A Deferred for the ack of a retransmitted id, or ``None`` for a new one."""
        if is_writer_key(key):
            return self._lookup_writer(key)
        if key in self.done:
            self.done.move_to_end(key)
            return defer.succeed(None)
        waiting = self.pending.get(key)
        if waiting is not None:
            d: defer.Deferred = defer.Deferred()
            waiting.append(d)
            return d
        return None

    def _lookup_writer(self, key: Key) -> defer.Deferred | None:
        source, writer, number = key
        stored = self.writers.get((source, writer))
        if stored is not None and number <= stored:
            self.writers.move_to_end((source, writer))
            return defer.succeed(None)
        waiting = self.writer_pending.get((source, writer), {})
        covering = [n for n in waiting if n >= number]
        if covering:
            d: defer.Deferred = defer.Deferred()
            waiting[min(covering)].append(d)
            return d
        return None

    def begin(self, key: Key) -> None:
        if is_writer_key(key):
            source, writer, number = key
            self.writer_pending.setdefault((source, writer), {})[number] = []
        else:
            self.pending[key] = []

    def _pop_waiters(self, key: Key) -> list[defer.Deferred]:
        if not is_writer_key(key):
            return self.pending.pop(key, [])
        source, writer, number = key
        waiting = self.writer_pending.get((source, writer), {})
        waiters = waiting.pop(number, [])
        if not waiting:
            self.writer_pending.pop((source, writer), None)
        return waiters

    def finish(self, key: Key, position: int) -> None:
        self.add(key, position)
        for d in self._pop_waiters(key):
            d.callback(None)

    def abandon(self, key: Key, failure: Any) -> None:
        for d in self._pop_waiters(key):
            d.errback(failure)

    def add(self, key: Key, position: int) -> None:
        if is_writer_key(key):
            source, writer, number = key
            writer_id = (source, writer)
            self.writers[writer_id] = max(number, self.writers.get(writer_id, number))
            self.writers.move_to_end(writer_id)
            while len(self.writers) > self.capacity:
                self.writers.popitem(last=False)
            return
        self.done[key] = position
        self.done.move_to_end(key)
        while len(self.done) > self.capacity:
            self.done.popitem(last=False)

    def add_all(self, entries: Iterable[tuple[Key, int]]) -> None:
        for key, position in entries:
            self.add(key, position)


def save_snapshot(
    path: str, entries: list[tuple[BatchKey, int]], position: int, writers: list[tuple[WriterId, int]] = ()
) -> None:
    """Write ``entries``, the ``writers``' last event numbers (and the spool position they
    cover up to) atomically."""
    data = msgpack.packb(
        [
            2,
            position,
            [[source, chunk, pos] for (source, chunk), pos in entries],
            [[source, writer, number] for (source, writer), number in writers],
        ]
    )
    replace_file(path, data)


def load_snapshot(path: str) -> tuple[list[tuple[Key, int]], int]:
    """The saved keys (batch ids with their positions, writers' last event numbers as
    writer keys) and the spool position they cover; nothing if there is no snapshot.
    Version 1 snapshots (batch ids only) still load."""
    try:
        with open(path, "rb") as f:
            snapshot = msgpack.unpackb(f.read(), raw=False)
        version, position, rows = snapshot[:3]
        writer_rows = snapshot[3] if version == 2 else []
        if version not in (1, 2):
            return [], 0
        entries: list[tuple[Key, int]] = [((source, bytes(chunk)), pos) for source, chunk, pos in rows]
        entries += [((source, bytes(writer), number), position) for source, writer, number in writer_rows]
        return entries, position
    except FileNotFoundError:
        return [], 0
    except (ValueError, TypeError, msgpack.UnpackException):
        return [], 0  # a damaged snapshot only weakens deduplication; the spool scan still runs

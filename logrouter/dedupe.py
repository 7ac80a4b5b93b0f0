"""Recognising client retransmissions by their ids, so a batch is stored only once.

Three kinds of idempotency key, all scoped by the source's name:

* a **batch id** ``(source, id)``: a forward ``chunk``, a Log Courier nonce. The same id
  again is the same batch again.
* a **writer sequence** ``(source, writer, event_number)``: a sender that numbers its
  events (a Pravega writer id and the number of the batch's last event). A batch whose
  number is not above the highest one stored for its writer was stored before; the
  router can say, after any restart, the last event number stored for a writer.
* **event keys** ``(source, [[sender, digests], ...])``: one key per event, for senders
  whose batches have no id but whose events name themselves (Beats events, see
  ``logrouter.sources.event_keys``): ``EventWindows`` keeps, per sender, a window of the
  last events stored (``per_sender`` of them; ``senders`` windows per source, the least
  recently used one forgotten first). A batch's events already stored are left out of it,
  and so are events another batch is storing, whose ack then waits for that batch.

A key seen again is acked at once if its first copy is durable; if the first copy is
still being stored, the retransmission's ack waits for it.

The window is bounded (oldest ids fall out first) and survives a restart: ids travel in
the spool records themselves, and a snapshot of the window is saved so the spool can be
trimmed without forgetting them. On start the router loads the snapshot, then adds the
ids of every spool record after the snapshot's position.

Batch ids are remembered as 16-byte keyed BLAKE2b digests of ``(source, id)``
(``batch_digest``) in a ``DigestRing`` (flat memory, ~42 bytes an id): a dict of
``(source, id)`` tuples took ~260 bytes an id, ~26 MB a worker at the default 100,000,
most of a worker's memory growth under a steady forward load.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from typing import Any, Callable, Iterable, NamedTuple

import msgpack
from twisted.internet import defer

from logrouter.atomic_file import replace_file
from logrouter.digest_ring import DigestRing

Key = tuple  # (source, batch id) or (source, writer, event number)
BatchKey = tuple[str, bytes]
WriterId = tuple[str, bytes]
EventKey = tuple[str, bytes]  # (sender, digest) of one event
DIGEST_BYTES = 16
EVENTS_PER_SENDER = 8192  # more than Filebeat's default queue (4096 events) can hold unacknowledged
SENDERS = 128


def batch_digest(source: str, batch_id: bytes, _source_keys: dict[str, bytes] = {}) -> bytes:
    """What the window remembers of a batch id: a digest keyed by its source, so ids of
    different sources never meet (a 128-bit digest: a chance collision is not a concern)."""
    source_key = _source_keys.get(source)
    if source_key is None:
        source_key = _source_keys[source] = hashlib.blake2b(source.encode(), digest_size=32).digest()
    return hashlib.blake2b(batch_id, digest_size=DIGEST_BYTES, key=source_key).digest()


def join_digests(digests: Iterable[bytes]) -> bytes:
    return b"".join(digests)


def split_digests(blob: bytes) -> Iterable[bytes]:
    """The 16-byte digests ``join_digests`` made of a list (a trailing partial one dropped)."""
    for start in range(0, len(blob) - DIGEST_BYTES + 1, DIGEST_BYTES):
        yield bytes(blob[start : start + DIGEST_BYTES])


class SavedWindow(NamedTuple):
    """A snapshot read back (``load_snapshot``): the spool position it covers, the batch
    ids' digests (``join_digests``, oldest first), and the other keys (writers' last
    event numbers as writer keys, each events window as one events key)."""

    position: int
    batch_digests: bytes
    keys: list


def is_writer_key(key: Key) -> bool:
    return len(key) == 3


def is_events_key(key: Key) -> bool:
    return len(key) == 2 and key[1].__class__ is list


class DedupeWindow:
    def __init__(self, capacity: int, event_limits: Callable[[str], tuple[int, int]] | None = None) -> None:
        """``event_limits(source)``: ``(per_sender, senders)`` of a source's event windows."""
        self.capacity = capacity
        self.events = EventWindows(event_limits or (lambda source: (EVENTS_PER_SENDER, SENDERS)))
        self.batch_ids = DigestRing(capacity, DIGEST_BYTES)  # batch_digest of each id stored
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
        if batch_digest(*key) in self.batch_ids:
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
        if is_events_key(key):
            self.events.add_record(key)
            return
        if is_writer_key(key):
            source, writer, number = key
            writer_id = (source, writer)
            self.writers[writer_id] = max(number, self.writers.get(writer_id, number))
            self.writers.move_to_end(writer_id)
            while len(self.writers) > self.capacity:
                self.writers.popitem(last=False)
            return
        self.batch_ids.add(batch_digest(*key))

    def restore(self, saved: SavedWindow) -> None:
        """What a snapshot held (before the ids of the spool records after it are added)."""
        for digest in split_digests(saved.batch_digests):
            self.batch_ids.add(digest)
        for key in saved.keys:
            self.add(key, saved.position)

    def snapshot(self) -> tuple[memoryview, list, list]:
        """What ``save_snapshot`` writes after the position: copies, taken on the reactor.
        The batch ids' copy is a buffer the next call overwrites: one save at a time
        (``logrouter.snapshots``)."""
        return self.batch_ids.joined(), list(self.writers.items()), self.events.rows()


def event_limits(config: Any, source: str) -> tuple[int, int]:
    """``(per_sender, senders)`` of a source's event windows: its options, else the defaults
    (a source no longer configured still has keys in the spool)."""
    component = config.sources.get(source)
    options = component.options if component is not None else {}
    return options.get("idempotency_window", EVENTS_PER_SENDER), options.get("idempotency_senders", SENDERS)


class KeyClaim:
    """A batch id or writer key being stored: ``begin`` once its batch goes to the spool,
    then ``finish`` or ``abandon`` (as ``EventClaim``)."""

    __slots__ = ("window", "key")

    def __init__(self, window: DedupeWindow, key: Key) -> None:
        self.window = window
        self.key = key

    def begin(self) -> None:
        self.window.begin(self.key)

    def finish(self, position: int) -> None:
        self.window.finish(self.key, position)

    def abandon(self, failure: Any) -> None:
        self.window.abandon(self.key, failure)


class _SenderWindow:
    """The digests of the last events stored for one sender, oldest first, and those being stored."""

    __slots__ = ("stored", "order", "pending")

    def __init__(self) -> None:
        self.stored: set[bytes] = set()
        self.order: deque[bytes] = deque()
        self.pending: dict[bytes, EventClaim] = {}

    def add(self, digest: bytes, capacity: int) -> None:
        if digest in self.stored:
            return
        self.stored.add(digest)
        self.order.append(digest)
        while len(self.order) > capacity:
            self.stored.discard(self.order.popleft())


class EventClaim:
    """What ``EventWindows.claim`` decided for one batch's events.

    ``keep``: the indices of the events to store (new ones, and those without a key);
    ``dropped``: how many are left out; ``waiting``: Deferreds of the other batches storing
    some of the left-out events, to wait for before acking. ``finish`` once the batch is
    stored (its keys enter the windows, batches waiting on it go on); ``abandon`` if it is not.
    """

    __slots__ = ("source", "keep", "dropped", "waiting", "groups", "waiters", "_waits_on", "capacity")

    def __init__(self, source: str, capacity: int) -> None:
        self.source = source
        self.capacity = capacity
        self.keep: list[int] = []
        self.dropped = 0
        self.waiting: list[defer.Deferred] = []
        self.groups: dict[str, tuple[_SenderWindow, list[bytes]]] = {}
        self.waiters: list[defer.Deferred] = []
        self._waits_on: set[int] = set()

    def wait_for(self, other: "EventClaim") -> None:
        if other is self or id(other) in self._waits_on:
            return
        self._waits_on.add(id(other))
        d: defer.Deferred = defer.Deferred()
        other.waiters.append(d)
        self.waiting.append(d)

    def record_key(self) -> Key | None:
        """The key stored with the batch: its senders and their events' digests."""
        rows = [[sender, b"".join(digests)] for sender, (_, digests) in self.groups.items() if digests]
        return (self.source, rows) if rows else None

    def begin(self) -> None:
        """Nothing to do: ``claim`` marked the events as being stored already."""

    def finish(self, position: int = 0) -> None:
        for window, digests in self.groups.values():
            pending = window.pending
            for digest in digests:
                if pending.get(digest) is self:
                    del pending[digest]
                window.add(digest, self.capacity)
        waiters, self.waiters = self.waiters, []
        for d in waiters:
            d.callback(None)

    def abandon(self, failure: Any) -> None:
        for window, digests in self.groups.values():
            pending = window.pending
            for digest in digests:
                if pending.get(digest) is self:
                    del pending[digest]
        waiters, self.waiters = self.waiters, []
        for d in waiters:
            d.errback(failure)


class EventWindows:
    """Per source and sender, the events stored lately, by their keys (``EventKey``)."""

    def __init__(self, limits: Callable[[str], tuple[int, int]]) -> None:
        self.limits = limits
        self.sources: dict[str, OrderedDict[str, _SenderWindow]] = {}

    def __bool__(self) -> bool:
        return any(self.sources.values())

    def _window(self, source: str, sender: str, senders: int) -> _SenderWindow:
        windows = self.sources.get(source)
        if windows is None:
            windows = self.sources[source] = OrderedDict()
        window = windows.get(sender)
        if window is None:
            window = windows[sender] = _SenderWindow()
            while len(windows) > senders:
                windows.popitem(last=False)  # a claim still storing into it finishes harmlessly
        else:
            windows.move_to_end(sender)
        return window

    def claim(self, source: str, keys: list[EventKey | None]) -> EventClaim:
        """Sort a batch's events (``keys`` in their order, None for an event without one)
        into those to store and those stored already or being stored."""
        per_sender, senders = self.limits(source)
        claim = EventClaim(source, per_sender)
        keep = claim.keep
        groups = claim.groups
        last: str | None = None
        window: Any = None
        digests: list[bytes] = []
        for i, key in enumerate(keys):
            if key is None:
                keep.append(i)
                continue
            sender, digest = key
            if sender != last:
                last = sender
                group = groups.get(sender)
                if group is None:
                    group = groups[sender] = (self._window(source, sender, senders), [])
                window, digests = group
            if digest in window.stored:
                claim.dropped += 1
                continue
            other = window.pending.get(digest)
            if other is not None:
                claim.dropped += 1
                claim.wait_for(other)
                continue
            window.pending[digest] = claim
            digests.append(digest)
            keep.append(i)
        return claim

    def add_record(self, key: Key) -> None:
        """The event keys of a stored record (a spool record or the snapshot), as stored."""
        source, rows = key
        per_sender, senders = self.limits(source)
        for row in rows:
            try:
                sender, blob = row
                if sender.__class__ is not str or not isinstance(blob, (bytes, bytearray)):
                    continue  # not what claims write: a damaged record only weakens deduplication
            except (TypeError, ValueError):
                continue
            window = self._window(source, sender, senders)
            for digest in split_digests(blob):
                window.add(digest, per_sender)

    def rows(self) -> list[tuple[str, str, list[bytes]]]:
        """Every window's digests, oldest first (for the snapshot; joined there, off the reactor)."""
        return [
            (source, sender, list(window.order))
            for source, windows in self.sources.items()
            for sender, window in windows.items()
        ]


def save_snapshot(
    path: str,
    batch_digests: bytes | memoryview,
    position: int,
    writers: list[tuple[WriterId, int]] = (),
    events: list[tuple[str, str, list[bytes]]] = (),
) -> None:
    """Write the batch ids' digests (``join_digests``), the ``writers``' last event
    numbers, the ``events`` windows (``EventWindows.rows``) and the spool position they
    cover up to, atomically (version 4). The digests are written as they are, not copied
    into the packed message."""
    packer = msgpack.Packer()
    head = packer.pack_array_header(5) + packer.pack(4) + packer.pack(position) + _bin_header(len(batch_digests))
    tail = packer.pack([[source, writer, number] for (source, writer), number in writers]) + packer.pack(
        [[source, sender, join_digests(digests)] for source, sender, digests in events]
    )
    replace_file(path, head, batch_digests, tail)


def _bin_header(size: int) -> bytes:
    """msgpack's head of a ``bin`` of ``size`` bytes (msgpack's Packer has none to call)."""
    if size < 1 << 8:
        return bytes((0xC4, size))
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


def load_snapshot(path: str) -> SavedWindow:
    """The saved window; an empty one if there is no snapshot or it is damaged. Versions
    1 (batch ids only), 2 (no events) and 3 (batch ids as ``[source, id, position]``)
    still load: their ids are digested as they are read."""
    try:
        with open(path, "rb") as f:
            snapshot = msgpack.unpackb(f.read(), raw=False)
        version, position, batch_rows = snapshot[:3]
        if version not in (1, 2, 3, 4):
            return SavedWindow(0, b"", [])
        writer_rows = snapshot[3] if version >= 2 else []
        event_rows = snapshot[4] if version >= 3 else []
        if version == 4:
            batch_digests = _checked(bytes, batch_rows)
        else:
            batch_digests = join_digests(batch_digest(_checked(str, source), _checked(bytes, chunk)) for source, chunk, _ in batch_rows)
        keys: list[Key] = [
            (_checked(str, source), _checked(bytes, writer), _checked(int, number)) for source, writer, number in writer_rows
        ]
        keys += [(_checked(str, source), [[_checked(str, sender), _checked(bytes, blob)]]) for source, sender, blob in event_rows]
        return SavedWindow(_checked(int, position), batch_digests, keys)
    except FileNotFoundError:
        return SavedWindow(0, b"", [])
    except (ValueError, TypeError, msgpack.UnpackException):
        return SavedWindow(0, b"", [])  # a damaged snapshot only weakens deduplication; the spool scan still runs


def _checked(kind: type, value: Any) -> Any:
    """``value`` if it is what the snapshot's writer put there (msgpack gives ``bytes`` for
    a bin), else ``ValueError``: never ``bytes(n)`` of a damaged number, say."""
    if value.__class__ is not kind or (kind is int and value < 0):
        raise ValueError(f"damaged snapshot: {value!r:.40} is not a {kind.__name__}")
    return value

"""The payload of one spool record: a batch as it came from its source, and its client id.

msgpack, because the events came in as msgpack-shaped values and the C packer is the
cheapest way back to bytes. Strings may carry lone surrogates (invalid UTF-8 received
inside msgpack str); ``surrogateescape`` writes and reads those bytes back unchanged.
The optional idempotency key is what lets retransmissions be recognised after a restart
(see ``logrouter.dedupe``): ``[source, batch id]``, ``[source, writer, event number]``, or
``[source, [[sender, digests], …]]`` (the keys of the batch's events, 16 bytes each).

Layout: ``[version, source, tag, events, key]``. Versions: 1 knew batch ids only; 2 adds
writer keys; 3 stores, in place of the events, what arrived: ``[format, …]`` for a batch
that carries it (``Batch.packed``), one of the stored formats the sources register in
``logrouter.spool.formats``, which reads it back. Batches without ``packed`` are written
as version 2. Every version is read, so a spool written before an upgrade still replays;
``tests/unit/test_spool_golden.py`` holds a record of each as written.
"""

from __future__ import annotations

import collections

import msgpack
import msgspec

from logrouter.batch import Batch
from logrouter.spool import formats

VERSION = 2  # batches of decoded events
PACKED_VERSION = 3  # batches that carry what arrived
READABLE_VERSIONS = (1, 2, 3)
_PACK = {"use_bin_type": True, "unicode_errors": "surrogateescape"}
_UNPACK = {"raw": False, "unicode_errors": "surrogateescape", "strict_map_key": False, "use_list": True}


# For JSON values msgspec writes the very bytes msgpack.packb writes, four times faster.
# Not for anything else: it would write an ExtType (a tuple) as an array.
_encode_json_values = msgspec.msgpack.Encoder().encode
_JSON_VALUES_REFUSED = (TypeError, ValueError, OverflowError)  # lone surrogates, ints beyond 64 bits


def encode_batch(batch: Batch, key: tuple | None = None) -> bytes:
    packed = batch.packed
    if packed is not None:
        formats.check(packed)  # a record replay could not read: refuse it now
        return msgpack.packb((PACKED_VERSION, batch.source, batch.tag, packed, key), **_PACK)
    events = batch.events
    if type(events) is not list:
        events = list(events)  # e.g. forward events still packed (wire.forward_lazy)
    body = (VERSION, batch.source, batch.tag, events, key)
    if batch.json_values:
        try:
            return _encode_json_values(body)
        except _JSON_VALUES_REFUSED:
            pass  # msgpack writes lone surrogates (surrogateescape) and refuses the rest
    return msgpack.packb(body, **_PACK)


def _key(key: list | None) -> tuple | None:
    return None if key is None else tuple(key)


def decode_batch(payload: bytes) -> tuple[Batch, tuple | None]:
    version, source, tag, events, key = msgpack.unpackb(payload, **_UNPACK)
    held = 0
    if version == PACKED_VERSION:
        events, held = formats.decode_held(events)
    elif version not in READABLE_VERSIONS:
        raise ValueError(f"unknown spool record version {version}")
    # Events come back as [time_ns, record] lists (versions 1, 2) or tuples (3); both
    # unpack like the tuples sources build.
    return Batch(tag, events, source, held_bytes=held), _key(key)


def decode_deferred(payload: bytes) -> Batch:
    """The batch of a record with only its source and tag read now: the events are
    decoded (by ``decode_batch``) each time they are read. Raises like ``decode_batch``
    for a record whose head is not one."""
    unpacker = msgpack.Unpacker(**_UNPACK)
    unpacker.feed(payload)
    if unpacker.read_array_header() != 5:
        raise ValueError("a spool record is an array of 5")
    version = unpacker.unpack()
    if version not in READABLE_VERSIONS:
        raise ValueError(f"unknown spool record version {version}")
    source = unpacker.unpack()
    tag = unpacker.unpack()
    return Batch.deferred(tag, source, lambda: decode_batch(payload)[0].events)


def decode_key(payload: bytes) -> tuple | None:
    """Only the idempotency key of a record, without building its events."""
    unpacker = msgpack.Unpacker(**_UNPACK)
    unpacker.feed(payload)
    unpacker.read_array_header()
    if unpacker.unpack() not in READABLE_VERSIONS:
        return None
    for _ in range(3):
        unpacker.skip()
    return _key(unpacker.unpack())


RECENT_BYTES = 4 << 20  # of batches kept for a sink behind (``Batch.charge``: memory, where known)


class RecentBatches:
    """The batches of spool records some sink has still to be handed, by position, up to
    ``limit`` bytes, each counted as a sink's queue counts it (``Batch.charge``: what
    it holds in memory, where known and more than its spool record).

    A sink that fell behind reads those records back; taking the batch they were encoded
    from saves decoding them again (for a version 3 record that is the whole decode of
    what arrived). The oldest are the ones it reads next, so once the bound is reached
    newer records are not kept (rather than pushing out the ones it is about to read),
    and ``release(position)`` lets go of every batch before the position all sinks have
    been handed: with every sink live, nothing stays. ``decode`` may run in another
    thread. Batches are shared, as they are on the live path: nothing may change them in
    place.
    """

    def __init__(self, limit: int = RECENT_BYTES) -> None:
        self.limit = limit
        self.hits = 0
        self._batches: dict[int, Batch] = {}
        self._sizes: collections.deque[tuple[int, int]] = collections.deque()
        self._bytes = 0

    def add(self, position: int, batch: Batch, size: int) -> None:
        """Keep ``batch`` of the record at ``position`` (``size``: what it counts)."""
        if self._bytes + size > self.limit:
            return  # full of older batches a sink reads first
        self._batches[position] = batch
        self._sizes.append((position, size))
        self._bytes += size

    def release(self, position: int) -> None:
        """Let go of the batches of records before ``position`` (every sink is past them)."""
        sizes = self._sizes
        while sizes and sizes[0][0] < position:
            old, old_size = sizes.popleft()
            self._bytes -= old_size
            self._batches.pop(old, None)

    def decode(self, position: int, payload: bytes, deferred: bool = False) -> Batch:
        """The batch of the record at ``position``: the one stored there, if still kept;
        else decoded from ``payload`` (``deferred``: whenever its events are read)."""
        batch = self._batches.get(position)
        if batch is None:
            return decode_deferred(payload) if deferred else decode_batch(payload)[0]
        self.hits += 1
        return batch

    def clear(self) -> None:
        self._batches = {}
        self._sizes.clear()
        self._bytes = 0

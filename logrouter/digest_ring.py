"""A bounded set of fixed-size digests that forgets the oldest first, in flat memory.

The batch-id window (``logrouter.dedupe``) remembers up to ``[spool] dedupe_window`` ids
(100,000 by default) per worker. As a Python ``set`` of ``bytes`` with a ``deque`` for
their order that is ~110 bytes an id (the objects, the set's table, the deque); here an
id is its 16 bytes in one ``bytearray`` (oldest first, a ring once full) and a 4-byte
slot in an open-addressing index (``array``, at most half full), and a copy for the
snapshots: ~42 bytes an id.

The index is linear probing over ``hash(digest)``: Python's hash of bytes is keyed per
process (SipHash), so ids a sender chose cannot be made to pile up in one run of slots.
An entry leaves the index by backward-shift deletion (no tombstones), so lookups stay
short however long the ring turns. The index is allocated at its full size on the first
``add`` (~8–16 bytes per id of capacity), the ring grows as ids arrive, and the copy a
snapshot is written from once, at the first snapshot (16 bytes per id of capacity).

Only the reactor thread uses it; a lookup or an add costs a few microseconds, and it is
done once per batch, not per event.
"""

from __future__ import annotations

from array import array
from typing import Iterator

EMPTY = 0  # index slots hold a ring position + 1


class DigestRing:
    """The last ``capacity`` distinct digests of ``width`` bytes added, oldest first."""

    __slots__ = ("capacity", "width", "ring", "count", "oldest", "index", "mask", "copy")

    def __init__(self, capacity: int, width: int = 16) -> None:
        if capacity <= 0 or width <= 0:
            raise ValueError("capacity and width must be positive")
        self.capacity = capacity
        self.width = width
        self.ring = bytearray()  # digest i at [i * width, (i + 1) * width)
        self.count = 0
        self.oldest = 0  # ring position of the oldest digest (0 until the ring is full)
        self.index: array | None = None
        self.mask = 0
        self.copy: bytearray | None = None  # the snapshot's buffer (``joined``)

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __contains__(self, digest: bytes) -> bool:
        return self._find(digest) >= 0

    def __iter__(self) -> Iterator[bytes]:
        """The digests, oldest first."""
        width, ring = self.width, self.ring
        for n in range(self.count):
            at = (self.oldest + n) % self.count * width
            yield bytes(ring[at : at + width])

    def joined(self) -> memoryview:
        """The digests, oldest first, as one buffer (a snapshot's form): a view of a copy
        kept for this, overwritten by the next call. One buffer of the ring's full size,
        reused, rather than megabytes allocated and freed every few seconds, which glibc's
        heap kept (~10 MiB a worker with the window full)."""
        if not self.count:
            return memoryview(b"")
        if self.copy is None:
            self.copy = bytearray(self.capacity * self.width)
        end, cut = self.count * self.width, self.oldest * self.width
        with memoryview(self.ring) as ring:
            self.copy[: end - cut] = ring[cut:end]
            self.copy[end - cut : end] = ring[:cut]
        return memoryview(self.copy)[:end]

    def add(self, digest: bytes) -> None:
        """Remember ``digest`` (one already there stays where it is); past ``capacity``,
        the oldest is forgotten."""
        if len(digest) != self.width:
            raise ValueError(f"a digest is {self.width} bytes, got {len(digest)}")
        if self.index is None:
            size = 1 << (2 * self.capacity - 1).bit_length()  # at least twice the capacity
            self.index = array("I", [EMPTY]) * size
            self.mask = size - 1
        if self._find(digest) >= 0:
            return
        width = self.width
        if self.count < self.capacity:
            position = self.count
            self.ring += digest
            self.count += 1
        else:
            position = self.oldest
            self._unindex(position)
            self.ring[position * width : (position + 1) * width] = digest
            self.oldest = (position + 1) % self.capacity
        index, mask = self.index, self.mask
        slot = hash(digest) & mask
        while index[slot] != EMPTY:
            slot = (slot + 1) & mask
        index[slot] = position + 1

    def _digest_at(self, position: int) -> bytes:
        at = position * self.width
        return bytes(self.ring[at : at + self.width])

    def _find(self, digest: bytes) -> int:
        """The index slot of ``digest``, or -1."""
        index = self.index
        if index is None:
            return -1
        mask, ring, width = self.mask, self.ring, self.width
        slot = hash(digest) & mask
        while True:
            entry = index[slot]
            if entry == EMPTY:
                return -1
            at = (entry - 1) * width
            if ring[at : at + width] == digest:
                return slot
            slot = (slot + 1) & mask

    def _unindex(self, position: int) -> None:
        """Take ring ``position``'s entry out of the index, shifting back the entries
        after it in its run that may move (so every entry stays reachable from its home slot)."""
        index, mask = self.index, self.mask
        assert index is not None
        hole = self._find(self._digest_at(position))
        slot = hole
        while True:
            slot = (slot + 1) & mask
            entry = index[slot]
            if entry == EMPTY:
                break
            home = hash(self._digest_at(entry - 1)) & mask
            # The entry may fill the hole unless its home lies cyclically in (hole, slot].
            if (slot - home) & mask >= (slot - hole) & mask:
                index[hole] = entry
                hole = slot
        index[hole] = EMPTY

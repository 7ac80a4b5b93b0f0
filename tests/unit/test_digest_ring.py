"""``DigestRing``: the batch-id window's flat set, against a plain model (a list of the
last ``capacity`` distinct digests), with small tables so probe runs wrap and collide."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logrouter.digest_ring import DigestRing


def digest(n: int, width: int = 16) -> bytes:
    return hashlib.blake2b(n.to_bytes(4, "big"), digest_size=width).digest()


class Model:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[bytes] = []

    def add(self, item: bytes) -> None:
        if item not in self.items:
            self.items.append(item)
            del self.items[: -self.capacity]


def check(ring: DigestRing, model: Model, universe: list[bytes]) -> None:
    assert list(ring) == model.items
    assert bytes(ring.joined()) == b"".join(model.items)
    assert len(ring) == len(model.items)
    for item in universe:
        assert (item in ring) == (item in model.items)
    index = ring.index
    if index is not None:  # every entry once, each reachable from its home slot
        positions = sorted(entry - 1 for entry in index if entry)
        assert positions == list(range(len(ring)))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9), st.lists(st.integers(0, 30), max_size=120))
def test_the_ring_remembers_what_the_model_does(capacity, adds):
    universe = [digest(n) for n in range(31)]
    ring, model = DigestRing(capacity), Model(capacity)
    for n in adds:
        ring.add(universe[n])
        model.add(universe[n])
        check(ring, model, universe)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.lists(st.integers(0, 200), max_size=400))
def test_a_ring_refilled_from_its_joined_digests_is_the_same(capacity, adds):
    universe = [digest(n, 8) for n in range(201)]
    ring = DigestRing(capacity, 8)
    for n in adds:
        ring.add(universe[n])
    again = DigestRing(capacity, 8)
    blob = bytes(ring.joined())
    for start in range(0, len(blob), 8):
        again.add(blob[start : start + 8])
    assert list(again) == list(ring)


def test_many_turns_of_the_ring_keep_lookups_exact():
    ring = DigestRing(1000)
    for n in range(20_000):
        ring.add(digest(n))
    assert all(digest(n) in ring for n in range(19_000, 20_000))
    assert digest(18_999) not in ring and digest(0) not in ring
    assert len(ring) == 1000 and sum(1 for entry in ring.index if entry) == 1000


def test_an_empty_ring_allocates_nothing_and_bad_digests_are_refused():
    ring = DigestRing(100_000)
    assert not ring and digest(1) not in ring and ring.index is None and bytes(ring.joined()) == b""
    with pytest.raises(ValueError, match="16 bytes"):
        ring.add(b"short")
    with pytest.raises(ValueError):
        DigestRing(0)

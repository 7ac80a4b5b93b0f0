"""The parts of a big PackedForward message kept packed by the native framer are the
parts the Python path makes: the same entries in each part (so a resend splits the same
way whichever path decodes it, and a part's dedupe key names the same events), the same
errors, the same bomb rule; the packed parts' bytes decode to their events.

Entries of every shape (events of the native subset, ones it leaves to Python, invalid
entries, big strings that straddle steps, values with a malformed Timestamp) are
split with small parts and steps, so each message has many; the carry limit is drawn
small too, so the hand-over to Python mid-message is exercised. Bounded example counts
(``fuzz_helpers``).
"""

from __future__ import annotations

import gzip
import struct

import msgpack
import pytest
from fuzz_helpers import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from logrouter.native import NATIVE, describe
from logrouter.wire.forward_entries import ForwardDecodeError
from logrouter.wire.forward_lazy import PackedEvents
from logrouter.wire.forward_offload import blob_parts
from logrouter.wire.forward_packed import decode_entries

pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"native decoding off: {describe()}")

NOW = 1_700_000_000_123_456_789
LIMIT = 1 << 24

_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=6) | st.binary(max_size=6)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6
)


def _event_time(seconds: int, nanos: int) -> msgpack.ExtType:
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanos))


@st.composite
def entry(draw) -> bytes:
    kind = draw(st.sampled_from(["event"] * 6 + ["big", "now", "seconds", "ext", "invalid", "bin key", "bad timestamp"]))
    seconds = draw(st.integers(0, 2**32 - 1))
    record = draw(st.dictionaries(st.text(max_size=4), _values, max_size=4))
    if kind == "big":
        record["message"] = "x" * draw(st.integers(100, 3000))
    if kind == "now":
        return msgpack.packb([_event_time(0, 0), record])
    if kind == "seconds":
        return msgpack.packb([seconds, record])
    if kind == "ext":
        record["ext"] = msgpack.ExtType(5, b"abc")
    if kind == "invalid":
        return msgpack.packb(draw(st.sampled_from([[1, "not a map"], 7, [1], "text"])))
    if kind == "bin key":
        return msgpack.packb([_event_time(seconds, 1), {b"key": 1}])
    if kind == "bad timestamp":
        return b"\x92" + msgpack.packb(_event_time(seconds, 1)) + b"\x81\xa1t\xc7\x03\xffabc"  # a 3-byte Timestamp
    return msgpack.packb([_event_time(seconds, draw(st.integers(0, 999_999_999))), record])


def parts_of(blob: bytes, compressed: str | None, part_bytes: int, native, carry_limit: int = 1 << 22):
    steps = blob_parts("tag", blob, compressed, b"chunk", {}, len(blob), LIMIT, lambda: NOW, part_bytes,
                       native=native, carry_limit=carry_limit)
    try:
        return [part for part in steps if part is not None], None
    except ForwardDecodeError as exc:
        return None, exc.reason


def shape(parts) -> list:
    return [(list(part.events), part.invalid, part.size_bytes, part.tag, part.chunk) for part in parts]


@fuzz_settings(max_examples=120)
@given(
    entries=st.lists(entry(), max_size=40),
    part_bytes=st.integers(1, 4000),
    carry_limit=st.integers(1, 5000),
    compressed=st.sampled_from([None, "gzip"]),
    damage=st.sampled_from([None] * 4 + ["cut", "0xc1", "deep", "huge array"]),
    where=st.floats(0, 1),
)
def test_native_parts_are_the_python_parts(entries, part_bytes, carry_limit, compressed, damage, where):
    blob = b"".join(entries)
    at = int(len(blob) * where)
    if damage == "cut":
        blob = blob[:at]
    elif damage is not None:
        blob = blob[:at] + {"0xc1": b"\xc1", "deep": b"\x92" + b"\x91" * 1100 + b"\xc0", "huge array": b"\xdd\xff\xff\xff\x00"}[damage] + blob[at:]
    if compressed == "gzip":
        blob = gzip.compress(blob)
    reference, error = parts_of(blob, compressed, part_bytes, None)
    native, native_error = parts_of(blob, compressed, part_bytes, NATIVE, carry_limit)
    assert native_error == error
    if reference is None:
        return
    assert shape(native) == shape(reference)
    for part in native:
        if isinstance(part.events, PackedEvents):
            assert part.packed == (part.events.entries, part.events.now)
            assert decode_entries(*part.packed) == (list(part.events), 0)


def test_usual_entries_stay_packed_in_parts():
    entries = b"".join(msgpack.packb([_event_time(1_700_000_000 + i, 0), {"message": "m" * 50, "i": i}]) for i in range(3000))
    parts, error = parts_of(gzip.compress(entries), "gzip", 20_000, NATIVE)
    assert error is None and len(parts) > 5
    assert all(isinstance(part.events, PackedEvents) and part.packed is not None for part in parts)
    assert b"".join(part.packed[0] for part in parts) == entries
    assert [len(part.events) for part in parts] == [len(p.events) for p in parts_of(gzip.compress(entries), "gzip", 20_000, None)[0]]


def test_a_huge_declared_length_then_an_inflate_limit_is_reported_as_in_python():
    # An array32 of 2**32-1 entries: the framer and the check's msgpack skip both wait
    # for the entries, and the gzip inflates past the limit before they could come.
    blob = gzip.compress(msgpack.packb([_event_time(1_700_000_000, 0), {"a": 1}]) + b"\xdd\xff\xff\xff\xff" + bytes(1 << 21))
    steps = [blob_parts("tag", blob, "gzip", None, {}, len(blob), 1 << 20, lambda: NOW, 1 << 20, native=native)
             for native in (None, NATIVE)]
    reasons = []
    for parts in steps:
        with pytest.raises(ForwardDecodeError) as caught:
            list(parts)
        reasons.append(caught.value.reason)
    assert reasons[0] == reasons[1] == "decompressed entries exceed max_decompressed_bytes (1048576)"


def test_a_bomb_after_packed_parts_is_refused_as_in_python():
    good = b"".join(msgpack.packb([_event_time(1_700_000_000, 0), {"i": i}]) for i in range(200))
    bad = msgpack.packb([1, "x"]) * 5000  # pairs, so check_entries lets them by: the parts' rule refuses
    blob = good + bad
    assert parts_of(blob, None, 1000, NATIVE)[1] == parts_of(blob, None, 1000, None)[1] is not None


@fuzz_settings()
@given(entries=st.lists(entry(), max_size=8), data=st.data())
def test_frame_stands_where_the_unpacker_stands(entries, data):
    # Pairs only (frame leaves anything else to Python), no Timestamp msgpack refuses.
    blob = b"".join(entry for entry in entries if entry[0] == 0x92 and b"\xc7\x03\xff" not in entry)
    cut = data.draw(st.integers(0, len(blob)))
    unpacker = msgpack.Unpacker(raw=True, strict_map_key=False, max_buffer_size=LIMIT)
    unpacker.feed(blob[:cut])
    ends = [0]
    for _ in unpacker:
        ends.append(unpacker.tell())
    assert NATIVE.frame(blob[:cut]) == (ends[-1], unpacker.tell())
    assert NATIVE.frame(b"\x92\xc1") is None
    assert NATIVE.frame(blob + b"\x07") is None  # an entry that is no pair

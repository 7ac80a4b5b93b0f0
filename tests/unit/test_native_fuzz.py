"""The native decoder fuzzed: garbage, truncated and damaged entries never crash it,
never raise, and it takes nothing the Python path refuses.

Every input goes to ``scan`` and to ``build`` (with and without a schema, whole and
by hour bucket). Either answers None (the Python path decides) or a result; where it
gives one, ``decode_entries`` must decode the same bytes without an error, to events
as many as the rows. Example counts are bounded (``fuzz_helpers``); the fuzz runs in
this process, so a crash would take the test run with it.
"""

from __future__ import annotations

import struct

import msgpack
import pytest
from fuzz_helpers import MAX_INPUT, fuzz_settings, mutated
from hypothesis import given
from hypothesis import strategies as st

from logrouter.native import NATIVE, describe
from logrouter.wire.fluent_forward import ForwardDecodeError, decode_entries

pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"native decoding off: {describe()}")

NOW = 1_700_000_000_000_000_000
SCHEMA = [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)]

_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8) | st.binary(max_size=8)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8
)
_records = st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e", "f"]) | st.text(max_size=3), _values, max_size=5)


@st.composite
def valid_entries(draw) -> bytes:
    packer = msgpack.Packer()
    out = b""
    for record in draw(st.lists(_records, max_size=6)):
        seconds = draw(st.integers(0, 2**32 - 1))
        out += packer.pack([msgpack.ExtType(0, struct.pack(">II", seconds, draw(st.integers(0, 999_999_999)))), record])
    return out


def check(entries: bytes) -> None:
    try:
        reference, invalid = decode_entries(entries, NOW)
    except ForwardDecodeError:
        reference = None
    scanned = NATIVE.scan(entries, NOW)
    if scanned is not None:
        assert reference is not None and invalid == 0
        count, _, buckets = scanned
        assert count == len(reference) == sum(n for _, n in buckets)
    for schema in ([], SCHEMA):
        for build in (False, True):
            found = NATIVE.build([(entries, NOW, None, 0, 1 << 40)], schema, build)
            if found is not None:
                assert reference is not None and invalid == 0, entries
                assert found[0] == len(reference)
    if scanned is not None:
        for bucket, count in scanned[2]:
            found = NATIVE.build([(entries, NOW, bucket, 0, count)], SCHEMA, True)
            assert found is not None and found[0] == count


@fuzz_settings()
@given(st.binary(max_size=MAX_INPUT))
def test_garbage(entries: bytes) -> None:
    check(entries)


@fuzz_settings()
@given(mutated(valid_entries()))
def test_damaged_entries(entries: bytes) -> None:
    check(entries)


@fuzz_settings()
@given(valid_entries(), st.integers(0, MAX_INPUT))
def test_every_cut(entries: bytes, at: int) -> None:
    check(entries[: at % (len(entries) + 1)])


def test_huge_declared_lengths_and_counts_reserve_nothing() -> None:
    head = b"\x92\xd7\x00" + struct.pack(">II", 1, 0)
    for tail in (b"\x81\xa1a\xdd\xff\xff\xff\xff", b"\x81\xa1a\xdb\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff",
                 b"\x81\xa1a\xc6\xff\xff\xff\xff", b"\x81\xa1a" + b"\xdd\x00\x00\x00\x01" * 10_000):
        check(head + tail)


def test_wrong_arguments_raise_type_errors_not_crashes() -> None:
    with pytest.raises(TypeError):
        NATIVE.scan("not bytes", NOW)
    with pytest.raises(TypeError):
        NATIVE.build([("x", NOW, None, 0, 1)], [], True)
    assert NATIVE.build([(b"", NOW, None, 0, 0)], [("a", 9)], True) is None  # an unknown type code
    assert NATIVE.build([(b"", NOW, None, 0, 0)], [("a", 1), ("a", 2)], True) is None  # a column twice

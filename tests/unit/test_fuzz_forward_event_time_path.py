"""The forward decoder's fast paths for ``[EventTime, map]`` entries give exactly what the
general path gives (events, invalid counts, errors) for any blob, cut anywhere.

Three paths decode a PackedForward blob (``fluent_forward._packed_events``): msgspec over
the whole blob, msgpack entry by entry with the times read from the bytes, and the
general path. Each is compared with the general path alone.
"""

from __future__ import annotations

import contextlib
import struct
from unittest import mock

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from fuzz_helpers import fuzz_settings
from logrouter.wire import forward_packed as fp

NOW = 1_700_000_000_123_456_789


def event_time(seconds: int, nanos: int = 0) -> msgpack.ExtType:
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanos))


keys = st.one_of(st.text(max_size=8), st.binary(max_size=8), st.integers(-5, 5))
nested_keys = st.one_of(st.text(max_size=5), st.integers(-3, 3), st.none(), st.booleans())
scalars = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.text(max_size=20), st.binary(max_size=20), st.booleans(), st.none(),
    st.floats(allow_nan=False),
    st.builds(event_time, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    # msgpack Timestamps (ext -1) in the three sizes, and the bytes of an entry head or a
    # Timestamp head inside a value: the whole-blob path must step aside, never differ.
    st.builds(msgpack.Timestamp, st.integers(0, 2**34 - 1), st.integers(0, 999_999_999)),
    st.builds(msgpack.Timestamp, st.integers(-(2**40), 2**40), st.integers(0, 999_999_999)),
    st.sampled_from([b"\x92\xd7\x00", b"\xd7\xff", b"\xd6\xff", b"\xc7\x0c\xff", b"\x92\xd7\x00" * 3]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(nested_keys, inner, max_size=3)),
    max_leaves=8,
)
records = st.dictionaries(keys, values, max_size=5)
event_times = st.builds(event_time, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
times = st.one_of(
    event_times, event_times, st.integers(0, 2**32), st.just(event_time(0)),
    st.builds(lambda s, n: msgpack.ExtType(0, struct.pack(">II", s, n) + b"\0"), st.integers(0, 9), st.integers(0, 9)),
)
entries = st.lists(st.one_of(st.tuples(times, records), st.tuples(times, values)), max_size=6)


def _pack(entry) -> bytes:
    return msgpack.packb(list(entry), use_bin_type=True, datetime=False)


def _none(blob, now_ns):
    return None


def _decode(blob: bytes, skip: tuple[str, ...] = ()):
    try:
        with contextlib.ExitStack() as patches:
            for name in skip:
                patches.enter_context(mock.patch.object(fp, name, _none))
            return fp.packed_events(blob, lambda: NOW)
    except fp.ForwardDecodeError as e:
        return ("error", str(e))


GENERAL = ("_whole_blob_entries", "_event_time_entries")


@fuzz_settings()
@given(entries, st.integers(0, 40))
def test_the_fast_paths_equal_the_general_path(listed, cut) -> None:
    blob = b"".join(_pack(entry) for entry in listed)
    for candidate in (blob, blob[: max(0, len(blob) - cut)]):
        general = _decode(candidate, GENERAL)
        assert _decode(candidate) == general
        assert _decode(candidate, ("_whole_blob_entries",)) == general
        assert _decode(candidate, ("_event_time_entries",)) == general


def test_the_whole_blob_path_takes_the_usual_blob() -> None:
    blob = b"".join(_pack((event_time(1_700_000_000 + i, i), {"i": i, "msg": "x" * i})) for i in range(50))
    events, invalid = fp._whole_blob_entries(blob, lambda: NOW)
    assert invalid == 0
    assert events == [((1_700_000_000 + i) * 10**9 + i, {"i": i, "msg": "x" * i}) for i in range(50)]
    assert fp._whole_blob_entries(b"", lambda: NOW) == ([], 0)
    # time 0 is "now", one clock reading for the whole blob
    clock = mock.Mock(return_value=NOW)
    events, _ = fp._whole_blob_entries(_pack((event_time(0), {})) * 3, clock)
    assert [t for t, _ in events] == [NOW] * 3 and clock.call_count == 1
    # a key given twice: the last value wins, in the first one's place (as msgpack does)
    twice = b"\x92" + msgpack.packb(event_time(5)) + b"\x83\xa1a\x01\xa1b\x02\xa1a\x03"
    assert fp._whole_blob_entries(twice, lambda: NOW) == ([(5 * 10**9, {"a": 3, "b": 2})], 0)
    assert list(fp._whole_blob_entries(twice, lambda: NOW)[0][0][1]) == ["a", "b"]
    assert _decode(twice) == _decode(twice, GENERAL)


def test_the_whole_blob_path_steps_aside_where_msgspec_would_differ() -> None:
    usual = _pack((event_time(5), {"a": 1}))
    stepping_aside = [
        usual + _pack((event_time(6), {"t": msgpack.Timestamp(5, 7)})),  # msgspec: a datetime
        usual + _pack((event_time(6), {b"bin key": 1})),  # msgspec: refused, str keys only
        usual + _pack((event_time(6), {"s": b"\xff"}))[:-3] + b"\xa1\xff",  # invalid UTF-8 text
        usual + _pack((event_time(6), {"b": b"\x92\xd7\x00"})),  # a head inside a value: count off
        usual + _pack((msgpack.ExtType(1, b"\0" * 8), {"a": 1})),  # another ext code
        usual + _pack((6, {"a": 1})),  # integer seconds
        usual[:-1],  # cut short
    ]
    for blob in stepping_aside:
        assert fp._whole_blob_entries(blob, lambda: NOW) is None, blob
        assert _decode(blob) == _decode(blob, GENERAL)


def test_an_array_map_key_inside_a_record_is_kept_as_a_tuple() -> None:
    # msgpack's unpacker cannot hash a list: the general path refuses the message, where
    # fluentd's in_forward (Ruby) keeps the key. The whole-blob path keeps it too.
    blob = _pack((event_time(5), {"nested": {(1, 2): "v"}}))
    assert fp.packed_events(blob, lambda: NOW) == ([(5 * 10**9, {"nested": {(1, 2): "v"}})], 0)
    assert _decode(blob, GENERAL)[0] == "error"


@fuzz_settings()
@given(st.binary(max_size=300), st.lists(st.sampled_from([b"\xff", b"\xd6\xff", b"\xd7\xff", b"\xc7\x0c\xff", b"\x0c\xff"]), max_size=80))
def test_the_timestamp_probe_misses_no_timestamp_head(noise, pieces) -> None:
    blob = noise + b"".join(pieces)
    holds = any(head in blob for head in fp._TIMESTAMP_HEADS)
    assert fp._may_hold_timestamp(blob) or not holds
    if not any(byte == 0xFF for byte in blob[1:]):
        assert not fp._may_hold_timestamp(blob)

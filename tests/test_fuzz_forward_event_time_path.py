"""The forward decoder's fast path for ``[EventTime, map]`` entries gives exactly what the
general path gives (events, invalid counts, errors) for any blob, cut anywhere."""

from __future__ import annotations

import struct
from unittest import mock

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from fuzz_helpers import fuzz_settings
from logrouter.wire import fluent_forward as ff

NOW = 1_700_000_000_123_456_789

keys = st.one_of(st.text(max_size=8), st.binary(max_size=8), st.integers(-5, 5))
scalars = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.text(max_size=20), st.binary(max_size=20), st.booleans(), st.none(),
    st.floats(allow_nan=False),
    st.builds(lambda s, n: msgpack.ExtType(0, struct.pack(">II", s, n)), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=8)
records = st.dictionaries(keys, values, max_size=5)
event_times = st.builds(lambda s, n: msgpack.ExtType(0, struct.pack(">II", s, n)), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
times = st.one_of(event_times, event_times, st.integers(0, 2**32), st.just(msgpack.ExtType(0, b"\0" * 8)))
entries = st.lists(st.one_of(st.tuples(times, records), st.tuples(times, values)), max_size=6)


def _pack(entry) -> bytes:
    return msgpack.packb(list(entry), use_bin_type=True)


def _decode(blob: bytes, general: bool):
    try:
        if general:
            with mock.patch.object(ff, "_event_time_entries", lambda blob, now_ns: None):
                return ff._packed_events(blob, lambda: NOW)
        return ff._packed_events(blob, lambda: NOW)
    except ff.ForwardDecodeError as e:
        return ("error", str(e))


@fuzz_settings()
@given(entries, st.integers(0, 40))
def test_the_event_time_path_equals_the_general_path(listed, cut) -> None:
    blob = b"".join(_pack(entry) for entry in listed)
    for candidate in (blob, blob[: max(0, len(blob) - cut)]):
        assert _decode(candidate, general=False) == _decode(candidate, general=True)

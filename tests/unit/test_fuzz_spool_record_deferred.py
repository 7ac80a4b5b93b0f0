"""Fuzz target for deferred spool records: read later, a record gives what it gave at once.

Spool record payloads (every version, valid and damaged the way fuzzers do) are decoded
both ways: ``decode_batch`` at once and ``decode_deferred`` with its events read after.
Checked: where the head is refused the whole record is refused too, and otherwise the
deferred batch has the same tag, source and events, or fails its decode where the
eager one fails.
"""

from __future__ import annotations

import struct

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from fuzz_helpers import fuzz_settings, mutated
from logrouter.batch import Batch
from logrouter.sources.fluent_forward import FORWARD_ENTRIES
from logrouter.spool.record import decode_batch, decode_deferred, encode_batch

T0 = 1_700_000_000 * 10**9

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
records = st.dictionaries(st.text(max_size=6), values, max_size=4)


@st.composite
def payloads(draw):
    kind = draw(st.sampled_from(["v2", "v3", "v1"]))
    source, tag = draw(st.text(max_size=6)), draw(st.text(max_size=6))
    events = [(T0 + draw(st.integers(0, 10**12)), draw(records)) for _ in range(draw(st.integers(0, 4)))]
    key = draw(st.none() | st.tuples(st.just(source), st.binary(max_size=6)))
    if kind == "v3":
        entries = b"".join(
            msgpack.packb([msgpack.ExtType(0, struct.pack(">II", t // 10**9, t % 10**9)), r], use_bin_type=True)
            for t, r in events
        )
        return encode_batch(Batch(tag, events, source, packed=(FORWARD_ENTRIES, entries, T0)), key)
    if kind == "v1":
        return msgpack.packb([1, source, tag, [[t, r] for t, r in events], key], use_bin_type=True)
    return encode_batch(Batch(tag, events, source), key)


def outcome(read):
    try:
        return read()
    except Exception as e:  # noqa: BLE001 - the kind of failure is what is compared
        return ("raised", type(e).__name__)


@given(mutated(payloads()))
@fuzz_settings()
def test_a_deferred_record_decodes_to_what_the_record_decodes_to(payload):
    eager = outcome(lambda: decode_batch(payload)[0])
    try:
        deferred = decode_deferred(payload)
    except Exception:  # noqa: BLE001 - a head refused: the record must be refused as well
        assert isinstance(eager, tuple) and eager[0] == "raised"
        return
    later = outcome(lambda: deferred.events)
    if isinstance(eager, tuple):
        assert isinstance(later, tuple) and later[0] == "raised"
        return
    assert (deferred.tag, deferred.source) == (eager.tag, eager.source)
    assert repr(later) == repr(eager.events)  # repr: a damaged float may be NaN, never equal to itself

"""``build(..., checked=True)``, for blobs ``scan`` took, builds what the full check
builds: the same rows, columns, ``_extra`` and fields, whole and by hour bucket, with
and without a schema, for entries of every shape and for damaged ones that ``scan``
still takes. Bounded example counts (``fuzz_helpers``).
"""

from __future__ import annotations

import pytest
from fuzz_helpers import fuzz_settings, mutated
from hypothesis import given
from test_native_fuzz import NOW, SCHEMA, valid_entries

from logrouter.native import NATIVE, describe
from logrouter.wire.forward_lazy import PackedEvents, lazy_events

pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"native decoding off: {describe()}")


def same_builds(entries: bytes) -> None:
    scanned = NATIVE.scan(entries, NOW)
    if scanned is None:
        return
    pieces = [[(entries, NOW, None, 0, 1 << 40)]]
    pieces += [[(entries, NOW, bucket, 1, count)] for bucket, count in scanned[2]]
    for piece in pieces:
        for schema in ([], SCHEMA):
            for build in (False, True):
                assert NATIVE.build(piece, schema, build, checked=True) == NATIVE.build(piece, schema, build, checked=False)


@fuzz_settings()
@given(valid_entries())
def test_checked_builds_what_the_check_builds(entries: bytes) -> None:
    same_builds(entries)


@fuzz_settings()
@given(mutated(valid_entries()))
def test_checked_builds_what_the_check_builds_for_damaged_entries(entries: bytes) -> None:
    same_builds(entries)


def test_only_scanned_events_are_checked() -> None:
    import msgpack

    blob = msgpack.packb([1_700_000_000, {"a": 1}]) * 3
    events = lazy_events(blob, None)
    assert events.checked and events[1:].checked and all(part.checked for _, part in events.split_by_hour())
    assert not PackedEvents(blob, None, events.buckets).checked

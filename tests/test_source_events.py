"""JSON events into batches (Beats, Log Courier): event times the lake cannot hold."""

from __future__ import annotations

import pytest

from logrouter.sources.events import TagTemplate, batch_builder
from logrouter.spool.record import encode_batch

NOW = 1_700_000_000 * 10**9


@pytest.mark.parametrize(
    "stamp",
    ["9999-12-31T23:59:59.000Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "2300-01-01T00:00:00+01:00", 1e308],
)
def test_a_timestamp_outside_int64_nanoseconds_is_the_arrival_time(stamp):
    (batch,) = batch_builder(TagTemplate("t"))([{"@timestamp": stamp, "message": "x"}], NOW)
    assert batch.events[0][0] == NOW
    encode_batch(batch)  # the spool can hold it


def test_times_near_the_edges_of_the_range_are_kept():
    build = batch_builder(TagTemplate("t"))
    (batch,) = build([{"@timestamp": "2262-04-11T23:47:15.999999999Z"}, {"@timestamp": "1677-09-21T00:12:45Z"}], NOW)
    assert [t for t, _ in batch.events] == [9_223_372_035_999_999_999, -9_223_372_035_000_000_000]

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


@pytest.mark.parametrize(
    "stamp",
    ["2026-11-23T22:00:00.1Z", "2026-11-23T22:00:00.123Z", "2026-11-23T22:00:00.123456789Z",
     "2026-11-23T22:00:00.1234567891Z", "2026-11-23T22:00:00.12a4Z", "2026-11-23T22:00:00.١٢٣Z",
     "2026-11-23X22:00:00.123Z", "2026-11-23T22:00:00.Z", "2026-02-30T22:00:00.5Z", "2026-11-23T22:00:00.500+01:00"],
)
def test_the_inline_utc_path_gives_what_the_full_parse_gives(stamp):
    # Go's RFC3339Nano (go-lumber's tst-send) and Beats' milliseconds take the inline
    # path; whatever it takes must come out as the full RFC 3339 parse says.
    from logrouter.sources.events import _time_of

    records = [{"@timestamp": stamp, "n": 1}, {"@timestamp": stamp, "n": 2}]
    (batch,) = batch_builder(TagTemplate("t"))(records, NOW)
    assert [t for t, _ in batch.events] == [_time_of(stamp, NOW)] * 2

"""JSON events into batches (Beats, Log Courier): event times the lake cannot hold, and
the column-wise reading of many events (times, one tag) giving what the per-event path gives."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_helpers import fuzz_settings

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


# -- column-wise: a read of many events in the usual shape -----------------------------------

MANY = 64  # from this many events on, times and tags are read column-wise


def usual(n: int, start: int = 0) -> list[dict]:
    """Go's RFC3339Nano stamps (trailing zeros cut, so their lengths vary), one type."""
    return [
        {"@timestamp": f"2026-11-24T04:00:10.{123456700 + 10 * (start + i):09d}".rstrip("0") + "Z", "type": "filebeat", "n": i}
        for i in range(n)
    ]


def test_a_read_in_the_usual_shape_is_timed_column_wise(monkeypatch):
    from logrouter.sources import events

    records = usual(MANY)
    expected = [events._time_of(r["@timestamp"], NOW) for r in records]
    class Untouchable(dict):
        def get(self, *args):
            raise AssertionError("the per-event path ran")

    monkeypatch.setattr(events, "_time_of", None)  # the per-event path would call it for some
    monkeypatch.setattr(events, "_SECONDS_CACHE", Untouchable())  # and read this for every one
    (batch,) = batch_builder(TagTemplate("t"))(records, NOW)
    assert [t for t, _ in batch.events] == expected
    assert [r for _, r in batch.events] == records


@pytest.mark.parametrize(
    "odd",
    ["2026-11-23T22:00:00.1234567891Z", "2026-11-23T22:00:00.12a4Z", "2026-11-23T22:00:00.١٢٣Z",
     "2026-11-23X22:00:00.123Z", "2026-11-23T22:00:00.Z", "2026-02-30T22:00:00.5Z", "2026-11-23T22:00:00.500+01:00",
     "2026-11-23 22:00:00.5Z", "2026-11-23t22:00:00.5Z", "2026-11-23T22:00:00.5z", "2026-11-23T22:00:60.5Z",
     "2026-11-23T22:00:00,5Z", "2262-04-11T23:47:16.1Z", "1677-09-21T00:12:43.9Z", "2262-04-11T23:47:15.999999999Z",
     "1677-09-21T00:12:44.000000001Z", "9999-12-31T23:59:59.000Z", "0001-01-01T00:00:00.5Z", "2026-11-23T22:00:00Z",
     "", None, 1_700_000_000, 1.5, {"t": 1}, b"2026-11-23T22:00:00.5Z", "\ud800", "2026-11-23T22:00:00.5\ud800Z",
     2**64, -(2**64), [2**64], float("nan"), True],
)
@pytest.mark.parametrize("at", [0, MANY // 2, MANY - 1])
def test_one_odd_stamp_among_many_comes_out_as_the_per_event_path_says(odd, at):
    from logrouter.sources.events import _time_of

    records = usual(MANY)
    records[at]["@timestamp"] = odd
    (batch,) = batch_builder(TagTemplate("t"))(records, NOW)
    assert [t for t, _ in batch.events] == [_time_of(r["@timestamp"], NOW) for r in records]


@pytest.mark.parametrize("first", [[None, 2**64], [2**64], [[2**64]], [{"a": 1}, {"a": 2**64}], [None, -(2**70)]])
def test_odd_stamps_ahead_of_the_strings_come_out_as_the_per_event_path_says(first):
    from logrouter.sources.events import _time_of

    records = usual(MANY)
    for i, odd in enumerate(first):
        records[i]["@timestamp"] = odd
    (batch,) = batch_builder(TagTemplate("t"))(records, NOW)
    assert [t for t, _ in batch.events] == [_time_of(r["@timestamp"], NOW) for r in records]


def test_a_read_without_a_stamp_here_and_there_takes_the_arrival_time_for_those():
    records = usual(MANY)
    del records[3]["@timestamp"]
    (batch,) = batch_builder(TagTemplate("t"))(records, NOW)
    assert batch.events[3][0] == NOW and batch.events[4][0] != NOW


_FIELD_DIGITS = st.integers(min_value=1, max_value=9)


@st.composite
def formatted(draw) -> str:
    """RFC 3339-ish stamps, mostly in the usual shape, some near it."""
    near_now = st.datetimes(min_value=datetime.datetime(2000, 1, 1), max_value=datetime.datetime(2100, 1, 1))
    edges = st.sampled_from([datetime.datetime(1677, 9, 21, 0, 12, 43), datetime.datetime(1677, 9, 21, 0, 12, 44),
                             datetime.datetime(2262, 4, 11, 23, 47, 15), datetime.datetime(2262, 4, 11, 23, 47, 16)])
    anywhen = st.datetimes(min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 12, 31, 23, 59, 59))
    moment = draw(st.one_of(near_now, near_now, near_now, edges, anywhen))
    digits = draw(_FIELD_DIGITS)
    fraction = "." + str(draw(st.integers(min_value=0, max_value=10**digits - 1))).zfill(digits)
    separator = draw(st.sampled_from("TTTTTTt "))
    zone = draw(st.sampled_from(["Z"] * 8 + ["z", "+00:00", "-01:30", ""]))
    fraction = draw(st.sampled_from([fraction, fraction, fraction, fraction, "", ",5"]))
    return moment.strftime(f"%Y-%m-%d{separator}%H:%M:%S").zfill(19) + fraction + zone


def stamps() -> st.SearchStrategy:
    """Those, and what is no stamp at all."""
    return st.one_of(formatted(), st.text(max_size=32), st.text(st.characters(), max_size=4).map(lambda t: t + "\ud800"),
                     st.none(), st.integers())


@fuzz_settings()
@given(
    base=st.lists(formatted(), min_size=1, max_size=4),
    odd=st.lists(stamps(), max_size=3),
    count=st.integers(min_value=MANY, max_value=MANY + 8),
)
def test_column_wise_times_are_the_per_event_times(base, odd, count):
    from logrouter.sources.events import _time_of

    records = [{"@timestamp": base[i % len(base)], "i": i} for i in range(count)]
    for i, stamp in enumerate(odd):
        records[(i * 7) % count]["@timestamp"] = stamp
    (batch,) = batch_builder(TagTemplate("t"))(records, NOW)
    assert [t for t, _ in batch.events] == [_time_of(r.get("@timestamp"), NOW) for r in records]


# -- column-wise: one tag for the whole read ---------------------------------------------------


def test_a_read_whose_events_share_the_tag_field_is_one_batch_named_by_it():
    records = usual(MANY)
    (batch,) = batch_builder(TagTemplate("beats.${type}.log"))(records, NOW)
    assert batch.tag == "beats.filebeat.log" and len(batch.events) == MANY


@pytest.mark.parametrize(
    "template, change",
    [
        ("beats.${type}", lambda r: r.update(type="auditbeat")),  # two tags
        ("beats.${type}", lambda r: r.update(type=7)),  # a number, rendered as text
        ("beats.${type:-none}", lambda r: r.pop("type")),  # the default
        ("beats.${@metadata.beat}", lambda r: r.update({"@metadata.beat": "dotted"})),  # the dotted key wins
        ("beats.${@metadata.beat}", lambda r: r.update({"@metadata": "not a map"})),
        ("beats.${@metadata.beat}", lambda r: r["@metadata"].update(beat="heartbeat")),
        ("${type}-${@metadata.beat}", lambda r: None),  # two fields: rendered event by event
    ],
)
def test_tags_read_column_wise_are_the_per_event_tags(template, change):
    records = usual(MANY)
    for r in records:
        r["@metadata"] = {"beat": "filebeat"}
    change(records[5])
    tags = TagTemplate(template)
    expected: dict[str, int] = {}
    for r in records:
        expected[tags.render(r)] = expected.get(tags.render(r), 0) + 1
    batches = batch_builder(tags)(records, NOW)
    assert {b.tag: len(b.events) for b in batches} == expected


def test_metadata_is_dropped_from_a_read_with_one_tag_when_asked():
    records = usual(MANY)
    for r in records:
        r["@metadata"] = {"beat": "filebeat"}
    (batch,) = batch_builder(TagTemplate("beats.${@metadata.beat}"), drop_metadata=True)(records, NOW)
    assert batch.tag == "beats.filebeat" and all("@metadata" not in r for _, r in batch.events)

"""parse_json, parse_regex and parse_time over whole batches: nested targets, missing
fields, failures flagged or sent to the error path, inputs never changed."""

from __future__ import annotations

import copy
import datetime

import pytest

from logrouter.filters.parse import ParseJsonFilter, ParseRegexFilter
from logrouter.filters.parse_time import ParseTimeFilter

from test_filters import make, records

T = 1_700_000_000 * 10**9


def batch(*recs):
    return [(T + i, r) for i, r in enumerate(recs)]


def run(f, events, tag="app"):
    from logrouter.batch import Batch

    before = copy.deepcopy(events)
    out = f.process(Batch(tag, events))
    assert events == before, "the input records were changed"
    return out


def test_parse_json_merges_into_the_top_level_and_keeps_the_rest():
    f, errors = make(ParseJsonFilter)
    out = run(f, batch(
        {"message": '{"level": "info", "n": 1, "host": "inner"}', "host": "outer"},
        {"message": b'{"b": true}'},
        {"other": 1},  # no field: unchanged
        {"message": None},  # null: unchanged
    ))
    assert records(out) == [
        {"message": '{"level": "info", "n": 1, "host": "inner"}', "host": "inner", "level": "info", "n": 1},
        {"message": b'{"b": true}', "b": True},
        {"other": 1},
        {"message": None},
    ]
    assert errors.calls == []


def test_parse_json_nested_field_target_and_remove():
    f, _ = make(ParseJsonFilter, field="$.k8s.log", target="$.parsed.body", remove_field=True)
    out = run(f, batch({"k8s": {"log": '[1, 2]', "pod": "p"}, "x": 1}, {"k8s": {"pod": "q"}}))
    assert records(out) == [
        {"k8s": {"pod": "p"}, "x": 1, "parsed": {"body": [1, 2]}},
        {"k8s": {"pod": "q"}},
    ]


def test_parse_json_remove_the_source_when_the_parse_has_the_same_key():
    f, _ = make(ParseJsonFilter, remove_field=True)
    assert records(run(f, batch({"message": '{"message": "inner", "a": 1}'}))) == [{"message": "inner", "a": 1}]


def test_parse_json_failures_are_flagged_by_default():
    f, errors = make(ParseJsonFilter)
    out = run(f, batch({"message": "not json"}, {"message": "[1]"}, {"message": 5}, {"message": '{"ok": 1}'}))
    got = records(out)
    assert got[3] == {"message": '{"ok": 1}', "ok": 1}
    assert got[0]["message"] == "not json" and got[0]["_parse_error"].startswith("parse_json: not JSON: Expecting value")
    assert "parsed to an array, not an object" in got[1]["_parse_error"]
    assert "holds a number, not text" in got[2]["_parse_error"]
    assert errors.calls == [] and f.failures.failed == 3


def test_parse_json_failures_to_the_error_path_with_the_original_record():
    f, errors = make(ParseJsonFilter, on_error="error")
    bad = {"message": "{broken"}
    out = run(f, batch(bad, {"message": '{"a": 1}'}))
    assert records(out) == [{"message": '{"a": 1}', "a": 1}]
    assert errors.calls == [("f", "app", bad, errors.calls[0][3])] and "not JSON" in errors.calls[0][3]
    assert run(f, batch(bad)) is None


def test_parse_json_flag_field_nested_and_blocked():
    f, errors = make(ParseJsonFilter, flag_field="$.meta.error")
    assert "parse_json" in records(run(f, batch({"message": "x", "meta": {"a": 1}})))[0]["meta"]["error"]
    out = run(f, batch({"message": "x", "meta": "scalar"}))
    assert out is None and "cannot set the flag field" in errors.calls[0][3]


ACCESS = (
    r'^(?P<client>\S+) \S+ (?P<user>\S+) \[(?P<ts>[^\]]+)\] "(?P<method>\S+) (?P<path>\S+) [^"]*" '
    r'(?P<status>\d{3}) (?P<bytes>\d+|-)(?: "(?P<referer>[^"]*)")?'
)
LINE = '127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326'


def test_parse_regex_named_groups_types_and_missing_optional_groups():
    f, errors = make(ParseRegexFilter, pattern=ACCESS, types={"status": "int"})
    out = run(f, batch({"message": LINE}, {"message": "garbage"}, {"no": "message"}))
    first = records(out)[0]
    assert first == {
        "message": LINE, "client": "127.0.0.1", "user": "frank", "ts": "10/Oct/2000:13:55:36 -0700",
        "method": "GET", "path": "/apache_pb.gif", "status": 200, "bytes": "2326",
    }  # "referer" took no part: left out
    assert records(out)[1]["_parse_error"] == "parse_regex: the pattern does not match"
    assert records(out)[2] == {"no": "message"}


def test_parse_regex_conversion_failures_and_target():
    f, errors = make(ParseRegexFilter, pattern=r"(?P<n>\w+)=(?P<v>\S+)", types={"v": "float", "n": "string"},
                     target="kv", on_error="error", field="$.raw.text")
    out = run(f, batch({"raw": {"text": "x=1.5"}}, {"raw": {"text": "y=abc"}}, {"raw": {"text": b"z=2"}}))
    assert records(out) == [{"raw": {"text": "x=1.5"}, "kv": {"n": "x", "v": 1.5}},
                            {"raw": {"text": b"z=2"}, "kv": {"n": "z", "v": 2.0}}]
    assert "group 'v': 'abc' is not a float" in errors.calls[0][3]


def test_parse_regex_option_checks():
    with pytest.raises(ValueError, match="no named group"):
        ParseRegexFilter.OPTIONS["pattern"].check(r"(\d+)")
    with pytest.raises(ValueError, match="not a valid regular expression"):
        ParseRegexFilter.OPTIONS["pattern"].check("(")
    with pytest.raises(ValueError, match="unknown type"):
        ParseRegexFilter.OPTIONS["types"].check({"a": "date"})
    assert ParseRegexFilter.check_options({"pattern": "(?P<a>x)", "types": {"b": "int"}}) == [
        "types: 'b' is not a group of the pattern"
    ]


# --- parse_time -------------------------------------------------------------------------------


def times(out):
    return [t for t, _ in out.events]


@pytest.mark.parametrize("value,expected", [
    ("2023-11-14T22:13:20Z", T),
    ("2023-11-14T22:13:20.123456789Z", T + 123456789),
    ("2023-11-14t22:13:20.5+00:00", T + 500_000_000),
    ("2023-11-14 23:13:20+01:00", T),
    ("2023-11-14T21:13:20-0100", T),
    ("2023-11-14T22:13:20.1234567891234Z", T + 123456789),  # beyond nanoseconds: cut
])
def test_parse_time_rfc3339(value, expected):
    f, _ = make(ParseTimeFilter)
    out = run(f, [(0, {"time": value})])
    assert times(out) == [expected] and records(out) == [{"time": value}]


def test_parse_time_rfc3339_without_offset_uses_the_time_zone_with_dst():
    f, _ = make(ParseTimeFilter, timezone="Europe/Berlin")
    out = run(f, [(0, {"time": "2023-11-14T23:13:20"}), (0, {"time": "2023-07-01T02:00:00"})])
    summer = int(datetime.datetime(2023, 7, 1, 0, 0, tzinfo=datetime.timezone.utc).timestamp()) * 10**9
    assert times(out) == [T, summer]
    f, _ = make(ParseTimeFilter, timezone="+05:30")
    assert times(run(f, [(0, {"time": "2023-11-15T03:43:20"})])) == [T]


def test_parse_time_epochs():
    f, _ = make(ParseTimeFilter, field="ts", formats=["epoch_ms"])
    out = run(f, [(0, {"ts": 1_700_000_000_123}), (0, {"ts": "1700000000123.456789"}), (0, {"ts": 1_700_000_000_123.5})])
    assert times(out) == [T + 123_000_000, T + 123_456_789, T + 123_500_000]
    for fmt, value in [("epoch", 1_700_000_000), ("epoch", "1700000000.000000001"), ("epoch_us", 1_700_000_000_000_000),
                       ("epoch_ns", T), ("epoch_ns", str(T)), ("epoch", 1_700_000_000.0)]:
        g, _ = make(ParseTimeFilter, field="ts", formats=[fmt])
        assert times(run(g, [(0, {"ts": value})]))[0] in (T, T + 1), (fmt, value)


def test_parse_time_strptime_access_log_and_the_first_format_that_reads_wins():
    f, _ = make(ParseTimeFilter, field="$.req.ts", formats=["rfc3339", "%d/%b/%Y:%H:%M:%S %z", "epoch"], remove_field=True)
    out = run(f, [
        (0, {"req": {"ts": "10/Oct/2000:13:55:36 -0700", "path": "/"}}),
        (0, {"req": {"ts": "2023-11-14T22:13:20Z"}}),
        (0, {"req": {"ts": 1_700_000_000}}),
        (0, {"req": {"ts": "10/Oct/2000:13:55:36 -0700"}}),  # from the cache
    ])
    oct10 = int(datetime.datetime(2000, 10, 10, 20, 55, 36, tzinfo=datetime.timezone.utc).timestamp()) * 10**9
    assert times(out) == [oct10, T, T, oct10]
    assert records(out) == [{"req": {"path": "/"}}, {"req": {}}, {"req": {}}, {"req": {}}]


def test_parse_time_strptime_without_zone_uses_the_option():
    f, _ = make(ParseTimeFilter, formats=["%Y-%m-%d %H:%M:%S"], timezone="America/New_York")
    assert times(run(f, [(0, {"time": "2023-11-14 17:13:20"})])) == [T]


def test_parse_time_failures_keep_the_old_time_and_missing_fields_pass():
    f, errors = make(ParseTimeFilter, formats=["rfc3339", "epoch"])
    out = run(f, [(7, {"time": "yesterday"}), (8, {"nothing": 1}), (9, {"time": "2023-13-01T00:00:00Z"}), (10, {"time": True})])
    assert times(out) == [7, 8, 9, 10]
    reasons = [r.get("_parse_error") for r in records(out)]
    assert reasons[1] is None
    assert reasons[0].startswith("parse_time: 'yesterday' matches no format (rfc3339: not an RFC 3339 time; epoch: not a number)")
    assert "month must be in 1..12" in reasons[2] and "not a number" in reasons[3]
    g, errors = make(ParseTimeFilter, on_error="error")
    assert run(g, [(7, {"time": "x"})]) is None and errors.calls[0][2] == {"time": "x"}


def test_parse_time_option_checks():
    with pytest.raises(ValueError, match="unknown time zone"):
        ParseTimeFilter.OPTIONS["timezone"].check("Mars/Olympus")
    with pytest.raises(ValueError, match="item 1: unknown format"):
        ParseTimeFilter.OPTIONS["formats"].check(["rfc3339", "iso"])
    with pytest.raises(ValueError, match="at least one"):
        ParseTimeFilter.OPTIONS["formats"].check([])


def test_parse_json_reads_what_json_loads_reads_at_the_edges():
    f, errors = make(ParseJsonFilter, target="v")
    texts = ["123456789012345678901234567890", "NaN", '"\\ud800"', '{"a": 1, "a": 2}', "1e400", ' [1, 2.5, "x"] ']
    import json as stdlib

    out = records(run(f, batch(*[{"message": t} for t in texts])))
    for text, record in zip(texts, out):
        expected = stdlib.loads(text)
        assert repr(record["v"]) == repr(expected), text
    assert errors.calls == []


def test_rfc3339_fast_path_agrees_with_the_full_reader():
    import datetime

    from logrouter.filters.parse_time import rfc3339_reader

    cached = rfc3339_reader(datetime.timezone.utc)
    texts = ["2023-11-14T22:13:20.123456789Z", "2023-11-14T22:13:20Z", "2023-11-14T22:13:20,5Z", "2023-11-14t22:13:20.1z",
             "2023-11-14T22:13:60Z", "2023-11-14T22:13:20.1234567891234Z", " 2023-11-14T22:13:20Z"]
    first = [cached(t) for t in texts]
    again = [cached(t) for t in texts]  # now from the seconds cache
    fresh = [rfc3339_reader(datetime.timezone.utc)(t) for t in texts]
    assert first == again == fresh
    assert first[0] == 1_700_000_000_123_456_789

"""drop, grep with a condition, and sample: whole batches, nested and missing fields."""

from __future__ import annotations

import copy

import pytest

from logrouter import registry
from logrouter.batch import Batch
from logrouter.filters.drop import DropFilter
from logrouter.filters.grep import GrepFilter
from logrouter.filters.sample import SampleFilter

from test_filters import Errors, make, records


def batch(records_, tag="app.web", t0=1000):
    return Batch(tag, [(t0 + i, r) for i, r in enumerate(records_)], source="src")


RECORDS = [
    {"path": "/health", "http": {"status": 200}},
    {"path": "/api", "http": {"status": 503}, "level": "error"},
    {"path": "/api"},  # no http at all
    {"http": "not a table"},
    {"path": "/ready", "http": {"status": 200, "agent": {"name": "kube-probe"}}},
]


def test_registered():
    assert registry.FILTERS["drop"] is DropFilter and registry.FILTERS["sample"] is SampleFilter


def test_drop_by_condition_over_a_whole_batch_without_touching_inputs():
    f, errors = make(DropFilter, condition='path =~ "^/(health|ready)$" or $.http.agent.name == "kube-probe"')
    b = batch(RECORDS)
    before = copy.deepcopy(b.events)
    out = f.process(b)
    assert records(out) == [RECORDS[1], RECORDS[2], RECORDS[3]]
    assert [t for t, _ in out.events] == [1001, 1002, 1003] and out.tag == "app.web" and out.source == "src"
    assert b.events == before and errors.calls == [] and f.dropped == 2


def test_drop_nested_and_missing_fields():
    f, _ = make(DropFilter, condition="$.http.status >= 500")
    assert records(f.process(batch(RECORDS))) == [RECORDS[0], RECORDS[2], RECORDS[3], RECORDS[4]]
    f, _ = make(DropFilter, condition="not exists($.http.status)")
    assert records(f.process(batch(RECORDS))) == [RECORDS[0], RECORDS[1], RECORDS[4]]


def test_drop_returns_the_batch_itself_or_none():
    f, _ = make(DropFilter, condition='path == "/nothing"')
    b = batch(RECORDS)
    assert f.process(b) is b
    f, _ = make(DropFilter, condition="exists(path) or exists(http)")
    assert f.process(b) is None


def test_drop_a_record_that_is_not_a_table_goes_to_the_error_path_alone():
    f, errors = make(DropFilter, condition='path == "/health"')
    out = f.process(Batch("t", [(1, {"path": "/api"}), (2, ["not", "a", "dict"]), (3, {"path": "/health"})]))
    assert records(out) == [{"path": "/api"}]
    assert len(errors.calls) == 1 and errors.calls[0][:3] == ("f", "t", ["not", "a", "dict"])


def test_drop_condition_errors_are_option_errors():
    with pytest.raises(ValueError, match="column 6"):
        DropFilter.OPTIONS["condition"].check("path = 1")


def test_grep_condition_keeps_what_it_is_true_for():
    f, _ = make(GrepFilter, condition='$.http.status == 200 and path != "/health"')
    assert records(f.process(batch(RECORDS))) == [RECORDS[4]]


def test_grep_condition_excludes_field_and_regexes():
    assert GrepFilter.check_options({"condition": "a == 1", "field": "x", "include": "y", "exclude": None}) == [
        "condition: set either condition or field with include/exclude, not both"
    ]
    assert GrepFilter.check_options({"condition": None, "field": None, "include": "y", "exclude": None}) == [
        "field: required key is missing (or set condition)"
    ]
    assert GrepFilter.check_options({"condition": "a == 1", "field": None, "include": None, "exclude": None}) == []


# --- sample ------------------------------------------------------------------------------------


def many(n, t0=10**18, **extra):
    return [(t0 + i * 1000, {"i": i, "trace": f"t{i % 37}", **extra}) for i in range(n)]


def test_sample_keeps_one_in_n_of_a_batch_and_is_deterministic():
    f, _ = make(SampleFilter, rate=10)
    b = Batch("t", many(1000))
    out = f.process(b)
    assert len(out) == 100
    kept = [r["i"] for r in records(out)]
    assert all(b - a == 10 for a, b in zip(kept, kept[1:]))
    g, _ = make(SampleFilter, rate=10)  # another process, a replay: the same choice
    assert [r["i"] for r in records(g.process(Batch("t", many(1000))))] == kept
    assert f.dropped == 900


def test_sample_small_batches_keep_about_one_in_n_overall():
    f, _ = make(SampleFilter, rate=10)
    kept = sum(len(f.process(Batch("t", many(1, t0=10**18 + i * 7919))) or []) for i in range(5000))
    assert 350 < kept < 650


def test_sample_keyed_keeps_a_keys_events_together_across_batches():
    f, _ = make(SampleFilter, rate=4, key=["trace"])
    kept = set()
    dropped = set()
    for n in range(5):
        events = many(200, t0=10**18 + n)
        out = f.process(Batch("t", events))
        got = {r["trace"] for r in records(out)}
        kept |= got
        dropped |= {r["trace"] for _, r in events} - got
    assert kept and dropped and not kept & dropped
    assert 4 <= len(kept) <= 16  # about a quarter of 37 keys


def test_sample_keyed_by_nested_and_missing_fields():
    f, _ = make(SampleFilter, rate=2, key=["$.ctx.user", "host"])
    events = [(i, {"ctx": {"user": f"u{i % 5}"}, "host": "h"}) for i in range(100)] + [(i, {}) for i in range(10)]
    out = records(f.process(Batch("t", events)))
    users = {r.get("ctx", {}).get("user") for r in out}
    for user in users - {None}:
        assert sum(1 for r in out if r.get("ctx", {}).get("user") == user) == 20
    missing = [r for r in out if not r]
    assert len(missing) in (0, 10)  # the records without the key are one key


def test_sample_with_a_condition_samples_only_what_it_selects():
    f, _ = make(SampleFilter, rate=10, condition='level == "debug"', rate_field="$.sample.rate")
    events = [(10**18 + i, {"i": i, "level": "debug" if i % 2 else "info"}) for i in range(2000)]
    b = Batch("t", events)
    before = copy.deepcopy(events)
    out = records(f.process(b))
    infos = [r for r in out if r["level"] == "info"]
    debugs = [r for r in out if r["level"] == "debug"]
    assert len(infos) == 1000 and all("sample" not in r for r in infos)
    assert len(debugs) == 100 and all(r["sample"] == {"rate": 10} for r in debugs)
    assert [r["i"] for r in out] == sorted(r["i"] for r in out)  # order kept
    assert b.events == before


def test_sample_rate_one_keeps_everything():
    f, _ = make(SampleFilter, rate=1)
    b = Batch("t", many(10))
    assert f.process(b) is b


@pytest.mark.parametrize("condition", [None, "i >= 0"])
def test_sample_a_rate_field_blocked_by_a_scalar_costs_only_that_event(condition):
    # `$.m.k` cannot be set where `m` holds a bool: that event goes to the error path with
    # the reason (as `set` does), the others are kept and marked; before, the whole batch
    # failed out of `process`.
    options = {"condition": condition} if condition else {}
    f, errors = make(SampleFilter, rate=1, rate_field="$.m.k", **options)
    out = f.process(Batch("t", [(1, {"i": 0, "m": True}), (2, {"i": 1, "m": {"a": 1}}), (3, {"i": 2})]))
    assert records(out) == [{"i": 1, "m": {"a": 1, "k": 1}}, {"i": 2, "m": {"k": 1}}]
    assert [(call[1], call[2]) for call in errors.calls] == [("t", {"i": 0, "m": True})]
    assert "'m' holds a bool" in errors.calls[0][3]
    assert f.dropped == 0  # sent to the error path, not sampled out


def test_sample_records_that_are_not_tables_go_to_the_error_path():
    f, errors = make(SampleFilter, rate=1, key=["a"])
    out = f.process(Batch("t", [(1, {"a": 1}), (2, "text")]))
    assert records(out) == [{"a": 1}] and errors.calls[0][2] == "text"


def test_sample_a_blocked_rate_field_in_a_condition_s_subset_costs_only_that_event():
    f, errors = make(SampleFilter, rate=1, rate_field="$.m.k", condition="i < 2")
    out = f.process(Batch("t", [(1, {"i": 0, "m": True}), (2, {"i": 1}), (3, {"i": 5, "m": True})]))
    assert records(out) == [{"i": 1, "m": {"k": 1}}, {"i": 5, "m": True}]  # i=5 is not sampled: untouched
    assert [call[2] for call in errors.calls] == [{"i": 0, "m": True}] and f.dropped == 0

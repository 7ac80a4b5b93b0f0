"""Tests for the match, grep, set, remove and rename filters."""

from __future__ import annotations

import copy
import time

import pytest

from logrouter import registry
from logrouter.batch import Batch
from logrouter.filters.fields import RemoveFilter, RenameFilter, SetFilter, parse_field_path
from logrouter.filters.grep import GrepFilter
from logrouter.filters.match import MatchFilter, compile_tag_pattern


class Errors:
    """An error path that remembers what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, object, str]] = []

    def __call__(self, component: str, tag: str, record: object, reason: str) -> None:
        self.calls.append((component, tag, record, reason))


def make(cls, **options):
    """A filter with its option defaults filled in, as the config validator would."""
    for key, option in cls.OPTIONS.items():
        if key not in options and not option.required:
            options[key] = option.default
    errors = Errors()
    return cls("f", options, errors), errors


def batch(*records, tag="app.web"):
    return Batch(tag, [(1000 + i, r) for i, r in enumerate(records)], source="src")


def records(result):
    return [] if result is None else [r for _, r in result.events]


def check_error(cls, key, value):
    with pytest.raises(ValueError) as info:
        cls.OPTIONS[key].check(value)
    return str(info.value)


class Unprintable:
    def __str__(self):
        raise RuntimeError("no str for you")


def test_registered():
    for name, cls in [("match", MatchFilter), ("grep", GrepFilter), ("set", SetFilter),
                      ("remove", RemoveFilter), ("rename", RenameFilter)]:
        assert registry.FILTERS[name] is cls


# --- match ----------------------------------------------------------------------------------

GLOBS = [
    ("a.*", ["a.b", "a.xyz"], ["a", "a.b.c", "ab", "b.a"]),
    ("a.**", ["a", "a.b", "a.b.c"], ["ab", "b", "b.a"]),
    ("**", ["a", "a.b.c", ""], []),
    ("*.b", ["a.b", "x.b"], ["b", "a.c.b", "a.bc"]),
    ("**.b", ["b", "a.b", "a.c.b"], ["ab", "b.a"]),
    ("a.**.b", ["a.b", "a.x.b", "a.x.y.b"], ["ab", "a.xb", "a.b.c"]),
    ("{a,b}.c", ["a.c", "b.c"], ["c", "ab.c", "a.b.c", "a.c.d"]),
    ("a.{b,c.*}", ["a.b", "a.c.d"], ["a.c", "a.b.d", "a.c.d.e", "a"]),
    ("x.{**.a,b}", ["x.a", "x.y.a", "x.b"], ["x", "x.y.b"]),
    ("a.b", ["a.b"], ["aXb", "a.b.c", "a"]),
    ("a+b", ["a+b"], ["aab", "ab"]),
    ("a.b(c)?$", ["a.b(c)?$"], ["a.b", "a.bc"]),
    ("app.web*", ["app.web", "app.web2"], ["app.we", "app.web.2"]),
    (r"a\*", ["a*"], ["ab"]),
    (r"a\{b\}", ["a{b}"], ["ab"]),
]


@pytest.mark.parametrize("pattern,yes,no", GLOBS)
def test_glob(pattern, yes, no):
    matches = compile_tag_pattern(pattern)
    for tag in yes:
        assert matches(tag), (pattern, tag)
    for tag in no:
        assert not matches(tag), (pattern, tag)


def test_glob_cache_gives_same_answers_and_stays_bounded():
    from logrouter.filters import match

    matches = compile_tag_pattern("a.*")
    for i in range(match.TAG_CACHE_SIZE * 3):
        assert matches(f"a.{i}")
        assert not matches(f"b.{i}")
    assert matches("a.x") and not matches("a")


@pytest.mark.parametrize("tag", ["app.** sys.*", ["app.**", "sys.*"], ["app.**  ", " sys.* "]])
def test_match_several_patterns(tag):
    f, errors = make(MatchFilter, tag=tag)
    for t in ["app", "app.web.1", "sys.kern"]:
        b = batch({"x": 1}, tag=t)
        assert f.process(b) is b
    for t in ["sys", "sys.kern.1", "other"]:
        assert f.process(batch({"x": 1}, tag=t)) is None
    assert errors.calls == []


@pytest.mark.parametrize("bad,message", [
    ("", "at least one"),
    ("   ", "at least one"),
    ([], "at least one"),
    ("a.{b,c", "'{' without '}'"),
    ("a.b}", "'}' without '{'"),
    ("{a,{b,c}", "'{' without '}'"),
    ("a\\", "lone backslash"),
    (["a.*", 3], "item 1 must be a string"),
])
def test_match_invalid_patterns_rejected(bad, message):
    assert message in check_error(MatchFilter, "tag", bad)


def test_match_nested_braces_valid():
    MatchFilter.OPTIONS["tag"].check("{a,{b,c}.d}.e")
    matches = compile_tag_pattern("{a,{b,c}.d}.e")
    assert matches("a.e") and matches("c.d.e") and not matches("c.e")


# --- grep -----------------------------------------------------------------------------------


def test_grep_include():
    f, errors = make(GrepFilter, field="msg", include="err(or)?")
    b = batch({"msg": "an error"}, {"msg": "fine"}, {"msg": "err"}, {"other": "error"})
    out = f.process(b)
    assert records(out) == [{"msg": "an error"}, {"msg": "err"}]
    assert out.tag == b.tag and out.source == "src"
    assert [t for t, _ in out.events] == [1000, 1002]  # times travel with their records
    assert errors.calls == []


def test_grep_exclude_and_missing_field_passes():
    f, _ = make(GrepFilter, field="level", exclude="^debug$")
    b = batch({"level": "debug"}, {"level": "info"}, {"msg": "no level"}, {"level": None})
    assert records(f.process(b)) == [{"level": "info"}, {"msg": "no level"}, {"level": None}]


def test_grep_missing_or_null_field_fails_include():
    f, _ = make(GrepFilter, field="level", include=".*")
    assert f.process(batch({"msg": "x"}, {"level": None})) is None


def test_grep_both():
    f, _ = make(GrepFilter, field="path", include="^/api/", exclude="health")
    b = batch({"path": "/api/users"}, {"path": "/api/health"}, {"path": "/static/x"}, {})
    assert records(f.process(b)) == [{"path": "/api/users"}]


def test_grep_whole_batch_passing_is_returned_as_is_and_nothing_passing_is_none():
    f, _ = make(GrepFilter, field="msg", include="x")
    b = batch({"msg": "x1"}, {"msg": "x2"})
    assert f.process(b) is b
    assert f.process(batch({"msg": "y"})) is None
    assert f.process(batch()) is None


def test_grep_non_string_values():
    f, _ = make(GrepFilter, field="v", include="^(5\\d\\d|true|1\\.5|caf\u00e9|\\[1, 2\\])$")
    b = batch({"v": 503}, {"v": 200}, {"v": True}, {"v": False}, {"v": 1.5},
              {"v": "caf\u00e9".encode()}, {"v": b"\xff"}, {"v": [1, 2]})
    assert records(f.process(b)) == [{"v": 503}, {"v": True}, {"v": 1.5},
                                     {"v": "caf\u00e9".encode()}, {"v": [1, 2]}]


@pytest.mark.parametrize("field", ["$.http.status", "$['http']['status']", '$["http"].status'])
def test_grep_nested_path(field):
    f, _ = make(GrepFilter, field=field, include="^5")
    b = batch({"http": {"status": 500}}, {"http": {"status": 200}}, {"http": "flat"}, {"http": None}, {})
    assert records(f.process(b)) == [{"http": {"status": 500}}]


def test_grep_array_index_and_dotted_top_level_key():
    f, _ = make(GrepFilter, field="$.tags[-1]", include="^prod$")
    assert records(f.process(batch({"tags": ["a", "prod"]}, {"tags": []}, {"tags": "prod"}))) == [
        {"tags": ["a", "prod"]}
    ]
    f, _ = make(GrepFilter, field="k8s.pod", include="web")  # no "$": a plain key, dots and all
    assert records(f.process(batch({"k8s.pod": "web-1"}, {"k8s": {"pod": "web-1"}}))) == [{"k8s.pod": "web-1"}]


def test_grep_failing_records_go_to_error_path_others_kept():
    f, errors = make(GrepFilter, field="msg", include="ok")
    bad_value = {"msg": Unprintable()}
    b = batch({"msg": "ok 1"}, bad_value, ["not", "a", "dict"], {"msg": "ok 2"})
    assert records(f.process(b)) == [{"msg": "ok 1"}, {"msg": "ok 2"}]
    assert [(c, t, r) for c, t, r, _ in errors.calls] == [
        ("f", "app.web", bad_value), ("f", "app.web", ["not", "a", "dict"])
    ]
    assert "no str for you" in errors.calls[0][3]


def test_grep_option_checks():
    assert "not a valid regular expression" in check_error(GrepFilter, "include", "a(b")
    assert "not a valid regular expression" in check_error(GrepFilter, "exclude", "[")
    assert "cannot parse field path" in check_error(GrepFilter, "field", "$.a..b")
    assert "must not be empty" in check_error(GrepFilter, "field", "")
    assert GrepFilter.check_options({"field": "x", "include": None, "exclude": None}) == [
        "include or exclude must be set"
    ]
    assert GrepFilter.check_options({"field": "x", "include": "a", "exclude": None}) == []
    with pytest.raises(ValueError):
        make(GrepFilter, field="x")


def test_grep_cost_per_event():
    """Not a timing assertion: prints µs/event (see with -s) and checks the result."""
    f, _ = make(GrepFilter, field="level", include="^(error|warn)$")
    levels = ["info", "debug", "warn", "error"]
    events = [(i, {"level": levels[i % 4], "msg": "request served", "n": i}) for i in range(100_000)]
    b = Batch("app", events)
    f.process(b)  # warm up
    start = time.perf_counter()
    out = f.process(b)
    elapsed = time.perf_counter() - start
    assert len(out) == 50_000
    print(f"\ngrep: {elapsed / 100_000 * 1e6:.3f} µs/event over 100k events")


# --- set ------------------------------------------------------------------------------------


def test_set_values_and_placeholders():
    f, errors = make(SetFilter, fields={
        "env": "prod",
        "n": 3,
        "ok": True,
        "list": [1, "${tag_parts[0]}"],
        "table": {"t": "${tag}"},
        "where": "${tag_parts[0]}/${tag_parts[-1]}/${tag_parts[1]}",
        "beyond": "[${tag_parts[5]}${tag_parts[-9]}]",
        "level": "overwritten",
    })
    out = f.process(batch({"msg": "hi", "level": "info"}, tag="app.web.eu"))
    assert records(out) == [{
        "msg": "hi", "level": "overwritten", "env": "prod", "n": 3, "ok": True,
        "list": [1, "app"], "table": {"t": "app.web.eu"}, "where": "app/eu/web", "beyond": "[]",
    }]
    # Placeholders are resolved for each batch's tag.
    assert records(f.process(batch({}, tag="sys")))[0]["where"] == "sys/sys/"
    assert errors.calls == []


def test_set_does_not_mutate_input():
    f, _ = make(SetFilter, fields={"a": 1, "$.n.x": 2})
    original = [{"a": 0, "n": {"x": 0, "y": 0}}, {"b": 1}]
    b = batch(*original)
    events_before, snapshot = list(b.events), copy.deepcopy(original)
    out = f.process(b)
    assert records(out) == [{"a": 1, "n": {"x": 2, "y": 0}}, {"b": 1, "a": 1, "n": {"x": 2}}]
    assert b.events == events_before and original == snapshot


def test_set_nested_into_non_table_goes_to_error_path():
    f, errors = make(SetFilter, fields={"$.n.x": 1})
    b = batch({"n": "scalar"}, {"n": {}}, 42)
    assert records(f.process(b)) == [{"n": {"x": 1}}]
    assert [r for _, _, r, _ in errors.calls] == [{"n": "scalar"}, 42]


@pytest.mark.parametrize("bad,message", [
    ({}, "at least one"),
    ({"a": "${tags}"}, "unknown placeholder '${tags}'"),
    ({"a": ["${tag_parts[x]}"]}, "unknown placeholder"),
    ({"a": {"b": "${hostname}"}}, "unknown placeholder"),
    ({"a": 1, "$.a.b": 2}, "'a' and a field inside it, '$.a.b', are both set"),
    ({"a": 1, "$['a']": 2}, "set the same field"),
    ({"$.a[0]": 1}, "array indexes"),
    ({"$.": 1}, "cannot parse"),
])
def test_set_option_checks(bad, message):
    assert message in check_error(SetFilter, "fields", bad)


# --- remove ---------------------------------------------------------------------------------


def test_remove_top_level_and_nested():
    f, errors = make(RemoveFilter, fields=["secret", "$.http.headers.cookie", "$['k']['gone']"])
    untouched = {"msg": "keep me"}
    original = [
        {"msg": "x", "secret": "s", "http": {"headers": {"cookie": "c", "host": "h"}, "status": 200}},
        untouched,
        {"http": "flat", "k": {"gone": 1, "kept": 2}},
    ]
    snapshot = copy.deepcopy(original)
    b = batch(*original)
    out = f.process(b)
    assert records(out) == [
        {"msg": "x", "http": {"headers": {"host": "h"}, "status": 200}},
        {"msg": "keep me"},
        {"http": "flat", "k": {"kept": 2}},
    ]
    assert out.events[1][1] is untouched  # unchanged records are not copied
    assert original == snapshot
    assert errors.calls == []


def test_remove_non_dict_record_goes_to_error_path():
    f, errors = make(RemoveFilter, fields=["a"])
    assert records(f.process(batch({"a": 1, "b": 2}, "text"))) == [{"b": 2}]
    assert [r for _, _, r, _ in errors.calls] == ["text"]


@pytest.mark.parametrize("bad,message", [
    ([], "at least one"), ([1], "item 0 must be a string"), (["$.a[1]"], "array indexes"), ([""], "empty"),
])
def test_remove_option_checks(bad, message):
    assert message in check_error(RemoveFilter, "fields", bad)


# --- rename ---------------------------------------------------------------------------------


def test_rename_overwrite_missing_and_swap():
    f, errors = make(RenameFilter, fields={"msg": "message", "lvl": "level"})
    original = [{"msg": "a", "message": "old", "x": 1}, {"lvl": "info"}, {"other": 1}]
    snapshot = copy.deepcopy(original)
    out = f.process(batch(*original))
    assert records(out) == [{"x": 1, "message": "a"}, {"level": "info"}, {"other": 1}]
    assert out.events[2][1] is original[2]
    assert original == snapshot and errors.calls == []

    swap, _ = make(RenameFilter, fields={"a": "b", "b": "a"})
    assert records(swap.process(batch({"a": 1, "b": 2}))) == [{"b": 1, "a": 2}]


def test_rename_non_dict_record_goes_to_error_path():
    f, errors = make(RenameFilter, fields={"a": "b"})
    assert records(f.process(batch(None, {"a": 1}))) == [{"b": 1}]
    assert [r for _, _, r, _ in errors.calls] == [None]


@pytest.mark.parametrize("bad,message", [
    ({}, "at least one"),
    ({"a": 1}, "non-empty string"),
    ({"a": ""}, "non-empty string"),
    ({"a": "c", "b": "c"}, "both renamed to 'c'"),
    ({"$.a.b": "c"}, "top-level"),
])
def test_rename_option_checks(bad, message):
    assert message in check_error(RenameFilter, "fields", bad)


# --- field paths ----------------------------------------------------------------------------


@pytest.mark.parametrize("text,path", [
    ("level", ("level",)),
    ("a.b", ("a.b",)),
    ("$.a", ("a",)),
    ("$.a.b", ("a", "b")),
    ("$['a']['b.c']", ("a", "b.c")),
    ('$["a"][0].b', ("a", 0, "b")),
    ("$.a[-1]", ("a", -1)),
])
def test_parse_field_path(text, path):
    assert parse_field_path(text) == path


@pytest.mark.parametrize("text", ["", "$", "$.", "$a", "$[0]", "$.a[x]", "$['a'", "$.a..b"])
def test_parse_field_path_rejects(text):
    with pytest.raises(ValueError):
        parse_field_path(text)

"""Filters on packed forward batches give exactly what they give on records.

For entries hypothesis draws and pipelines of ``grep`` / ``set`` / ``remove`` /
``rename`` / ``match`` / ``sample``, the batch that went through the pipeline still packed
(``logrouter.filters.columnar``) holds the same events as the batch of decoded records
that went through it, and the lake's table built natively from the packed result
equals the one built from those events. Unit tests pin which cases stay packed and
which fall back to records. Skipped where the extension is not installed.
"""

from __future__ import annotations

from array import array

import msgpack
import pytest
from fuzz_helpers import fuzz_settings, mutated
from hypothesis import given
from hypothesis import strategies as st
from test_native_table import HOUR, NOW, assert_same_tables, entries_of, same_events

from logrouter.batch import Batch
from logrouter.filters.drop import DropFilter
from logrouter.filters.fields import RemoveFilter, RenameFilter, SetFilter
from logrouter.filters.grep import GrepFilter
from logrouter.filters.match import MatchFilter
from logrouter.filters.route import RouteFilter
from logrouter.filters.sample import SampleFilter
from logrouter.lake.convert import TableBuilder
from logrouter.lake.native_table import PendingRows, build_table, file_schema_of
from logrouter.lake.schema import ColumnTypes, file_schema
from logrouter.native import NATIVE, describe
from logrouter.wire.fluent_forward import decode_entries
from logrouter.wire.forward_lazy import PackedEvents, lazy_events

pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"native decoding off: {describe()}")

TAG = "app.web.eu"


class Errors:
    def __init__(self) -> None:
        self.calls: list = []

    def __call__(self, component, tag, record, reason) -> None:
        self.calls.append((component, tag, record, reason))


def make(cls, **options):
    for key, option in cls.OPTIONS.items():
        if key not in options and not option.required:
            options[key] = option.default
    return cls("f", options, Errors())


names = st.sampled_from(["a", "b", "msg", "n", "m", "x.y", "é"])
texts = st.sampled_from(["", "error", "ok 200", "Error: é", "a\nb", "true", "12", "x"]) | st.text(max_size=5)
scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.integers(-3, 300) | texts | st.binary(max_size=4)
values = scalars | st.floats(allow_nan=False) | st.dictionaries(st.sampled_from(["k", "j"]), scalars, max_size=2) | st.lists(scalars, max_size=2)
records = st.dictionaries(names, values, max_size=5)
times = st.sampled_from([NOW, NOW + 1, NOW + HOUR, NOW - 5])
events_lists = st.lists(st.tuples(times, records), min_size=1, max_size=10)

patterns = st.sampled_from(["e", "^e", "0$", "(?i)ERROR", "[0-9]+", "^$", "é", "true", r"\d\s?", "a.b", "(?s)a.b", "^ok 200$"])
set_values = (
    scalars | st.floats(allow_nan=False) | st.lists(scalars, max_size=2)
    | st.sampled_from(["${tag}", "${tag_parts[1]}-x", "${tag_parts[-9]}"])
)
filters = st.one_of(
    st.builds(lambda f, i, e: (GrepFilter, dict(field=f, include=i, exclude=e)),
              st.sampled_from(["a", "msg", "n", "$.m.k", "$.m.j", "é"]), patterns | st.none(), patterns | st.none())
    .filter(lambda spec: spec[1]["include"] is not None or spec[1]["exclude"] is not None),
    st.builds(lambda fields: (SetFilter, dict(fields=fields)), st.dictionaries(names | st.just("$.m.k"), set_values, min_size=1, max_size=3)
              .filter(lambda d: not ("m" in d and "$.m.k" in d))),
    st.builds(lambda fields: (RemoveFilter, dict(fields=fields)), st.lists(names | st.just("$.m.k"), min_size=1, max_size=3)),
    st.builds(lambda fields: (RenameFilter, dict(fields=fields)),
              st.dictionaries(names.filter(lambda n: n != "x.y"), names, min_size=1, max_size=3)
              .filter(lambda d: len(set(d.values())) == len(d))),
    st.builds(lambda tag: (MatchFilter, dict(tag=tag)), st.sampled_from(["app.**", "other.*"])),
    st.builds(lambda rate, field: (SampleFilter, dict(rate=rate, rate_field=field)),
              st.integers(1, 4), st.sampled_from(["", "n", "w", "$.q.k"])),
)
fields_ = st.sampled_from(["a", "msg", "n", "$.m.k", "$.m", "$['é']", "$.m[0]"])
literals = st.sampled_from(['"error"', '""', "0", "1", "-3", "12", "2.5", "true", "false", "null", "9007199254740993", '"é"'])
tests_ = st.one_of(
    st.builds("{} {} {}".format, fields_, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), literals)
    .filter(lambda t: not (t.split()[1] in "<<=>>=" and t.split()[2] in ("true", "false", "null"))),
    st.builds("{} {} {}".format, literals.filter(lambda v: v not in ("true", "false", "null")), st.sampled_from(["<", ">="]), fields_),
    st.builds('{} {} "{}"'.format, fields_, st.sampled_from(["=~", "!~"]), patterns),
    st.builds("exists({})".format, fields_),
    st.builds("{} in [{}, {}]".format, fields_, *[st.sampled_from(['"error"', "1", "2.5", '"x"', "12"])] * 2),
)
conditions_ = st.recursive(
    tests_, lambda inner: st.builds("({}) and ({})".format, inner, inner) | st.builds("({}) or ({})".format, inner, inner)
    | st.builds("not ({})".format, inner), max_leaves=3,
)
filters = st.one_of(
    filters,
    st.builds(lambda c: (DropFilter, dict(condition=c)), conditions_),
    st.builds(lambda c: (GrepFilter, dict(condition=c)), conditions_),
    st.builds(lambda rate, c: (SampleFilter, dict(rate=rate, condition=c)), st.integers(1, 3), conditions_),
)
pipelines = st.lists(filters, min_size=1, max_size=4)
routes = st.dictionaries(st.sampled_from(["x", "y", "z"]), conditions_, min_size=1, max_size=3)


def run(pipeline, batch: Batch) -> Batch | None:
    for cls, options in pipeline:
        batch = make(cls, **dict(options)).process(batch)
        if batch is None:
            return None
    return batch


def both(events, pipeline):
    """(packed result, record result) of a pipeline, or None if not packed at all."""
    entries = entries_of(events)
    packed = lazy_events(entries, NOW)
    if packed is None:
        return None
    reference, _ = decode_entries(entries, NOW)
    return run(pipeline, Batch(TAG, packed, "forward")), run(pipeline, Batch(TAG, reference, "forward"))


def lake_tables(packed_events, columns):
    """(native table, table built from the decoded events) of one row group."""
    native_types, python_types = ColumnTypes(columns), ColumnTypes(columns)
    pending = PendingRows()
    for _, group in packed_events.split_by_hour():
        pending.extend(group)
    decoded = pending.events()
    native_schema = file_schema_of(native_types, pending, {})
    inferred: dict = {}
    python_schema = file_schema(python_types, [record for _, record in decoded], inferred)
    assert native_schema == python_schema
    native = build_table(TableBuilder(native_schema, native_types), pending)
    python = TableBuilder(python_schema, python_types).build(decoded, inferred)
    assert native_types.items() == python_types.items()
    return native, python


@fuzz_settings(max_examples=250)
@given(events_lists, pipelines, st.dictionaries(st.sampled_from(["a", "msg", "n"]), st.sampled_from(["int", "string", "float"]), max_size=2))
def test_a_pipeline_gives_the_same_events_and_rows_packed_as_on_records(events, pipeline, columns) -> None:
    found = both(events, pipeline)
    if found is None:
        return
    packed, records = found
    assert (packed is None) == (records is None)
    if packed is None:
        return
    assert same_events(list(packed.events), list(records.events))
    if type(packed.events) is PackedEvents:
        assert_same_tables(*lake_tables(packed.events, columns))


@fuzz_settings(max_examples=150)
@given(events_lists, pipelines, routes, st.booleans())
def test_route_splits_packed_batches_as_records(events, pipeline, routes, first_match) -> None:
    found = both(events, pipeline)
    if found is None or found[0] is None:
        return
    packed, records = found
    route = dict(routes=routes, first_match=first_match)
    split, reference = make(RouteFilter, **route).process(packed), make(RouteFilter, **route).process(records)
    assert list(split) == list(reference)
    for name, part in split.items():
        assert same_events(list(part.events), list(reference[name].events)), name


# --- which cases stay packed ----------------------------------------------------------------


def packed_batch(*records, times=None) -> Batch:
    events = [(NOW if times is None else times[i], record) for i, record in enumerate(records)]
    found = lazy_events(entries_of(events), NOW)
    assert found is not None
    return Batch(TAG, found, "forward")


def test_grep_set_remove_rename_keep_the_batch_packed() -> None:
    batch = packed_batch({"msg": "error: disk", "n": 1, "secret": "s"}, {"msg": "ok", "n": 2}, {"msg": "Error 5", "n": 3})
    pipeline = [
        (GrepFilter, dict(field="msg", include="(?i)^error")),
        (SetFilter, dict(fields={"env": "prod", "tag": "${tag}"})),
        (RemoveFilter, dict(fields=["secret"])),
        (RenameFilter, dict(fields={"n": "count"})),
    ]
    out = run(pipeline, batch)
    assert type(out.events) is PackedEvents and out.events._events is None  # nothing decoded
    assert [r for _, r in out.events] == [
        {"msg": "error: disk", "env": "prod", "tag": TAG, "count": 1},
        {"msg": "Error 5", "env": "prod", "tag": TAG, "count": 3},
    ]
    assert batch.events._events is None  # the input batch was never decoded either


def test_drop_grep_and_route_conditions_keep_the_batch_packed() -> None:
    batch = packed_batch({"level": "error", "ms": 1500, "http": {"path": "/health"}}, {"level": "info", "ms": 3},
                         {"level": "debug", "ms": 2.5, "http": {"path": "/api"}})
    out = make(DropFilter, condition='$.http.path =~ "^/health" or level == "debug"').process(batch)
    assert type(out.events) is PackedEvents and [r["ms"] for _, r in out.events] == [3]
    out = make(GrepFilter, condition='ms > 2 and not exists($.http)').process(batch)
    assert type(out.events) is PackedEvents and [r["ms"] for _, r in out.events] == [3]
    split = make(RouteFilter, routes={"slow": "ms >= 1000", "errors": 'level in ["error", "fatal"]'}, first_match=True).process(batch)
    assert {name: [r["ms"] for _, r in part.events] for name, part in split.items()} == {"slow": [1500], "_unmatched": [3, 2.5]}
    assert all(type(part.events) is PackedEvents for part in split.values())
    assert batch.events._events is None


def test_sample_decodes_only_the_ends_and_keeps_the_batch_packed() -> None:
    batch = packed_batch(*({"n": i, "msg": "x" * i} for i in range(25)))
    out = make(SampleFilter, rate=4, rate_field="weight").process(batch)
    assert type(out.events) is PackedEvents and batch.events._events is None
    reference = make(SampleFilter, rate=4, rate_field="weight").process(Batch(TAG, list(batch.events), "forward"))
    assert list(out.events) == reference.events and all(r["weight"] == 4 for _, r in reference.events)
    assert len(reference.events) in (6, 7)
    batch = packed_batch(*({"n": i, "msg": "x" * i} for i in range(25)))  # not decoded yet
    debug = make(SampleFilter, rate=3, condition="n >= 10").process(batch)
    assert type(debug.events) is PackedEvents and batch.events._events is None
    assert [r["n"] for _, r in debug.events][:10] == list(range(10)) and len(debug.events) in (15, 16)


def test_grep_on_ints_bools_and_a_nested_key_stays_packed() -> None:
    batch = packed_batch({"n": 200, "m": {"k": True}}, {"n": -4, "m": {"k": False}}, {"m": "flat"}, {"n": None})
    out = make(GrepFilter, field="n", include="^2").process(batch)
    assert type(out.events) is PackedEvents and [r["n"] for _, r in out.events] == [200]
    out = make(GrepFilter, field="$.m.k", exclude="true").process(batch)
    assert type(out.events) is PackedEvents and len(out.events) == 3


@pytest.mark.parametrize(
    "filter_",
    [
        (GrepFilter, dict(field="f", include="1")),  # a float's text is Python's
        (GrepFilter, dict(field="d", include="k")),  # so is a table's
        (GrepFilter, dict(condition='f =~ "1"')),  # a float's text, in a condition too
        (DropFilter, dict(condition='$.d[0] == 1')),  # a path with an index
        (DropFilter, dict(condition='f == 9007199254740993')),  # an int a float64 cannot hold
        (SetFilter, dict(fields={"$.d.z": 1})),  # a path into a table
        (RemoveFilter, dict(fields=["$.d.k"])),
    ],
)
def test_what_needs_record_values_reads_records(filter_) -> None:
    batch = packed_batch({"f": 1.5, "d": {"k": 1}}, {"f": 2.0, "d": {"k": 2}})
    cls, options = filter_
    out = make(cls, **options).process(batch)
    assert batch.events._events is not None  # decoded: the filter read records
    reference = make(cls, **options).process(Batch(TAG, list(batch.events), "forward"))
    assert list(out.events) == reference.events


def test_a_toml_date_set_reads_records() -> None:
    import datetime

    out = make(SetFilter, fields={"when": datetime.date(2026, 1, 2)}).process(packed_batch({"a": 1}))
    assert type(out.events) is list and out.events[0][1]["when"] == datetime.date(2026, 1, 2)


def test_a_regex_arrow_refuses_falls_back_to_records() -> None:
    batch = packed_batch({"msg": "aa"}, {"msg": "b"})
    # google-re2 and Arrow's RE2 agree on this pattern's syntax; a refused one falls back.
    from logrouter.filters import columnar

    assert columnar.grep_selection(batch.events, ("msg",), "(", None) is None


def test_filtered_rows_across_hours_and_slices_are_the_same_as_decoded() -> None:
    batch = packed_batch(*({"msg": f"m{i}", "n": i} for i in range(6)),
                         times=[NOW, NOW + HOUR, NOW, NOW + HOUR, NOW + 2, NOW + HOUR])
    out = make(GrepFilter, field="n", exclude="^[03]$").process(batch)
    out = make(SetFilter, fields={"x": [1, "y"]}).process(out)
    expected = [(t, {**r, "x": [1, "y"]}) for t, r in list(batch.events) if r["n"] not in (0, 3)]
    assert list(out.events) == expected
    assert list(out.events[1:3]) == expected[1:3]
    groups: dict = {}
    for event in expected:  # hour groups in order of first appearance, as partition.split_by_hour
        groups.setdefault(event[0] // HOUR, []).append(event)
    assert [(b, list(g)) for b, g in out.events.split_by_hour()] == list(groups.items())
    narrowed = out.events[1:3]
    assert msgpack.packb(list(narrowed)) == msgpack.packb(expected[1:3])


# --- the new native entry points, fuzzed -----------------------------------------------------

_edits = st.lists(
    st.sampled_from([
        (1, [(b"a", msgpack.packb("x")), (b"z", msgpack.packb({"k": [1, None]}))]),
        (1, [(b"b", b"\xc1")]),  # a set value outside the subset: the build says None
        (2, [(b"a", b""), (b"c", b"")]),
        (3, [(b"a", b"c"), (b"c", b"a")]),
    ]),
    max_size=3,
)


@fuzz_settings(max_examples=200)
@given(mutated(st.builds(entries_of, events_lists)), st.lists(st.integers(0, 12), max_size=6), _edits)
def test_damaged_entries_with_filters_never_crash_the_extension(entries, rows, edits) -> None:
    """Damaged blobs, selections past the end and odd edits: an answer or None, no crash."""
    selection = array("I", sorted(set(rows))).tobytes()
    piece = (entries, NOW, None, 0, 1 << 40)
    for filtered in (None, (selection, edits), (None, edits)):
        for schema in ([], [("a", 4), ("n", 2)]):
            NATIVE.build([piece], schema, True, None if filtered is None else [filtered])
        NATIVE.texts([piece], ["a"], None if filtered is None else [filtered])
        NATIVE.texts([piece], ["m", "k"], None if filtered is None else [filtered])
        NATIVE.values([piece], [["m", "k"], ["a"]], None if filtered is None else [filtered])
        NATIVE.entries_at(piece, sorted(set(rows)), filtered)


def test_a_set_value_outside_the_native_subset_reads_records() -> None:
    out = make(SetFilter, fields={"s": "\ud800"}).process(packed_batch({"a": 1}))
    assert type(out.events) is list and out.events[0][1] == {"a": 1, "s": "\ud800"}

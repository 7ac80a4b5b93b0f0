"""Which fields of which records go to ``_extra``: ``TableBuilder._collect_unknown``
works out a record shape's fields outside the schema once; the result must be the
per-record rule's (fields not in the schema, None left out, each record's own order)."""

from __future__ import annotations

import json

from fuzz_helpers import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
import pyarrow as pa

from logrouter.lake.convert import TableBuilder
from logrouter.lake.schema import ColumnTypes, file_schema

NAMES = ["a", "b", "c", "lines", "info"]
VALUES = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3), st.lists(st.integers(), max_size=2))


def builder(columns: dict) -> TableBuilder:
    types = ColumnTypes()
    return TableBuilder(file_schema(types, [columns], {}), types)


def per_record(records: list[dict], names: frozenset) -> dict[int, dict]:
    extras = {}
    for index, record in enumerate(records):
        fields = {k: v for k, v in record.items() if k not in names and v is not None}
        if fields:
            extras[index] = fields
    return extras


@fuzz_settings()
@given(st.lists(st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=5), max_size=30))
def test_the_fields_outside_the_schema_are_each_records_own_in_its_order(records):
    table = builder({"a": 1, "b": "x"})
    unknown = set().union(*records).difference(table._names)
    extras: dict = {}
    table._collect_unknown(records, unknown, extras)
    assert extras == per_record(records, table._names)
    assert [list(f) for f in extras.values()] == [list(f) for f in per_record(records, table._names).values()]


def test_records_of_one_shape_in_another_order_keep_theirs():
    table = builder({"a": 1})
    records = [{"a": 1, "lines": [1], "info": "x"}, {"info": "y", "a": 2, "lines": None}, {"lines": [2], "info": "z", "a": 3}]
    extras: dict = {}
    table._collect_unknown(records, {"lines", "info"}, extras)
    assert [list(f.items()) for f in extras.values()] == [[("lines", [1]), ("info", "x")], [("info", "y")], [("lines", [2]), ("info", "z")]]


def test_a_field_outside_the_schema_is_learned_from_its_first_scalar_value_only():
    table = builder({"a": 1})
    records = [{"a": 1, "host": {"name": "x"}, "n": [1]}, {"a": 2, "host": {"name": "y"}, "n": None}, {"a": 3, "n": "7"}]
    table._collect_unknown(records, {"host", "n"}, {})
    assert "host" not in table.types  # objects only: nothing to learn
    assert table.types.get("n") == pa.string()  # a list first, then its first scalar


def test_keys_equal_but_not_the_same_keep_each_records_own():
    # Forward records may have non-str keys: 1, 1.0 and True are equal as dict keys, so
    # their shapes share one entry; each record still keeps its own key object.
    table = builder({"a": 1})
    records = [{"a": 1, 1: "int"}, {"a": 2, True: "bool"}, {"a": 3, 1.0: "float"}]
    extras: dict = {}
    table._collect_unknown(records, {1}, extras)
    assert [type(k) for f in extras.values() for k in f] == [int, bool, float]


@fuzz_settings()
@given(st.lists(st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=5), min_size=1, max_size=30))
def test_build_puts_every_field_outside_the_schema_in_extra(records):
    # build skips the union of all keys when every record has exactly as many keys as
    # there are columns and holds all of them; a record that lacks a column and has
    # another field in its place has the same count and must still be caught.
    table = builder({"a": 1, "b": "x"})
    built = table.build([(0, r) for r in records])
    got = [None if text is None else json.loads(text) for text in built.column("_extra").to_pylist()]
    want = [None] * len(records)
    for index, fields in per_record(records, table._names).items():
        want[index] = fields
    for index, record in enumerate(records):  # values that do not fit their column go there too
        for name, kind in (("a", int), ("b", str)):
            value = record.get(name)
            if value is not None and type(value) is not kind:
                want[index] = {**(want[index] or {}), name: value}
    assert got == want


def test_a_record_missing_a_column_with_another_field_in_its_place():
    table = builder({"a": 1, "b": "x"})
    built = table.build([(0, {"a": 1, "b": "y"}), (0, {"a": 2, "c": 3})])
    assert built.column("_extra").to_pylist() == [None, '{"c":3}']
    assert built.column("b").to_pylist() == ["y", None]

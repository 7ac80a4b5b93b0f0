"""Schema rules of the lake: typed columns, the _extra catch-all, conflicts."""

from __future__ import annotations

import base64
import json
import math

import pyarrow as pa
import pytest

from logrouter.lake.convert import TableBuilder, time_column
from logrouter.lake.extra import MAX_DEPTH, TOO_DEEP, encode_extra, fix_text
from logrouter.lake.schema import (
    EXTRA,
    TIME,
    TIME_TYPE,
    ColumnTypes,
    file_schema,
    infer_column_type,
)

T0 = 1_700_000_000_123_456_789
BAD_TEXT = b"caf\xc3\xa9 \xff\xfe".decode("utf-8", "surrogateescape")  # 'café ' + 2 invalid bytes


def table_of(records, types=None, later=()):
    """Build a file the way the writer does: schema from the first rows, then tables."""
    types = types if types is not None else ColumnTypes()
    events = [(T0 + i, r) for i, r in enumerate(records)]
    inferred = {}
    schema = file_schema(types, records, inferred)
    builder = TableBuilder(schema, types)
    tables = [builder.build(events, inferred)]
    tables.extend(builder.build([(T0, r) for r in batch]) for batch in later)
    return pa.concat_tables(tables), types


def rows(table):
    return table.to_pylist()


def extra(row):
    return None if row[EXTRA] is None else json.loads(row[EXTRA])


def test_scalar_types_map_to_columns_and_time_is_utc_microseconds():
    table, _ = table_of([{"b": True, "i": 7, "f": 1.5, "s": "text", "y": b"\x00\x01"}])
    assert table.schema.names == [TIME, "b", "i", "f", "s", "y", EXTRA]
    assert [f.type for f in table.schema] == [
        TIME_TYPE, pa.bool_(), pa.int64(), pa.float64(), pa.string(), pa.binary(), pa.string()
    ]
    row = rows(table)[0]
    assert (row["b"], row["i"], row["f"], row["s"], row["y"]) == (True, 7, 1.5, "text", b"\x00\x01")
    assert row[EXTRA] is None
    # nanoseconds truncated to microseconds
    assert table.column(TIME).cast(pa.int64()).to_pylist() == [T0 // 1000]


def test_int_then_str_in_one_column_sends_the_str_to_extra():
    table, _ = table_of([{"a": 1}, {"a": "two"}, {"a": 3}])
    assert table.schema.field("a").type == pa.int64()
    got = rows(table)
    assert [r["a"] for r in got] == [1, None, 3]
    assert [extra(r) for r in got] == [None, {"a": "two"}, None]


def test_conflicting_value_in_a_later_row_group_goes_to_extra():
    table, _ = table_of([{"a": 1}], later=[[{"a": "x"}, {"a": 2}, {"a": 2.5}, {"a": True}]])
    got = rows(table)
    assert [r["a"] for r in got] == [1, None, 2, None, None]
    assert [extra(r) for r in got] == [None, {"a": "x"}, None, {"a": 2.5}, {"a": True}]


def test_ints_and_floats_together_make_a_float_column_and_ints_are_cast():
    table, _ = table_of([{"x": 1}, {"x": 2.5}], later=[[{"x": 3}], [{"x": 4}, {"x": 0.5}]])
    assert table.schema.field("x").type == pa.float64()
    assert table.column("x").to_pylist() == [1.0, 2.5, 3.0, 4.0, 0.5]
    assert table.column(EXTRA).null_count == len(table)


def test_float_in_int_column_is_not_truncated():
    table, _ = table_of([{"n": 1}], later=[[{"n": 1.5}, {"n": 2.0}]])
    got = rows(table)
    assert [r["n"] for r in got] == [1, None, None]
    assert [extra(r) for r in got][1:] == [{"n": 1.5}, {"n": 2.0}]


def test_bools_never_pass_as_numbers():
    # pyarrow infers [2.5, True] as double; the lake must not store 1.0.
    table, _ = table_of([{"f": 2.5, "i": 1}], later=[[{"f": 2.5, "i": 1}, {"f": True, "i": False}]])
    got = rows(table)
    assert [r["f"] for r in got] == [2.5, 2.5, None]
    assert [r["i"] for r in got] == [1, 1, None]
    assert extra(got[2]) == {"f": True, "i": False}


def test_bool_column_refuses_ints():
    table, _ = table_of([{"ok": True}, {"ok": 1}, {"ok": False}])
    assert table.schema.field("ok").type == pa.bool_()
    assert [r["ok"] for r in rows(table)] == [True, None, False]
    assert extra(rows(table)[1]) == {"ok": 1}


def test_nested_values_always_go_to_extra():
    record = {"msg": "m", "k8s": {"pod": "p", "labels": {"a": "b"}}, "tags": [1, "x", None]}
    table, _ = table_of([record, {"msg": "n", "k8s": "flat"}])
    assert "tags" not in table.schema.names
    # k8s: the first *scalar* value decides the type; the dict goes to _extra
    assert table.schema.field("k8s").type == pa.string()
    got = rows(table)
    assert extra(got[0]) == {"k8s": record["k8s"], "tags": record["tags"]}
    assert got[1]["k8s"] == "flat" and got[1][EXTRA] is None


@pytest.mark.parametrize("name", ["time", "_extra", "tag", "dt", "hour", "Time", "TAG", "Hour", "_EXTRA"])
def test_reserved_names_go_to_extra(name):
    table, _ = table_of([{name: 5, "other": 1}])
    assert table.schema.names == [TIME, "other", EXTRA]
    assert extra(rows(table)[0]) == {name: 5}


def test_names_equal_ignoring_case_get_one_column():
    # Spark resolves column names case-insensitively; two would be ambiguous.
    table, types = table_of([{"status": 200, "Status": "OK", "STATUS": 1}])
    assert table.schema.names == [TIME, "status", EXTRA]
    assert extra(rows(table)[0]) == {"Status": "OK", "STATUS": 1}
    assert "Status" not in types


def test_empty_and_undecodable_field_names_go_to_extra():
    bad_key = "k\udcff"
    table, _ = table_of([{"": 1, bad_key: 2, "ok": 3}])
    assert table.schema.names == [TIME, "ok", EXTRA]
    assert extra(rows(table)[0]) == {"": 1, "k\\xff": 2}


def test_ints_beyond_int64_go_to_extra_exactly():
    huge, negative = 2**64 + 1, -(2**63) - 1
    table, _ = table_of([{"n": 1, "f": 0.5}], later=[[{"n": huge, "f": huge}, {"n": negative}]])
    got = rows(table)
    assert [r["n"] for r in got] == [1, None, None]
    assert got[1]["f"] is None
    assert json.loads(got[1][EXTRA]) == {"n": huge, "f": huge}
    assert json.loads(got[2][EXTRA]) == {"n": negative}
    # A huge int first does not type the column; the next value does.
    table, _ = table_of([{"n": huge}, {"n": 5}])
    assert table.schema.field("n").type == pa.int64()
    assert json.loads(rows(table)[0][EXTRA]) == {"n": huge}


def test_int64_bounds_stay_in_the_column():
    table, _ = table_of([{"n": 2**63 - 1}, {"n": -(2**63)}])
    assert table.column("n").to_pylist() == [2**63 - 1, -(2**63)]


def test_bytes_in_binary_column_and_base64_in_extra():
    table, _ = table_of([{"s": "text", "raw": b"\xff\x00"}], later=[[{"s": b"\xfe", "raw": "caf\u00e9"}]])
    got = rows(table)
    assert got[0]["raw"] == b"\xff\x00"
    # bytes in a string column -> _extra as base64; str in a binary column -> its UTF-8 bytes
    assert got[1]["s"] is None and got[1]["raw"] == "caf\u00e9".encode()
    assert extra(got[1]) == {"s": base64.b64encode(b"\xfe").decode()}


def test_surrogate_strings_are_fixed_in_columns_and_extra():
    table, _ = table_of(
        [{"msg": "fine", "raw": b"x"}],
        later=[[{"msg": BAD_TEXT, "raw": BAD_TEXT, "nested": {"k": BAD_TEXT, BAD_TEXT: 1}}, {"msg": "ok"}]],
    )
    got = rows(table)
    assert got[1]["msg"] == "caf\u00e9 \\xff\\xfe"
    assert got[2]["msg"] == "ok"
    # a binary column gets the original bytes back
    assert got[1]["raw"] == b"caf\xc3\xa9 \xff\xfe"
    assert extra(got[1]) == {"nested": {"k": "caf\u00e9 \\xff\\xfe", "caf\u00e9 \\xff\\xfe": 1}}


def test_surrogate_string_in_the_first_row_group_types_the_column_as_string():
    table, _ = table_of([{"msg": BAD_TEXT}, {"msg": "plain"}])
    assert table.schema.field("msg").type == pa.string()
    assert table.column("msg").to_pylist() == ["caf\u00e9 \\xff\\xfe", "plain"]


def test_all_null_field_gets_no_column_and_later_values_go_to_extra():
    types = ColumnTypes()
    table, _ = table_of([{"a": 1, "n": None}, {"a": 2, "n": None}], types, later=[[{"a": 3, "n": "now"}]])
    assert "n" not in table.schema.names
    assert extra(rows(table)[2]) == {"n": "now"}
    assert extra(rows(table)[0]) is None  # nulls are never written to _extra
    # the next file has the column, with the type seen first
    table, _ = table_of([{"a": 4, "n": None}, {"n": "x"}], types)
    assert table.schema.field("n").type == pa.string()


def test_field_appearing_in_a_later_batch_is_kept_and_becomes_a_column_next_file():
    types = ColumnTypes()
    table, _ = table_of([{"a": 1}], types, later=[[{"a": 2, "late": 7}]])
    assert table.schema.names == [TIME, "a", EXTRA]
    assert extra(rows(table)[1]) == {"late": 7}
    assert types.get("late") == pa.int64()
    # next file: "late" is a column; its type was fixed by the first value seen
    table, _ = table_of([{"late": "str now"}, {"late": 8}], types)
    assert table.schema.field("late").type == pa.int64()
    assert [r["late"] for r in rows(table)] == [None, 8]
    assert extra(rows(table)[0]) == {"late": "str now"}


def test_first_type_wins_across_files_and_tags():
    types = ColumnTypes()
    table_of([{"code": 404}], types)
    table, _ = table_of([{"code": "E404"}, {"code": 500}], types)
    assert table.schema.field("code").type == pa.int64()
    assert [r["code"] for r in rows(table)] == [None, 500]


def test_declared_columns_are_in_every_file_with_their_type():
    types = ColumnTypes({"status": "int", "host": pa.string()})
    table, _ = table_of([{"msg": "m", "status": "bad"}], types)
    assert table.schema.names == [TIME, "status", "host", "msg", EXTRA]
    row = rows(table)[0]
    assert row["status"] is None and row["host"] is None
    assert extra(row) == {"status": "bad"}


@pytest.mark.parametrize(
    "declared", [{"time": "int"}, {"x": "decimal"}, {"x": pa.list_(pa.int64())}, {"a": "int", "A": "int"}]
)
def test_bad_declarations_are_refused(declared):
    with pytest.raises(ValueError):
        ColumnTypes(declared)


def test_max_columns_sends_further_fields_to_extra():
    table, _ = table_of([{"a": 1, "b": 2, "c": 3}], ColumnTypes(max_columns=2))
    assert table.schema.names == [TIME, "a", "b", EXTRA]
    assert extra(rows(table)[0]) == {"c": 3}


def test_nan_stays_in_a_float_column_and_is_a_string_in_extra():
    table, _ = table_of([{"f": float("nan"), "g": {"x": float("inf"), "y": float("-inf"), "z": float("nan")}}])
    row = rows(table)[0]
    assert math.isnan(row["f"])
    assert extra(row) == {"g": {"x": "Infinity", "y": "-Infinity", "z": "NaN"}}


def test_empty_records_and_records_without_columns():
    table, _ = table_of([{}, {"a": None}, {"a": 1}])
    assert len(table) == 3
    assert table.column(EXTRA).null_count == 3


def test_placement_does_not_depend_on_the_neighbours():
    """A value lands in the same place whether its column takes the fast path or not."""
    samples = [1, -5, 2.5, True, "s", b"b", BAD_TEXT, 2**70, {"d": 1}, [1], None]
    for column_value in [1, 2.5, True, "s", b"b"]:
        types = ColumnTypes()
        schema = file_schema(types, [{"c": column_value}])
        builder = TableBuilder(schema, types)
        for value in samples:
            alone = builder.build([(T0, {"c": value})]).to_pylist()[0]
            # a conflicting neighbour forces the per-value path for the column
            mixed = builder.build([(T0, {"c": value}), (T0, {"c": {"force": "slow"}})]).to_pylist()[0]
            assert alone == mixed, (column_value, value)


def test_infer_column_type_rule():
    assert infer_column_type([None, 1, 2]) == pa.int64()
    assert infer_column_type([1, 2.5]) == pa.float64()
    assert infer_column_type([1, "a", 2.5]) == pa.float64()
    assert infer_column_type(["a", 1]) == pa.string()
    assert infer_column_type([b"a", "b"]) == pa.binary()
    assert infer_column_type(["b", b"a"]) == pa.string()
    assert infer_column_type([2.5, True]) == pa.float64()
    assert infer_column_type([True, 2.5]) == pa.bool_()
    assert infer_column_type([{"a": 1}, [1], None]) is None
    assert infer_column_type([None, None]) is None
    assert infer_column_type([2**64, 1]) == pa.int64()


def test_times_out_of_int64_are_clamped_not_dropped():
    column = time_column([0, 2**70, -(2**70)])
    assert column.type == TIME_TYPE
    assert column.cast(pa.int64()).to_pylist() == [0, (2**63 - 1) // 1000, -(2**63) // 1000 + 1]


def test_fix_text():
    assert fix_text("plain") == "plain"
    assert fix_text(BAD_TEXT) == "caf\u00e9 \\xff\\xfe"
    assert fix_text("a\ud800b") == "a\\ud800b"  # not a surrogateescape byte


def test_encode_extra_is_valid_compact_utf8_json():
    value = {
        "b": b"\x00\xff",
        "s": BAD_TEXT,
        "n": [1, 2**80, None, True, 1.5],
        "k": {1: "int key", b"\xffk": "bytes key"},
        "o": object.__new__(type("Custom", (), {"__str__": lambda self: "custom"})),
    }
    text = encode_extra(value)
    text.encode("utf-8")
    assert json.loads(text) == {
        "b": "AP8=",
        "s": "caf\u00e9 \\xff\\xfe",
        "n": [1, 2**80, None, True, 1.5],
        "k": {"1": "int key", "\\xffk": "bytes key"},
        "o": "custom",
    }
    assert encode_extra({"a": [1, {"b": "c"}]}) == '{"a":[1,{"b":"c"}]}'
    assert encode_extra({"u": "ünï"}) == '{"u":"ünï"}'


def test_encode_extra_cuts_absurd_nesting():
    deep: object = "bottom"
    for _ in range(5000):
        deep = [deep]
    decoded = json.loads(encode_extra({"d": deep}))
    depth = 0
    node = decoded["d"]
    while isinstance(node, list):
        node, depth = node[0], depth + 1
    assert node == TOO_DEEP and depth == MAX_DEPTH - 1  # the _extra object is level 1


def test_learning_from_extra_follows_first_appearance():
    types = ColumnTypes(max_columns=3)
    table_of([{"a": 1}], types, later=[[{"a": 1, "zz": {"n": 1}}, {"Zz": 1, "zz": "s", "y": 2.5, "x": 1}]])
    # "zz": first *scalar* value is a str; "Zz" came first in its record but "zz" first overall;
    # the cap (3) leaves "x" out, whatever the set order of the names
    assert types.items() == [("a", pa.int64()), ("zz", pa.string()), ("y", pa.float64())]

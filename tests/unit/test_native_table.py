"""The native decode of forward entries agrees with the Python path, its reference.

For entries of every shape hypothesis draws (and raw ones it cannot: float32, keys
twice, ext values, invalid UTF-8), ``PackedEvents`` stands for exactly the events
``decode_entries`` gives, and the lake builds the same file schema, learns the same
types and writes the same table (``_extra`` compared as JSON values) from the packed
bytes as from the decoded events. What the extension does not take it hands back to
Python, so every bad input fails the same way on both paths (tests/unit/test_native_fuzz.py
throws garbage at it). Skipped where the extension is not installed.
"""

from __future__ import annotations

import json
import struct

import msgpack
import pyarrow as pa
import pytest
from fuzz_helpers import fuzz_settings, same
from hypothesis import given
from hypothesis import strategies as st

from logrouter.lake.convert import TableBuilder
from logrouter.lake.partition import split_by_hour
from logrouter.lake.native_table import PendingRows, build_table, file_schema_of
from logrouter.lake.schema import ColumnTypes, file_schema
from logrouter.native import NATIVE, describe
from logrouter.wire.fluent_forward import ForwardDecodeError, decode_entries
from logrouter.wire.forward_lazy import PackedEvents, lazy_events

pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"native decoding off: {describe()}")

NOW = 1_700_000_000_123_456_789
HOUR = 3_600_000_000_000


def event_time(time_ns: int) -> msgpack.ExtType:
    seconds, nanos = divmod(time_ns, 1_000_000_000)
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanos))


def entries_of(events, single_float: bool = False, int_times: bool = False) -> bytes:
    packer = msgpack.Packer(use_single_float=single_float)
    return b"".join(
        packer.pack([t // 1_000_000_000 if int_times else event_time(t), record]) for t, record in events
    )


keys = st.sampled_from(["a", "b", "c", "msg", "n", "time", "_extra", "Tag", "", "A", "x.y"]) | st.text(max_size=4)
scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.integers(-5, 300)
    | st.floats() | st.text(max_size=6) | st.binary(max_size=6)
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8
)
records = st.dictionaries(keys, values, max_size=6)
times = st.integers(0, 2**32 - 1).map(lambda s: s * 1_000_000_000) | st.sampled_from([0, NOW, NOW + HOUR, NOW - 1])
events_lists = st.lists(st.tuples(times, records), max_size=12)
declared = st.dictionaries(st.sampled_from(["a", "b", "c", "n", "msg"]), st.sampled_from(["bool", "int", "float", "string", "binary"]), max_size=3)


def same_events(a, b) -> bool:
    """The same events, NaN values included (compared as the bytes msgpack makes of them)."""
    return msgpack.packb(a) == msgpack.packb(b)


def assert_same_tables(native: pa.Table, python: pa.Table) -> None:
    assert native.schema == python.schema
    for name in native.column_names:
        left, right = native.column(name).to_pylist(), python.column(name).to_pylist()
        if name == "_extra":
            assert [None if t is None else json.loads(t) for t in left] == [None if t is None else json.loads(t) for t in right] or all(
                (x is None and y is None) or same(json.loads(x), json.loads(y)) for x, y in zip(left, right)
            ), (left, right)
        else:
            assert len(left) == len(right)
            assert all(same(x, y) or x == y for x, y in zip(left, right)), (name, left, right)


def both_ways(events, columns, now=NOW, **packing):
    """(native table, Python table, native types, Python types), or None if the
    extension leaves the entries to Python."""
    entries = entries_of(events, **packing)
    packed = lazy_events(entries, now)
    reference, invalid = decode_entries(entries, now)
    if packed is None:
        return None
    assert invalid == 0
    assert len(packed) == len(reference) and same_events(list(packed), reference)
    native_types, python_types = ColumnTypes(columns), ColumnTypes(columns)
    pending = PendingRows()
    for bucket, group in packed.split_by_hour():
        pending.extend(group)
    assert same_events(pending.events(), [e for _, group in split_by_hour(reference) for e in group])
    native_schema = file_schema_of(native_types, pending, {})
    inferred: dict = {}
    python_schema = file_schema(python_types, [record for _, record in pending.events()], inferred)
    assert native_schema == python_schema
    assert native_types.items() == python_types.items()
    native = build_table(TableBuilder(native_schema, native_types), pending)
    python = TableBuilder(python_schema, python_types).build(pending.events(), inferred)
    assert native_types.items() == python_types.items()
    return native, python


@fuzz_settings(max_examples=300)
@given(events_lists, declared)
def test_native_and_python_build_the_same_first_row_group(events, columns) -> None:
    built = both_ways(events, columns)
    if built is not None:
        assert_same_tables(*built)


@fuzz_settings(max_examples=150)
@given(events_lists, events_lists, declared)
def test_a_later_row_group_of_a_file_is_the_same_both_ways(first, later, columns) -> None:
    """Rows built into a file's schema chosen from other rows: misfits and unknown fields."""
    schema = file_schema(ColumnTypes(columns), [r for _, r in first])
    entries = entries_of(later)
    packed = lazy_events(entries, NOW)
    if packed is None:
        return
    native_types, python_types = ColumnTypes(columns), ColumnTypes(columns)
    file_schema(native_types, [r for _, r in first])
    file_schema(python_types, [r for _, r in first])
    pending = PendingRows()
    pending.extend(packed)
    native = build_table(TableBuilder(schema, native_types), pending)
    python = TableBuilder(schema, python_types).build(decode_entries(entries, NOW)[0])
    assert_same_tables(native, python)
    assert native_types.items() == python_types.items()


@fuzz_settings(max_examples=100)
@given(events_lists, st.booleans(), st.booleans())
def test_float32_and_integer_times_are_read_the_same(events, single_float, int_times) -> None:
    try:
        entries_of(events, single_float)
    except OverflowError:
        return  # a double no float32 holds
    built = both_ways(events, {}, single_float=single_float, int_times=int_times)
    if built is not None:
        assert_same_tables(*built)


@fuzz_settings(max_examples=100)
@given(events_lists, st.integers(0, 12), st.integers(0, 12))
def test_slices_and_hour_groups_hold_the_same_rows(events, start, stop) -> None:
    entries = entries_of(events)
    packed = lazy_events(entries, NOW)
    if packed is None:
        return
    reference = decode_entries(entries, NOW)[0]
    assert same_events(list(packed[start:stop]), reference[start:stop])
    assert len(packed[start:stop]) == len(reference[start:stop])
    for bucket, group in packed.split_by_hour():
        expected = [e for e in reference if e[0] // HOUR == bucket]
        assert same_events(list(group), expected)
        for a, b in ((0, 1), (1, 3), (2, 100)):
            pending = PendingRows()
            pending.extend(group[a:b])
            schema = file_schema(ColumnTypes(), [r for _, r in expected])
            table = build_table(TableBuilder(schema, ColumnTypes()), pending)
            python = TableBuilder(schema, ColumnTypes()).build(expected[a:b])
            assert_same_tables(table, python)


def test_the_usual_events_are_taken_natively() -> None:
    events = [(NOW + i, {"host": "web1", "level": "info", "status": 200 + i, "took": 0.5, "http": {"path": "/x", "q": [1, None]}})
              for i in range(5)]
    packed = lazy_events(entries_of(events), NOW)
    assert isinstance(packed, PackedEvents) and len(packed) == 5
    native, python = both_ways(events, {"status": "int"})
    assert_same_tables(native, python)
    assert native.column("_extra").to_pylist()[0] == '{"http":{"path":"/x","q":[1,null]}}'


def test_misfits_follow_unknown_fields_in_column_order() -> None:
    events = [(NOW, {"z": 1, "b": "no int", "x": None, "a": [1], "y": b"\x00\xff"})]
    schema = file_schema(ColumnTypes({"a": "int", "b": "int"}), [])
    pending = PendingRows()
    pending.extend(lazy_events(entries_of(events), NOW))
    table = build_table(TableBuilder(schema, ColumnTypes({"a": "int", "b": "int"})), pending)
    assert table.column("_extra").to_pylist() == ['{"z":1,"y":"AP8=","a":[1],"b":"no int"}']
    assert table.column("a").to_pylist() == [None]


def test_special_floats_and_escapes_in_extra() -> None:
    events = [(NOW, {"f": [float("nan"), float("inf"), -float("inf"), 1e-7, 1e300], "s": 'q"\\\n\x01é'})]
    native, python = both_ways(events, {"s": "int"})
    assert json.loads(native.column("_extra")[0].as_py()) == {"f": ["NaN", "Infinity", "-Infinity", 1e-7, 1e300], "s": 'q"\\\n\x01é'}
    assert_same_tables(native, python)


raw_outside = {
    "a key twice": b"\x92\xd7\x00" + struct.pack(">II", 1, 0) + b"\x82\xa1a\x01\xa1a\x02",
    "a key twice, nested": b"\x92\xd7\x00" + struct.pack(">II", 1, 0) + b"\x81\xa1n\x82\xa1a\x01\xa1a\x02",
    "a bin key": b"\x92\xd7\x00" + struct.pack(">II", 1, 0) + b"\x81\xc4\x01a\x01",
    "an int key": b"\x92\xd7\x00" + struct.pack(">II", 1, 0) + b"\x81\x01\x01",
    "invalid UTF-8": b"\x92\xd7\x00" + struct.pack(">II", 1, 0) + b"\x81\xa1a\xa1\xff",
    "an ext value": b"\x92\xd7\x00" + struct.pack(">II", 1, 0) + b"\x81\xa1a\xd4\x05\x00",
    "an EventTime value": b"\x92\xd7\x00" + struct.pack(">II", 1, 0) + b"\x81\xa1a\xd7\x00" + bytes(8),
    "a float time": b"\x92\xcb" + struct.pack(">d", 1.5) + b"\x80",
    "a record that is no map": b"\x92\xd7\x00" + struct.pack(">II", 1, 0) + b"\x91\x01",
    "an entry of three": b"\x93\xd7\x00" + struct.pack(">II", 1, 0) + b"\x80\xc0",
    "nested too deep": b"\x92\xd7\x00" + struct.pack(">II", 1, 0) + b"\x81\xa1a" + b"\x91" * 40 + b"\xc0",
    "cut short": b"\x92\xd7\x00" + struct.pack(">II", 1, 0) + b"\x82\xa1a\x01",
    "garbage": b"\xc1\xc1\xc1",
}


@pytest.mark.parametrize("entries", list(raw_outside.values()), ids=list(raw_outside))
def test_what_the_extension_leaves_to_python(entries: bytes) -> None:
    assert lazy_events(entries, NOW) is None
    assert NATIVE.build([(entries, NOW, None, 0, 1 << 30)], [], False) is None


def test_time_zero_needs_a_clock_reading() -> None:
    entries = entries_of([(0, {"a": 1}), (NOW, {"a": 2})])
    assert lazy_events(entries, None) is None  # the caller reads the clock first
    packed = lazy_events(entries, NOW)
    assert list(packed) == decode_entries(entries, NOW)[0] == [(NOW, {"a": 1}), (NOW, {"a": 2})]


def test_bad_input_fails_the_same_way_on_both_paths() -> None:
    """The spool's replay decodes what the extension refuses in Python: same error."""
    from logrouter.spool.record import decode_batch, encode_batch
    from logrouter.batch import Batch

    bad = raw_outside["cut short"]
    payload = encode_batch(Batch("t", [(1, {})], "src", packed=("forward", bad, None)))
    with pytest.raises(ForwardDecodeError) as native_error:
        decode_batch(payload)
    with pytest.raises(ForwardDecodeError) as python_error:
        decode_entries(bad, None)
    assert str(native_error.value) == str(python_error.value)


def test_the_table_holds_the_buffers_the_build_made() -> None:
    """The table keeps the build's buffers alive after everything else is gone, and they
    are read-only."""
    import gc

    events = [(NOW + i, {"msg": f"m{i}", "n": i, "deep": {"k": [i]}}) for i in range(50)]
    pending = PendingRows()
    pending.extend(lazy_events(entries_of(events), NOW))
    types = ColumnTypes()
    table = build_table(TableBuilder(file_schema_of(types, pending, {}), types), pending)
    expected = [(f"m{i}", i, json.dumps({"deep": {"k": [i]}}, separators=(",", ":"))) for i in range(50)]
    del pending
    gc.collect()
    rows = zip(table.column("msg").to_pylist(), table.column("n").to_pylist(), table.column("_extra").to_pylist())
    assert [(m, n, json.dumps(json.loads(e), separators=(",", ":"))) for m, n, e in rows] == expected
    rows, times, columns, extra, _ = NATIVE.build([(entries_of(events), NOW, None, 0, 1 << 30)], [("msg", 4)], True)
    data = columns[0][2]
    assert data == b"".join(f"m{i}".encode() for i in range(50)) and bytes(data) == data and data != b"x"
    assert len(times) == 8 * rows == 400
    view = memoryview(extra[3])
    assert view.readonly and view.nbytes == 4 * 51
    with pytest.raises(TypeError):
        view[0] = 1  # type: ignore[index]

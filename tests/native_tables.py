"""The lake's table of the same events built natively (packed) and in Python (decoded),
and the comparison of the two: shared by the property tests of each native read
(Beats/Log Courier documents, logjam bodies)."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pyarrow as pa

from fuzz_helpers import same
from logrouter.lake.convert import TableBuilder
from logrouter.lake.native_table import PendingRows, build_table, file_schema_of
from logrouter.lake.partition import split_by_hour
from logrouter.lake.schema import ColumnTypes, file_schema


def lake_tables(events_native: Any, events_python: list, packed: bool = False) -> tuple[pa.Table, pa.Table]:
    """The same rows built natively (packed) and in Python (decoded): (native, python).
    ``packed``: the native rows must stay packed all the way."""
    pending = PendingRows()
    for _, group in events_native.split_by_hour():
        pending.extend(group)
    if packed:
        assert pending.packed() is not None
    reference = [e for _, group in split_by_hour(events_python) for e in group]
    assert msgpack.packb(pending.events()) == msgpack.packb(reference)
    native_types, python_types = ColumnTypes(), ColumnTypes()
    native_schema = file_schema_of(native_types, pending, {})
    inferred: dict = {}
    python_schema = file_schema(python_types, [record for _, record in reference], inferred)
    assert native_schema == python_schema
    native = build_table(TableBuilder(native_schema, native_types), pending)
    python = TableBuilder(python_schema, python_types).build(reference, inferred)
    assert native_types.items() == python_types.items()
    return native, python


def assert_same_tables(native: pa.Table, python: pa.Table) -> None:
    """Equal schemas and values; ``_extra`` compared as the JSON values it holds."""
    assert native.schema == python.schema
    for name in native.column_names:
        left, right = native.column(name).to_pylist(), python.column(name).to_pylist()
        if name == "_extra":
            left = [None if t is None else json.loads(t) for t in left]
            right = [None if t is None else json.loads(t) for t in right]
        assert len(left) == len(right) and all(same(x, y) or x == y for x, y in zip(left, right)), (name, left, right)

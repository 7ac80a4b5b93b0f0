"""A row group's Arrow table straight from forward entries, by the native extension.

The lake writer keeps each open file's rows waiting for a row group in a
``PendingRows``: decoded events, and events still packed as the forward entries that
arrived (``wire.forward_lazy.PackedEvents``, or Beats JSON documents the extension
transcoded into such entries, ``wire.json_lazy.DocumentEvents``). When every row of a row group is
packed and the extension is installed, ``file_schema_of`` and ``build_table`` go
from the bytes to the table in native code (``logrouter_native.build``): the time
column, each column of the file's schema typed, the rest as ``_extra`` JSON, never a
Python object per event. Otherwise — rows from another source, a record the
extension leaves to Python, no extension — they are what ``schema.file_schema`` and
``convert.TableBuilder.build`` make of the decoded events, which is the reference:
the native path gives the same schema, the same learned types and the same table
(tests/unit/test_native_table.py), also for rows filters narrowed and edited while
packed (``PackedEvents.filtered``, tests/unit/test_filters_columnar.py).
"""

from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa

from logrouter.lake.convert import TableBuilder
from logrouter.lake.schema import (
    BINARY,
    BOOL,
    EXTRA,
    FLOAT64,
    INT64,
    STRING,
    TIME,
    TIME_TYPE,
    ColumnTypes,
    Inferred,
    file_schema,
)
from logrouter.native import NATIVE
from logrouter.wire.forward_lazy import PackedEvents

__all__ = ["PendingRows", "build_table", "file_schema_of"]

Event = tuple[int, dict[str, Any]]

# The extension's type codes (native/src/columns.rs).
_CODES = {BOOL: 1, INT64: 2, FLOAT64: 3, STRING: 4, BINARY: 5}
_TYPES = {code: column_type for column_type, code in _CODES.items()}
_NS = pa.timestamp("ns", tz="UTC")


class PendingRows:
    """One open file's rows waiting for a row group, in order: lists of decoded events
    and ``PackedEvents``. Reading it as a sequence of events decodes the packed ones
    (once)."""

    __slots__ = ("parts", "_count", "_events")

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self._count = 0
        self._events: list[Event] | None = None

    def extend(self, events: Any) -> None:
        if len(events):
            self.parts.append(events)
            self._count += len(events)
            self._events = None

    def packed(self) -> list[PackedEvents] | None:
        """The parts, if every one of them is still packed (and the extension is here)."""
        parts = self.parts
        if NATIVE is None or not parts or not all(isinstance(part, PackedEvents) for part in parts):
            return None
        return parts

    def events(self) -> list[Event]:
        events = self._events
        if events is None:
            parts = self.parts
            events = self._events = list(parts[0]) if len(parts) == 1 else [e for part in parts for e in part]
        return events

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def __getitem__(self, index: Any) -> Any:
        return self.events()[index]


def _run(parts: list[PackedEvents], columns: list[tuple[str, int]], build: bool) -> Any:
    # Blobs the extension scanned already are not checked again (PackedEvents.checked).
    checked = all(part.checked for part in parts)
    # Transcoded JSON documents' objects and arrays go into _extra as their text came.
    texts = [part.texts for part in parts] if build and any(part.texts for part in parts) else None
    try:
        filtered = [part.filtered() for part in parts]
        if not any(filtered):  # as before filters could keep batches packed
            return NATIVE.build([part.piece() for part in parts], columns, build, None, checked, texts)  # type: ignore[union-attr]
        filtered = [(None, []) if f is None else f for f in filtered]
        return NATIVE.build([part.piece() for part in parts], columns, build, filtered, checked, texts)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - a bug in the extension: the Python path is the reference
        return None


def _column_type(first: int, float_after_int: bool) -> pa.DataType | None:
    """``schema.infer_column_type`` of a field from what the extension saw of it."""
    if first == _CODES[INT64] and float_after_int:
        return FLOAT64
    return _TYPES.get(first)


def file_schema_of(types: ColumnTypes, pending: PendingRows, inferred: Inferred) -> pa.Schema:
    """``schema.file_schema`` of a new file whose first row group is ``pending``."""
    parts = pending.packed()
    found = None if parts is None else _run(parts, [], False)
    if found is None:
        return file_schema(types, [event[1] for event in pending], inferred)
    # file_schema's rules, from the fields in order of first appearance.
    fields = [pa.field(TIME, TIME_TYPE)]
    chosen = set(types.declared)
    fields.extend(pa.field(name, types.get(name)) for name in types.declared)
    for name, first, float_after_int in found[4]:
        if name in chosen:
            continue
        column_type = _column_type(first, float_after_int)
        if column_type is None:
            continue  # all null or nothing typed: no column in this file
        column_type = types.admit(name, column_type)
        if column_type is not None:
            chosen.add(name)
            fields.append(pa.field(name, column_type))
    fields.append(pa.field(EXTRA, STRING))
    return pa.schema(fields)


def _array(column_type: pa.DataType, rows: int, column: tuple) -> pa.Array:
    nulls, validity, data, offsets = column
    buffers = [None if validity is None else pa.py_buffer(validity)]
    if offsets is not None:
        buffers.append(pa.py_buffer(offsets))
    buffers.append(pa.py_buffer(data))
    return pa.Array.from_buffers(column_type, rows, buffers, nulls)


def build_table(builder: TableBuilder, pending: PendingRows, inferred: Inferred | None = None) -> pa.Table:
    """``builder.build`` of the pending rows, natively where every one is packed."""
    parts = pending.packed()
    schema = builder.schema
    columns = [(field.name, _CODES.get(field.type)) for field in schema][1:-1]
    if parts is None or any(code is None for _, code in columns):
        return builder.build(pending, inferred)
    found = _run(parts, columns, True)
    if found is None:
        return builder.build(pending, inferred)
    rows, times, arrays, extra, fields = found
    nanos = pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(times)])
    table = [nanos.view(_NS).cast(TIME_TYPE, safe=False)]
    table += [_array(field.type, rows, column) for field, column in zip(list(schema)[1:-1], arrays)]
    table.append(_array(STRING, rows, extra))
    # As convert.TableBuilder: a field outside this file's columns teaches its first
    # scalar type (not promoted) for the next file.
    types, names = builder.types, set(schema.names)
    for name, first, _ in fields:
        if first and name not in names and name not in types:
            types.admit(name, _TYPES[first])
    return pa.Table.from_arrays(table, schema=schema)

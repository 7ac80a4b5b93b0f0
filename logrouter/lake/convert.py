"""Events -> an Arrow table of one file's fixed schema.

Owns the per-event path of the lake: pulling each column's values out of the
records, converting them with pyarrow's C++ converter, and moving whatever does not
fit (schema.py's rules) into the ``_extra`` JSON column.

The fast path does no per-value Python work beyond one ``dict.get`` per field per
record (``map``, in C): ``pa.array(values)`` *infers* the type and the column is
accepted when the inferred type is the column's (or a null column, or int64 for a
float64 column). Inference, not conversion to the target type, because pyarrow's
typed conversion is lenient in lossy ways (1.5 into int64 gives 1, bytes into string
pass). Only a column whose inference fails or disagrees goes value by value, and
only rows with fields outside the schema are visited one by one.
"""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter
from typing import Any, Callable, Sequence

import pyarrow as pa

from logrouter.lake.extra import encode_extra, fix_text
from logrouter.lake.schema import (
    BINARY,
    BOOL,
    EXTRA,
    FLOAT64,
    INT64,
    INT64_MAX,
    INT64_MIN,
    SCALAR_TYPES,
    STRING,
    TIME,
    TIME_TYPE,
    ColumnTypes,
    Inferred,
    field_order,
    scalar_type,
)

Event = tuple[int, dict[str, Any]]

_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeEncodeError)
_NULL = pa.null()
_NS = pa.timestamp("ns", tz="UTC")
_MISS = object()  # a value that does not fit its column


def _fit_bool(value: Any) -> Any:
    return value if type(value) is bool else _MISS


def _fit_int(value: Any) -> Any:
    if type(value) is int and INT64_MIN <= value <= INT64_MAX:
        return value
    return _MISS


def _fit_float(value: Any) -> Any:
    kind = type(value)
    if kind is float:
        return value
    if kind is int and INT64_MIN <= value <= INT64_MAX:
        return float(value)
    return _MISS


def _fit_string(value: Any) -> Any:
    if type(value) is not str:
        return _MISS
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return fix_text(value)
    return value


def _fit_binary(value: Any) -> Any:
    kind = type(value)
    if kind is bytes:
        return value
    if kind is bytearray:
        return bytes(value)
    if kind is str:
        try:  # surrogate-escaped text gets its original bytes back
            return value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace")
    return _MISS


_FITTERS: dict[pa.DataType, Callable[[Any], Any]] = {
    BOOL: _fit_bool,
    INT64: _fit_int,
    FLOAT64: _fit_float,
    STRING: _fit_string,
    BINARY: _fit_binary,
}


def _accept(array: pa.Array, column_type: pa.DataType, values: list[Any]) -> pa.Array | None:
    """``array`` (inferred from ``values``) as a column of ``column_type``, if the
    rules allow it."""
    inferred = array.type
    if inferred == column_type:
        # The one leak in pyarrow's inference: bools after a float infer as double
        # ([2.5, True] -> [2.5, 1.0]). Checking costs a pass, so only float columns pay.
        if inferred == FLOAT64 and bool in set(map(type, values)):
            return None
        return array
    if inferred == _NULL:
        return pa.nulls(len(array), column_type)
    if column_type == FLOAT64 and inferred == INT64:
        return array.cast(FLOAT64, safe=False)  # ints beyond 2**53 round, like float()
    if column_type == BINARY and inferred == STRING:
        return array.cast(BINARY)
    return None


_TIME, _RECORD = itemgetter(0), itemgetter(1)


def time_column(times: list[int]) -> pa.Array:
    """Event times (ns) as ``timestamp[us, UTC]``, truncated to microseconds."""
    try:
        nanos = pa.array(times, pa.int64())
    except _CONVERSION_ERRORS:
        # Out-of-range or non-int times from a misbehaving source: clamp, never drop.
        nanos = pa.array([min(max(int(t), INT64_MIN), INT64_MAX) for t in times], pa.int64())
    return nanos.view(_NS).cast(TIME_TYPE, safe=False)


class TableBuilder:
    """Builds tables of one file's schema; new field types are learned into ``types``."""

    def __init__(self, schema: pa.Schema, types: ColumnTypes) -> None:
        if schema.names[0] != TIME or schema.names[-1] != EXTRA:
            raise ValueError(f"a lake schema starts with {TIME!r} and ends with {EXTRA!r}")
        self.schema = schema
        self.types = types
        self._columns = [(field.name, field.type) for field in schema][1:-1]
        self._names = frozenset(name for name, _ in self._columns)

    def build(self, events: Sequence[Event], inferred: Inferred | None = None) -> pa.Table:
        """The table of ``events``. ``inferred`` is what ``schema.file_schema`` filled
        in for the same events (first row group): values and arrays to reuse."""
        count = len(events)
        records = list(map(_RECORD, events))
        arrays = [time_column(list(map(_TIME, events)))]
        extras: dict[int, dict[str, Any]] = {}

        # Each column's values first: when every record holds every column and nothing
        # else (as many keys as columns: each holds at least that many once every
        # column's itemgetter found its key), no record has a field outside the schema,
        # and the union of all their keys (a hash per field) is not needed.
        exact = inferred is None and sum(map(len, records)) == len(self._columns) * count
        columns: list[tuple[str, pa.DataType, list[Any], pa.Array | None]] = []
        for name, column_type in self._columns:
            if inferred is not None and name in inferred:
                values, array = inferred[name]
                if array is not None:
                    array = _accept(array, column_type, values)
            else:
                try:
                    values = list(map(itemgetter(name), records))  # every record has it: the usual case
                except KeyError:
                    exact = False
                    values = list(map(dict.get, records, repeat(name, count)))
                try:
                    array = _accept(pa.array(values), column_type, values)
                except _CONVERSION_ERRORS:
                    array = None
            columns.append((name, column_type, values, array))

        # Fields outside the schema go to extras first, then the values that do not fit
        # their column (the order of each _extra object's fields).
        if not exact:
            unknown = set().union(*records).difference(self._names)
            if unknown:
                self._collect_unknown(records, unknown, extras)
        for name, column_type, values, array in columns:
            if array is None:
                array = self._fit_values(name, column_type, values, extras)
            arrays.append(array)

        arrays.append(self._extra_column(count, extras))
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def _collect_unknown(
        self, records: list[dict[str, Any]], unknown: set[str], extras: dict[int, dict[str, Any]]
    ) -> None:
        """Fields outside the schema -> ``extras``; their types are learned for the next file."""
        names = self._names
        # Records of one source mostly share their fields and their order: which of a
        # record's fields lie outside the schema is worked out once per such shape.
        # By position: shapes whose keys are equal but not the same (1, 1.0, True) share
        # an entry, and each record's fields keep its own key objects.
        outside: dict[tuple[Any, ...], tuple[int, ...]] = {}
        for index, record in enumerate(records):
            shape = tuple(record)
            at = outside.get(shape)
            if at is None:
                at = outside[shape] = tuple(i for i, key in enumerate(shape) if key not in names)
            if at:
                fields = {key: value for i in at if (value := record[key := shape[i]]) is not None}
                if fields:
                    extras[index] = fields
        # In order of first appearance (not set order, which varies between runs): the
        # order decides which of two names differing in case, or which fields past
        # max_columns, get columns.
        for key in field_order(records):
            if key in unknown and key not in self.types:
                values = list(map(dict.get, records, repeat(key)))
                if set(map(type, values)).isdisjoint(SCALAR_TYPES):
                    continue  # only objects and lists (Beats' host, agent, log): nothing to learn
                first = next((v for v in values if scalar_type(v) is not None), None)
                self.types.learn(key, first)

    def _fit_values(
        self, name: str, column_type: pa.DataType, values: list[Any], extras: dict[int, dict[str, Any]]
    ) -> pa.Array:
        """The slow path for one column: each value fits, is fixed, or goes to ``extras``."""
        fit = _FITTERS[column_type]
        for index, value in enumerate(values):
            if value is not None:
                fitted = fit(value)
                if fitted is _MISS:
                    extras.setdefault(index, {})[name] = value
                    values[index] = None
                elif fitted is not value:
                    values[index] = fitted
        return pa.array(values, column_type)

    @staticmethod
    def _extra_column(count: int, extras: dict[int, dict[str, Any]]) -> pa.Array:
        if not extras:
            return pa.nulls(count, STRING)
        texts: list[str | None] = [None] * count
        for index, fields in extras.items():
            texts[index] = encode_extra(fields)
        return pa.array(texts, STRING)


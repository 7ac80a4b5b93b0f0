"""The lake's schema rules: which record fields get typed columns, and which type.

Owns the column-type registry of one writer (``ColumnTypes``) and the choice of a
new file's schema from its first rows (``file_schema``). Turning rows into a table of
that schema is convert.py's job.

The rules (also in docs/lake.md):

* Every file has the columns ``time`` (``timestamp[us, tz=UTC]``; Spark cannot read
  nanoseconds), then one typed column per record field, then ``_extra`` (string: a
  JSON object of the record's fields that have no column or did not fit it; null
  when there are none). No record is dropped for its shape.
* Typed columns are ``bool``, ``int64``, ``float64``, ``string`` or ``binary``, from
  Python bool, int, float, str and bytes. Nested values (dict, list) are never typed;
  they always go to ``_extra``.
* Field names that can never be columns go to ``_extra``: the reserved names
  ``time``, ``_extra``, ``tag``, ``dt``, ``hour`` (the partition columns: a data
  column named like one breaks Spark), compared case-insensitively because Spark
  resolves names case-insensitively; a name equal, ignoring case, to an earlier
  column (``Status`` after ``status``); the empty name; names that are not valid
  UTF-8; and new names once a writer has ``max_columns`` columns.
* First type wins, writer-wide: a field's type is fixed the first time this writer
  gives it a column (or by a declared type), for every tag and every later file, so
  the lake reads as one table. A file's column set is fixed when its first row group
  is written: the declared columns plus every field that has a non-null value in
  that row group. A field that first appears after that lands in ``_extra`` for the
  rest of the file, and becomes a column in the next file.
* The type of a new field is the type of its first non-null scalar value in the
  file's first row group, except that ints and floats together make a ``float64``
  column. A field that is null in every row of the first row group gets no column
  in that file.
* A value goes to ``_extra`` when its type differs from its column's: an int in a
  float64 column is stored as a float (rounded beyond 2**53), a str in a binary
  column as its UTF-8 bytes (the original bytes for surrogate-escaped text); every
  other mismatch (a str in an int64 column, a bool in an int64 column, a float in an
  int64 column, bytes in a string column, …) moves the value to ``_extra``. Ints
  outside int64 always go to ``_extra``, where they stay exact JSON numbers.
* Strings with lone surrogates are made valid (``extra.fix_text``: invalid bytes are
  spelled ``\\xNN``) wherever they are stored.
* Null and missing are the same thing in the lake: null values are never written
  to ``_extra``.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

from logrouter.lake.column_names import DECLARED_TYPES, EXTRA, RESERVED, TIME, usable  # noqa: F401 - RESERVED: imported from here too

TIME_TYPE = pa.timestamp("us", tz="UTC")

BOOL = pa.bool_()
INT64 = pa.int64()
FLOAT64 = pa.float64()
STRING = pa.string()
BINARY = pa.binary()

#: Python scalar type -> column type. Looked up by exact type: bool is an int
#: subclass and must not become an int64 column.
SCALAR_TYPES: dict[type, pa.DataType] = {
    bool: BOOL,
    int: INT64,
    float: FLOAT64,
    str: STRING,
    bytes: BINARY,
    bytearray: BINARY,
}

#: Names a configuration may use to declare a column's type (``column_names.DECLARED_TYPES``).
TYPE_NAMES: dict[str, pa.DataType] = {
    name: {"bool": BOOL, "int64": INT64, "float64": FLOAT64, "string": STRING, "binary": BINARY}[kind]
    for name, kind in DECLARED_TYPES.items()
}
COLUMN_TYPES = frozenset(SCALAR_TYPES.values())

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

DEFAULT_MAX_COLUMNS = 500


def scalar_type(value: Any) -> pa.DataType | None:
    """The column type a single value would give a new column, or None."""
    column_type = SCALAR_TYPES.get(type(value))
    if column_type is INT64 and not INT64_MIN <= value <= INT64_MAX:
        return None
    return column_type


class ColumnTypes:
    """One writer's field name -> column type registry: declared, then first seen.

    Shared by every file of a writer so that one field has one type across tags and
    files. Not thread-safe; the writer using it runs in one thread at a time.
    """

    def __init__(
        self,
        declared: Mapping[str, pa.DataType | str] | Iterable[tuple[str, pa.DataType | str]] = (),
        max_columns: int = DEFAULT_MAX_COLUMNS,
    ) -> None:
        self.max_columns = max_columns
        self._types: dict[str, pa.DataType] = {}
        self._folded: set[str] = set()
        self._refused: set[Any] = set()
        items = declared.items() if isinstance(declared, Mapping) else declared
        for name, column_type in items:
            column_type = TYPE_NAMES.get(column_type, column_type) if isinstance(column_type, str) else column_type
            if column_type not in COLUMN_TYPES:
                raise ValueError(f"column {name!r}: type must be one of {sorted(TYPE_NAMES)}, not {column_type}")
            if not self._eligible(name):
                raise ValueError(f"column {name!r} cannot be declared: reserved or duplicate name")
            self._add(name, column_type)
        #: Declared columns, in declaration order; every file has them.
        self.declared: tuple[str, ...] = tuple(self._types)

    def __len__(self) -> int:
        return len(self._types)

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def get(self, name: str) -> pa.DataType | None:
        return self._types.get(name)

    def items(self) -> list[tuple[str, pa.DataType]]:
        return list(self._types.items())

    def admit(self, name: Any, column_type: pa.DataType) -> pa.DataType | None:
        """The type ``name`` has from now on (the existing one if it has one), or
        None if the name can never be a column."""
        known = self._types.get(name)
        if known is not None:
            return known
        if name in self._refused or not self._eligible(name):
            return None
        if len(self._types) >= self.max_columns:
            return None  # not remembered as refused: max_columns may be raised
        self._add(name, column_type)
        return column_type

    def export(self) -> list[list[str]]:
        """``[[name, type name], …]`` of the columns learned (not declared), for a state file."""
        names = {column_type: name for name, column_type in TYPE_NAMES.items() if name in ("bool", "int", "float", "string", "binary")}
        return [[name, names[t]] for name, t in self._types.items() if name not in self.declared]

    def restore(self, items: Iterable[Iterable[str]]) -> None:
        """Learn the columns of an earlier ``export`` (a restart keeps its field types)."""
        for name, type_name in items:
            column_type = TYPE_NAMES.get(type_name)
            if column_type is not None and name not in self._types and self._eligible(name):
                self._add(name, column_type)

    def replace(self, name: str, column_type: pa.DataType | None) -> None:
        """Give ``name`` the type ``column_type`` from now on, or never a column (None).

        For a shared table whose type for a name wins over the one this writer chose
        (another writer gave it a column first)."""
        if self._types.pop(name, None) is not None:
            self._folded.discard(name.casefold())
        if column_type is None:
            self._refused.add(name)
            self.declared = tuple(n for n in self.declared if n != name)
        else:
            self._refused.discard(name)
            self._add(name, column_type)

    def learn(self, name: Any, value: Any) -> None:
        """Register ``name`` from a value seen outside any column (for the next file)."""
        if name not in self._types:
            column_type = scalar_type(value)
            if column_type is not None:
                self.admit(name, column_type)

    def _add(self, name: str, column_type: pa.DataType) -> None:
        self._types[name] = column_type
        self._folded.add(name.casefold())

    def _eligible(self, name: Any) -> bool:
        ok = usable(name, self._folded)
        if not ok and len(self._refused) < 100_000:  # bounded: names can be junk
            self._refused.add(name)
        return ok


_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeEncodeError)
_STRICTLY_INFERRED = (BOOL, INT64, STRING)
_NULL = pa.null()


def infer_column_type(values: Sequence[Any]) -> pa.DataType | None:
    """The type a new column takes from its values in a file's first row group:
    the type of the first non-null scalar value, or float64 if that is an int and
    floats follow. None if no value is a typed scalar."""
    return _infer(values)[0]


def _infer(values: Sequence[Any]) -> tuple[pa.DataType | None, pa.Array | None]:
    """``infer_column_type``, plus pyarrow's inferred array for reuse (or None).

    pyarrow's inference (C++) answers the common cases. It is strict for bool,
    int64 and string; it infers double for ints and floats (right) but also for
    bools after a float (checked), and binary for str and bytes mixed (so binary
    goes the slow way, as do nested values, huge ints and lone surrogates).
    """
    try:
        array = pa.array(values)
    except _CONVERSION_ERRORS:
        array = None
    inferred = None if array is None else array.type
    if inferred in _STRICTLY_INFERRED:
        return inferred, array
    if inferred == _NULL:
        return None, array
    if inferred == FLOAT64 and bool not in set(map(type, values)):
        return FLOAT64, array
    first = None
    for value in values:
        column_type = scalar_type(value)
        if column_type is None:
            continue
        if first is None:
            first = column_type
            if first is not INT64:
                break
        elif column_type is FLOAT64:
            first = FLOAT64
            break
    return first, array


def field_order(records: Sequence[dict[str, Any]]) -> list[Any]:
    """Every field name of ``records``, in order of first appearance."""
    every = set().union(*records)
    seen: dict[Any, Any] = {}
    for record in records:  # usually the first few records already name every field
        seen.update(record)
        if len(seen) == len(every):
            break
    return list(seen)


#: Per field: its values in the first row group and pyarrow's inferred array (or None).
Inferred = dict[str, tuple[list[Any], "pa.Array | None"]]


def file_schema(
    types: ColumnTypes, records: Sequence[dict[str, Any]], inferred: Inferred | None = None
) -> pa.Schema:
    """The schema of a new file whose first row group holds ``records``.

    Registers new fields in ``types`` (first type wins). Column order: ``time``,
    declared columns, other fields in order of first appearance, ``_extra``. If
    ``inferred`` is given it is filled so convert.py need not extract and infer the
    same values again.
    """
    fields = [pa.field(TIME, TIME_TYPE)]
    chosen = set(types.declared)
    fields.extend(pa.field(name, types.get(name)) for name in types.declared)
    count = len(records)
    for name in field_order(records):
        if name in chosen:
            continue
        values = list(map(dict.get, records, repeat(name, count)))
        column_type, array = _infer(values)
        if column_type is None:
            continue  # all null or nothing typed: no column in this file
        column_type = types.admit(name, column_type)
        if column_type is not None:
            chosen.add(name)
            fields.append(pa.field(name, column_type))
            if inferred is not None:
                inferred[name] = (values, array)
    fields.append(pa.field(EXTRA, STRING))
    return pa.schema(fields)

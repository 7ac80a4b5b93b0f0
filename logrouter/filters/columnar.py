"""Filters on batches still packed: what ``grep``, ``set``, ``remove``, ``rename`` and
``sample`` do to forward events that arrived as PackedForward entries, without decoding them.

A batch whose events are ``wire.forward_lazy.PackedEvents`` (forward entries kept as
the bytes that arrived, where ``logrouter_native`` is installed) stays so through these
filters: ``grep`` reads its field as an Arrow string column straight from the bytes
(``logrouter_native.texts``) and evaluates its regexes with pyarrow compute (RE2, as
``logrouter.regex``), giving a row selection; ``set`` / ``remove`` / ``rename`` of
top-level fields to values known for the whole batch become ``Edit``s; ``sample``
without a key or condition decodes only the first and last events (``events_at``),
which is all its choice reads, and selects every ``rate``-th row. The Parquet
sink's native build applies both while it fills the lake's columns; anything that
reads the events decodes them once with the selection and edits applied, as the
record path would have made them.

Each helper answers None where the packed path cannot give exactly the record path's
result (a nested path, a value only Python renders, a regex pyarrow's RE2 refuses, no
extension): the filter then runs on records, as every other filter does.
"""

from __future__ import annotations

from typing import Any

from logrouter.batch import Batch
from logrouter.native import NATIVE
from logrouter.wire.forward_lazy import Edit, PackedEvents

__all__ = ["condition_mask", "edited", "events_at", "grep_selection", "packed_of", "selected", "set_edit"]

_INT64 = (-(2**63), 2**64 - 1)  # what msgpack holds as an integer (uint64 above int64)


def packed_of(batch: Batch) -> PackedEvents | None:
    """The batch's events if they are still packed (never decodes a deferred batch)."""
    if batch.is_deferred:
        return None
    events = batch.events
    # DocumentEvents (Beats, Log Courier) are packed too: their entries are the
    # extension's transcode of the documents, which decodes to the same events.
    return events if isinstance(events, PackedEvents) else None


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether a value is what a msgpack record holds and decodes back to as itself."""
    kind = value.__class__
    if value is None or kind in (str, bool, float):
        return True
    if kind is int:
        return _INT64[0] <= value <= _INT64[1]
    if depth >= 30:
        return False
    if kind is list:
        return all(_plain(item, depth + 1) for item in value)
    if kind is dict:
        return all(key.__class__ is str and _plain(item, depth + 1) for key, item in value.items())
    return False


def set_edit(pairs: dict[str, Any]) -> Edit | None:
    """A ``SET`` of top-level fields to these values, or None if one is not a plain
    JSON-like value (a TOML date, say): the record path handles those."""
    if not all(_plain(value) for value in pairs.values()):
        return None
    import msgpack

    try:
        native = (Edit.SET, [(key.encode(), msgpack.packb(value, use_bin_type=True)) for key, value in pairs.items()])
    except (UnicodeEncodeError, ValueError, TypeError):  # a lone surrogate, say: not in the native subset
        return None
    return Edit(Edit.SET, tuple(pairs.items()), native)


def remove_edit(keys: frozenset[str] | list[str]) -> Edit:
    ordered = sorted(keys)
    return Edit(Edit.REMOVE, tuple((key, None) for key in ordered), (Edit.REMOVE, [(key.encode(), b"") for key in ordered]))


def rename_edit(pairs: list[tuple[str, str]]) -> Edit:
    return Edit(Edit.RENAME, tuple(pairs), (Edit.RENAME, [(old.encode(), new.encode()) for old, new in pairs]))


def edited(batch: Batch, packed: PackedEvents, edit: Edit) -> Batch:
    return batch.replace(events=packed.edited(edit))  # type: ignore[arg-type]


def selected(batch: Batch, packed: PackedEvents, keep: Any) -> Batch | None:
    """The batch narrowed to the rows where the pyarrow boolean array ``keep`` is true
    (None: no row; the batch itself: every row)."""
    import pyarrow.compute as pc

    rows = pc.indices_nonzero(keep).to_pylist()
    if not rows:
        return None
    if len(rows) == len(packed):
        return batch
    return batch.replace(events=packed.narrowed(rows))  # type: ignore[arg-type]


def events_at(packed: PackedEvents, rows: list[int]) -> list[tuple[int, dict[str, Any]]] | None:
    """The events numbered ``rows`` (ascending) as ``events()`` would give them,
    decoding only their entries (None: the extension cannot say where they are)."""
    if NATIVE is None:
        return None
    try:
        spans = NATIVE.entries_at(packed.piece(), rows, packed.filtered())
    except Exception:  # noqa: BLE001 - a bug in the extension: the record path is the reference
        return None
    if spans is None:
        return None
    from logrouter.wire.forward_packed import decode_entries

    out = []
    for start, end in spans:
        (event,), _ = decode_entries(packed.entries[start:end], packed.now)
        record = event[1]
        for edit in packed.edits:
            record = edit.apply(record)
        out.append((event[0], record))
    return out


def texts(packed: PackedEvents, path: tuple) -> Any:
    """The text ``grep`` sees of the field at ``path`` of each row, as a pyarrow string
    array (null: missing or null), or None where only Python can give it."""
    if NATIVE is None or not all(key.__class__ is str for key in path):
        return None
    filtered = packed.filtered()
    try:
        found = NATIVE.texts([packed.piece()], list(path), None if filtered is None else [filtered])
    except Exception:  # noqa: BLE001 - a bug in the extension: the record path is the reference
        return None
    if found is None:
        return None
    import pyarrow as pa

    rows, nulls, validity, data, offsets = found
    if rows != len(packed):
        return None
    buffers = [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), rows, buffers, nulls)


def grep_selection(packed: PackedEvents, path: tuple, include: str | None, exclude: str | None) -> Any:
    """``grep``'s keep mask over the packed rows, or None (run it on records)."""
    column = texts(packed, path)
    if column is None:
        return None
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        keep = None
        if include is not None:
            keep = pc.fill_null(pc.match_substring_regex(column, include), False)
        if exclude is not None:
            dropped = pc.invert(pc.fill_null(pc.match_substring_regex(column, exclude), False))
            keep = dropped if keep is None else pc.and_(keep, dropped)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # a pattern Arrow's RE2 refuses (google-re2 took it): records decide
    return keep


# --- conditions on columns ------------------------------------------------------------------

# The kinds logrouter_native.values gives (native/src/edits.rs).
MISSING, NIL, BOOL, INT, FLOAT, STR, BIN, CONTAINER, WIDE_INT, RAW_BIN = range(10)
_EXACT = 2**53


class _Fallback(Exception):
    """The condition needs what only the records can tell."""


def condition_mask(packed: PackedEvents, plan: tuple | None) -> Any:
    """A condition's results over the packed rows (a pyarrow boolean array without
    nulls, true where ``Condition.test`` is true), or None (test the records). ``plan``
    is ``Condition.plan``; the semantics are ``logrouter.conditions``'."""
    if plan is None or NATIVE is None:
        return None
    import pyarrow as pa

    try:
        return _Evaluator(packed, _columns(packed, _paths(plan))).mask(plan)
    except (_Fallback, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _paths(plan: tuple) -> list[tuple]:
    """The field paths a plan reads, each once, in order."""
    if plan[0] in ("and", "or"):
        found = [path for part in plan[1] for path in _paths(part)]
        return list(dict.fromkeys(found))
    if plan[0] == "not":
        return _paths(plan[1])
    return [tuple(plan[1])]


def _columns(packed: PackedEvents, paths: list[tuple]) -> dict[tuple, tuple]:
    """(kinds, texts, numbers) arrays per path, read in one walk over the entries."""
    if not all(key.__class__ is str for path in paths for key in path):
        raise _Fallback  # an index into an array: the records decide
    filtered = packed.filtered()
    try:
        raw = NATIVE.values([packed.piece()], [list(path) for path in paths], None if filtered is None else [filtered])  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - a bug in the extension: the records decide
        raise _Fallback from None
    if raw is None or any(found[0] != len(packed) for found in raw):
        raise _Fallback
    import pyarrow as pa

    columns = {}
    for path, (rows, kinds, (nulls, validity, data, offsets), numbers) in zip(paths, raw):
        columns[path] = (
            pa.Array.from_buffers(pa.uint8(), rows, [None, pa.py_buffer(kinds)]),
            pa.Array.from_buffers(pa.string(), rows, [None if validity is None else pa.py_buffer(validity),
                                                      pa.py_buffer(offsets), pa.py_buffer(data)], nulls),
            pa.Array.from_buffers(pa.float64(), rows, [None, pa.py_buffer(numbers)]),
        )
    return columns


class _Evaluator:
    def __init__(self, packed: PackedEvents, columns: dict[tuple, tuple]) -> None:
        self.packed = packed
        self.columns = columns

    def column(self, path: tuple) -> tuple:
        """(kinds, texts, numbers) of the field at ``path``."""
        return self.columns[path]

    def kind_in(self, path: tuple, *kinds: int) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        return pc.is_in(self.column(path)[0], value_set=pa.array(kinds, pa.uint8()))

    def has(self, path: tuple, kind: int) -> bool:
        import pyarrow.compute as pc

        return bool(pc.any(pc.equal(self.column(path)[0], kind)).as_py())

    def mask(self, plan: tuple) -> Any:
        import pyarrow.compute as pc

        op = plan[0]
        if op == "and" or op == "or":
            masks = [self.mask(part) for part in plan[1]]
            combine = pc.and_ if op == "and" else pc.or_
            out = masks[0]
            for other in masks[1:]:
                out = combine(out, other)
            return out
        if op == "not":
            return pc.invert(self.mask(plan[1]))
        path = tuple(plan[1])
        if op == "exists":
            return pc.not_equal(self.column(path)[0], MISSING)
        if op == "eq":
            return self.equals(path, plan[2])
        if op == "in":
            out = self.equals(path, plan[2][0])
            for value in plan[2][1:]:
                out = pc.or_(out, self.equals(path, value))
            return out
        if op == "order":
            return self.order(path, plan[2], plan[3])
        if op == "regex":
            if self.has(path, FLOAT) or self.has(path, RAW_BIN):
                raise _Fallback  # their text is Python's
            texts = self.column(path)[1]
            matched = pc.fill_null(pc.match_substring_regex(texts, plan[2]), False)
            return pc.and_(self.kind_in(path, BOOL, INT, STR, BIN, WIDE_INT), matched)
        raise _Fallback

    def number(self, path: tuple, value: Any) -> Any:
        """The numbers column, where comparing it to ``value`` is exact."""
        if value.__class__ is int and not -_EXACT <= value <= _EXACT:
            raise _Fallback
        if self.has(path, WIDE_INT):
            raise _Fallback
        return self.column(path)[2]

    def equals(self, path: tuple, value: Any) -> Any:
        import pyarrow.compute as pc

        if value is None:
            return self.kind_in(path, MISSING, NIL)
        if value.__class__ is bool:
            texts = self.column(path)[1]
            return pc.and_(self.kind_in(path, BOOL), pc.fill_null(pc.equal(texts, "true" if value else "false"), False))
        if value.__class__ is str:
            texts = self.column(path)[1]
            return pc.and_(self.kind_in(path, STR), pc.fill_null(pc.equal(texts, value), False))
        if value.__class__ in (int, float):
            numbers = self.number(path, value)
            return pc.and_(self.kind_in(path, INT, FLOAT), pc.equal(numbers, float(value)))
        raise _Fallback

    def order(self, path: tuple, op: str, value: Any) -> Any:
        import pyarrow.compute as pc

        compare = {"<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}[op]
        if value.__class__ is str:
            texts = self.column(path)[1]
            return pc.and_(self.kind_in(path, STR), pc.fill_null(compare(texts, value), False))
        if value.__class__ in (int, float):
            numbers = self.number(path, value)
            return pc.and_(self.kind_in(path, INT, FLOAT), compare(numbers, float(value)))
        raise _Fallback

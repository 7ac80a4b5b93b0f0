"""How the files of one partition merge into one schema without losing a value.

Owns the merge rules (pyarrow only; the Spark job turns a ``MergePlan`` into
DataFrame operations, ``logrouter.jobs.compact``):

* ``time`` and ``_extra`` are kept as they are; ``_extra`` is never parsed or
  rewritten except to *add* values (below). A field that is a typed column in one
  file and only inside ``_extra`` in another (the lake's schema rules allow both)
  stays that way, row by row: the merged file has the typed column (null for rows
  whose value is in ``_extra``) and the ``_extra`` text of every row is unchanged.
  Readers already look in both places (``coalesce(col, _extra.col)``).
* Typed columns are the union over all files: a row of a file without the column
  gets null there.
* A column whose type differs between files (possible across writers or restarts),
  or whose name differs only in case (Spark resolves names case-insensitively): for
  each case-folded name one *variant* (name + type) wins and stays a typed column;
  the values of every other variant move into ``_extra`` under their own name, JSON
  encoded the way the lake encodes ``_extra`` (bytes as base64, NaN/±Infinity as
  strings, exact integers). Nothing is cast, so nothing is rounded or lost.
* The winner is deterministic: the variant with the most rows (summed over the files
  that have it), ties broken by the first file (in name order) that has it, then by
  name and type text. Compacting the same files again picks the same winner; a
  compacted file holds most rows, so its types keep winning when late files arrive.
* Column order: ``time``, typed columns in order of first appearance (files in name
  order), ``_extra``.

A row never has the same field both in a typed column and in ``_extra`` (the writer
puts each value in one place), so adding a moved value to ``_extra`` never overwrites.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

TIME = "time"
EXTRA = "_extra"


@dataclass(frozen=True)
class InputFile:
    """One file of the partition as its footer describes it."""

    name: str
    bytes: int
    rows: int
    schema: pa.Schema
    #: Compressed size of the column data (the file less its footer and page overhead).
    data_bytes: int = 0


@dataclass
class MergePlan:
    #: Output columns, in order, with their types (``time`` first, ``_extra`` last).
    columns: list[tuple[str, pa.DataType]]
    #: Per input file name: the columns whose values move into ``_extra``, in order.
    moves: dict[str, list[str]] = field(default_factory=dict)

    def groups(self, files: list[InputFile]) -> list[tuple[tuple[tuple[str, str], ...], list[InputFile]]]:
        """Files that can be read together (same moved variants), as
        ``[(moved (name, type) pairs, files)]``, deterministic order."""
        by_key: dict[tuple[tuple[str, str], ...], list[InputFile]] = {}
        for f in sorted(files, key=lambda f: f.name):
            types = {n: str(f.schema.field(n).type) for n in f.schema.names}
            key = tuple((name, types[name]) for name in self.moves.get(f.name, []))
            by_key.setdefault(key, []).append(f)
        return sorted(by_key.items())


class MergeError(ValueError):
    """A file the merge cannot take (its ``time`` or ``_extra`` column is not the lake's)."""


def plan_merge(files: list[InputFile]) -> MergePlan:
    ordered = sorted(files, key=lambda f: f.name)
    # folded name -> variant (name, type text) -> [rows, first file index, type]
    variants: dict[str, dict[tuple[str, str], list]] = {}
    first_seen: dict[str, int] = {}  # folded name -> position of first appearance
    position = 0
    for index, f in enumerate(ordered):
        names = f.schema.names
        if TIME not in names:
            raise MergeError(f"{f.name}: no {TIME!r} column")
        time_type = f.schema.field(TIME).type
        if not pa.types.is_timestamp(time_type):
            raise MergeError(f"{f.name}: column {TIME!r} is {time_type}, not a timestamp")
        if EXTRA in names and not pa.types.is_string(f.schema.field(EXTRA).type):
            raise MergeError(f"{f.name}: column {EXTRA!r} is {f.schema.field(EXTRA).type}, not a string")
        for column in f.schema:
            if column.name in (TIME, EXTRA):
                continue
            folded = column.name.casefold()
            if folded not in first_seen:
                first_seen[folded] = position
                position += 1
            slot = variants.setdefault(folded, {}).setdefault((column.name, str(column.type)), [0, index, column.type])
            slot[0] += f.rows
    winners: dict[str, tuple[str, str]] = {}
    for folded, options in variants.items():
        winners[folded] = min(options, key=lambda v: (-options[v][0], options[v][1], v[0], v[1]))
    columns: list[tuple[str, pa.DataType]] = [(TIME, pa.timestamp("us", tz="UTC"))]
    for folded in sorted(first_seen, key=first_seen.__getitem__):
        name, type_text = winners[folded]
        columns.append((name, variants[folded][(name, type_text)][2]))
    columns.append((EXTRA, pa.string()))
    moves: dict[str, list[str]] = {}
    for f in ordered:
        moved = [
            c.name
            for c in f.schema
            if c.name not in (TIME, EXTRA) and winners[c.name.casefold()] != (c.name, str(c.type))
        ]
        if moved:
            moves[f.name] = sorted(moved)
    return MergePlan(columns, moves)

"""Nested tables as dotted columns: ``{"host": {"name": "a"}}`` → ``{"host.name": "a"}``.

A parquet sink with ``flatten = true`` stores each nested table's scalar leaves as typed
columns of their own (``host.name``, ``http.response.status``) instead of one JSON text
in ``_extra``: engines then filter and aggregate on them without parsing JSON.

Rules: tables are walked down to ``MAX_DEPTH`` levels and their keys joined with ``.``;
arrays, empty tables and tables nested deeper stay values (and land in ``_extra`` as
before). A flattened name that a record already uses at the top level (a key ``"host.name"``
beside a table ``host``) is not overwritten: the whole table is then kept as it is. Records
are never changed in place, and a record without a table in it is passed on as is.
"""

from __future__ import annotations

from typing import Any, Sequence

MAX_DEPTH = 16

Event = tuple[int, dict[str, Any]]


def flatten_events(events: Sequence[Event]) -> list[Event] | Sequence[Event]:
    """``events`` with every record flattened; the same list when nothing is nested."""
    out: list[Event] | None = None
    for i, (time_ns, record) in enumerate(events):
        flat = flatten_record(record)
        if flat is not record:
            if out is None:
                out = list(events[:i])
            out.append((time_ns, flat))
        elif out is not None:
            out.append((time_ns, record))
    return events if out is None else out


def flatten_record(record: dict[str, Any]) -> dict[str, Any]:
    for value in record.values():
        if value.__class__ is dict and value:
            break
    else:
        return record  # the common case: nothing to flatten
    out: dict[str, Any] = {}
    for key, value in record.items():
        if value.__class__ is dict and value:
            leaves: dict[str, Any] = {}
            _leaves(key, value, 1, leaves)
            if any(name in record for name in leaves):
                out[key] = value  # a top-level key already has one of these names
            else:
                out.update(leaves)
        else:
            out[key] = value
    return out


def _leaves(prefix: str, table: dict[str, Any], depth: int, out: dict[str, Any]) -> None:
    for key, value in table.items():
        name = f"{prefix}.{key}"
        if value.__class__ is dict and value and depth < MAX_DEPTH:
            _leaves(name, value, depth + 1, out)
        else:
            out[name] = value

"""The stored formats of the spool: the forms a record may keep a batch's events in, by
name, and how each is read back. The spool owns this registry; the spool imports no
protocol.

A record (``logrouter.spool.record``) of version 1 or 2 holds decoded events, the spool's
own form. A record of version 3 holds what a source received, ``[name, *fields]`` (the
``Batch.packed`` the source made), so storing it costs a copy of those bytes instead of
encoding every event. The source whose batches carry a format registers it here when its
module is imported: the format's name, the names of its fields, and ``decode(*fields)``,
which must give exactly the events the source routed live, and optionally
``held(events, *fields)``: the bytes those events hold in memory, for a format whose
records are far smaller than that (compressed): the batch read back carries it
(``Batch.held_bytes``) so a sink's queue counts memory, not the record. A process imports only the
sources its config names, so a reader that meets a name not registered yet (a record
of a source no longer in the config, or a tool that validated no config) imports the
module ``registry.STORED_FORMATS`` gives for it before it gives up on the record.

**A name is a version.** A spool written before an upgrade is replayed after it, so a
decoder must give the same events for the same fields for as long as such spools may
exist: a change to what it yields needs a new name, registered beside the old one, which
stays. ``tests/unit/test_spool_golden.py`` holds a record of each registered format as written
and fails for a format without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from logrouter.batch import Event


@dataclass(frozen=True)
class StoredFormat:
    name: str
    fields: tuple[str, ...]  # what follows the name in a stored record, in order
    decode: Callable[..., list[Event]]  # decode(*fields): the events
    held: Callable[..., int] | None = None  # held(events, *fields): the bytes they hold in memory


_FORMATS: dict[str, StoredFormat] = {}


def register(
    name: str, fields: tuple[str, ...], decode: Callable[..., list[Event]], held: Callable[..., int] | None = None
) -> StoredFormat:
    """Declare the stored format ``name`` (see the module's docstring for what that binds)."""
    stored = StoredFormat(name, tuple(fields), decode, held)
    existing = _FORMATS.get(name)
    if existing is not None and existing != stored:
        raise ValueError(f"stored format {name!r} registered twice")
    _FORMATS[name] = stored
    return stored


def registered() -> dict[str, StoredFormat]:
    """Every stored format registered so far, by name."""
    return dict(_FORMATS)


def _lookup(name: Any) -> StoredFormat | None:
    stored = _FORMATS.get(name)
    if stored is None and isinstance(name, str):
        from logrouter import registry

        registry.load_stored_format(name)  # a format of a source this process does not run
        stored = _FORMATS.get(name)
    return stored


def check(packed: tuple) -> None:
    """Refuse (``ValueError``) a ``Batch.packed`` a replay could not read back."""
    stored = _lookup(packed[0])
    if stored is None:
        raise ValueError(f"unknown packed events format {packed[0]!r}")
    if len(packed) != 1 + len(stored.fields):
        raise ValueError(f"packed events format {stored.name!r} stores {', '.join(stored.fields)}; got {len(packed) - 1} fields")


def decode(packed: list) -> list[Event]:
    """The events of a version 3 record's ``[name, *fields]``; ``ValueError`` if unreadable."""
    return decode_held(packed)[0]


def decode_held(packed: list) -> tuple[list[Event], int]:
    """The events of a version 3 record's ``[name, *fields]`` and the bytes they hold in
    memory (0: unknown, about the record's size); ``ValueError`` if unreadable."""
    stored = _lookup(packed[0])
    if stored is None:
        raise ValueError(f"unknown packed events format {packed[0]!r} in a spool record")
    if len(packed) != 1 + len(stored.fields):
        raise ValueError(f"a spool record of format {stored.name!r} holds {len(packed) - 1} fields, not {len(stored.fields)}")
    events = stored.decode(*packed[1:])
    return events, 0 if stored.held is None else stored.held(events, *packed[1:])

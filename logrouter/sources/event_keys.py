"""Per-event idempotency keys of Beats events: what names an event a sender may send again.

Lumberjack has no batch id: a Beats client that lost an ack (the router died after storing
a window, the connection broke) sends the window's events again, on a new connection, and
not necessarily as the same windows. So an event is recognised by fields of its own. The
``idempotency_key`` option of a source says which (``key_maker``):

- ``"auto"`` (the default): ``@metadata._id`` when the event has one (a non-empty
  string: Filebeat's ``add_id`` and ``fingerprint`` processors, ``json.document_id``);
  else, for events of Filebeat's file inputs, the line as the running Filebeat read it:
  ``agent.ephemeral_id``, ``log.file.path``, ``log.offset`` and ``@timestamp`` (the time it
  read the line), all four present (strings, and an integer offset); else none. These
  are read as Beats send them, as nested objects.
- a list of field paths: those fields' values (scalars; an event lacking one has none);
  ``a.b`` is a top-level key ``"a.b"`` if there is one, else ``b`` inside the object ``a``.
- ``"off"``: no event has a key.

Why those four and not the path and offset alone: Filebeat 7.17 events carry no inode or
device, a file rotated or truncated under the same path starts again at offset 0 (and a
renamed file still being read keeps the old path in its events), so path and offset name
different lines over time; the same Filebeat process never reads two lines of one path
at one offset within the same millisecond. ``agent.ephemeral_id`` changes with every
Filebeat start, so lines it reads again after a restart count as new ones (at least
once); events it replays from its disk queue keep their fields and are recognised.

A key is ``(sender, digest)``: the sender is ``agent.id`` (stable across a Beat's
restarts; ``""`` without one) and scopes the bounded window the router keeps
(``logrouter.dedupe.EventWindows``); the digest is 16 bytes of BLAKE2b over the values
(with their types and which rule found them), so the window holds a fixed size per event.

``key_maker`` makes them of decoded records, the reference; a read the native extension
takes gets them from its scan (``native_key``), which hashes the same bytes.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import msgspec

from logrouter.dedupe import DIGEST_BYTES
from logrouter.wire.json_lazy import DOTTED_FIRST, WALK, Path

AUTO = "auto"
OFF = "off"
ID_FIELD = "@metadata._id"
LINE_FIELDS = ("agent.ephemeral_id", "log.file.path", "log.offset", "@timestamp")
SENDER_FIELD = "agent.id"

Key = tuple[str, bytes]
KeyMaker = Callable[[list[dict[str, Any]]], "list[Key | None] | None"]

_SCALARS = (str, int, float, bool)
_encode = msgspec.msgpack.Encoder().encode
_UNENCODABLE = (UnicodeEncodeError, OverflowError)


def check_spec(value: Any) -> None:
    """The ``idempotency_key`` option: ``"auto"``, ``"off"`` or a non-empty list of field paths."""
    if isinstance(value, str):
        if value not in (AUTO, OFF):
            raise ValueError(f'must be "auto", "off" or a list of field paths, got {value!r}')
        return
    if not value:
        raise ValueError("a list of field paths must name at least one field")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item or any(not part for part in item.split(".")):
            raise ValueError(f"item {i} must be a field path such as \"log.offset\", got {item!r}")


def _getter(path: str) -> Callable[[dict[str, Any]], Any]:
    """The value at ``path`` (``a.b.c`` walks nested objects; a top-level key with the dots
    in it is found first, as in tag templates), or None."""
    keys = path.split(".")
    if len(keys) == 1:
        return lambda record: record.get(path)
    first, rest = keys[0], keys[1:]

    def get(record: dict[str, Any]) -> Any:
        value = record.get(path)
        if value is not None:
            return value
        value = record.get(first)
        for key in rest:
            if value.__class__ is not dict:
                return None
            value = value.get(key)
        return value

    return get


def key_maker(spec: str | list[str]) -> KeyMaker | None:
    """The function giving each record's key (None for a record without one, None for the
    whole list when no record has one), or None for ``"off"``."""
    if spec == OFF:
        return None
    if spec == AUTO:
        return _auto()
    return _fields(list(spec), _getter(SENDER_FIELD))


def _fields_name(paths: list[str]) -> str:
    """The first value a field list's keys hash: another field list names other events."""
    return "fields:" + "\0".join(paths)


def _digest(values: tuple) -> bytes:
    return hashlib.blake2b(_encode(values), digest_size=DIGEST_BYTES).digest()


def _auto() -> KeyMaker:
    """``"auto"``, read as Beats send events (nested objects), in one pass: it runs per event."""
    blake2b = hashlib.blake2b
    encode = _encode
    size = DIGEST_BYTES

    def keys(records: list[dict[str, Any]]) -> list[Key | None] | None:
        out: list[Key | None] = []
        append = out.append
        found = False
        for r in records:
            agent = r.get("agent")
            if agent.__class__ is not dict:
                agent = _EMPTY
            meta = r.get("@metadata")
            doc_id = meta.get("_id") if meta.__class__ is dict else None
            if doc_id.__class__ is str and doc_id:
                values: tuple = ("id", doc_id)
            else:
                log = r.get("log")
                if log.__class__ is not dict:
                    append(None)
                    continue
                offset = log.get("offset")
                file = log.get("file")
                path = file.get("path") if file.__class__ is dict else None
                ephemeral = agent.get("ephemeral_id")
                stamp = r.get("@timestamp")
                if (
                    offset.__class__ is not int
                    or path.__class__ is not str
                    or ephemeral.__class__ is not str
                    or stamp.__class__ is not str
                ):
                    append(None)
                    continue
                values = ("line", ephemeral, path, offset, stamp)
            try:
                data = encode(values)
            except _UNENCODABLE:  # a lone surrogate from a JSON escape: no key, at least once
                append(None)
                continue
            sender = agent.get("id")
            append((sender if sender.__class__ is str else "", blake2b(data, digest_size=size).digest()))
            found = True
        return out if found else None

    return keys


_EMPTY: dict[str, Any] = {}


def _fields(paths: list[str], sender_of: Callable[[dict[str, Any]], Any]) -> KeyMaker:
    getters = [_getter(path) for path in paths]
    name = _fields_name(paths)

    def keys(records: list[dict[str, Any]]) -> list[Key | None] | None:
        out: list[Key | None] = []
        found = False
        for r in records:
            values = [get(r) for get in getters]
            if not all(isinstance(v, _SCALARS) for v in values):
                out.append(None)
                continue
            try:
                digest = _digest((name, *values))
            except _UNENCODABLE:  # an integer beyond 64 bits, a lone surrogate
                out.append(None)
                continue
            sender = sender_of(r)
            out.append((sender if sender.__class__ is str else "", digest))
            found = True
        return out if found else None

    return keys


# -- keys made by the native scan (a read the extension keeps undecoded) -------------------

_AUTO_PATHS = ("@metadata._id", "log.offset", "log.file.path", "agent.ephemeral_id", "@timestamp", SENDER_FIELD)
AUTO_KIND, FIELDS_KIND = 0, 1


def native_key(spec: str | list[str]) -> tuple[list[Path], int, str] | None:
    """For ``spec`` other than ``"off"``: the field paths a key needs (the sender's
    last), and what the native scan is asked to make of their values (``kind``, ``name``:
    ``AUTO_KIND``, or ``FIELDS_KIND`` and the list's name), which gives the keys
    ``key_maker`` gives the decoded records (``native/src/keys.rs``: the same lookups,
    the same msgpack, the same BLAKE2b)."""
    if spec == OFF:
        return None
    if spec == AUTO:
        return [(WALK, path, tuple(path.split("."))) for path in _AUTO_PATHS], AUTO_KIND, ""
    names = list(spec)
    return [(DOTTED_FIRST, path, tuple(path.split("."))) for path in [*names, SENDER_FIELD]], FIELDS_KIND, _fields_name(names)

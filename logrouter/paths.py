"""Field paths: the one syntax every component uses to name a field of a record.

A path is either a plain top-level key (``"level"``; dots and other characters are part
of the name) or a record-accessor path in the Fluentd style that starts with ``$``:
``$.a.b``, ``$['a']['b.c']``, ``$["a"]``, ``$.tags[0]``, ``$.tags[-1]``. Parsed once (at
config load) into a tuple of keys and list indexes; this module also holds the reader and
the copy-on-write writers built on it:

* ``getter(path)`` reads a field, ``None`` (or a given default) when absent;
* ``with_value(record, path, value)`` and ``without(record, path)`` return a changed copy,
  copying only the tables on the path, so a record shared by several branches of the
  graph is never changed in place.

Inside a condition (``logrouter.conditions``) a ``$`` path ends at white space or an
operator character; a name holding those is written ``$['a name']``.
"""

from __future__ import annotations

import re
from typing import Any, Callable

Path = tuple[str | int, ...]

SYNTAX = "a top-level key, or a path `$.a.b` / `$['a']['b.c']` / `$.tags[-1]`"

# One segment after the leading "$": .name, ['name'], ["name"] or [index].
_SEGMENT = re.compile(r"""\.([^.\[\]'"]+)|\['([^']*)'\]|\["([^"]*)"\]|\[(-?\d+)\]""")
# The same inside an expression: a .name stops at white space and operator characters.
_EMBEDDED_SEGMENT = re.compile(r"""\.([^.\[\]'"\s=!<>~(),]+)|\['([^']*)'\]|\["([^"]*)"\]|\[(-?\d+)\]""")

MISSING: Any = object()  # what ``getter(path, MISSING)`` returns for an absent field


class PathError(ValueError):
    """A malformed path; ``offset`` is where in the text it went wrong."""

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.offset = offset


def parse(text: str) -> Path:
    """``"level"`` -> ``("level",)``; ``"$.a['b.c'][0]"`` -> ``("a", "b.c", 0)``.

    Raises ``PathError`` (a ``ValueError``) for a malformed ``$`` path or an empty name.
    """
    if not text:
        raise PathError("field name must not be empty")
    if not text.startswith("$"):
        return (text,)
    path, end = _segments(text, 1, _SEGMENT)
    if end != len(text):
        raise PathError(f"cannot parse field path {text!r} at offset {end}", end)
    if not path:
        raise PathError(f"field path {text!r} names no field", end)
    return path


def scan(text: str, pos: int) -> tuple[Path, int]:
    """A ``$`` path embedded in ``text`` at ``pos``: the path and the offset just past it."""
    if not text.startswith("$", pos):
        raise PathError("a path starts with '$'", pos)
    path, end = _segments(text, pos + 1, _EMBEDDED_SEGMENT)
    if not path:
        raise PathError("a path names a field after '$': $.name or $['name']", end)
    return path, end


def _segments(text: str, pos: int, segment: re.Pattern[str]) -> tuple[Path, int]:
    path: list[str | int] = []
    start = pos - 1
    while pos < len(text):
        m = segment.match(text, pos)
        if m is None:
            break
        name, single, double, index = m.groups()
        if index is not None:
            if not path:
                raise PathError(f"field path {text[start:m.end()]!r} must start with a key, not an index", pos)
            path.append(int(index))
        else:
            path.append(name if name is not None else single if single is not None else double)
        pos = m.end()
    return tuple(path), pos


def key_path(text: str) -> Path:
    """A path for writing: keys only, since array elements cannot be set or removed."""
    path = parse(text)
    if any(type(key) is int for key in path):
        raise PathError(f"field path {text!r}: array indexes are not supported here")
    return path


def text(path: Path) -> str:
    """The path written back in the ``$`` syntax (for messages)."""
    if len(path) == 1 and isinstance(path[0], str):
        return path[0]
    out = ["$"]
    for key in path:
        if type(key) is int:
            out.append(f"[{key}]")
        elif key and re.fullmatch(r"[^.\[\]'\"\s=!<>~(),]+", key):
            out.append("." + key)
        else:
            out.append("[" + repr(key) + "]")
    return "".join(out)


def getter(path: Path, default: Any = None) -> Callable[[dict[str, Any]], Any]:
    """A reader for ``path`` that returns ``default`` when the field is absent.

    A non-dict record raises (the caller's error path); a nested value of the wrong shape
    (``$.a.b`` where ``a`` is a string) reads as absent, since records of mixed shapes are
    normal in logs and not an error of the record.
    """
    first = path[0]
    if len(path) == 1:
        if default is None:
            return lambda record: record.get(first)
        return lambda record: record.get(first, default)
    rest = path[1:]

    def get(record: dict[str, Any]) -> Any:
        node = record.get(first, default)
        for key in rest:
            if type(key) is int:
                if not isinstance(node, list) or not -len(node) <= key < len(node):
                    return default
                node = node[key]
            else:
                if not isinstance(node, dict):
                    return default
                node = node.get(key, default)
        return node

    return get


def set_in(record: dict[str, Any], path: Path, value: Any) -> None:
    """Set a nested field in ``record`` (already a copy), copying each table on the way.

    A key on the way that holds a non-table raises ``TypeError``: replacing it with a
    table would lose data silently.
    """
    node = record
    for key in path[:-1]:
        child = node.get(key)
        if child is None:
            child = {}
        elif isinstance(child, dict):
            child = dict(child)
        else:
            raise TypeError(f"field {key!r} holds a {type(child).__name__}, not a table")
        node[key] = child
        node = child
    node[path[-1]] = value


def with_value(record: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """A copy of ``record`` with the field at ``path`` set to ``value``."""
    new = dict(record)
    set_in(new, path, value)
    return new


def without(record: dict[str, Any], path: Path) -> dict[str, Any]:
    """``record`` without the nested field at ``path``; the same object when it is absent."""
    nodes = [record]
    for key in path[:-1]:
        node = nodes[-1].get(key)
        if not isinstance(node, dict):
            return record
        nodes.append(node)
    if path[-1] not in nodes[-1]:
        return record
    new = dict(nodes[-1])
    del new[path[-1]]
    for parent, key in zip(reversed(nodes[:-1]), reversed(path[:-1])):
        copy = dict(parent)
        copy[key] = new
        new = copy
    return new


def check(value: str) -> None:
    """``Option.check`` for a path option."""
    parse(value)


def check_list(value: list[Any]) -> None:
    """``Option.check`` for a list of paths (at least one)."""
    if not value:
        raise ValueError("must name at least one field")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ValueError(f"item {i} must be a string, got {item!r}")
        try:
            parse(item)
        except ValueError as e:
            raise ValueError(f"item {i}: {e}") from None

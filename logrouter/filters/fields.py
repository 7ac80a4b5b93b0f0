"""The filters that change record fields: ``set``, ``remove``, ``rename``.

A field is named by the project's one path syntax (``logrouter.paths``): a plain
top-level key (``"level"``, dots included) or ``$.a.b``, ``$['a']['b']``, ``$.a[0]``.

The filters never mutate their input: a record they change is shallow-copied, and a nested
table on a changed path is copied too (copy on write), because a batch may fan out to
several branches. A record they leave unchanged is passed on as the same object.

On a batch of forward entries still packed (``logrouter.filters.columnar``), a change to
top-level fields only (``set`` values JSON-like, placeholders resolved per batch) is
recorded as an edit and the batch stays packed; a ``$.a.b`` path reads records.
"""

from __future__ import annotations

import re
from typing import Any

from logrouter import paths, registry
from logrouter.batch import Batch, Event
from logrouter.config.options import Option
from logrouter.errors import ErrorPath
from logrouter.filters import columnar

# Per-tag caches are cleared when they reach this size: sources send few distinct tags, so
# this only matters against a flood of unique tags, where it keeps memory bounded.
TAG_CACHE_SIZE = 1024

# The project's one path syntax lives in ``logrouter.paths``; these names stay for callers.
Path = paths.Path
parse_field_path = paths.parse
field_getter = paths.getter
_key_path = paths.key_path
_set_in = paths.set_in
_without = paths.without


# --- placeholders in `set` values ----------------------------------------------------------

_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_TAG_PART = re.compile(r"tag_parts\[(-?\d+)\]")


def _check_placeholders(value: Any) -> bool:
    """Raise for an unknown ``${...}``; return whether ``value`` holds any placeholder."""
    if isinstance(value, str):
        found = False
        for m in _PLACEHOLDER.finditer(value):
            if m.group(1) != "tag" and not _TAG_PART.fullmatch(m.group(1)):
                raise ValueError(
                    f"unknown placeholder {m.group(0)!r} in {value!r}; "
                    "known: ${tag}, ${tag_parts[N]}"
                )
            found = True
        return found
    if isinstance(value, list):
        return any([_check_placeholders(v) for v in value])
    if isinstance(value, dict):
        return any([_check_placeholders(v) for v in value.values()])
    return False


def _resolve(value: Any, tag: str, parts: list[str]) -> Any:
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: _placeholder_value(m.group(1), tag, parts), value)
    if isinstance(value, list):
        return [_resolve(v, tag, parts) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, tag, parts) for k, v in value.items()}
    return value


def _placeholder_value(name: str, tag: str, parts: list[str]) -> str:
    if name == "tag":
        return tag
    index = int(_TAG_PART.fullmatch(name).group(1))
    # An index the tag does not have yields "": the tag is runtime data, so this cannot be
    # a config error, and dropping the events to the error path would lose them.
    return parts[index] if -len(parts) <= index < len(parts) else ""


# --- option checks ------------------------------------------------------------------------


def _check_set_fields(fields: dict[str, Any]) -> None:
    if not fields:
        raise ValueError("must set at least one field")
    paths = []
    for name, value in fields.items():
        paths.append((name, _key_path(name)))
        _check_placeholders(value)
    # With no path a prefix of another, the order of applying them cannot matter.
    for name_a, a in paths:
        for name_b, b in paths:
            if name_a == name_b or b[: len(a)] != a:
                continue
            if a == b:
                raise ValueError(f"{name_a!r} and {name_b!r} set the same field")
            raise ValueError(f"{name_a!r} and a field inside it, {name_b!r}, are both set")


def _check_remove_fields(fields: list[Any]) -> None:
    if not fields:
        raise ValueError("must name at least one field")
    for i, name in enumerate(fields):
        if not isinstance(name, str):
            raise ValueError(f"item {i} must be a string, got {name!r}")
        _key_path(name)


def _check_rename_fields(fields: dict[str, Any]) -> None:
    if not fields:
        raise ValueError("must name at least one field")
    targets: dict[str, str] = {}
    for old, new in fields.items():
        if not isinstance(new, str) or not new:
            raise ValueError(f"new name for {old!r} must be a non-empty string, got {new!r}")
        if not old:
            raise ValueError("field name must not be empty")
        if old.startswith(("$.", "$[")):
            raise ValueError(f"{old!r}: rename works on top-level fields only")
        if new in targets:
            raise ValueError(f"{targets[new]!r} and {old!r} are both renamed to {new!r}")
        targets[new] = old


# --- filters ------------------------------------------------------------------------------


@registry.filter("set")
class SetFilter:
    """Sets fields to constant values; strings may use ``${tag}`` and ``${tag_parts[N]}``."""

    OPTIONS = {
        "fields": Option(
            dict,
            doc="field or `$.a.b` path → any TOML value; strings may use `${tag}` and `${tag_parts[N]}` (N may be "
            "negative; a missing part gives `\"\"`)",
            check=_check_set_fields,
        ),
    }

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath) -> None:
        self.name = name
        self.errors = errors
        fields = options["fields"]
        _check_set_fields(fields)
        self._fields = fields
        self._templated = any([_check_placeholders(v) for v in fields.values()])
        self._paths = {field: _key_path(field) for field in fields}
        self._resolved: dict[str, tuple[dict[str, Any], list[tuple[Path, Any]]]] = {}
        if not self._templated:
            self._resolved_for("")  # constant: resolve once, whatever the tag

    def _resolved_for(self, tag: str) -> tuple[dict[str, Any], list[tuple[Path, Any]]]:
        """Top-level values and nested (path, value) pairs for a tag, cached per tag."""
        key = tag if self._templated else ""
        cached = self._resolved.get(key)
        if cached is None:
            parts = tag.split(".")
            top: dict[str, Any] = {}
            nested: list[tuple[Path, Any]] = []
            for field, value in self._fields.items():
                path, value = self._paths[field], _resolve(value, tag, parts)
                if len(path) == 1:
                    top[path[0]] = value
                else:
                    nested.append((path, value))
            cached = (top, nested)
            if len(self._resolved) >= TAG_CACHE_SIZE:
                self._resolved.clear()
            self._resolved[key] = cached
        return cached

    def process(self, batch: Batch) -> Batch | None:
        top, nested = self._resolved_for(batch.tag)
        packed = None if nested else columnar.packed_of(batch)
        if packed is not None:
            edit = columnar.set_edit(top)
            if edit is not None:
                return columnar.edited(batch, packed, edit) if len(packed) else None
        out: list[Event] = []
        append = out.append
        for event in batch.events:
            record = event[1]
            try:
                new = {**record, **top}
                for path, value in nested:
                    _set_in(new, path, value)
            except Exception as exc:
                self.errors(self.name, batch.tag, record, f"{type(exc).__name__}: {exc}")
                continue
            append((event[0], new))
        return batch.replace(events=out) if out else None


@registry.filter("remove")
class RemoveFilter:
    """Removes fields (top-level names or ``$.a.b`` paths); absent fields are ignored."""

    OPTIONS = {
        "fields": Option(
            list, doc="top-level names or `$.a.b` paths to remove; absent fields are ignored", check=_check_remove_fields
        ),
    }

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath) -> None:
        self.name = name
        self.errors = errors
        _check_remove_fields(options["fields"])
        paths = [_key_path(f) for f in options["fields"]]
        self._top = frozenset(p[0] for p in paths if len(p) == 1)
        self._nested = [p for p in paths if len(p) > 1]
        self._edit = columnar.remove_edit(self._top)

    def process(self, batch: Batch) -> Batch | None:
        top, nested = self._top, self._nested
        packed = None if nested else columnar.packed_of(batch)
        if packed is not None:
            return columnar.edited(batch, packed, self._edit) if len(packed) else None
        out: list[Event] = []
        append = out.append
        for event in batch.events:
            record = event[1]
            try:
                new = record
                # Most records lack most listed fields: copy only when one is present.
                if not top.isdisjoint(record.keys()):
                    new = dict(record)
                    for key in top:
                        new.pop(key, None)
                for path in nested:
                    new = _without(new, path)
            except Exception as exc:
                self.errors(self.name, batch.tag, record, f"{type(exc).__name__}: {exc}")
                continue
            append(event if new is record else (event[0], new))
        return batch.replace(events=out) if out else None


@registry.filter("rename")
class RenameFilter:
    """Renames top-level fields; an absent old field is ignored, the new name overwrites."""

    OPTIONS = {
        "fields": Option(dict, doc="old → new top-level name; all renames happen at once (`{a = \"b\", b = \"a\"}` swaps)", check=_check_rename_fields),
    }

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath) -> None:
        self.name = name
        self.errors = errors
        _check_rename_fields(options["fields"])
        self._pairs = [(old, new) for old, new in options["fields"].items() if old != new]
        self._old = frozenset(old for old, _ in self._pairs)
        self._edit = columnar.rename_edit(self._pairs)

    def process(self, batch: Batch) -> Batch | None:
        pairs, olds = self._pairs, self._old
        packed = columnar.packed_of(batch)
        if packed is not None:
            return columnar.edited(batch, packed, self._edit) if len(packed) else None
        out: list[Event] = []
        append = out.append
        for event in batch.events:
            record = event[1]
            try:
                if olds.isdisjoint(record.keys()):
                    append(event)
                    continue
                new = dict(record)
                # Remove every old name before writing any new one, so the renames happen
                # at once: {a = "b", b = "a"} swaps the two fields.
                for old in olds:
                    new.pop(old, None)
                for old, name in pairs:
                    if old in record:
                        new[name] = record[old]
            except Exception as exc:
                self.errors(self.name, batch.tag, record, f"{type(exc).__name__}: {exc}")
                continue
            append((event[0], new))
        return batch.replace(events=out) if out else None

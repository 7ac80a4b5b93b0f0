"""The ``grep`` filter: keeps or drops records by a regular expression on one field.

Semantics follow Fluentd's grep filter: ``include`` keeps records whose field matches
(a search: RE2, ``logrouter.regex``), ``exclude`` drops records whose field matches; with both, a record must
match ``include`` and not ``exclude``. A record without the field (or with a null value)
never passes ``include`` and always passes ``exclude``. Instead of a field and regexes,
``condition`` (``logrouter.conditions``) keeps the records it is true for.

On a batch of forward entries still packed, ``field`` with ``include`` / ``exclude`` is
evaluated on the field's column (``logrouter.filters.columnar``), and so is a
``condition`` (``columnar.condition_mask``): the batch stays packed. A field whose
value only Python renders reads records.
"""

from __future__ import annotations

from typing import Any

from logrouter import conditions, regex, registry
from logrouter.batch import Batch, Event
from logrouter.config.options import Option
from logrouter.errors import ErrorPath
from logrouter.filters import columnar
from logrouter.filters.common import narrowed
from logrouter.filters.drop import evaluate
from logrouter.filters.fields import field_getter, parse_field_path


def _check_field(value: str) -> None:
    parse_field_path(value)


def as_text(value: Any) -> str:
    """The text a regex sees for a non-string field value."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, bool):
        # Records come from JSON/msgpack, where users know these as true/false.
        return "true" if value else "false"
    return str(value)


@registry.filter("grep")
class GrepFilter:
    """Keeps records whose field matches ``include`` and does not match ``exclude``."""

    OPTIONS = {
        "field": Option(str, default=None, doc="a top-level key, or a path `$.a.b` / `$['a']['b']` / `$.tags[-1]`; with `include` / `exclude`", check=_check_field),
        "include": Option(str, default=None, doc="regex (RE2 syntax, see Regexes): a record passes only if its field matches somewhere (a missing or null field does not)", check=regex.check),
        "exclude": Option(str, default=None, doc="regex (RE2 syntax): a record whose field matches is dropped (a missing or null field does not match)", check=regex.check),
        "condition": Option(str, default=None, doc="instead of `field`/`include`/`exclude`: records it is true for pass (see Conditions)", check=conditions.check),
    }

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[str]:
        has_regex = options.get("include") is not None or options.get("exclude") is not None
        if options.get("condition") is not None:
            if has_regex or options.get("field") is not None:
                return ["condition: set either condition or field with include/exclude, not both"]
            return []
        if options.get("field") is None:
            return ["field: required key is missing (or set condition)"]
        if not has_regex:
            return ["include or exclude must be set"]
        return []

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath) -> None:
        self.name = name
        self.errors = errors
        problems = self.check_options(options)
        if problems:
            raise ValueError("; ".join(problems))
        self._condition = conditions.Condition(options["condition"]) if options.get("condition") is not None else None
        if self._condition is not None:
            return
        self.field = options["field"]
        path = parse_field_path(self.field)
        self._get = field_getter(path)
        # A top-level key is read inline in the loop: a call per event costs a third more.
        self._key = path[0] if len(path) == 1 else None
        self._path = tuple(path)
        include, exclude = options.get("include"), options.get("exclude")
        self._patterns = (include, exclude)
        self._include = regex.compile(include).searcher() if include is not None else None
        self._exclude = regex.compile(exclude).searcher() if exclude is not None else None

    def process(self, batch: Batch) -> Batch | None:
        if self._condition is not None:
            packed = columnar.packed_of(batch)
            if packed is not None:
                keep = columnar.condition_mask(packed, self._condition.plan)
                if keep is not None:
                    return columnar.selected(batch, packed, keep)
            return narrowed(batch, evaluate(self._condition, self.name, batch, self.errors, keep_when=True))
        packed = columnar.packed_of(batch)
        if packed is not None:  # forward entries still packed: on their columns, undecoded
            keep = columnar.grep_selection(packed, self._path, *self._patterns)
            if keep is not None:
                return columnar.selected(batch, packed, keep)
        get, key, include, exclude = self._get, self._key, self._include, self._exclude
        # What a record without the field does is the same for the whole batch.
        keep_missing = include is None
        kept: list[Event] = []
        append = kept.append
        for event in batch.events:
            try:
                value = event[1].get(key) if key is not None else get(event[1])
                if value is None:
                    keep = keep_missing
                else:
                    if value.__class__ is not str:
                        value = as_text(value)
                    keep = (include is None or include(value)) and (exclude is None or not exclude(value))
            except Exception as exc:
                self.errors(self.name, batch.tag, event[1], f"{type(exc).__name__}: {exc}")
                continue
            if keep:
                append(event)
        if not kept:
            return None
        return batch if len(kept) == len(batch.events) else batch.replace(events=kept)

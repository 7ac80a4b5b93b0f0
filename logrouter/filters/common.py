"""What the filters in this package share: batch results, keys, and the failure policy.

* ``narrowed(batch, kept)``: the batch itself when nothing was dropped, ``None`` when
  everything was, else a copy with the kept events; ``replaced`` for rewritten events.
* ``key_function(fields)``: a record -> hashable key reader over a list of field paths
  (missing and null read alike; tables and arrays are keyed by their JSON text).
* ``FailurePolicy``: what a parser does with a record it cannot handle, the
  ``on_error`` / ``flag_field`` options: pass the record on unchanged with the reason in
  a flag field, or hand it to the component's error path (``errors(component, tag,
  record, reason)``, the original record), which the dead-letter output will route.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from logrouter import paths
from logrouter.batch import Batch, Event
from logrouter.config.options import Option, one_of


def narrowed(batch: Batch, kept: list[Event]) -> Batch | None:
    """For filters that select (``kept`` holds some of the batch's own events, in order)."""
    if not kept:
        return None
    return batch if len(kept) == len(batch.events) else batch.replace(events=kept)


def replaced(batch: Batch, events: list[Event]) -> Batch | None:
    """For filters that rewrite events: the batch with ``events``, ``None`` when empty."""
    return batch.replace(events=events) if events else None


def _hashable(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, default=repr)
    return value


def key_function(fields: list[str]) -> Callable[[dict[str, Any]], Any]:
    """A reader of the key a record has over ``fields`` (one value, or a tuple of them)."""
    getters = [paths.getter(paths.parse(f)) for f in fields]
    if len(getters) == 1:
        (get,) = getters

        def one(record: dict[str, Any]) -> Any:
            value = get(record)
            if value.__class__ is str:
                return value
            return _hashable(value)

        return one
    return lambda record: tuple([_hashable(get(record)) for get in getters])


ON_ERROR = ("flag", "error")


def failure_options(what: str) -> dict[str, Option]:
    return {
        "on_error": Option(
            str, "flag", f"when {what}: `flag` = the record goes on unchanged with the reason in `flag_field`; "
            "`error` = it goes to the error path", one_of(*ON_ERROR)
        ),
        "flag_field": Option(str, "_parse_error", "field (or `$.a.b` path) that gets the reason when `on_error = \"flag\"`", paths.check),
    }


class FailurePolicy:
    """Applies ``on_error``: ``fail(record) -> event or None`` for a record that failed."""

    def __init__(self, component: str, options: dict[str, Any], errors: Any) -> None:
        self.component = component
        self.errors = errors
        self.flag = options["on_error"] == "flag"
        self.flag_path = paths.key_path(options["flag_field"])
        self.failed = 0

    def fail(self, tag: str, event: Event, reason: str) -> Event | None:
        self.failed += 1
        if self.flag:
            try:
                return (event[0], paths.with_value(event[1], self.flag_path, reason))
            except Exception as exc:  # the flag's path is blocked by a scalar
                reason = f"{reason}; and cannot set the flag field: {exc}"
        self.errors(self.component, tag, event[1], reason)
        return None


def on_tables(name: str, batch: Batch, errors: Any, run: Callable[[list[Event]], list[Event]]) -> list[Event]:
    """``run(events)`` over the batch's events whose records are tables; the others (only
    a broken source makes one) go to the error path first. The check is one pass of
    class tests, so stateful filters never see a record they cannot read.
    """
    events = batch.events
    for event in events:
        if event[1].__class__ is not dict:
            break
    else:
        return run(events)
    good = []
    for event in events:
        if isinstance(event[1], dict):
            good.append(event)
        else:
            errors(name, batch.tag, event[1], f"not a table: {type(event[1]).__name__}")
    return run(good) if good else []

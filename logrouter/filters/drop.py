"""The ``drop`` filter: drops the records a condition selects (``logrouter.conditions``).

A batch of forward entries still packed is tested on its columns where the condition
allows (``logrouter.filters.columnar.condition_mask``) and stays packed.
"""

from __future__ import annotations

from typing import Any

from logrouter import conditions, registry
from logrouter.batch import Batch, Event
from logrouter.config.options import Option
from logrouter.errors import ErrorPath
from logrouter.filters import columnar
from logrouter.filters.common import narrowed


def evaluate(condition: conditions.Condition, name: str, batch: Batch, errors: ErrorPath, keep_when: bool) -> list[Event]:
    """The events whose condition result is ``keep_when``; one comprehension over the batch.

    A condition never raises for a record of any shape; a record that is not a table at
    all (a broken source) sends the batch to a per-event loop that gives it to the error
    path, so it cannot take the rest with it.
    """
    test = condition.test
    try:
        if keep_when:
            return [event for event in batch.events if test(event[1])]
        return [event for event in batch.events if not test(event[1])]
    except Exception:
        kept = []
        for event in batch.events:
            try:
                if bool(test(event[1])) is keep_when:
                    kept.append(event)
            except Exception as exc:
                errors(name, batch.tag, event[1], f"condition failed: {type(exc).__name__}: {exc}")
        return kept


@registry.filter("drop")
class DropFilter:
    """Drops every record the condition is true for; the others pass unchanged."""

    OPTIONS = {
        "condition": Option(str, doc="records it is true for are dropped; " + conditions.SYNTAX + " (see Conditions)", check=conditions.check),
    }

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath) -> None:
        self.name = name
        self.errors = errors
        self.condition = conditions.Condition(options["condition"])
        self.dropped = 0

    def process(self, batch: Batch) -> Batch | None:
        packed = columnar.packed_of(batch)
        if packed is not None:  # forward entries still packed: tested on their columns
            dropping = columnar.condition_mask(packed, self.condition.plan)
            if dropping is not None:
                import pyarrow.compute as pc

                keep = pc.invert(dropping)
                self.dropped += len(packed) - pc.sum(keep).as_py() if len(packed) else 0
                return columnar.selected(batch, packed, keep)
        kept = evaluate(self.condition, self.name, batch, self.errors, keep_when=False)
        self.dropped += len(batch.events) - len(kept)
        return narrowed(batch, kept)

"""The ``route`` filter: named outputs chosen by conditions, plus ``_unmatched``.

Other components take one of its outputs as input (``by_level.errors``: see the router's
named outputs), never the filter as a whole. Each route is a condition
(``logrouter.conditions``); an event goes to every route whose condition holds
(``first_match = false``, as Vector's ``route``), or only to the first in the order
written (``first_match = true``, as a Fluentd ``<match>`` chain); events no route takes
go to ``_unmatched``. Events are not copied: a record reaching two routes is the same
object in both (filters never change their input records in place). A batch of forward
entries still packed is split on its columns where the conditions allow
(``logrouter.filters.columnar.condition_mask``): each output stays packed.
"""

from __future__ import annotations

import re
from typing import Any

from logrouter import conditions, registry
from logrouter.batch import Batch
from logrouter.config.load import ERRORS_OUTPUT
from logrouter.config.options import Option, Problems
from logrouter.errors import ErrorPath
from logrouter.filters import columnar

UNMATCHED = "_unmatched"
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def _check_routes(value: dict[str, Any]) -> None:
    problems = []
    if not value:
        problems.append("must name at least one route: {name = \"<condition>\", …}")
    for name, condition in value.items():
        where = f".{name}"
        if not _NAME.match(name):
            problems.append(f"{where}: a route name is letters, digits, '_' and '-' (it is written as <filter>.{name})")
        elif name in (ERRORS_OUTPUT, UNMATCHED):
            problems.append(f"{where}: {name!r} is a reserved output name")
        if not isinstance(condition, str):
            problems.append(f"{where}: must be a condition string, got {condition!r}")
            continue
        try:
            conditions.check(condition)
        except ValueError as e:
            problems.append(f"{where}: {e}")
    if problems:
        raise Problems(problems)


@registry.filter("route")
class RouteFilter:
    """Splits each batch into its routes' outputs and ``_unmatched``."""

    OPTIONS = {
        "routes": Option(
            dict, doc="output name → condition (`{failed = 'level == \"error\"', slow = '$.ms > 1000'}`); "
            "take them as `<filter>.<name>` and `<filter>._unmatched`", check=_check_routes,
        ),
        "first_match": Option(bool, False, "an event goes only to the first route (in the order written) whose condition holds"),
    }

    @classmethod
    def outputs(cls, options: dict[str, Any]) -> list[str] | None:
        if "routes" not in options:
            return None  # the routes option itself was refused: its error says enough
        return [*options["routes"], UNMATCHED]

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath) -> None:
        self.name = name
        self.errors = errors
        self.routes = [(route, conditions.Condition(text).test) for route, text in options["routes"].items()]
        self._plans = [conditions.Condition(text).plan for text in options["routes"].values()]
        self.first_match = options["first_match"]

    def process(self, batch: Batch) -> dict[str, Batch]:
        packed = columnar.packed_of(batch)
        if packed is not None:
            out = self._packed(batch, packed)
            if out is not None:
                return out
        events = batch.events
        taken = [False] * len(events)
        out: dict[str, Batch] = {}
        for route, test in self.routes:
            selected = []
            append = selected.append
            for i, event in enumerate(events):
                if self.first_match and taken[i]:
                    continue
                if test(event[1]):
                    append(event)
                    taken[i] = True
            if selected:
                out[route] = batch.replace(selected)
        rest = [event for i, event in enumerate(events) if not taken[i]]
        if rest:
            out[UNMATCHED] = batch.replace(rest)
        return out

    def _packed(self, batch: Batch, packed: Any) -> dict[str, Batch] | None:
        """``process`` on the packed batch's columns; None: test the records."""
        import pyarrow.compute as pc

        masks = []
        for plan in self._plans:
            mask = columnar.condition_mask(packed, plan)
            if mask is None:
                return None
            masks.append(mask)
        out: dict[str, Batch] = {}
        taken = None
        for (route, _), mask in zip(self.routes, masks):
            if self.first_match and taken is not None:
                mask = pc.and_(mask, pc.invert(taken))
            part = columnar.selected(batch, packed, mask)
            if part is not None:
                out[route] = batch.replace(events=packed) if part is batch else part
            taken = mask if taken is None else pc.or_(taken, mask)
        rest = columnar.selected(batch, packed, pc.invert(taken))
        if rest is not None:
            out[UNMATCHED] = batch.replace(events=packed) if rest is batch else rest
        return out

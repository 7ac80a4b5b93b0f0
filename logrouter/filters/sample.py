"""The ``sample`` filter: keeps 1 in ``rate`` events, deterministically.

Without ``key`` the kept events are every ``rate``-th of the batch, from an offset drawn
from the batch's own content (first event, times, length), so the whole batch costs one
slice. With ``key`` a stable hash (CRC-32) of the key's values decides: all events of a
key are kept or dropped together, across batches, restarts and routers. Both choices
depend only on the data, so a sink replaying the spool after a failure sees exactly the
events it saw the first time. With ``condition`` only the events it is true for are
sampled; the others pass (sample the debug logs, keep everything else).

On a batch of forward events still packed (``logrouter.filters.columnar``), sampling
without ``key`` decodes only the first and last events sampled for the offset and keeps
the batch packed: a ``condition`` is tested on the columns, a ``rate_field`` at the top
level becomes an edit (not with a condition: then only some events get it).
"""

from __future__ import annotations

import zlib
from typing import Any

from logrouter import conditions, paths, registry
from logrouter.batch import Batch, Event
from logrouter.config.options import Option, positive
from logrouter.errors import ErrorPath
from logrouter.filters import columnar
from logrouter.filters.common import key_function, narrowed, on_tables, replaced

KEY_CACHE_SIZE = 65536


def _check_keys(value: list[Any]) -> None:
    if value:
        paths.check_list(value)


def _check_rate_field(value: str) -> None:
    if value:
        paths.key_path(value)


def _check_condition(value: Any) -> None:
    conditions.check(value)


def stable_hash(key: Any) -> int:
    """A hash that is the same in every process (Python's ``hash`` of a str is not)."""
    text = key if key.__class__ is str else repr(key)
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


@registry.filter("sample")
class SampleFilter:
    """Keeps 1 in ``rate`` events (per key, when ``key`` is set)."""

    OPTIONS = {
        "rate": Option(int, doc="keep 1 in this many events", check=positive),
        "key": Option(list, [], "fields whose values decide together (`[\"trace_id\"]`): a key's events are all kept or all dropped", _check_keys),
        "condition": Option(str, None, "only events it is true for are sampled, the others pass (see Conditions)", _check_condition),
        "rate_field": Option(str, "", "field set to `rate` on the sampled events kept, to weigh them later (`\"\"` = none)", _check_rate_field),
    }

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath) -> None:
        self.name = name
        self.errors = errors
        self.rate = options["rate"]
        positive(self.rate)
        self._key = key_function(options["key"]) if options["key"] else None
        self._condition = conditions.Condition(options["condition"]) if options.get("condition") is not None else None
        self._rate_path = paths.key_path(options["rate_field"]) if options["rate_field"] else None
        self._decisions: dict[Any, bool] = {}
        self.dropped = 0

    def _offset(self, events: list[Event]) -> int:
        return self._offset_of(events[0], events[-1][0], len(events))

    def _offset_of(self, first: Event, last_time: int, count: int) -> int:
        seed = f"{first[0]}:{last_time}:{count}:{first[1]!r}"
        return stable_hash(seed) % self.rate

    def _sampled(self, events: list[Event]) -> list[Event]:
        """The events kept of those subject to sampling."""
        rate = self.rate
        if rate == 1 or not events:
            return list(events)
        get = self._key
        if get is None:
            return events[(rate - self._offset(events)) % rate :: rate]
        decisions = self._decisions
        kept = []
        for event in events:
            key = get(event[1])
            keep = decisions.get(key)
            if keep is None:
                keep = stable_hash(key) % rate == 0
                if len(decisions) >= KEY_CACHE_SIZE:
                    decisions.clear()
                decisions[key] = keep
            if keep:
                kept.append(event)
        return kept

    def process(self, batch: Batch) -> Batch | None:
        packed = columnar.packed_of(batch) if self._key is None else None
        if packed is not None and len(packed) and (self._rate_path is None or len(self._rate_path) == 1):
            out = self._packed(batch, packed)
            if out is not NotImplemented:
                return out
        unmarkable: list[Any] = []  # records whose rate_field cannot be set: the error path's, not sampled out
        kept = on_tables(self.name, batch, self.errors, lambda events: self._run(events, batch.tag, unmarkable))
        self.dropped += len(batch.events) - len(kept) - len(unmarkable)
        return narrowed(batch, kept) if self._rate_path is None else replaced(batch, kept)

    def _packed(self, batch: Batch, packed: Any) -> Any:
        """``process`` of a packed batch, kept packed; NotImplemented: read the records."""
        count, rate = len(packed), self.rate
        subject: Any = range(count)
        if self._condition is not None:
            if self._rate_path is not None:
                return NotImplemented  # only the sampled events get the field: not one edit for all
            mask = columnar.condition_mask(packed, self._condition.plan)
            if mask is None:
                return NotImplemented
            import pyarrow.compute as pc

            subject = pc.indices_nonzero(mask).to_pylist()
            if not subject:
                return batch
        rows: Any = subject
        if rate > 1:
            first, last = subject[0], subject[-1]
            ends = columnar.events_at(packed, [first] if first == last else [first, last])
            if ends is None:
                return NotImplemented
            rows = subject[(rate - self._offset_of(ends[0], ends[-1][0], len(subject))) % rate :: rate]
        if len(subject) < count:  # with a condition: the events it is false for pass
            chosen = set(rows)
            sampled = set(subject)
            rows = [i for i in range(count) if i not in sampled or i in chosen]
        edit = None
        if self._rate_path is not None:
            edit = columnar.set_edit({self._rate_path[0]: rate})
            if edit is None:
                return NotImplemented
        self.dropped += count - len(rows)
        if not rows:
            return None
        if len(rows) < count:
            batch = batch.replace(events=packed.narrowed(rows))  # type: ignore[arg-type]
            packed = batch.events
        return batch if edit is None else columnar.edited(batch, packed, edit)

    def _run(self, events: list[Event], tag: str, unmarkable: list[Any]) -> list[Event]:
        condition = self._condition
        if condition is None:
            return self._mark(self._sampled(events), tag, unmarkable)
        test = condition.test
        mask = [test(event[1]) for event in events]
        subject = [event for event, sampled in zip(events, mask) if sampled]
        if len(subject) == len(events):
            return self._mark(self._sampled(events), tag, unmarkable)
        if not subject:
            return events
        kept = self._sampled(subject)
        if len(kept) == len(subject) and self._rate_path is None:
            return events
        chosen = {id(event) for event in kept}
        mark = self._rate_path is not None
        out = []
        for event, sampled in zip(events, mask):
            if not sampled:
                out.append(event)
            elif id(event) in chosen:
                out.extend(self._mark([event], tag, unmarkable) if mark else (event,))
        return out

    def _mark(self, events: list[Event], tag: str, unmarkable: list[Any]) -> list[Event]:
        path = self._rate_path
        if path is None:
            return events
        rate = self.rate
        try:
            return [(t, paths.with_value(record, path, rate)) for t, record in events]
        except TypeError:
            pass  # a scalar on the way to the field in some record: those alone fail, below
        marked = []
        for t, record in events:
            try:
                marked.append((t, paths.with_value(record, path, rate)))
            except TypeError as exc:
                unmarkable.append(record)
                self.errors(self.name, tag, record, f"cannot set rate_field: {exc}")
        return marked

"""What flowed through the graph, for the metrics page and ``logrouter top``: per source
the events and spool bytes it stored, per filter the events it took in and passed on.

The router counts a source's batches as they are stored (one place for every protocol;
the bytes are the spool record's, close to what came over the wire: most sources store
what arrived as it arrived); each filter node counts around its filter's ``process``.
Counts are kept by name, so a reload that keeps or changes a component keeps counting
where it was; components no longer configured are not shown.
"""

from __future__ import annotations

from typing import Any, Iterator

Sample = tuple[str, str, dict[str, str], float]


class Flow:
    """Per-source ``[events, bytes]`` and per-filter ``[events in, events out]``."""

    def __init__(self) -> None:
        self.sources: dict[str, list[int]] = {}
        self.filters: dict[str, list[int]] = {}

    def stored(self, source: str, events: int, size: int) -> None:
        counts = self.sources.get(source)
        if counts is None:
            counts = self.sources[source] = [0, 0]
        counts[0] += events
        counts[1] += size

    def filter_counts(self, name: str) -> list[int]:
        """The ``[in, out]`` list the filter node of ``name`` adds to."""
        return self.filters.setdefault(name, [0, 0])

    def samples(self, config: Any) -> Iterator[Sample]:
        """The counts of the components ``config`` names (a source or filter that stored
        or passed nothing yet shows 0)."""
        for name, component in config.sources.items():
            events, size = self.sources.get(name, (0, 0))
            labels = {"source": name, "type": component.type}
            yield "logrouter_source_events_total", "counter", labels, events
            yield "logrouter_source_bytes_total", "counter", labels, size
        for name, component in config.filters.items():
            taken, passed = self.filters.get(name, (0, 0))
            labels = {"filter": name, "type": component.type}
            yield "logrouter_filter_events_in_total", "counter", labels, taken
            yield "logrouter_filter_events_out_total", "counter", labels, passed

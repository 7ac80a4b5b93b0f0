"""One reading of a router's ``/metrics`` page: the numbers ``logrouter top`` shows.

The page is our own Prometheus text (``logrouter.metrics``; with workers, the
supervisor's sums, ``logrouter.workers.metrics``), read with that module's parser; this
module groups its samples by component: per source (connections, events and bytes
stored, connections refused), per filter (events in and out, records to the error path),
per sink (events taken, lag in bytes and seconds, holding the sources, live or catching
up, last commit), the spool (backlog, size on disk, failing) and the workers. Counters
stay totals here; ``logrouter.top.view`` makes rates of two snapshots. Pure text work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from logrouter.workers.metrics import parse

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = re.compile(r"\\(.)")


def labels_of(text: str) -> dict[str, str]:
    """``source="a",reason="x"`` -> ``{"source": "a", "reason": "x"}`` (escapes undone)."""
    return {key: _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value) for key, value in _LABEL.findall(text)}


@dataclass
class Component:
    """One source, filter or sink: its type and its numbers by short name."""

    type: str = ""
    numbers: dict[str, float] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        return self.numbers.get(name)

    def add(self, name: str, value: float) -> None:
        self.numbers[name] = self.numbers.get(name, 0.0) + value


@dataclass
class Snapshot:
    """What one page said, read at ``at`` (a monotonic clock, for rates) and ``wall``
    (the time of day, for how long ago a sink committed)."""

    at: float
    wall: float
    sources: dict[str, Component] = field(default_factory=dict)
    filters: dict[str, Component] = field(default_factory=dict)
    sinks: dict[str, Component] = field(default_factory=dict)
    router: dict[str, float] = field(default_factory=dict)
    workers: dict[str, float] = field(default_factory=dict)  # count, running, up (absent: one process)


# metric -> (section, short name). Counters are kept as totals.
_SOURCE = {
    "logrouter_source_connections": "connections",
    "logrouter_source_events_total": "events",
    "logrouter_source_bytes_total": "bytes",
    "logrouter_source_connections_refused_total": "refused",
}
_FILTER = {
    "logrouter_filter_events_in_total": "in",
    "logrouter_filter_events_out_total": "out",
}
_SINK = {
    "logrouter_sink_events_in_total": "events",
    "logrouter_sink_lag_bytes": "lag_bytes",
    "logrouter_sink_lag_seconds": "lag_seconds",
    "logrouter_sink_holding_sources": "held",
    "logrouter_sink_live": "live",
    "logrouter_sink_last_commit_timestamp_seconds": "last_commit",
    "logrouter_sink_failures_total": "failures",
}
_ROUTER = {
    "logrouter_events_in_total": "events",
    "logrouter_spool_backlog_bytes": "backlog_bytes",
    "logrouter_spool_size_bytes": "spool_bytes",
    "logrouter_spool_failing": "spool_failing",
    "logrouter_sources_paused": "paused",
}


def read_page(text: str, at: float, wall: float) -> Snapshot:
    """The snapshot of one ``/metrics`` page."""
    snapshot = Snapshot(at=at, wall=wall)
    errors: dict[str, float] = {}
    for metric, _, label_text, value in parse(text):
        if metric in _SOURCE:
            labels = labels_of(label_text)
            _component(snapshot.sources, labels, "source").add(_SOURCE[metric], value)
        elif metric in _FILTER:
            labels = labels_of(label_text)
            _component(snapshot.filters, labels, "filter").add(_FILTER[metric], value)
        elif metric in _SINK:
            labels = labels_of(label_text)
            _component(snapshot.sinks, labels, "sink").add(_SINK[metric], value)
        elif metric in _ROUTER:
            snapshot.router[_ROUTER[metric]] = snapshot.router.get(_ROUTER[metric], 0.0) + value
        elif metric == "logrouter_error_path_records_total":
            name = labels_of(label_text).get("component", "")
            errors[name] = errors.get(name, 0.0) + value
        elif metric == "logrouter_workers":
            snapshot.workers["count"] = value
        elif metric in ("logrouter_worker_running", "logrouter_worker_up"):
            key = metric.rsplit("_", 1)[1]
            snapshot.workers[key] = snapshot.workers.get(key, 0.0) + value
    for name, count in errors.items():
        for group in (snapshot.filters, snapshot.sinks):
            if name in group:
                group[name].numbers["errors"] = count
    for group in (snapshot.filters, snapshot.sinks):
        for component in group.values():
            component.numbers.setdefault("errors", 0.0)
    return snapshot


def _component(group: dict[str, Component], labels: dict[str, str], key: str) -> Component:
    name = labels.get(key, "")
    component = group.get(name)
    if component is None:
        component = group[name] = Component(type=labels.get("type", ""))
    return component

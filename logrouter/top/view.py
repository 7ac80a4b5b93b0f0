"""What ``logrouter top`` draws: a pure function of two snapshots (``render``).

Rates are the difference of two snapshots' counters over the time between them (none
for the first snapshot, or when a counter went back: a restart); gauges are the newer
snapshot's. The result is a ``rich`` renderable: a header line (where the page came
from, workers, events in per second, the spool's backlog and size on disk), then one
table each for sources, filters and sinks. Nothing here touches a terminal or the
network, so the tests render it into a string.
"""

from __future__ import annotations

import time

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from logrouter.top.snapshot import Component, Snapshot
from logrouter.units import human_bytes, human_duration

NONE = "–"


def rate(previous: Snapshot | None, current: Snapshot, group: str, name: str, number: str) -> float | None:
    """Per second, of ``number`` of component ``name`` in ``group`` (``"router"`` for the
    router's own numbers) between the snapshots; None when it cannot be told."""
    if previous is None or current.at <= previous.at:
        return None
    if group == "router":
        before, now = previous.router.get(number), current.router.get(number)
    else:
        old: Component | None = getattr(previous, group).get(name)
        new: Component | None = getattr(current, group).get(name)
        before = old.get(number) if old is not None else None
        now = new.get(number) if new is not None else None
    if before is None or now is None or now < before:
        return None
    return (now - before) / (current.at - previous.at)


def _count(value: float | None) -> str:
    return NONE if value is None else f"{value:,.0f}"


def _per_second(value: float | None) -> str:
    return NONE if value is None else f"{value:,.0f}/s" if value >= 10 or value == 0 else f"{value:,.1f}/s"


def _bytes_per_second(value: float | None) -> str:
    return NONE if value is None else f"{human_bytes(value)}/s"


def _bytes(value: float | None) -> str:
    return NONE if value is None else human_bytes(value)


def _seconds(value: float | None) -> str:
    if value is None:
        return NONE
    return f"{value:.1f} s" if value < 10 else human_duration(value)


def _ago(last: float | None, now: float) -> str:
    if not last:
        return "not yet"
    return f"{human_duration(max(now - last, 0))} ago"


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, expand=False, pad_edge=False)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index < 2 else "right", no_wrap=True)
    return table


def header(current: Snapshot | None, previous: Snapshot | None, where: str, error: str | None) -> Text:
    text = Text(f"logrouter top · {where}", style="bold")
    if current is not None:
        workers = current.workers
        if "count" in workers:
            text.append(f" · {workers['count']:.0f} workers ({workers.get('up', 0):.0f} up)")
        text.append(f" · in {_per_second(rate(previous, current, 'router', '', 'events'))}")
        text.append(f" · spool backlog {_bytes(current.router.get('backlog_bytes'))}")
        text.append(f", on disk {_bytes(current.router.get('spool_bytes'))}")
        if current.router.get("spool_failing"):
            text.append(" · spool writes failing", style="bold red")
        elif current.router.get("paused"):
            text.append(" · sources paused (spool full)", style="yellow")
        text.append(f" · {time.strftime('%H:%M:%S', time.localtime(current.wall))}")
    if error:
        text.append(f"\n{error}", style="bold red")
    return text


def render(previous: Snapshot | None, current: Snapshot | None, where: str, error: str | None = None) -> RenderableType:
    """The whole view: ``current`` with rates since ``previous``; ``error`` (the last fetch
    failed) is shown under the header, over the last numbers read."""
    parts: list[RenderableType] = [header(current, previous, where, error)]
    if current is None:
        return Group(*parts)
    sources = _table("sources", "source", "type", "conns", "events", "events/s", "bytes/s", "refused")
    for name, source in current.sources.items():
        sources.add_row(
            name, source.type, _count(source.get("connections")), _count(source.get("events")),
            _per_second(rate(previous, current, "sources", name, "events")),
            _bytes_per_second(rate(previous, current, "sources", name, "bytes")),
            _count(source.get("refused")),
        )
    parts.append(sources)
    if current.filters:
        filters = _table("filters", "filter", "type", "in/s", "out/s", "errors")
        for name, component in current.filters.items():
            filters.add_row(
                name, component.type,
                _per_second(rate(previous, current, "filters", name, "in")),
                _per_second(rate(previous, current, "filters", name, "out")),
                _count(component.get("errors")),
            )
        parts.append(filters)
    sinks = _table("sinks", "sink", "type", "events", "events/s", "lag", "lag age", "state", "held", "last commit")
    for name, sink in current.sinks.items():
        state = "live" if sink.get("live") else "catching up"
        if rate(previous, current, "sinks", name, "failures"):
            state = Text("failing", style="bold red")
        sinks.add_row(
            name, sink.type, _count(sink.get("events")),
            _per_second(rate(previous, current, "sinks", name, "events")),
            _bytes(sink.get("lag_bytes")), _seconds(sink.get("lag_seconds")), state,
            "yes" if sink.get("held") else "no",
            _ago(sink.get("last_commit"), current.wall),
        )
    parts.append(sinks)
    return Group(*parts)

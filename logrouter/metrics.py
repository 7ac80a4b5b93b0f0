"""The Prometheus page of one router: every component's samples, collected and rendered.

Each component owns its numbers and says what they are: ``samples()`` yields
``(name, type, labels, value)`` for the router (and its spool), every source (the
contract of ``logrouter.sources.base``), the error path, every sink and compaction.
The numbers are plain attributes bumped on the hot path and read only when scraped, so
counting costs nothing extra. This module only collects the samples and renders them;
``logrouter.http_endpoint`` serves the page (``[router] metrics_listen``).
"""

from __future__ import annotations

from typing import Any, Iterator

Sample = tuple[str, str, dict[str, str], float]

#: Gauges that are an age or a point in time: over several processes (``workers``) the
#: page shows the largest (the oldest uncommitted event, the latest commit), not the sum.
LARGEST_OVER_PROCESSES = frozenset({"logrouter_sink_lag_seconds", "logrouter_sink_last_commit_timestamp_seconds"})


def collect(router: Any) -> Iterator[Sample]:
    """Every component's samples, in the order their metrics appear on the page."""
    yield from router.samples()
    for source in router.sources.values():
        yield from source.samples()
    yield from router.errors.samples()
    for component in getattr(router, "filters", {}).values():
        samples = getattr(component, "samples", None)  # filters that count (throttle, dedupe, …)
        if samples is not None:
            yield from samples()
    for sink in router.sinks.values():
        yield from sink.samples()
    yield from router.feed_samples()
    compaction = getattr(router, "compaction", None)  # set by RouterService when [compaction] is enabled
    if compaction is not None:
        yield from compaction.samples()


def render_samples(samples: Iterator[Sample]) -> str:
    """Prometheus text: one ``# TYPE`` line per metric, all its samples right below it."""
    families: dict[str, tuple[str, list[str]]] = {}
    for metric, kind, labels, value in samples:
        family = families.get(metric)
        if family is None:
            family = families[metric] = (kind, [])
        label_text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
        family[1].append(f"{metric}{{{label_text}}} {value}" if label_text else f"{metric} {value}")
    lines: list[str] = []
    for metric, (kind, lines_of_metric) in families.items():
        lines.append(f"# TYPE {metric} {kind}")
        lines.extend(lines_of_metric)
    return "\n".join(lines) + "\n"


def render(router: Any) -> str:
    return render_samples(collect(router))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


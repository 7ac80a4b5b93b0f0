"""The supervisor's ``/metrics``: every worker's samples summed over the workers.

Each worker renders its own page (``logrouter.metrics.render``); this module parses those
pages and writes one with, for every metric, the sum over the workers under the labels
the workers use: the page reads as one process's would, so dashboards and alerts built
for one process keep working, and a PromQL ``sum()`` never counts a worker twice (a
page holding both the sums and per-worker series would). An age or a point in time
(``LARGEST_OVER_PROCESSES``: a sink's lag in seconds, its last commit) is the largest
over the workers instead of their sum. Each worker's own page is
served apart (``/workers/<i>/metrics``). A worker that did not answer in time adds the
counters of its last page (``stale``), so the sums never go backwards for a late
scrape. Pure text work, no Twisted.
"""

from __future__ import annotations

from typing import Iterator

from logrouter.metrics import LARGEST_OVER_PROCESSES, Sample, render_samples


def parse(text: str) -> Iterator[tuple[str, str, str, float]]:
    """``(metric, type, label text, value)`` of each sample of a page in our own format."""
    kinds: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) == 4:
                kinds[parts[2]] = parts[3]
            continue
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        try:
            number = float(value)
        except ValueError:
            continue
        if head.endswith("}") and "{" in head:
            metric, _, labels = head[:-1].partition("{")
        else:
            metric, labels = head, ""
        yield metric, kinds.get(metric, "untyped"), labels, number


def merge(pages: dict[int, str], own: list[Sample] = (), stale: dict[int, str] | None = None) -> str:  # type: ignore[assignment]
    """One page from the workers' ``pages`` (by worker index) and the supervisor's ``own``
    samples. ``stale``: the last pages of workers that did not answer now; only their
    counters are added (a counter stays where it was, a gauge of then would be a guess)."""
    families: dict[str, tuple[str, dict[str, float]]] = {}
    every = [(index, pages[index], False) for index in pages] + [(i, t, True) for i, t in (stale or {}).items() if i not in pages]
    for _, text, old in sorted(every, key=lambda item: item[0]):
        for metric, kind, labels, value in parse(text):
            if old and kind != "counter":
                continue
            family = families.get(metric)
            if family is None:
                family = families[metric] = (kind, {})
            sums = family[1]
            if metric in LARGEST_OVER_PROCESSES:
                sums[labels] = max(sums.get(labels, value), value)
            else:
                sums[labels] = sums.get(labels, 0.0) + value
    lines: list[str] = []
    for metric, (kind, sums) in families.items():
        lines.append(f"# TYPE {metric} {kind}")
        lines.extend(f"{metric}{{{labels}}} {_number(v)}" if labels else f"{metric} {_number(v)}" for labels, v in sums.items())
    text = "\n".join(lines) + "\n" if lines else ""
    return text + (render_samples(iter(own)) if own else "")


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)

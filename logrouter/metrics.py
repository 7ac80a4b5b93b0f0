"""Prometheus metrics and a health check over HTTP (``[router] metrics_listen``).

The numbers live on the components themselves (plain integer attributes bumped on the
hot path); this module only reads them when scraped, so counting costs nothing extra.
"""

from __future__ import annotations

from typing import Any, Iterator

from twisted.web import resource, server


def _samples(router: Any) -> Iterator[tuple[str, str, dict[str, str], float]]:
    yield "logrouter_batches_in_total", "counter", {}, router.batches_in
    yield "logrouter_events_in_total", "counter", {}, router.events_in
    yield "logrouter_spool_fsyncs_total", "counter", {}, router.spool.fsyncs
    yield "logrouter_spool_end_bytes", "gauge", {}, router.spool.end
    yield "logrouter_spool_durable_bytes", "gauge", {}, router.spool.durable_end
    for name, source in router.sources.items():
        labels = {"source": name, "type": source.TYPE}
        yield "logrouter_source_connections", "gauge", labels, len(source.connections)
        yield "logrouter_source_connections_total", "counter", labels, source.connections_total
        yield "logrouter_source_decode_errors_total", "counter", labels, source.decode_errors
        yield "logrouter_source_invalid_events_total", "counter", labels, getattr(source, "invalid_events", 0)
    for name, count in router.errors.counts.items():
        yield "logrouter_error_path_records_total", "counter", {"component": name}, count
    for name, sink in router.sinks.items():
        labels = {"sink": name, "type": sink.TYPE}
        yield "logrouter_sink_events_in_total", "counter", labels, sink.events_in
        for attribute in ("files_published", "rows_published"):
            if hasattr(sink, attribute):
                yield f"logrouter_sink_{attribute}_total", "counter", labels, getattr(sink, attribute)


def render(router: Any) -> str:
    lines: list[str] = []
    typed: set[str] = set()
    for metric, kind, labels, value in _samples(router):
        if metric not in typed:
            typed.add(metric)
            lines.append(f"# TYPE {metric} {kind}")
        label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{metric}{{{label_text}}} {value}" if label_text else f"{metric} {value}")
    return "\n".join(lines) + "\n"


class MetricsResource(resource.Resource):
    isLeaf = True

    def __init__(self, router: Any) -> None:
        super().__init__()
        self.router = router

    def render_GET(self, request: server.Request) -> bytes:
        if request.path == b"/metrics":
            request.setHeader(b"content-type", b"text/plain; version=0.0.4")
            return render(self.router).encode()
        if request.path == b"/health":
            request.setHeader(b"content-type", b"text/plain")
            return b"ok\n"
        request.setResponseCode(404)
        return b"not found: try /metrics or /health\n"


def site(router: Any) -> server.Site:
    factory = server.Site(MetricsResource(router))
    factory.noisy = False
    factory.log = lambda request: None  # scrapes are not worth a log line each
    return factory

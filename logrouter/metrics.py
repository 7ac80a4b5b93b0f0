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
    yield "logrouter_spool_written_bytes", "gauge", {}, router.spool.written_end
    yield "logrouter_spool_backlog_bytes", "gauge", {}, router.backlog_bytes()
    yield "logrouter_spool_size_bytes", "gauge", {}, router.spool.size_bytes
    yield "logrouter_spool_torn_tails_total", "counter", {}, router.spool.torn_tails
    yield "logrouter_spool_quarantined_total", "counter", {}, router.spool.quarantined
    yield "logrouter_spool_missing_ranges_total", "counter", {}, router.spool.missing_ranges
    yield "logrouter_spool_write_errors_total", "counter", {}, router.spool.write_errors
    yield "logrouter_spool_failing", "gauge", {}, int(router.spool_failing)
    yield "logrouter_duplicates_total", "counter", {}, router.duplicates
    yield "logrouter_unstorable_batches_total", "counter", {}, router.unstorable_batches
    yield "logrouter_sources_paused", "gauge", {}, int(router.paused)
    yield "logrouter_sources_pauses_total", "counter", {}, router.pauses
    paused = router.paused_secs + (router.reactor.seconds() - router._paused_at if router.paused else 0)
    yield "logrouter_sources_paused_seconds_total", "counter", {}, round(paused, 3)
    for name, source in router.sources.items():
        labels = {"source": name, "type": source.TYPE}
        yield "logrouter_source_connections", "gauge", labels, len(source.connections)
        yield "logrouter_source_connections_total", "counter", labels, source.connections_total
        yield "logrouter_source_decode_errors_total", "counter", labels, source.decode_errors
        # Counters only some protocols have (TLS, handshake, heartbeats, …).
        for attribute in (
            "invalid_events", "tls_errors", "auth_failures", "size_mismatches", "heartbeats",
            "offloaded_messages", "offloaded_parts",
        ):
            if hasattr(source, attribute):
                yield f"logrouter_source_{attribute}_total", "counter", labels, getattr(source, attribute)
        # Stream sources: connections refused by a cap, and why each accepted one ended.
        for reason, count in getattr(source, "refused", {}).items():
            yield "logrouter_source_connections_refused_total", "counter", {**labels, "reason": reason}, count
        for reason, count in getattr(source, "closed", {}).items():
            yield "logrouter_source_connections_closed_total", "counter", {**labels, "reason": reason}, count
    for name, count in router.errors.counts.items():
        yield "logrouter_error_path_records_total", "counter", {"component": name}, count
    for name, sink in router.sinks.items():
        labels = {"sink": name, "type": sink.TYPE}
        feed = router.feeds[name]
        yield "logrouter_sink_events_in_total", "counter", labels, sink.events_in
        yield "logrouter_sink_cursor_bytes", "gauge", labels, sink.cursor
        yield "logrouter_sink_lag_bytes", "gauge", labels, max(router.spool.end - sink.cursor, 0)
        yield "logrouter_sink_queued_bytes", "gauge", labels, sink.queued_bytes
        yield "logrouter_sink_live", "gauge", labels, int(feed.live)
        yield "logrouter_sink_failures_total", "counter", labels, sink.failures
        writer = getattr(sink, "writer", None)
        if writer is not None:  # the parquet sink's open files and the rows they buffer
            yield "logrouter_sink_open_files", "gauge", labels, writer.open_files
            yield "logrouter_sink_buffered_rows", "gauge", labels, writer.buffered_rows
        # Counters only some sinks have (files, forward chunks, Beats windows, …).
        for attribute in (
            "files_published", "rows_published", "commits",
            "chunks_sent", "chunks_acked", "chunks_resent", "ack_timeouts", "server_downs",
            "handshake_failures", "unknown_acks",
            "windows_sent", "events_acked", "partial_acks", "keepalives", "connections",
        ):
            if hasattr(sink, attribute):
                yield f"logrouter_sink_{attribute}_total", "counter", labels, getattr(sink, attribute)
    compaction = getattr(router, "compaction", None)  # set by RouterService when [compaction] is enabled
    if compaction is not None:
        yield from compaction.samples()


def render(router: Any) -> str:
    # The text format wants every sample of a metric right under its TYPE line, while
    # _samples yields them per component: group them here.
    families: dict[str, tuple[str, list[str]]] = {}
    for metric, kind, labels, value in _samples(router):
        family = families.get(metric)
        if family is None:
            family = families[metric] = (kind, [])
        label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        family[1].append(f"{metric}{{{label_text}}} {value}" if label_text else f"{metric} {value}")
    lines: list[str] = []
    for metric, (kind, samples) in families.items():
        lines.append(f"# TYPE {metric} {kind}")
        lines.extend(samples)
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

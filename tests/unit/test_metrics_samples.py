"""Components own their metrics: the router, its spool, each source (through the source
contract of ``logrouter.sources.base``), the error path, each sink and compaction yield
their samples; ``logrouter.metrics`` only renders them, one ``# TYPE`` line per metric.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from twisted.internet import defer, task

from logrouter import metrics, registry
from logrouter.config.load import load_string
from logrouter.router import Router
from logrouter.sources.base import Source, SourceBase, SourceContext, build_source
from logrouter.sources.fluent_forward import FluentForwardSource
from logrouter.sources.lumberjack import LumberjackSource
from logrouter.sources.stream import StreamSource


@pytest.fixture
def router(tmp_path):
    config = load_string(f'''
[spool]
path = "{tmp_path}/spool"

[sources.fwd]
type = "fluent_forward"
listen = "tcp:0"

[sources.beats]
type = "lumberjack"
listen = "tcp:0"

[filters.m]
type = "match"
inputs = ["fwd"]
tag = "**"

[sinks.lake]
type = "parquet"
inputs = ["m", "beats"]
path = "{tmp_path}/lake"

[sinks.out]
type = "fluent_forward"
inputs = ["fwd"]
servers = [{{ host = "127.0.0.1", port = 1 }}]

[sinks.lj]
type = "lumberjack"
inputs = ["beats"]
hosts = ["127.0.0.1:1"]
''')
    return Router(config, task.Clock())


def parse(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}


def test_every_metric_has_one_type_line_with_its_samples_below(router):
    router.errors.counts["m"] = 2
    router.compaction = SimpleNamespace(samples=lambda: iter([("logrouter_compaction_running", "gauge", {}, 0)]))
    text = metrics.render(router)
    lines = text.splitlines()
    types = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))
    current = None
    for line in lines:
        if line.startswith("# TYPE "):
            current = line.split()[2]
        else:
            assert line.split("{")[0].split(" ")[0] == current, line
    values = parse(text)
    assert values['logrouter_error_path_records_total{component="m"}'] == 2
    assert values["logrouter_compaction_running"] == 0


def test_names_and_labels_are_those_dashboards_use(router):
    values = parse(metrics.render(router))
    for name in (
        "logrouter_batches_in_total", "logrouter_events_in_total", "logrouter_spool_fsyncs_total",
        "logrouter_spool_end_bytes", "logrouter_spool_written_bytes", "logrouter_spool_backlog_bytes",
        "logrouter_spool_size_bytes", "logrouter_spool_torn_tails_total", "logrouter_spool_quarantined_total",
        "logrouter_spool_missing_ranges_total", "logrouter_spool_write_errors_total", "logrouter_spool_failing",
        "logrouter_duplicates_total", "logrouter_unstorable_batches_total", "logrouter_sources_paused",
        "logrouter_sources_pauses_total", "logrouter_sources_paused_seconds_total",
    ):
        assert name in values, name
    fwd = '{source="fwd",type="fluent_forward"}'
    for counter in (
        "connections", "connections_total", "decode_errors_total", "invalid_events_total", "tls_errors_total",
        "auth_failures_total", "size_mismatches_total", "heartbeats_total", "offloaded_messages_total",
        "offloaded_parts_total",
    ):
        assert f"logrouter_source_{counter}{fwd}" in values, counter
    beats = '{source="beats",type="lumberjack"}'
    assert f"logrouter_source_invalid_events_total{beats}" in values
    assert f"logrouter_source_tls_errors_total{beats}" in values
    assert f"logrouter_source_heartbeats_total{beats}" not in values  # a forward-only counter
    assert 'logrouter_source_connections_closed_total{source="beats",type="lumberjack",reason="peer"}' in values
    assert 'logrouter_source_connections_refused_total{source="fwd",type="fluent_forward",reason="max_connections"}' in values
    for sink, type_name, own in (
        ("lake", "parquet", ("files_published_total", "rows_published_total", "commits_total", "open_files", "buffered_rows")),
        ("out", "fluent_forward", ("chunks_sent_total", "chunks_acked_total", "chunks_resent_total", "ack_timeouts_total",
                                   "server_downs_total", "handshake_failures_total", "unknown_acks_total")),
        ("lj", "lumberjack", ("windows_sent_total", "events_acked_total", "partial_acks_total", "keepalives_total",
                              "connections_total")),
    ):
        labels = f'{{sink="{sink}",type="{type_name}"}}'
        for metric in ("events_in_total", "cursor_bytes", "lag_bytes", "queued_bytes", "live", "failures_total", *own):
            assert f"logrouter_sink_{metric}{labels}" in values, (sink, metric)


def test_source_classes_declare_their_own_counters():
    assert set(StreamSource.COUNTERS) == {"decode_errors", "tls_errors"}
    assert set(StreamSource.COUNTERS) <= set(FluentForwardSource.COUNTERS)
    assert set(StreamSource.COUNTERS) <= set(LumberjackSource.COUNTERS)
    assert "offloaded_parts" in FluentForwardSource.COUNTERS and "offloaded_parts" not in LumberjackSource.COUNTERS
    assert all(isinstance(text, str) and text for text in FluentForwardSource.COUNTERS.values())


def test_every_registered_source_keeps_the_contract(router):
    registry.load_builtin()
    for cls in registry.SOURCES.values():
        for method in ("start", "stop", "pause_reading", "resume_reading", "samples"):
            assert callable(getattr(cls, method, None)), (cls, method)
    assert all(isinstance(source, Source) for source in router.sources.values())
    assert router.source_context.router is router and router.source_context.errors is router.errors


class Subscriber(SourceBase):
    """A source that is not a TCP stream: no connections, its own counters."""

    TYPE = "test_subscriber"
    COUNTERS = {"gaps": "sequence numbers missing", "messages": "messages received"}

    def start(self) -> defer.Deferred:
        self.started = True
        return defer.succeed(None)

    def stop(self) -> defer.Deferred:
        return defer.succeed(None)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def test_a_source_without_connections_fits_the_contract_and_the_metrics(router):
    context = SourceContext(router=router, reactor=router.reactor, errors=router.errors, state_dir="/nonexistent")
    source = build_source(Subscriber, "zmq", {}, context)
    assert isinstance(source, Source) and source.context is context and source.reactor is router.reactor
    assert context.state_path("zmq") == "/nonexistent/zmq"
    source.gaps = 3
    router.sources["zmq"] = source
    values = parse(metrics.render(router))
    assert values['logrouter_source_gaps_total{source="zmq",type="test_subscriber"}'] == 3
    assert values['logrouter_source_messages_total{source="zmq",type="test_subscriber"}'] == 0
    assert 'logrouter_source_connections{source="zmq",type="test_subscriber"}' not in values
    router.backpressure.max_spool_bytes = -1  # over the bound: every source is paused through the contract
    router.check_backpressure()
    assert source.paused is True


def test_a_class_missing_part_of_the_contract_is_refused(router):
    class Half:
        TYPE = "half"

        def __init__(self, name: str, options: dict[str, Any], context: Any) -> None:
            self.name = name

        def start(self) -> defer.Deferred:
            return defer.succeed(None)

    with pytest.raises(TypeError, match="missing stop, pause_reading, resume_reading, samples"):
        build_source(Half, "half", {}, router.source_context)


def test_label_values_are_escaped():
    text = metrics.render_samples(iter([("m", "gauge", {"a": 'x"y\\z'}, 1)]))
    assert text == '# TYPE m gauge\nm{a="x\\"y\\\\z"} 1\n'

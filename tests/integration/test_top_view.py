"""``logrouter top`` without a terminal: a metrics page read into a snapshot, the view drawn
from two snapshots (rates from their difference) into a string, and where the command
finds the page. ``tests/integration/test_top_tmux.py`` runs the command in a real terminal.
"""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rich.console import Console

from logrouter.config.http_options import endpoint_url
from logrouter.metrics import render_samples
from logrouter.top import command
from logrouter.top.snapshot import labels_of, read_page
from logrouter.top.view import NONE, rate, render

FWD = {"source": "forward", "type": "fluent_forward"}
LAKE = {"sink": "lake", "type": "parquet"}
WALL = 1_700_000_000.0


def page(events: int, lag_secs: float = 2.5, last_commit: float = WALL - 7, extra: list | None = None, workers: bool = False) -> str:
    samples = [
        ("logrouter_events_in_total", "counter", {}, events + 10),
        ("logrouter_spool_size_bytes", "gauge", {}, 3 << 20),
        ("logrouter_spool_backlog_bytes", "gauge", {}, 1 << 20),
        ("logrouter_spool_failing", "gauge", {}, 0),
        ("logrouter_sources_paused", "gauge", {}, 0),
        ("logrouter_source_connections", "gauge", FWD, 3),
        ("logrouter_source_connections_refused_total", "counter", {**FWD, "reason": "max_connections"}, 2),
        ("logrouter_source_connections_refused_total", "counter", {**FWD, "reason": "tls"}, 1),
        ("logrouter_source_events_total", "counter", FWD, events),
        ("logrouter_source_bytes_total", "counter", FWD, events * 100),
        ("logrouter_source_events_total", "counter", {"source": "lj", "type": "logjam"}, 10),
        ("logrouter_source_bytes_total", "counter", {"source": "lj", "type": "logjam"}, 999),
        ("logrouter_error_path_records_total", "counter", {"component": "keep"}, 4),
        ("logrouter_filter_events_in_total", "counter", {"filter": "keep", "type": "grep"}, events),
        ("logrouter_filter_events_out_total", "counter", {"filter": "keep", "type": "grep"}, events // 2),
        ("logrouter_sink_events_in_total", "counter", LAKE, events // 2),
        ("logrouter_sink_failures_total", "counter", LAKE, 0),
        ("logrouter_sink_lag_bytes", "gauge", LAKE, 5 << 20),
        ("logrouter_sink_lag_seconds", "gauge", LAKE, lag_secs),
        ("logrouter_sink_live", "gauge", LAKE, 1),
        ("logrouter_sink_holding_sources", "gauge", LAKE, 1),
        ("logrouter_sink_last_commit_timestamp_seconds", "gauge", LAKE, last_commit),
        *(extra or []),
    ]
    if workers:
        samples += [
            ("logrouter_workers", "gauge", {}, 2),
            ("logrouter_worker_running", "gauge", {"worker": "0"}, 1),
            ("logrouter_worker_running", "gauge", {"worker": "1"}, 1),
            ("logrouter_worker_up", "gauge", {"worker": "0"}, 1),
            ("logrouter_worker_up", "gauge", {"worker": "1"}, 0),
        ]
    return render_samples(iter(samples))


def text_of(renderable) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def row(text: str, name: str) -> list[str]:
    """The cells of the table row that starts with ``name`` (split on runs of 2+ spaces)."""
    for line in text.splitlines():
        if line.strip().startswith(name + " "):
            return re.split(r"\s{2,}", line.strip())
    raise AssertionError(f"no row {name!r} in:\n{text}")


def test_a_page_is_grouped_by_component():
    snapshot = read_page(page(1000, workers=True), at=5.0, wall=WALL)
    forward = snapshot.sources["forward"]
    assert forward.type == "fluent_forward"
    assert forward.numbers == {"connections": 3, "refused": 3, "events": 1000, "bytes": 100_000}
    assert snapshot.sources["lj"].get("connections") is None  # a subscriber has none
    assert snapshot.filters["keep"].numbers == {"in": 1000, "out": 500, "errors": 4}
    lake = snapshot.sinks["lake"]
    assert lake.type == "parquet" and lake.get("lag_seconds") == 2.5 and lake.get("held") == 1 and lake.get("errors") == 0
    assert snapshot.router["backlog_bytes"] == 1 << 20 and snapshot.router["events"] == 1010
    assert snapshot.workers == {"count": 2, "running": 2, "up": 1}
    assert read_page(page(1), 0, WALL).workers == {}  # one process: no workers section
    assert labels_of(r'component="a\"b\\c",x="line\nnext"') == {"component": 'a"b\\c', "x": "line\nnext"}


def test_rates_come_from_two_snapshots():
    first = read_page(page(1000), at=10.0, wall=WALL)
    second = read_page(page(3000), at=12.0, wall=WALL + 2)
    assert rate(first, second, "sources", "forward", "events") == 1000
    assert rate(first, second, "sources", "forward", "bytes") == 100_000
    assert rate(first, second, "filters", "keep", "out") == 500
    assert rate(first, second, "router", "", "events") == 1000
    assert rate(None, second, "sources", "forward", "events") is None  # the first snapshot
    assert rate(second, first, "sources", "forward", "events") is None  # no time passed forward
    restarted = read_page(page(10), at=14.0, wall=WALL + 4)
    assert rate(second, restarted, "sources", "forward", "events") is None  # a counter went back: a restart
    assert rate(first, second, "sources", "gone", "events") is None


def test_the_view_shows_rates_gauges_and_how_long_ago_a_sink_committed():
    first = read_page(page(1000, workers=True), at=10.0, wall=WALL)
    second = read_page(page(3000, lag_secs=42.0, workers=True), at=12.0, wall=WALL + 2)
    text = text_of(render(first, second, "http://127.0.0.1:9"))
    head = text.splitlines()[0]
    assert "logrouter top · http://127.0.0.1:9 · 2 workers (1 up) · in 1,000/s" in head
    assert "spool backlog 1.0 MiB, on disk 3.0 MiB" in text
    assert row(text, "forward") == ["forward", "fluent_forward", "3", "3,000", "1,000/s", "97.7 KiB/s", "3"]
    assert row(text, "lj") == ["lj", "logjam", NONE, "10", "0/s", "0 B/s", NONE]
    assert row(text, "keep") == ["keep", "grep", "1,000/s", "500/s", "4"]
    assert row(text, "lake") == ["lake", "parquet", "1,500", "500/s", "5.0 MiB", "42 s", "live", "yes", "9 s ago"]


def test_the_first_view_has_no_rates_and_a_failed_fetch_is_said_over_the_last_numbers():
    only = read_page(page(1000, last_commit=0), at=10.0, wall=WALL)
    text = text_of(render(None, only, "u", "cannot read u/metrics: refused (trying again)"))
    assert text.splitlines()[1] == "cannot read u/metrics: refused (trying again)"
    assert row(text, "forward")[4:6] == [NONE, NONE] and row(text, "lake")[-1] == "not yet"
    assert text_of(render(None, None, "u", "connecting …")).splitlines() == ["logrouter top · u", "connecting …"]
    failing = read_page(page(2000, extra=[("logrouter_spool_failing", "gauge", {}, 1)]), at=11.0, wall=WALL)
    assert "spool writes failing" in text_of(render(only, failing, "u"))


def test_the_command_finds_the_page_from_the_config(tmp_path):
    assert endpoint_url("tcp:24229:interface=127.0.0.1") == "http://127.0.0.1:24229"
    assert endpoint_url("tcp:9880") == "http://127.0.0.1:9880"
    assert endpoint_url(r"tcp6:9880:interface=\:\:1") == "http://[::1]:9880"
    assert endpoint_url("tcp:0") is None and endpoint_url("") is None and endpoint_url("unix:/tmp/m.sock") is None
    config = tmp_path / "c.toml"
    config.write_text('[router]\nmetrics_listen = "tcp:24229"\n[spool]\npath = "s"\n')
    assert command.base_url(str(config)) == ("http://127.0.0.1:24229", "")
    config.write_text('[spool]\npath = "s"\n')
    url, why = command.base_url(str(config))
    assert url is None and "metrics_listen is not a TCP endpoint with a fixed port; pass --url" in why


def test_once_says_so_when_the_router_cannot_be_reached(capsys):
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: refused
        args = SimpleNamespace(url=f"http://127.0.0.1:{port}", config=None, interval=0.1, once=True)
        assert command.run(args, out=io.StringIO()) == 1
    assert f"cannot read http://127.0.0.1:{port}/metrics" in capsys.readouterr().err

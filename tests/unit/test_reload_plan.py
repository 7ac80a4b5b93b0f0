"""``logrouter.reload.plan``: what a reload keeps, stops and starts, on configs only."""

from __future__ import annotations

from logrouter.config.load import load_string
from logrouter.reload import plan

BASE = """
[router]
shutdown_timeout_secs = 30
[spool]
path = "var/spool"
[sources.a]
type = "fluent_forward"
listen = "tcp:0"
[sources.b]
type = "lumberjack"
listen = "tcp:0"
[filters.only]
type = "grep"
inputs = ["a"]
field = "message"
include = "."
[sinks.lake]
type = "parquet"
inputs = ["only", "b"]
path = "lake"
"""


def test_nothing_changed() -> None:
    p = plan(load_string(BASE), load_string(BASE))
    assert (p.keep_sources, p.stop_sources, p.start_sources) == (["a", "b"], [], [])
    assert (p.keep_sinks, p.stop_sinks, p.start_sinks) == (["lake"], [], [])
    assert not p.changes and p.summary() == "sources kept: a, b; sinks kept: lake"


def test_changed_removed_and_new_components() -> None:
    new = BASE.replace('[sources.b]\ntype = "lumberjack"\nlisten = "tcp:0"', '[sources.c]\ntype = "lumberjack"\nlisten = "tcp:0"')
    new = new.replace('inputs = ["only", "b"]', 'inputs = ["only", "c"]\nroll_secs = 5')
    p = plan(load_string(BASE), load_string(new))
    assert (p.keep_sources, p.stop_sources, p.start_sources) == (["a"], ["b"], ["c"])
    assert (p.keep_sinks, p.stop_sinks, p.start_sinks) == ([], ["lake"], ["lake"])
    assert "sources started: c" in p.summary()


def test_inputs_only_change_routes_and_spool_changes_need_a_restart() -> None:
    new = BASE.replace('inputs = ["only", "b"]', 'inputs = ["a", "b"]').replace('"var/spool"', '"elsewhere"')
    new = new.replace("shutdown_timeout_secs = 30", "shutdown_timeout_secs = 5\nmetrics_listen = \"tcp:0\"")
    p = plan(load_string(BASE), load_string(new))
    assert p.keep_sinks == ["lake"] and p.routes_changed and p.changes
    assert p.needs_restart == ["[spool]", "router.metrics_listen"]
    assert p.effective.spool["path"] == "var/spool" and p.effective.router["shutdown_timeout_secs"] == 5
    assert p.effective.router["metrics_listen"] == ""

"""A removed source's acked batches still reach every sink its route named when they were
acked: a sink held back from the spool while a reload (or an edited config at a restart)
removes the source reads them later through the source's old route, filters included;
the route goes once every such sink has passed them (``logrouter.retired``)."""

from __future__ import annotations

import datetime
import json

import pytest

from helpers import spin
from source_fakes import CursorSink
from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.load import load_string
from logrouter.router import Router
from logrouter.sinks.base import SINK_OPTIONS, SinkBase

T0 = 1_700_000_000 * 10**9


class GateSink(CursorSink, SinkBase):
    """Keeps what it is handed. ``hold()`` makes it look full, so that the router feeds it
    nothing (it is left to catch up from the spool later); ``release()`` lets it read."""

    OPTIONS = {**SINK_OPTIONS}
    TYPE = "rt_gate"
    got: dict[str, list] = {}

    def start(self):
        GateSink.got.setdefault(self.name, [])
        return super().start()

    def write(self, batch, position, size):
        GateSink.got[self.name].extend(r for _, r in batch.events)

    def release(self) -> None:
        self.queued_bytes = 0
        self.on_progress()


@pytest.fixture(autouse=True)
def components():
    registry.load_builtin()
    registry.sink("rt_gate")(GateSink)
    GateSink.got = {}
    yield
    del registry.SINKS["rt_gate"]


SOURCES = """
[router]
shutdown_timeout_secs = 0.5
[sources.keep]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"
"""
GONE = """
[sources.gone]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"
[filters.mark]
type = "set"
inputs = ["gone"]
fields = { via = "mark", at = 1979-05-27T07:32:00Z }
"""
SINKS = """
[sinks.lag]
type = "rt_gate"
inputs = [{inputs}]
[sinks.live]
type = "rt_gate"
inputs = [{inputs}]
"""
BEFORE = SOURCES + GONE + SINKS.format(inputs='"keep", "mark"')
AFTER = SOURCES + SINKS.format(inputs='"keep"')


def config(tmp_path, text):
    return load_string(f'[spool]\npath = "{tmp_path}/spool"\n' + text)


def hold(router: Router, name: str) -> None:
    """The sink is full and no longer fed live: what is stored meanwhile waits in the spool."""
    feed = router.feeds[name]
    feed.fall_behind()
    feed.sink.queued_bytes = feed.sink.options["max_queue_bytes"] * 10


def store_from_gone(reactor, router: Router, batches: int = 5) -> None:
    for i in range(batches):
        spin(reactor, router.ingest(Batch("t", [(T0, {"n": i})], "gone")))


def saved(tmp_path) -> dict:
    return json.loads((tmp_path / "spool" / "routes.json").read_bytes())


def numbers(name: str) -> list:
    return sorted(r["n"] for r in GateSink.got[name])


def test_a_reload_keeps_a_removed_sources_route_until_the_held_sink_passed_its_batches(tmp_path, threaded_reactor):
    reactor = threaded_reactor
    router = Router(config(tmp_path, BEFORE), reactor)
    spin(reactor, router.start())
    hold(router, "lag")
    store_from_gone(reactor, router)
    assert numbers("live") == [0, 1, 2, 3, 4] and numbers("lag") == []
    end = router.spool.end

    plan = spin(reactor, router.reconfigure(config(tmp_path, AFTER)))
    assert plan.stop_sources == ["gone"]
    assert f"still routed until their sinks pass them: gone → lag, live (until spool position {end})" in plan.summary()
    assert [e["source"] for e in saved(tmp_path)["retired"]] == ["gone"]

    router.feeds["lag"].sink.release()
    spin(reactor, router.feeds["lag"].reading)
    assert numbers("lag") == [0, 1, 2, 3, 4]  # through the old route, its filter included
    assert all(r["via"] == "mark" and r["at"] == datetime.datetime(1979, 5, 27, 7, 32, tzinfo=datetime.timezone.utc)
               for r in GateSink.got["lag"])
    # Every sink it named passed them: the route is dropped, here and in the saved file.
    assert router.retired.entries == {} and "gone" not in router.routes
    spin(reactor, router.retired.idle())
    assert saved(tmp_path)["retired"] == [] and saved(tmp_path)["graph"]["sources"] == ["keep"]
    spin(reactor, router.stop())
    assert numbers("live") == [0, 1, 2, 3, 4]  # once


def test_a_restart_after_the_reload_still_routes_them(tmp_path, threaded_reactor):
    reactor = threaded_reactor
    router = Router(config(tmp_path, BEFORE), reactor)
    spin(reactor, router.start())
    hold(router, "lag")
    store_from_gone(reactor, router)
    spin(reactor, router.reconfigure(config(tmp_path, AFTER)))
    spin(reactor, router.stop())  # lag still held: its cursor stays before gone's batches
    assert numbers("lag") == []

    again = Router(config(tmp_path, AFTER), reactor)
    spin(reactor, again.start())
    spin(reactor, again.feeds["lag"].reading)
    assert numbers("lag") == [0, 1, 2, 3, 4] and all(r["via"] == "mark" for r in GateSink.got["lag"])
    assert numbers("live") == [0, 1, 2, 3, 4]  # it had passed them: not again
    assert again.retired.entries == {}
    spin(reactor, again.stop())


def test_a_source_deleted_from_the_file_between_two_runs_is_routed_the_same_way(tmp_path, threaded_reactor):
    reactor = threaded_reactor
    router = Router(config(tmp_path, BEFORE), reactor)
    spin(reactor, router.start())
    hold(router, "lag")
    store_from_gone(reactor, router)
    spin(reactor, router.stop())

    again = Router(config(tmp_path, AFTER), reactor)  # no reload: the file was edited
    spin(reactor, again.start())
    spin(reactor, again.feeds["lag"].reading)
    assert numbers("lag") == [0, 1, 2, 3, 4] and all(r["via"] == "mark" for r in GateSink.got["lag"])
    spin(reactor, again.stop())


def test_the_subgraph_of_a_source_leaves_out_other_sources_and_error_outputs():
    from logrouter import retired

    graph = {
        "sources": ["a", "b"],
        "filters": {
            "f": {"type": "set", "options": {}, "inputs": ["a", "b"]},
            "r": {"type": "route", "options": {}, "inputs": ["f"]},
            "g": {"type": "set", "options": {}, "inputs": ["b"]},
        },
        "sinks": {"x": ["r.slow"], "y": ["g"], "dead": ["f.errors"]},
    }
    assert retired.subgraph(graph, "a") == {
        "sources": ["a"],
        "filters": {"f": {"type": "set", "options": {}, "inputs": ["a"]}, "r": {"type": "route", "options": {}, "inputs": ["f"]}},
        "sinks": {"x": ["r.slow"]},
    }
    value = {"at": datetime.date(2024, 1, 2), "t": datetime.time(1, 2), "list": (1, 2)}
    assert retired.loads(retired.dumps(value)) == {**value, "list": [1, 2]}


def test_a_damaged_routes_file_is_moved_aside_and_the_router_starts(tmp_path, threaded_reactor):
    reactor = threaded_reactor
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "routes.json").write_text('{"graph": {"sources": "torn')
    router = Router(config(tmp_path, AFTER), reactor)
    spin(reactor, router.start())
    assert (tmp_path / "spool" / "routes.json.damaged").exists()
    assert saved(tmp_path)["graph"]["sources"] == ["keep"]
    spin(reactor, router.stop())

"""Dead letters and named outputs through the real router and spool: what a filter or sink
reports goes to ``<component>.errors`` as events carrying the original record, stored
once however often a replay reports it; inputs naming outputs are checked at load."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import defer

from helpers import spin
from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.load import ConfigError, load_string
from logrouter.config.options import Option
from logrouter.router import Router
from logrouter.sinks.base import SINK_OPTIONS, SinkBase


class RejectFilter:
    """Reports records with ``bad`` to the error path and passes the rest."""

    OPTIONS: dict[str, Option] = {}

    def __init__(self, name: str, options: dict[str, Any], errors: Any) -> None:
        self.name = name
        self.errors = errors

    def process(self, batch: Batch) -> Batch:
        kept = []
        for event in batch.events:
            if event[1].get("bad"):
                self.errors(self.name, batch.tag, event[1], "bad record")
            else:
                kept.append(event)
        return batch.replace(kept)


class SplitFilter:
    """Named outputs: ``even`` and ``odd`` by the record's ``n``."""

    OPTIONS: dict[str, Option] = {}

    @classmethod
    def outputs(cls, options: dict[str, Any]) -> list[str]:
        return ["even", "odd"]

    def __init__(self, name: str, options: dict[str, Any], errors: Any) -> None:
        pass

    def process(self, batch: Batch) -> dict[str, Batch]:
        even = [e for e in batch.events if e[1]["n"] % 2 == 0]
        odd = [e for e in batch.events if e[1]["n"] % 2]
        return {"even": batch.replace(even), "odd": batch.replace(odd)}


class CollectSink(SinkBase):
    """Keeps what it is handed; done at once (its cursor follows ``advance``)."""

    OPTIONS = {**SINK_OPTIONS}
    got: dict[str, list] = {}

    def start(self) -> defer.Deferred:
        CollectSink.got[self.name] = []
        return defer.succeed(0)

    def write(self, batch: Batch, position: int, size: int) -> None:
        CollectSink.got[self.name].extend((batch.tag, batch.source, r) for _, r in batch.events)

    def advance(self, end: int) -> None:
        self.cursor = end
        self.on_progress()

    def stop(self) -> defer.Deferred:
        return defer.succeed(None)


@pytest.fixture(autouse=True)
def test_components():
    """The test's own component types, registered only while its tests run (the README's
    option tables list every registered type)."""
    registry.load_builtin()
    registry.filter("test_reject")(RejectFilter)
    registry.filter("test_split")(SplitFilter)
    registry.sink("test_collect")(CollectSink)
    yield
    del registry.FILTERS["test_reject"], registry.FILTERS["test_split"], registry.SINKS["test_collect"]


def config(tmp_path, body: str) -> Any:
    return load_string(
        f'[spool]\npath = "{tmp_path}/spool"\n[sources.in]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        + body
    )


@pytest.fixture
def running(tmp_path):
    from twisted.internet import reactor

    pool = reactor.getThreadPool()  # the global reactor is iterated by hand: start its pool
    if not pool.started:
        pool.start()
    routers = []

    def start(body: str) -> Router:
        router = Router(config(tmp_path, body), reactor)
        spin(reactor, router.start())
        routers.append(router)
        return router

    yield start
    for router in routers:
        if not router.stop_requested:
            spin(reactor, router.stop())
    reactor._stopThreadPool()


def settle(router: Router, predicate) -> None:
    from twisted.internet import reactor

    d: defer.Deferred = defer.Deferred()

    def check() -> None:
        if predicate():
            d.callback(None)
        else:
            reactor.callLater(0.01, check)

    check()
    spin(reactor, d, timeout=10)


BODY = """
[filters.f]
type = "test_reject"
inputs = ["in"]
[sinks.a]
type = "test_collect"
inputs = ["f"]
[sinks.dl]
type = "test_collect"
inputs = ["f.errors"]
"""


def test_dead_letters_carry_the_record_and_are_stored_once(running) -> None:
    from twisted.internet import reactor

    router = running(BODY)
    for i in range(3):
        events = [(1, {"n": i * 10 + j, "bad": j == 1}) for j in range(3)]
        spin(reactor, router.ingest(Batch("app", events, "in"), f"chunk-{i}".encode()))
    got = CollectSink.got
    settle(router, lambda: len(got["a"]) == 6 and len(got["dl"]) == 3)
    assert sorted(r["event"]["n"] for _, _, r in got["dl"]) == [1, 11, 21]
    tag, source, letter = got["dl"][0]
    assert (tag, source) == ("app", "f.errors")
    assert letter == {"component": "f", "reason": "bad record", "event": {"n": letter["event"]["n"], "bad": True}}
    spin(reactor, router.stop())
    # A restart replays the whole spool (these sinks keep no cursor): the filter reports the
    # same records again, and the router recognises those dead letters as stored.
    again = running(BODY)
    settle(again, lambda: len(got["a"]) == 6 and len(got["dl"]) == 3 and again.duplicates >= 3)
    assert sorted(r["event"]["n"] for _, _, r in got["dl"]) == [1, 11, 21]


def test_named_outputs_route_to_their_consumers(running) -> None:
    router = running(
        """
[filters.split]
type = "test_split"
inputs = ["in"]
[sinks.evens]
type = "test_collect"
inputs = ["split.even"]
[sinks.odds]
type = "test_collect"
inputs = ["split.odd"]
"""
    )
    from twisted.internet import reactor

    spin(reactor, router.ingest(Batch("t", [(1, {"n": n}) for n in range(5)], "in")))
    got = CollectSink.got
    settle(router, lambda: len(got["evens"]) == 3 and len(got["odds"]) == 2)
    assert [r["n"] for _, _, r in got["odds"]] == [1, 3]


def errors_of(tmp_path, body: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        config(tmp_path, body)
    return e.value.errors


def test_output_references_are_checked(tmp_path) -> None:
    base = '[filters.split]\ntype = "test_split"\ninputs = ["in"]\n'
    assert errors_of(tmp_path, base + '[sinks.s]\ntype = "test_collect"\ninputs = ["split"]\n') == [
        "sinks.s.inputs[0]: 'split' has named outputs: take one of split.even, split.odd"
    ]
    assert errors_of(tmp_path, base + '[sinks.s]\ntype = "test_collect"\ninputs = ["split.three"]\n') == [
        "sinks.s.inputs[0]: 'split' has no output 'three' (its outputs: split.errors, split.even, split.odd)"
    ]
    assert errors_of(tmp_path, '[sinks.s]\ntype = "test_collect"\ninputs = ["s.errors"]\n') == [
        "sinks.s.inputs: cycle s -> s"
    ]
    # a sink's and a source's errors are outputs too
    config(tmp_path, '[sinks.s]\ntype = "test_collect"\ninputs = ["in"]\n[sinks.t]\ntype = "test_collect"\ninputs = ["s.errors", "in.errors"]\n')


def test_a_filter_whose_only_consumer_is_its_errors_output_still_runs(running) -> None:
    from twisted.internet import reactor

    router = running(
        """
[filters.check]
type = "test_reject"
inputs = ["in"]
[sinks.a]
type = "test_collect"
inputs = ["in"]
[sinks.dl]
type = "test_collect"
inputs = ["check.errors"]
"""
    )
    spin(reactor, router.ingest(Batch("t", [(1, {"bad": True}), (2, {"ok": 1})], "in")))
    got = CollectSink.got
    settle(router, lambda: len(got["a"]) == 2 and len(got["dl"]) == 1)

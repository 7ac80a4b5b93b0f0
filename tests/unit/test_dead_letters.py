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
    """The test's own component types, registered only while its tests run (the docs'
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
    settle(again, lambda: len(got["a"]) == 6 and len(got["dl"]) == 3 and again.intake.duplicates >= 3)
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


# -- a graceful stop delivers the dead letters it stores ------------------------------------


def stop_right_after(router: Router, d: defer.Deferred) -> defer.Deferred:
    """The router's stop, asked for the moment ``d`` (a batch stored) fires."""
    stopped: defer.Deferred = defer.Deferred()
    d.addCallback(lambda _: router.stop().chainDeferred(stopped))
    return stopped


def test_a_stop_right_after_an_ack_delivers_that_batchs_dead_letters(running) -> None:
    from twisted.internet import reactor

    router = running(BODY)
    router.sources = {}  # nothing to drain: the stop reaches the sinks at once
    events = [(1, {"n": j, "bad": j % 2 == 1}) for j in range(6)]
    spin(reactor, stop_right_after(router, router.ingest(Batch("app", events, "in"), b"chunk-1")))
    got = CollectSink.got
    assert sorted(r["n"] for _, _, r in got["a"]) == [0, 2, 4]
    assert sorted(r["event"]["n"] for _, _, r in got["dl"]) == [1, 3, 5]


def test_a_sink_catching_up_at_the_stop_gets_the_dead_letters_of_what_it_reads(running) -> None:
    from twisted.internet import reactor

    # One sink takes the filter's output and its dead letters; it is behind the spool
    # when the stop comes, so the filter reports them while the stop lets it catch up.
    router = running('[filters.f]\ntype = "test_reject"\ninputs = ["in"]\n'
                     '[sinks.both]\ntype = "test_collect"\ninputs = ["f", "f.errors"]\n')
    router.feeds["both"].fall_behind()
    events = [(1, {"n": j, "bad": j % 2 == 1}) for j in range(6)]
    spin(reactor, stop_right_after(router, router.ingest(Batch("app", events, "in"), b"chunk-1")))
    got = CollectSink.got["both"]
    assert sorted(r["n"] for _, source, r in got if source == "in") == [0, 2, 4]
    assert sorted(r["event"]["n"] for _, source, r in got if source == "f.errors") == [1, 3, 5]


class LateRefusingSink(CollectSink):
    """Refuses records with ``bad`` a reactor turn after it was handed them, as a sink whose
    work runs in a thread does; ``settled`` until then is False."""

    def write(self, batch: Batch, position: int, size: int) -> None:
        from twisted.internet import reactor

        self.queued_bytes += size
        reactor.callLater(0, self._refuse, batch, size)

    def _refuse(self, batch: Batch, size: int) -> None:
        for _, record in batch.events:
            if record.get("bad"):
                self.errors(self.name, batch.tag, record, "cannot take it")
        self.queued_bytes -= size
        self.on_progress()

    def settled(self) -> bool:
        return self.queued_bytes == 0


def test_what_a_sink_refuses_while_the_stop_drains_reaches_its_error_sink(running) -> None:
    from twisted.internet import reactor

    registry.sink("test_late")(LateRefusingSink)
    try:
        router = running('[sinks.s]\ntype = "test_late"\ninputs = ["in"]\n'
                         '[sinks.dl]\ntype = "test_collect"\ninputs = ["s.errors"]\n')
        router.sources = {}
        events = [(1, {"n": j, "bad": j == 2}) for j in range(3)]
        spin(reactor, stop_right_after(router, router.ingest(Batch("app", events, "in"), b"chunk-1")))
        assert [r["event"]["n"] for _, _, r in CollectSink.got["dl"]] == [2]
    finally:
        del registry.SINKS["test_late"]


def test_a_second_pass_over_a_record_in_the_same_turn_stores_no_second_copy() -> None:
    # Two sinks catching up through one filter read the same spool record, each pass
    # reporting its failures; both reads may end in one reactor turn.
    from twisted.internet import task

    from logrouter.errors import RoutedErrors

    stored = []

    class Router:
        def ingest(self, batch, key):
            stored.append((key, [e["event"]["n"] for _, e in batch.events]))
            return defer.succeed(None)

    errors = RoutedErrors(Router(), task.Clock())
    errors.routed = {"f"}
    for _ in range(2):
        errors.pass_number += 1
        errors.position = 700
        errors("f", "t", {"n": 1}, "bad")
        errors("f", "t", {"n": 1}, "bad")  # the same record twice in one batch: both kept
        errors.position = None
    errors.flush()
    assert stored == [(b"700|t", [1, 1])]

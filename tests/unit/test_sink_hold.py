"""A full sink holds the sources: a live sink whose queue passes ``max_queue_bytes`` makes
the sources that can push back stop reading until it drains, for at most its
``hold_sources_secs``; then it reads from the spool and they read again.

The router runs on a ``task.Clock``; its sources are fakes that record what they are
told, its sink a fake whose queue the test fills and drains.
"""

from __future__ import annotations

import pytest
from twisted.internet import defer, task

from source_fakes import log_lines  # noqa: F401  (a fixture)
from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.load import load_string
from logrouter.feeds import HOLD_SLACK, LOW_WATER
from logrouter.router import Router
from logrouter.sinks.base import SINK_OPTIONS, SinkBase

BOUND = 1000
T0 = 1_700_000_000 * 10**9


class RecordingSource:
    """Says what the router told it."""

    def __init__(self, pushes_back: bool) -> None:
        self.PUSHES_BACK = pushes_back
        self.reading = True
        self.pauses = 0

    def pause_reading(self) -> None:
        assert self.reading, "paused twice"
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        assert not self.reading, "resumed while reading"
        self.reading = True

    def start(self):
        return defer.succeed(None)

    def stop(self):
        return defer.succeed(None)

    def samples(self):
        return iter(())


class QueueSink(SinkBase):
    """Holds what it is handed until the test drains it."""

    TYPE = "hold_queue"
    OPTIONS = dict(SINK_OPTIONS)

    def start(self):
        return defer.succeed(0)

    def write(self, batch, position, size):
        self.queued_bytes += size

    def advance(self, end):
        pass

    def stop(self):
        return defer.succeed(None)

    def drain(self, left: int) -> None:
        self.queued_bytes = left
        self.on_progress()


@pytest.fixture
def held(tmp_path):
    """(router, clock, sink, TCP-like source, subscriber-like source), the sink fed live."""
    registry.load_builtin()
    registry.sink("hold_queue")(QueueSink)
    clock = task.Clock()
    config = load_string(
        f'[spool]\npath = "{tmp_path}/spool"\n'
        '[sources.tcp]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[sources.sub]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[sources.elsewhere]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[filters.keep]\ntype = "grep"\ninputs = ["tcp"]\nfield = "n"\ninclude = "."\n'
        f'[sinks.lake]\ntype = "hold_queue"\ninputs = ["keep", "sub"]\nmax_queue_bytes = {BOUND}\nhold_sources_secs = 5\n'
        '[sinks.other]\ntype = "hold_queue"\ninputs = ["elsewhere"]\n'
    )
    # The routes a reload saves are written at once (logrouter.retired).
    router = Router(config, clock, run_blocking=lambda f, *args: defer.maybeDeferred(f, *args))
    router.spool.open()
    tcp, subscriber = RecordingSource(True), RecordingSource(False)
    router.sources = {"tcp": tcp, "sub": subscriber, "elsewhere": RecordingSource(True)}
    feed = router.feeds["lake"]
    feed.start(0)
    feed.go_live()
    yield router, clock, feed.sink, tcp, subscriber
    del registry.SINKS["hold_queue"]


def hand(router: Router, size: int, source: str = "tcp") -> None:
    """One batch of ``size`` spool bytes from ``source``, stored and routed live."""
    position = router.routed_end
    router.route_stored(Batch("t", [(T0, {"n": "1"})], source), position, position + size, size)


def samples(router: Router) -> dict[str, float]:
    """The lake sink's feed samples."""
    return {name: value for name, _, labels, value in router.feed_samples() if labels["sink"] == "lake"}


def test_a_full_sink_holds_the_sources_that_push_back_until_it_drains(held):
    router, clock, sink, tcp, subscriber = held
    hand(router, BOUND)
    assert tcp.reading  # at its bound, not past it
    hand(router, 1)
    assert not tcp.reading and subscriber.reading  # a subscriber that stopped reading would lose messages
    assert router.sources["elsewhere"].reading  # it feeds another sink only
    assert router.feeds["lake"].live  # it stays live: nothing is read back and decoded again
    assert samples(router)["logrouter_sink_holding_sources"] == 1

    clock.advance(2)
    sink.drain(int(BOUND * LOW_WATER))  # not under the low-water mark yet
    assert not tcp.reading
    sink.drain(int(BOUND * LOW_WATER) - 1)
    assert tcp.reading and router.feeds["lake"].live
    state = samples(router)
    assert state["logrouter_sink_holding_sources"] == 0
    assert state["logrouter_sink_holds_total"] == 1
    assert state["logrouter_sink_held_seconds_total"] == 2
    assert not clock.getDelayedCalls()  # the hold's time limit is cancelled

    hand(router, BOUND)  # full again: a second hold
    assert not tcp.reading and samples(router)["logrouter_sink_holds_total"] == 2


def test_a_sink_that_does_not_drain_in_time_reads_from_the_spool_and_the_sources_read_again(held, log_lines):
    router, clock, sink, tcp, _ = held
    hand(router, BOUND + 1)
    clock.advance(4.9)
    assert not tcp.reading
    clock.advance(0.1)
    assert tcp.reading
    assert not router.feeds["lake"].live
    assert any("stayed over max_queue_bytes for 5.0s" in line for line in log_lines)
    assert samples(router)["logrouter_sink_held_seconds_total"] == 5
    assert samples(router)["logrouter_sink_overflows_total"] == 1


def test_what_sources_that_cannot_stop_send_while_held_is_taken_up_to_the_slack_then_the_sink_reads_from_the_spool(held):
    router, _, _, tcp, _ = held
    hand(router, BOUND + 1)
    hand(router, int(BOUND * HOLD_SLACK) - BOUND - 1, source="sub")
    assert router.feeds["lake"].live and not tcp.reading
    hand(router, 1, source="sub")
    assert not router.feeds["lake"].live and tcp.reading


def test_what_held_sources_had_read_before_they_stopped_is_taken_besides_the_slack(held):
    # Many senders each with windows in flight: what their connections had read and the
    # spool was still writing when the hold began arrives after it, well past the slack.
    # It is bounded (they read nothing more), so the sink stays live rather than decode
    # it all again from the spool.
    router, clock, sink, tcp, _ = held
    hand(router, BOUND + 1)
    for _ in range(10):
        hand(router, BOUND)
    assert router.feeds["lake"].live and not tcp.reading
    hand(router, int(BOUND * HOLD_SLACK) - BOUND - 1, source="sub")
    assert router.feeds["lake"].live
    assert samples(router)["logrouter_sink_overflows_total"] == 0
    hand(router, 1, source="sub")  # past the slack by what the subscriber sent
    assert not router.feeds["lake"].live and tcp.reading
    assert samples(router)["logrouter_sink_overflows_total"] == 1


def test_what_a_source_held_for_another_sink_hands_over_does_not_widen_this_ones_slack(held):
    router, _, sink, tcp, _ = held
    other = router.feeds["other"]
    other.start(0)
    other.go_live()
    other.sink.options["max_queue_bytes"] = BOUND
    hand(router, BOUND + 1)  # lake holds tcp
    hand(router, BOUND + 1, source="elsewhere")  # other holds elsewhere
    for _ in range(5):
        hand(router, BOUND, source="elsewhere")  # in flight for other, never reaches lake
    assert router.feeds["lake"].held_inflow == 0
    hand(router, int(BOUND * HOLD_SLACK) - BOUND, source="sub")
    assert not router.feeds["lake"].live  # past the slack: the other sink's traffic excused nothing


def test_what_held_sources_hand_over_counts_for_one_hold_only(held):
    router, _, sink, tcp, _ = held
    hand(router, BOUND + 1)
    hand(router, 5 * BOUND)
    sink.drain(0)
    assert tcp.reading and router.feeds["lake"].live
    hand(router, BOUND + 1)  # a second hold: the first one's allowance is gone
    hand(router, int(BOUND * HOLD_SLACK) - BOUND, source="sub")
    assert not router.feeds["lake"].live


def test_a_sink_that_fails_while_holding_lets_the_sources_go(held):
    router, _, sink, tcp, _ = held
    hand(router, BOUND + 1)
    sink.fail(RuntimeError("disk full"))
    sink.on_progress()  # as every sink does after fail()
    assert tcp.reading and not router.feeds["lake"].live
    assert samples(router)["logrouter_sink_holding_sources"] == 0


def test_with_hold_sources_secs_0_a_full_sink_reads_from_the_spool_at_once(held):
    router, _, sink, tcp, _ = held
    sink.options = dict(sink.options, hold_sources_secs=0)
    hand(router, BOUND + 1)
    assert tcp.reading and not router.feeds["lake"].live
    assert samples(router)["logrouter_sink_holds_total"] == 0


def test_the_sources_read_again_only_once_neither_the_spool_nor_a_sink_holds_them(held, monkeypatch):
    router, _, sink, tcp, subscriber = held
    hand(router, BOUND + 1)
    monkeypatch.setattr(router.backpressure, "max_spool_bytes", -1)  # the spool's backlog is over its bound too
    router.check_backpressure()
    assert router.paused and not tcp.reading and not subscriber.reading
    sink.drain(0)  # the sink lets go ...
    assert not tcp.reading and not subscriber.reading  # ... the spool still holds every source
    monkeypatch.setattr(router.backpressure, "max_spool_bytes", 1 << 40)
    router.check_backpressure()
    assert tcp.reading and subscriber.reading
    assert tcp.pauses == 1  # told once, not once per reason


# -- stopping, reloading, and what the option takes -------------------------------------------


class StoppableSource(RecordingSource):
    """Notes the calls it gets; its stop (the drain) ends when the test says."""

    def __init__(self) -> None:
        super().__init__(True)
        self.calls: list[str] = []
        self.stopped = defer.Deferred()

    def pause_reading(self) -> None:
        super().pause_reading()
        self.calls.append("pause")

    def resume_reading(self) -> None:
        super().resume_reading()
        self.calls.append("resume")

    def stop(self):
        self.calls.append("stop")
        return self.stopped


def test_a_stop_lets_held_sources_read_what_their_senders_sent_while_they_drain(held):
    router, clock, _, _, _ = held
    draining = StoppableSource()
    router.sources = {"tcp": draining}
    hand(router, BOUND + 1)
    router.stop()
    assert draining.calls == ["pause", "resume", "stop"]  # resumed before its drain, not after
    hand(router, BOUND + 1)  # what it still reads does not hold it again
    assert draining.reading
    draining.stopped.callback(None)


def test_a_reload_lets_a_held_source_it_stops_read_while_it_drains(tmp_path, held):
    router, _, _, _, _ = held
    leaving = StoppableSource()
    router.sources["tcp"] = leaving
    hand(router, BOUND + 1)
    assert not leaving.reading
    config = load_string(
        f'[spool]\npath = "{tmp_path}/spool"\n'
        '[sources.sub]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        f'[sinks.lake]\ntype = "hold_queue"\ninputs = ["sub"]\nmax_queue_bytes = {BOUND}\nhold_sources_secs = 5\n'
    )
    router.reconfigure(config)
    assert leaving.calls == ["pause", "resume", "stop"]
    leaving.stopped.callback(None)


def test_a_source_that_failed_to_start_in_a_reload_is_held_like_the_others_when_it_comes_back(
    tmp_path, held, monkeypatch
):
    from logrouter import router as router_module

    router, _, _, _, _ = held
    built: list[StoppableSource] = []
    first_start = defer.Deferred()

    def build(cls, name, options, context):
        source = StoppableSource()
        source.start = (lambda: first_start) if not built else (lambda: defer.succeed(None))
        built.append(source)
        return source

    monkeypatch.setattr(router_module, "build_source", build)
    text = (
        f'[spool]\npath = "{tmp_path}/spool"\n'
        '[sources.tcp]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[sources.late]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        f'[sinks.lake]\ntype = "hold_queue"\ninputs = ["tcp", "late"]\nmax_queue_bytes = {BOUND}\nhold_sources_secs = 5\n'
    )
    router.reconfigure(load_string(text))
    hand(router, BOUND + 1)  # held while `late` is starting ...
    assert not built[0].reading
    first_start.errback(OSError("port in use"))
    assert "late" not in router.sources
    router.reconfigure(load_string(text))  # ... and when it comes back, the hold still on
    assert router.sources["late"] is built[-1] and not built[-1].reading


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_hold_sources_secs_takes_a_finite_number_of_seconds(tmp_path, value):
    from logrouter.config.load import ConfigError

    with pytest.raises(ConfigError) as info:
        load_string(
            f'[spool]\npath = "{tmp_path}/spool"\n'
            '[sources.tcp]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
            f'[sinks.lake]\ntype = "parquet"\ninputs = ["tcp"]\npath = "lake"\nhold_sources_secs = {value}\n'
        )
    assert [e for e in info.value.errors if e.startswith("sinks.lake.hold_sources_secs: must be")]

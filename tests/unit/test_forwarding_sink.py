"""The forwarding sinks' shared lifecycle (``logrouter.sinks.forwarding``) on ``task.Clock``
with a synchronous ``run_blocking``: start (state read, ticker, heartbeats, a failed open
undone), ticks (a silent cursor move reported, the cursor saved at most once a second),
failures (backoff and replay; none while stopping), and stop (drain, drain timeout, the
forced save, the output closed last).

``Toy`` is the smallest protocol: ``outstanding`` counts what its next hop has not acked.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.internet import defer, task

from logrouter.batch import Batch
from logrouter.sinks.base import SINK_OPTIONS
from logrouter.sinks.forwarding import STATE_SAVE_SECS, ForwardingSink, host_label
from logrouter.sinks.state import SinkState
from source_fakes import log_lines  # noqa: F401  (a fixture)


class ToyError(Exception):
    pass


class Toy(ForwardingSink):
    TYPE = "toy"
    ERROR = ToyError
    RESENT = "sent again (toy)"

    def __init__(self, clock: task.Clock, **options: Any) -> None:
        merged = {k: o.default for k, o in SINK_OPTIONS.items()}
        merged.update(drain_timeout_secs=5, heartbeat_secs=None)
        merged.update(options)
        super().__init__("toy", merged, errors=None, reactor=clock)
        self.run_blocking = lambda f, *a, **k: defer.maybeDeferred(f, *a, **k)
        self.outstanding = 0
        self.calls: list[str] = []
        self.open_error: Exception | None = None
        self.drain_timeout: float | None = float(merged["drain_timeout_secs"])

    def _open(self) -> None:
        self.calls.append("open")
        if self.open_error is not None:
            raise self.open_error

    def _start_failed(self, failure: Any) -> Any:
        self.calls.append("start failed")
        return failure

    def _heartbeat_secs(self) -> float | None:
        return self.options["heartbeat_secs"]

    def _heartbeat(self) -> None:
        self.calls.append(f"heartbeat at {self.reactor.seconds():g}")

    def _log_started(self, cursor: int) -> None:
        self.calls.append(f"started at {cursor}")

    def _drain_timeout(self) -> float | None:
        return self.drain_timeout

    def _drained(self) -> bool:
        return self.outstanding == 0

    def _undrained(self) -> str:
        return f"{self.outstanding} toy(s) not acked"

    def _drop_connections(self) -> None:
        self.calls.append("drop connections")

    def _drop(self) -> None:
        self.calls.append("drop")
        self.outstanding = 0
        self.queued_bytes = 0

    def _close_output(self, saved: defer.Deferred) -> defer.Deferred:
        self.calls.append(f"close ({'saved' if saved.called else 'saving'})")
        return saved

    # What a protocol does when its next hop acks: move the cursor, tell whoever waits.
    def acked(self, cursor: int) -> None:
        self.outstanding -= 1
        self.cursor = cursor
        self._check_drained()


@pytest.fixture
def clock() -> task.Clock:
    c = task.Clock()
    c.advance(1000)
    return c


def started(clock: task.Clock, tmp_path: Any, cursor: int | None = None, **options: Any) -> Toy:
    state = SinkState(str(tmp_path / "sinks" / "toy.json"))
    if cursor is not None:
        state.save({"cursor": cursor})
    sink = Toy(clock, **options)
    sink.state = state
    progress: list[int] = []
    sink.on_progress = lambda: progress.append(sink.cursor)
    sink.progress = progress  # type: ignore[attr-defined]
    d = sink.start()
    assert d.called and d.result == sink.cursor
    return sink


def saved_state(tmp_path: Any) -> dict:
    return json.loads((tmp_path / "sinks" / "toy.json").read_text())


def test_start_resumes_from_the_saved_cursor_then_ticks_and_heartbeats(clock, tmp_path):
    sink = started(clock, tmp_path, cursor=300, heartbeat_secs=2)
    assert sink.cursor == 300 and sink.started and sink.accepting
    assert sink.calls == ["open", "started at 300"]  # the first heartbeat one interval later
    assert sink.ticker.running and sink.heartbeats.running
    clock.advance(2)
    assert sink.calls[-1] == "heartbeat at 1002"
    # The cursor read back counts as saved: nothing is written until it moves.
    clock.advance(STATE_SAVE_SECS)
    assert saved_state(tmp_path) == {"cursor": 300}


def test_heartbeats_at_start_when_the_protocol_says_so(clock, tmp_path):
    Toy.HEARTBEAT_AT_START = True
    try:
        sink = started(clock, tmp_path, heartbeat_secs=2)
    finally:
        del Toy.HEARTBEAT_AT_START
    assert sink.calls == ["open", "heartbeat at 1000", "started at 0"]


def test_no_heartbeats_without_an_interval(clock, tmp_path):
    sink = started(clock, tmp_path)
    assert not sink.heartbeats.running


def test_a_failed_open_fails_the_start_and_nothing_runs(clock, tmp_path):
    sink = Toy(clock)
    sink.open_error = OSError("cannot bind")
    d = sink.start()
    failure = d.result
    d.addErrback(lambda _: None)
    assert isinstance(failure.value, OSError)
    assert not sink.started and not sink.accepting and not sink.ticker.running
    assert not clock.getDelayedCalls()


def test_a_failed_state_read_is_undone_by_start_failed(clock, tmp_path):
    sink = Toy(clock)
    sink._load_state = lambda: 1 / 0  # type: ignore[method-assign]
    d = sink.start()
    d.addErrback(lambda _: None)
    assert sink.calls == ["open", "start failed"] and not sink.started


def test_a_tick_reports_a_cursor_that_moved_silently_and_saves_it(clock, tmp_path):
    sink = started(clock, tmp_path)
    sink.cursor = 100  # moved without on_progress (e.g. inside advance)
    clock.advance(STATE_SAVE_SECS)
    assert sink.progress == [100]
    assert saved_state(tmp_path) == {"cursor": 100}
    clock.advance(STATE_SAVE_SECS)
    assert sink.progress == [100]  # reported once
    sink.cursor = 200
    sink.failing = True
    clock.advance(STATE_SAVE_SECS)
    assert sink.progress == [100]  # a failing sink reports nothing


def test_the_cursor_is_saved_at_most_about_once_a_second(clock, tmp_path):
    sink = started(clock, tmp_path)
    saves: list[dict] = []
    real = sink.state.save
    sink.state.save = lambda state: (saves.append(state), real(state))  # type: ignore[method-assign]
    for cursor in (10, 20, 30, 40):
        sink.cursor = cursor
        clock.advance(STATE_SAVE_SECS / 2)
    assert saves == [{"cursor": 20}, {"cursor": 40}]


def test_a_failure_drops_everything_backs_off_and_replays(clock, tmp_path):
    sink = started(clock, tmp_path, cursor=50, retry_initial_secs=2.0)
    rewinds: list[int] = []
    sink.on_rewind = lambda: rewinds.append(sink.cursor)
    sink.outstanding = 3
    sink._broken("the next hop went away")
    assert sink.failing and sink.failures == 1 and not sink.accepting
    assert sink.calls[-2:] == ["drop connections", "drop"] and sink.progress == [50]
    sink._broken("again")  # already failing: once is enough
    assert sink.failures == 1
    clock.advance(2)
    assert not sink.failing and rewinds == [50] and sink.calls[-1] == "drop"  # reset before the replay


def test_stop_waits_for_the_drain_then_saves_and_closes_last(clock, tmp_path):
    sink = started(clock, tmp_path, heartbeat_secs=1)
    sink.outstanding = 2
    stopped: list[Any] = []
    sink.stop().addCallback(stopped.append)
    assert sink.stopping and not sink.stopped and not stopped
    sink.acked(100)
    assert not stopped
    sink.acked(200)
    assert stopped and sink.stopped and not sink.accepting
    assert sink.calls[-1] == "close (saved)"  # with a synchronous runner the save is done
    assert saved_state(tmp_path) == {"cursor": 200}
    assert not sink.ticker.running and not sink.heartbeats.running
    assert not clock.getDelayedCalls()  # the drain timer is cancelled


def test_the_drain_timeout_warns_and_stops_anyway(clock, tmp_path, log_lines):
    sink = started(clock, tmp_path, drain_timeout_secs=3)
    sink.outstanding = 2
    stopped: list[Any] = []
    sink.stop().addCallback(stopped.append)
    clock.advance(2.9)
    assert not stopped
    clock.advance(0.1)
    assert stopped and sink.stopped
    assert (
        "toy sink toy: stopping with 2 toy(s) not acked after 3s; they stay in the spool and are "
        "sent again (toy) on the next start"
    ) in log_lines


def test_without_a_drain_timeout_stop_waits_as_long_as_it_takes(clock, tmp_path):
    sink = started(clock, tmp_path)
    sink.drain_timeout = None
    sink.outstanding = 1
    stopped: list[Any] = []
    sink.stop().addCallback(stopped.append)
    assert [c for c in clock.getDelayedCalls() if c.func == sink._drain_timed_out] == []
    clock.advance(3600)
    assert not stopped
    sink.acked(10)
    assert stopped


def test_a_failure_while_stopping_ends_the_drain_without_a_retry(clock, tmp_path, log_lines):
    sink = started(clock, tmp_path, cursor=40)
    sink.outstanding = 1
    stopped: list[Any] = []
    sink.stop().addCallback(stopped.append)
    sink._broken("connection lost")
    assert stopped and sink.failing and sink.failures == 1
    assert "toy sink toy failed while stopping: connection lost" in log_lines
    assert not clock.getDelayedCalls()  # no retry after the stop
    assert saved_state(tmp_path) == {"cursor": 40}


def test_stop_before_start_or_while_failing_does_not_wait(clock, tmp_path):
    sink = Toy(clock)
    sink.outstanding = 1
    assert sink.stop().called
    failing = started(clock, tmp_path)
    failing.outstanding = 1
    failing._broken("down")
    stopped: list[Any] = []
    failing.stop().addCallback(stopped.append)
    assert stopped and not clock.getDelayedCalls()  # the retry is cancelled too


def test_hold_keeps_the_events_of_an_accepting_sink(clock, tmp_path):
    sink = Toy(clock)
    sink.unsent, sink.unsent_events, sink._bytes_since_mark = [], 0, 0
    batch = Batch("app", [(1, {"a": 1}), (2, {"a": 2})], "src")
    assert sink._hold(batch, 100) == 0  # not started: the replay brings it again
    sink.state = SinkState(str(tmp_path / "sinks" / "toy.json"))
    sink.start()
    assert sink._hold(batch, 100) == 2
    assert sink._hold(Batch("app", [], "src"), 30) == 0  # nothing for this sink
    assert sink.unsent == [("app", batch.events)] and sink.unsent_events == 2
    assert sink.queued_bytes == sink._bytes_since_mark == 100 and sink.events_in == 2
    sink._broken("down")
    assert sink._hold(batch, 100) == 0  # failing


def test_host_label():
    assert host_label("logstash", 5044) == "logstash:5044"
    assert host_label("::1", 24224) == "[::1]:24224"

"""A sink's feed as a state machine (``logrouter.feeds``): every transition, the ones refused,
and the hold's policy, on a ``task.Clock`` with a fake sink."""

from __future__ import annotations

import pytest
from twisted.internet import task

from source_fakes import log_lines  # noqa: F401  (a fixture)
from logrouter.feeds import BEHIND, HELD, HOLD_SLACK, LIVE, LOW_WATER, READING, REMOVED, STARTING, FeedState, FeedStateError, SinkFeed

BOUND = 1000


class FakeSink:
    TYPE = "fake"

    def __init__(self) -> None:
        self.options = {"max_queue_bytes": BOUND, "hold_sources_secs": 5.0}
        self.queued_bytes = 0
        self.cursor = 0
        self.advanced: list[int] = []

    def advance(self, end: int) -> None:
        self.advanced.append(end)


class Recorder:
    def __init__(self) -> None:
        self.changes = 0
        self.expired: list[SinkFeed] = []

    def change(self) -> None:
        self.changes += 1


@pytest.fixture
def made():
    clock = task.Clock()
    seen = Recorder()

    def make(state: FeedState = STARTING) -> SinkFeed:
        feed = SinkFeed("lake", FakeSink(), clock, on_hold_change=seen.change, on_hold_expired=seen.expired.append)
        into(feed, state)
        seen.changes = 0
        return feed

    return make, clock, seen


def into(feed: SinkFeed, state: FeedState) -> None:
    """Drive a new feed into ``state`` through the transitions."""
    if state is STARTING:
        return
    if state is REMOVED:
        feed.remove()
        return
    feed.start(0)
    if state is READING:
        feed.begin_read(object())
    elif state in (LIVE, HELD):
        feed.go_live()
        if state is HELD:
            feed.hold(5.0)


def test_start_places_the_feed_at_the_sinks_position_without_counting_a_commit(made):
    make, _, _ = made
    feed = make()
    assert feed.state is STARTING and not feed.started and not feed.live
    feed.sink.cursor = 300
    feed.started_at(300)
    feed.start(500)
    assert feed.state is BEHIND and feed.started and not feed.live
    assert feed.delivered == 500 and feed.sink.advanced == [500]
    assert feed.committed_at == 0.0


def test_a_read_begins_and_ends(made):
    make, _, _ = made
    feed = make(BEHIND)
    reading = object()
    epoch = feed.begin_read(reading)
    assert feed.state is READING and feed.reading is reading and epoch == feed.epoch
    assert feed.started and not feed.live
    feed.end_read()
    assert feed.state is BEHIND and feed.reading is None


def test_go_live_and_be_handed_records(made):
    make, clock, _ = made
    feed = make(BEHIND)
    feed.go_live()
    assert feed.state is LIVE and feed.live
    clock.advance(7)
    feed.sink.cursor = 40  # a sink that commits as it is handed records
    feed.moved(100)
    assert feed.delivered == 100 and feed.sink.advanced[-1] == 100 and feed.committed_at == 7


def test_a_hold_begins_and_is_released(made):
    make, clock, seen = made
    feed = make(LIVE)
    clock.advance(1)
    feed.hold(5.0)
    assert feed.state is HELD and feed.live and seen.changes == 1
    assert feed.holds == 1 and feed.held_since == 1 and len(clock.getDelayedCalls()) == 1
    clock.advance(2)
    feed.held_inflow = 50
    feed.release()
    assert feed.state is LIVE and seen.changes == 2
    assert feed.held_secs == 2 and feed.held_since is None and feed.held_inflow == 0
    assert clock.getDelayedCalls() == []  # the hold's time limit is cancelled


def test_a_hold_that_lasts_too_long_overflows_and_says_so(made, log_lines):  # noqa: F811
    make, clock, seen = made
    feed = make(HELD)
    clock.advance(4.9)
    assert feed.state is HELD
    clock.advance(0.1)
    assert feed.state is BEHIND and feed.overflows == 1 and feed.held_secs == 5
    assert seen.changes == 1 and seen.expired == [feed]
    assert any("sink lake: its queue stayed over max_queue_bytes for 5.0s" in line for line in log_lines)


@pytest.mark.parametrize("state", [LIVE, HELD])
def test_an_overflow_sends_the_feed_to_the_spool(made, state):
    make, clock, seen = made
    feed = make(state)
    feed.overflow()
    assert feed.state is BEHIND and feed.overflows == 1
    assert seen.changes == (1 if state is HELD else 0) and clock.getDelayedCalls() == []


@pytest.mark.parametrize("state", [LIVE, HELD])
def test_falling_behind_when_fed_live(made, state):
    make, clock, seen = made
    feed = make(state)
    epoch = feed.epoch
    feed.fall_behind()
    assert feed.state is BEHIND and feed.epoch == epoch + 1 and feed.overflows == 0
    assert seen.changes == (1 if state is HELD else 0) and clock.getDelayedCalls() == []


def test_falling_behind_while_reading_discards_the_read_under_way(made):
    make, _, _ = made
    feed = make(BEHIND)
    epoch = feed.begin_read(object())
    feed.fall_behind()
    assert feed.state is READING and feed.epoch != epoch  # its records are not applied
    feed.end_read()
    assert feed.state is BEHIND


@pytest.mark.parametrize("state", [STARTING, BEHIND, REMOVED])
def test_falling_behind_elsewhere_changes_nothing_but_the_epoch(made, state):
    make, _, _ = made
    feed = make(state)
    epoch = feed.epoch
    feed.fall_behind()
    assert feed.state is state and feed.epoch == epoch + 1


def test_a_rewind_feeds_it_again_from_its_cursor(made):
    make, _, _ = made
    feed = make(LIVE)
    feed.moved(900)
    feed.sink.cursor = 300
    epoch = feed.epoch
    feed.rewind()
    assert feed.state is BEHIND and feed.delivered == 300 and feed.sink.advanced[-1] == 300 and feed.epoch == epoch + 1


@pytest.mark.parametrize("state", list(FeedState))
def test_any_state_can_be_removed(made, state):
    make, clock, seen = made
    feed = make(state)
    epoch = feed.epoch
    feed.remove()
    assert feed.state is REMOVED and not feed.started and not feed.live and feed.epoch == epoch + 1
    assert seen.changes == (1 if state is HELD else 0) and clock.getDelayedCalls() == []


def test_a_read_under_way_when_removed_ends_in_removed(made):
    make, _, _ = made
    feed = make(READING)
    feed.remove()
    assert feed.reading is not None  # a reload waits for it
    feed.end_read()
    assert feed.state is REMOVED and feed.reading is None


ALLOWED = {
    "start": {STARTING},
    "begin_read": {BEHIND},
    "end_read": {READING, REMOVED},
    "go_live": {BEHIND},
    "hold": {LIVE},
    "release": {HELD},
    "overflow": {LIVE, HELD},
}
CALLS = {
    "start": lambda feed: feed.start(0),
    "begin_read": lambda feed: feed.begin_read(object()),
    "end_read": lambda feed: feed.end_read(),
    "go_live": lambda feed: feed.go_live(),
    "hold": lambda feed: feed.hold(5.0),
    "release": lambda feed: feed.release(),
    "overflow": lambda feed: feed.overflow(),
}


@pytest.mark.parametrize(
    "transition, state",
    [(t, s) for t, allowed in ALLOWED.items() for s in FeedState if s not in allowed],
    ids=lambda value: getattr(value, "value", value),
)
def test_a_transition_from_a_state_it_does_not_start_from_is_refused(made, transition, state):
    make, _, _ = made
    feed = make(state)
    with pytest.raises(FeedStateError, match=f"sink lake: {transition} from {state.value}"):
        CALLS[transition](feed)
    assert feed.state is state


# -- the hold's policy ---------------------------------------------------------------------


def test_a_live_feed_over_its_bound_holds_the_sources(made):
    make, _, seen = made
    feed = make(LIVE)
    feed.sink.queued_bytes = BOUND
    feed.check_queue(may_hold=True)
    assert feed.state is LIVE  # at its bound, not past it
    feed.sink.queued_bytes = BOUND + 1
    feed.check_queue(may_hold=True)
    assert feed.state is HELD and seen.changes == 1


@pytest.mark.parametrize("secs, may_hold", [(0, True), (5.0, False)])
def test_a_live_feed_that_may_not_hold_overflows(made, secs, may_hold):
    make, _, _ = made
    feed = make(LIVE)
    feed.sink.options["hold_sources_secs"] = secs
    feed.sink.queued_bytes = BOUND + 1
    feed.check_queue(may_hold)
    assert feed.state is BEHIND and feed.overflows == 1 and feed.holds == 0


def test_a_held_feed_takes_up_to_its_slack_and_what_the_held_sources_had_read(made):
    make, _, _ = made
    feed = make(HELD)
    feed.sink.queued_bytes = int(BOUND * HOLD_SLACK)
    feed.check_queue(may_hold=True)
    assert feed.state is HELD
    feed.held_inflow = 10
    feed.sink.queued_bytes = int(BOUND * HOLD_SLACK) + 10
    feed.check_queue(may_hold=True)
    assert feed.state is HELD
    feed.sink.queued_bytes += 1
    feed.check_queue(may_hold=True)
    assert feed.state is BEHIND and feed.overflows == 1


@pytest.mark.parametrize("state", [STARTING, BEHIND, READING, REMOVED])
def test_a_feed_not_fed_live_is_not_checked_for_its_queue(made, state):
    make, _, _ = made
    feed = make(state)
    feed.sink.queued_bytes = BOUND * 10
    feed.check_queue(may_hold=True)
    assert feed.state is state and feed.overflows == 0


def test_a_held_feed_is_released_under_the_low_water_mark(made):
    make, _, _ = made
    feed = make(HELD)
    feed.sink.queued_bytes = int(BOUND * LOW_WATER)
    feed.check_drained()
    assert feed.state is HELD
    feed.sink.queued_bytes -= 1
    feed.check_drained()
    assert feed.state is LIVE


def test_the_samples_say_how_it_is_fed(made):
    from logrouter.spool.ages import StoreTimes

    make, clock, _ = made
    feed = make(HELD)
    clock.advance(3)
    got = {name: value for name, _, _, value in feed.samples(0, clock.seconds(), StoreTimes(0.0))}
    assert got["logrouter_sink_live"] == 1 and got["logrouter_sink_holding_sources"] == 1
    assert got["logrouter_sink_held_seconds_total"] == 3 and got["logrouter_sink_holds_total"] == 1

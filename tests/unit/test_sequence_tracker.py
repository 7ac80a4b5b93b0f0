"""SequenceTracker on its own: a task.Clock, sequence numbers fed by hand, events collected."""

from __future__ import annotations

import pytest
from twisted.internet import task
from twisted.logger import Logger

from logrouter.sources.sequence import (
    DEFAULT_SILENCE_SECS,
    SEQUENCE_MAX,
    SequenceEvent,
    SequenceTracker,
    SilentStream,
    Verdict,
)

EP = "tcp://dev.example:9606"
NEW, DUP = Verdict.NEW, Verdict.DUPLICATE


def make(**kwargs):
    clock = task.Clock()
    events: list[SequenceEvent] = []
    tracker = SequenceTracker(clock, on_event=events.append, **kwargs)
    logged: list[dict] = []
    tracker.log = Logger(namespace="test", observer=logged.append)
    return clock, tracker, events, logged


def feed(tracker, seqs, endpoint=EP, device=3):
    return [tracker.observe(endpoint, device, s).value for s in seqs]


def counters(tracker, endpoint=EP, device=3):
    s = tracker.stream(endpoint, device)
    return {"received": s.received, "lost": s.lost, "duplicates": s.duplicates, "restarts": s.restarts, "last": s.last}


def test_in_order_from_one_counts_nothing():
    _, tracker, events, logged = make()
    assert feed(tracker, range(1, 101)) == ["new"] * 100
    assert counters(tracker) == {"received": 100, "lost": 0, "duplicates": 0, "restarts": 0, "last": 100}
    assert events == [] and logged == []


def test_first_message_of_a_stream_is_not_a_gap():
    _, tracker, events, _ = make()
    assert feed(tracker, [5000, 5001]) == ["new", "new"]
    assert counters(tracker)["lost"] == 0 and events == []


def test_gap_counts_the_missing_numbers():
    _, tracker, events, logged = make()
    assert feed(tracker, [4, 5, 9, 10, 12]) == ["new"] * 5
    assert counters(tracker)["lost"] == 3 + 1
    assert [(e.kind, e.sequence, e.previous, e.count) for e in events] == [("gap", 9, 5, 3), ("gap", 12, 10, 1)]
    assert logged == []  # gaps are the source's to log


def test_same_number_again_is_a_duplicate_and_does_not_move_last():
    _, tracker, events, _ = make()
    assert feed(tracker, [1, 2, 3, 3, 4]) == ["new", "new", "new", "duplicate", "new"]
    assert counters(tracker) == {"received": 5, "lost": 0, "duplicates": 1, "restarts": 0, "last": 4}
    assert events == []


def test_out_of_order_below_last_is_a_duplicate_not_a_reorder():
    # ZeroMQ keeps order on a connection: a number below the last one was either heard
    # already or counted lost; it is never stored late.
    _, tracker, _, _ = make()
    assert feed(tracker, [10, 11, 14, 12, 15]) == ["new", "new", "new", "duplicate", "new"]
    assert counters(tracker)["lost"] == 2
    assert counters(tracker)["duplicates"] == 1


def test_a_device_heard_twice_interleaved_stores_each_number_once():
    _, tracker, _, _ = make()
    verdicts = feed(tracker, [5, 5, 6, 6, 7, 7, 8, 8])
    assert verdicts == ["new", "duplicate"] * 4
    assert counters(tracker)["duplicates"] == 4 and counters(tracker)["restarts"] == 0


def test_wrap_from_max_to_zero_is_neither_loss_nor_restart():
    _, tracker, events, logged = make()
    assert feed(tracker, [SEQUENCE_MAX - 1, SEQUENCE_MAX, 0, 1, 2]) == ["new"] * 5
    assert counters(tracker) == {"received": 5, "lost": 0, "duplicates": 0, "restarts": 0, "last": 2}
    assert [e.kind for e in events] == ["wrap"]
    assert tracker.stream(EP, 3).wraps == 1 and logged == []


def test_wrap_from_max_to_one_skips_zero_without_loss():
    _, tracker, events, _ = make()
    assert feed(tracker, [SEQUENCE_MAX, 1, 2]) == ["new"] * 3
    assert counters(tracker)["lost"] == 0 and counters(tracker)["restarts"] == 0
    assert [e.kind for e in events] == ["wrap"]


def test_gap_across_the_wrap_counts_only_real_numbers():
    _, tracker, events, _ = make()
    # missing: MAX-1, MAX, (0 is not a number of the counter), 1, 2
    assert feed(tracker, [SEQUENCE_MAX - 2, 3]) == ["new", "new"]
    assert counters(tracker)["lost"] == 4
    assert [(e.kind, e.count) for e in events] == [("wrap", 0), ("gap", 4)]


def test_restart_back_to_one_is_counted_and_logged_once():
    _, tracker, events, logged = make()
    assert feed(tracker, [1000, 1001, 1, 2, 3]) == ["new"] * 5
    assert counters(tracker) == {"received": 5, "lost": 0, "duplicates": 0, "restarts": 1, "last": 3}
    assert [(e.kind, e.sequence, e.previous, e.count) for e in events] == [("restart", 1, 1001, 0)]
    assert len(logged) == 1
    assert logged[0]["device"] == 3 and logged[0]["sequence"] == 1 and logged[0]["last"] == 1001


def test_restart_seen_late_counts_the_new_runs_missed_messages():
    # The SUB socket reconnects after the device restarts: its first numbers are gone.
    _, tracker, events, _ = make(duplicate_window=16)
    assert feed(tracker, [5000, 4, 5]) == ["new"] * 3
    assert counters(tracker) == {"received": 3, "lost": 3, "duplicates": 0, "restarts": 1, "last": 5}
    assert [(e.kind, e.count) for e in events] == [("restart", 3)]


def test_restart_landing_in_the_duplicate_window_costs_at_most_one_message():
    _, tracker, events, logged = make(duplicate_window=1024)
    # the device crash-loops: 300 numbers, restart, first heard is 295
    verdicts = feed(tracker, [299, 300, 295, 296, 297])
    assert verdicts == ["new", "new", "duplicate", "new", "new"]
    c = counters(tracker)
    assert c["restarts"] == 1 and c["duplicates"] == 1 and c["last"] == 297
    assert c["lost"] == 295  # 1..295 of the new run, the dropped 295 included
    assert [e.kind for e in events] == ["restart"] and len(logged) == 1


def test_last_one_then_one_again_is_a_duplicate():
    _, tracker, _, _ = make()
    assert feed(tracker, [1, 1, 2]) == ["new", "duplicate", "new"]
    assert counters(tracker)["restarts"] == 0


def test_device_zero_is_never_judged():
    _, tracker, events, _ = make()
    assert feed(tracker, [7, 7, 1, 900, 3], device=0) == ["new"] * 5
    c = counters(tracker, device=0)
    assert c["received"] == 5 and c["lost"] == c["duplicates"] == c["restarts"] == 0
    assert events == []


def test_streams_are_keyed_by_endpoint_and_device():
    _, tracker, _, _ = make()
    tracker.observe(EP, 1, 10)
    tracker.observe(EP, 2, 500)
    tracker.observe("tcp://other:9606", 1, 3)
    tracker.observe(EP, 1, 11)
    tracker.observe(EP, 2, 502)
    tracker.observe("tcp://other:9606", 1, 4)
    assert counters(tracker, EP, 1)["lost"] == 0
    assert counters(tracker, EP, 2)["lost"] == 1
    assert counters(tracker, "tcp://other:9606", 1)["lost"] == 0
    assert len(tracker) == 3


def test_heartbeats_use_the_counter_and_keep_the_announced_endpoint():
    _, tracker, events, _ = make()
    tracker.observe(EP, 3, 8)
    tracker.observe(EP, 3, 9)
    assert tracker.heartbeat(EP, 3, 10, announced="tcp://h.example:9606") is NEW
    tracker.observe(EP, 3, 11)
    assert counters(tracker)["lost"] == 0 and events == []
    assert tracker.stream(EP, 3).announced == "tcp://h.example:9606"
    assert tracker.heartbeat(EP, 3, 10) is DUP  # announced kept when a heartbeat names none
    assert tracker.stream(EP, 3).announced == "tcp://h.example:9606"


def test_silence_after_thirty_seconds_without_data_or_heartbeat():
    clock, tracker, _, _ = make()
    assert DEFAULT_SILENCE_SECS == 30.0
    tracker.heartbeat(EP, 3, 1, announced="tcp://h.example:9606")
    tracker.observe("tcp://b:9606", 4, 1)
    clock.advance(20)
    tracker.observe("tcp://b:9606", 4, 2)
    clock.advance(9.5)
    assert tracker.silent() == []
    clock.advance(0.5)
    assert tracker.silent() == [SilentStream(EP, 3, 30.0, "tcp://h.example:9606")]
    assert tracker.silent_endpoints() == [EP]
    clock.advance(5)
    tracker.heartbeat(EP, 3, 2)  # a heartbeat alone keeps a stream alive
    assert tracker.silent() == []
    # least recently heard first
    assert tracker.silent(now=clock.seconds() + 40) == [
        SilentStream("tcp://b:9606", 4, 55.0, None),
        SilentStream(EP, 3, 40.0, "tcp://h.example:9606"),
    ]


def test_silent_endpoints_needs_every_device_of_the_endpoint_quiet():
    clock, tracker, _, _ = make(silence_secs=10)
    tracker.observe(EP, 1, 1)
    clock.advance(6)
    tracker.observe(EP, 2, 1)
    clock.advance(5)
    assert [s.device for s in tracker.silent()] == [1]
    assert tracker.silent_endpoints() == []
    clock.advance(5)
    assert tracker.silent_endpoints() == [EP]


def test_reconnecting_restarts_the_silence_timer():
    clock, tracker, _, _ = make()
    tracker.observe(EP, 3, 1)
    tracker.observe("tcp://b:9606", 3, 1)
    clock.advance(31)
    assert len(tracker.silent()) == 2
    tracker.reconnecting(EP)
    assert [s.endpoint for s in tracker.silent()] == ["tcp://b:9606"]
    clock.advance(30)
    assert len(tracker.silent()) == 2
    # what was missed while reconnecting is a gap like any other
    tracker.observe(EP, 3, 7)
    assert counters(tracker)["lost"] == 5


def test_key_cap_evicts_the_least_recently_heard_stream():
    _, tracker, events, _ = make(max_keys=2)
    tracker.observe(EP, 1, 1)
    tracker.observe(EP, 2, 1)
    tracker.observe(EP, 1, 2)  # 1 is now the most recent
    tracker.observe(EP, 3, 1)  # evicts 2
    assert tracker.stream(EP, 2) is None
    assert tracker.stream(EP, 1) is not None and tracker.stream(EP, 3) is not None
    assert len(tracker) == 2 and tracker.evicted == 1
    assert [(e.kind, e.device, e.previous) for e in events] == [("evicted", 2, 1)]
    # an evicted stream comes back as new: its first number is not a gap
    tracker.observe(EP, 2, 50)
    assert counters(tracker, EP, 2)["lost"] == 0 and tracker.evicted == 2


def test_many_streams_stay_within_the_cap():
    _, tracker, _, _ = make(max_keys=100)
    for device in range(1, 10_001):
        tracker.observe(EP, device, 1)
    assert len(tracker) == 100 and tracker.evicted == 9_900


def test_forget_drops_an_endpoints_streams():
    _, tracker, _, _ = make()
    tracker.observe(EP, 1, 1)
    tracker.observe(EP, 2, 1)
    tracker.observe("tcp://b:9606", 1, 1)
    tracker.forget(EP, 2)
    assert tracker.stream(EP, 2) is None and len(tracker) == 2
    tracker.forget(EP)
    assert len(tracker) == 1


def test_samples_per_stream():
    _, tracker, _, _ = make()
    feed(tracker, [1, 2, 5, 5, 1], device=7)
    feed(tracker, [10], endpoint="tcp://b:9606", device=1)
    samples = list(tracker.samples("jam"))
    labels7 = {"source": "jam", "device": f"{EP}#7"}
    labels1 = {"source": "jam", "device": "tcp://b:9606#1"}
    assert samples == [
        ("logrouter_logjam_lost_messages_total", "counter", labels7, 2),
        ("logrouter_logjam_duplicates_total", "counter", labels7, 1),
        ("logrouter_logjam_restarts_total", "counter", labels7, 1),
        ("logrouter_logjam_lost_messages_total", "counter", labels1, 0),
        ("logrouter_logjam_duplicates_total", "counter", labels1, 0),
        ("logrouter_logjam_restarts_total", "counter", labels1, 0),
        ("logrouter_logjam_sequence_streams_evicted_total", "counter", {"source": "jam"}, 0),
    ]
    for name, kind, labels, value in samples:
        assert isinstance(name, str) and kind == "counter" and isinstance(labels, dict) and value >= 0


def test_samples_of_an_empty_tracker():
    _, tracker, _, _ = make()
    assert list(tracker.samples("jam")) == [
        ("logrouter_logjam_sequence_streams_evicted_total", "counter", {"source": "jam"}, 0)
    ]


def test_without_on_event_restarts_are_still_logged():
    clock = task.Clock()
    tracker = SequenceTracker(clock)
    logged: list[dict] = []
    tracker.log = Logger(namespace="test", observer=logged.append)
    for s in (10, 11, 1):
        tracker.observe(EP, 3, s)
    assert len(logged) == 1 and tracker.stream(EP, 3).restarts == 1


@pytest.mark.parametrize(
    "kwargs", [{"max_keys": 0}, {"duplicate_window": 0}, {"silence_secs": 0}]
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        SequenceTracker(task.Clock(), **kwargs)

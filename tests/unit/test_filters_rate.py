"""throttle (on an injected clock) and dedupe (in event time), over whole batches."""

from __future__ import annotations

import copy

from twisted.internet import task

from logrouter.batch import Batch, Routing
from logrouter.filters.dedupe import DedupeFilter
from logrouter.filters.throttle import ThrottleFilter

from test_filters import Errors, records

SECOND = 10**9


def make(cls, clock=None, **options):
    for key, option in cls.OPTIONS.items():
        if key not in options and not option.required:
            options[key] = option.default
    errors = Errors()
    if cls is ThrottleFilter:
        return cls("f", options, errors, clock=clock), errors
    return cls("f", options, errors), errors


def events(n, **record):
    return [(i, {"i": i, **record}) for i in range(n)]


def test_throttle_unkeyed_lets_rate_per_second_through_with_a_burst():
    clock = task.Clock()
    f, errors = make(ThrottleFilter, clock, rate=10)
    b = Batch("t", events(25))
    before = copy.deepcopy(b.events)
    assert [r["i"] for r in records(f.process(b))] == list(range(10))
    assert b.events == before and f.throttled == 15 and errors.calls == []
    clock.advance(0.5)
    assert len(f.process(Batch("t", events(25)))) == 5
    assert f.process(Batch("t", events(3))) is None
    clock.advance(100)
    assert len(f.process(Batch("t", events(25)))) == 10  # the bucket holds burst, no more


def test_throttle_keyed_by_nested_fields_and_missing_ones_share_a_key():
    clock = task.Clock()
    f, _ = make(ThrottleFilter, clock, rate=2, burst=3, key=["$.host.name"])
    evs = [(i, {"host": {"name": "a"}}) for i in range(5)] + [(i, {"host": {"name": "b"}}) for i in range(2)]
    evs += [(i, {}) for i in range(4)] + [(i, {"host": "scalar"}) for i in range(1)]
    out = records(f.process(Batch("t", evs)))
    names = [r["host"]["name"] if isinstance(r.get("host"), dict) else None for r in out]
    assert names.count("a") == 3 and names.count("b") == 2 and names.count(None) == 3
    clock.advance(1)
    out = records(f.process(Batch("t", [(0, {"host": {"name": "a"}})] * 5)))
    assert len(out) == 2


def test_throttle_over_the_limit_to_the_error_path_with_the_reason():
    clock = task.Clock()
    f, errors = make(ThrottleFilter, clock, rate=1, key=["host"], over="error")
    out = f.process(Batch("noisy", [(0, {"host": "h1", "n": 1}), (0, {"host": "h1", "n": 2})]))
    assert records(out) == [{"host": "h1", "n": 1}]
    assert errors.calls == [("f", "noisy", {"host": "h1", "n": 2}, "throttle: over 1 events/s for key 'h1'")]


def test_throttle_only_matching_tags_and_per_tag_buckets():
    clock = task.Clock()
    f, _ = make(ThrottleFilter, clock, rate=1, tag="noisy.**", per_tag=True)
    quiet = Batch("quiet", events(5))
    assert f.process(quiet) is quiet
    assert len(f.process(Batch("noisy.a", events(5)))) == 1
    assert len(f.process(Batch("noisy.b", events(5)))) == 1
    assert f.process(Batch("noisy.a", events(5))) is None


def test_throttle_memory_is_bounded():
    clock = task.Clock()
    f, _ = make(ThrottleFilter, clock, rate=1, key=["k"], max_keys=100)
    for i in range(50):
        f.process(Batch("t", [(0, {"k": f"{i}-{j}"}) for j in range(10)]))
        clock.advance(0.01)
        assert len(f._buckets) <= 100
    clock.advance(10)
    f.process(Batch("t", [(0, {"k": "new"})]))
    assert len(f._buckets) <= 100


def test_throttle_default_clock_is_the_reactor():
    f, _ = make(ThrottleFilter, None, rate=5)
    assert len(f.process(Batch("t", events(10)))) == 5


# --- dedupe -------------------------------------------------------------------------------------


def test_dedupe_drops_repeats_within_the_window_in_event_time():
    f, _ = make(DedupeFilter, fields=["message", "$.ctx.host"], window_secs=10)
    evs = [
        (0, {"message": "disk full", "ctx": {"host": "a"}}),
        (1 * SECOND, {"message": "disk full", "ctx": {"host": "a"}}),  # duplicate
        (2 * SECOND, {"message": "disk full", "ctx": {"host": "b"}}),  # another host
        (3 * SECOND, {"message": "disk full"}),  # host missing: another key
        (11 * SECOND, {"message": "disk full", "ctx": {"host": "a"}}),  # window over: passes, new window
        (15 * SECOND, {"message": "disk full", "ctx": {"host": "a"}}),  # in the new window
        (20 * SECOND, {"other": 1}),  # no key fields at all: passes
        (21 * SECOND, {"other": 2}),
    ]
    b = Batch("t", evs)
    before = copy.deepcopy(evs)
    out = f.process(b)
    assert [t // SECOND for t, _ in out.events] == [0, 2, 3, 11, 20, 21]
    assert b.events == before and f.duplicates == 2


def test_dedupe_across_batches_and_a_replay_gives_the_same_output():
    f, _ = make(DedupeFilter, fields=["m"], window_secs=60)
    first = Batch("t", [(i * SECOND, {"m": f"x{i % 3}"}) for i in range(6)])
    second = Batch("t", [(100 * SECOND + i, {"m": f"x{i % 3}"}) for i in range(6)])

    def routing(position):  # one routing of the spool record at position
        return Routing(position, position + 100, 90, frozenset({"sink"}))

    out1 = records(f.process(first, routing(0)))
    out2 = records(f.process(second, routing(100)))
    assert out1 == [{"m": "x0"}, {"m": "x1"}, {"m": "x2"}] and out2 == out1
    # A sink failed and the router replays the same spool records through the same filter.
    assert records(f.process(first, routing(0))) == out1 and records(f.process(second, routing(100))) == out2


def test_dedupe_unhashable_values_and_bounded_memory():
    f, _ = make(DedupeFilter, fields=["v"], max_keys=10)
    out = f.process(Batch("t", [(0, {"v": [1, 2]}), (1, {"v": [1, 2]}), (2, {"v": {"a": 1}}), (3, {"v": {"a": 1}})]))
    assert len(out) == 2
    f.process(Batch("t", [(i, {"v": i}) for i in range(100)]))
    assert len(f._seen) <= 10


def test_dedupe_records_that_are_not_tables_go_to_the_error_path():
    f, errors = make(DedupeFilter, fields=["v"])
    out = f.process(Batch("t", [(0, {"v": 1}), (1, 42)]))
    assert records(out) == [{"v": 1}] and errors.calls[0][2] == 42

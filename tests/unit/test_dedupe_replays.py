"""``dedupe`` tells a replayed spool record from a duplicate by the record's spool position
(issue 28, item 4), never by the event's shape: the same event sent again in its own
message, or a batch resent under a new chunk id, is a duplicate; a record routed again
(a sink's replay) gets the decisions of its first routing. The filter is driven with
``Routing`` objects as the router hands them over; ``test_dedupe_restarts`` runs it in
the router, across a crash.
"""

from __future__ import annotations

import msgpack

from logrouter.batch import Batch, Routing
from logrouter.filters.dedupe import DedupeFilter

from test_filters import Errors, records

SECOND = 10**9
T0 = 1_700_000_000 * SECOND


def make(**options) -> DedupeFilter:
    for key, option in DedupeFilter.OPTIONS.items():
        if key not in options and not option.required:
            options[key] = option.default
    return DedupeFilter("d", options, Errors())


def at(position: int) -> Routing:
    """A new routing of the spool record at ``position``."""
    return Routing(position, position + 50, 40, frozenset({"lake"}))


def messages(result) -> list:
    return [r["message"] for r in records(result)] if result is not None else []


# --- the filter ------------------------------------------------------------------------------


def test_the_same_event_again_in_its_own_message_within_the_same_second_is_dropped():
    f = make(fields=["message"])
    event = (T0, {"message": "disk full", "host": "a"})
    assert messages(f.process(Batch("t", [event]), at(0))) == ["disk full"]
    # Sent again (its own message: another spool record), same time, same place in its batch.
    assert f.process(Batch("t", [event]), at(100)) is None
    assert f.process(Batch("t", [(T0 + SECOND // 2, dict(event[1]))]), at(200)) is None
    assert f.duplicates == 2


def test_a_whole_batch_resent_under_a_new_chunk_id_is_dropped_whole():
    f = make(fields=["message"])
    batch = [(T0 + i, {"message": f"m{i}"}) for i in range(6)]
    assert messages(f.process(Batch("t", batch), at(0))) == [f"m{i}" for i in range(6)]
    assert f.process(Batch("t", [(t, dict(r)) for t, r in batch]), at(1000)) is None
    assert f.duplicates == 6


def first_pass(f: DedupeFilter, spool: list[tuple[int, list]]) -> list[list[str]]:
    return [messages(f.process(Batch("t", events), at(position))) for position, events in spool]


SPOOL = [
    (0, [(T0, {"message": "a"}), (T0 + 1, {"message": "b"}), (T0 + 2, {"message": "a"})]),
    (100, [(T0, {"message": "a"}), (T0 + 3, {"message": "c"})]),  # a: sent again
    (200, [(T0 + 120 * SECOND, {"message": "a"}), (T0 + 121 * SECOND, {"message": "b"})]),  # new windows
    (300, [(T0 + 125 * SECOND, {"message": "a"}), (T0 + 130 * SECOND, {"message": "b"})]),  # in them
    (400, [(T0 + 5, {"message": "b"})]),  # late: b's current window (at 121 s) decides
]


def test_a_replay_of_the_same_spool_records_gives_the_first_output():
    f = make(fields=["message"])
    first = first_pass(f, SPOOL)
    assert first == [["a", "b"], ["c"], ["a", "b"], [], ["b"]]
    # A sink replays from the start, then one from the middle; each routing is new.
    assert first_pass(f, SPOOL) == first
    assert first_pass(f, SPOOL[2:]) == first[2:]
    # Replays of single records, out of order, between live records of other keys.
    for position, events in [SPOOL[1], SPOOL[0], SPOOL[4], SPOOL[3]]:
        assert messages(f.process(Batch("t", events), at(position))) == first[SPOOL.index((position, events))]
        f.process(Batch("t", [(T0 + 10**12 + position, {"message": f"live {position}"})]), at(10_000 + position))
    assert first_pass(f, SPOOL) == first


def test_a_record_replayed_behind_a_newer_window_is_decided_against_its_own():
    f = make(fields=["message"], window_secs=60)
    assert messages(f.process(Batch("t", [(T0, {"message": "a"})]), at(0))) == ["a"]
    assert f.process(Batch("t", [(T0 + 10 * SECOND, {"message": "a"})]), at(100)) is None
    assert messages(f.process(Batch("t", [(T0 + 100 * SECOND, {"message": "a"})]), at(200))) == ["a"]
    # Replayed now: the window of the record at 0 decides it, not the newest one (100 s away).
    assert f.process(Batch("t", [(T0 + 10 * SECOND, {"message": "a"})]), at(100)) is None
    assert messages(f.process(Batch("t", [(T0, {"message": "a"})]), at(0))) == ["a"]


def test_batches_of_one_record_joining_at_the_filter_are_numbered_in_one_routing():
    # Two routes of one record meet at the filter: their events have places of their own.
    f = make(fields=["message"])
    event = (T0, {"message": "x"})
    routing = at(0)
    assert messages(f.process(Batch("t", [event]), routing)) == ["x"]
    assert f.process(Batch("t", [event]), routing) is None
    again = at(0)
    assert messages(f.process(Batch("t", [event]), again)) == ["x"]
    assert f.process(Batch("t", [event]), again) is None


def test_windows_no_replay_can_reach_are_forgotten():
    f = make(fields=["message"], window_secs=1)
    for n in range(5):
        f.process(Batch("t", [(T0 + n * 10 * SECOND, {"message": "k"})]), at(n * 100))
    assert len(f._seen["k"]) == 5  # every sink may still replay every record
    f.release(250)  # the records before 250 are behind every cursor
    f.process(Batch("t", [(T0 + 50 * SECOND, {"message": "k"})]), at(500))
    # An opener decides the events up to the next one: the one at 200 those of records up
    # to 300, which a sink may replay; those at 0 and 100 nothing a replay can reach.
    assert [place >> 32 for place, _ in f._seen["k"]] == [200, 300, 400, 500]
    f.release(450)
    f.process(Batch("t", [(T0 + 60 * SECOND, {"message": "k"})]), at(600))
    assert [place >> 32 for place, _ in f._seen["k"]] == [400, 500, 600]


def test_a_filter_without_routings_counts_each_batch_as_a_new_record():
    f = make(fields=["message"])
    event = (T0, {"message": "x"})
    assert messages(f.process(Batch("t", [event]))) == ["x"]
    assert f.process(Batch("t", [event])) is None


def test_the_memory_taken_back_from_its_encoding_decides_alike():
    f = make(fields=["message", "$.ctx.host"], max_keys=1000)
    spool = [(p * 100, [(T0 + p * SECOND, {"message": "m", "ctx": {"host": f"h{p % 3}"}}),
                        (T0, {"message": b"raw", "ctx": {"host": None}}), (T0 + p, {"message": [1, p % 2]})])
             for p in range(6)]
    first = [records(f.process(Batch("t", events), at(position))) for position, events in spool]
    covered, state = f.snapshot()
    assert covered == spool[-1][0] + 50
    encoded = msgpack.unpackb(msgpack.packb(f.encode(state), use_bin_type=True), raw=False, use_list=False)
    again = make(fields=["message", "$.ctx.host"], max_keys=1000)
    again.restore(encoded, covered)
    assert again._seen == f._seen and again.frontier == covered
    assert [records(again.process(Batch("t", events), at(position))) for position, events in spool] == first

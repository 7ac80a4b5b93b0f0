"""Idempotency keys: batch ids and writer sequences, stored once, remembered across restarts."""

from __future__ import annotations

import msgpack
import pytest
from twisted.python.failure import Failure

from helpers import spin
from logrouter import dedupe
from logrouter.batch import Batch
from logrouter.config.load import load_string
from logrouter.router import Router
from logrouter.spool.record import decode_batch, decode_key, encode_batch


def make_router(path):
    from twisted.internet import reactor

    router = Router(load_string(f'[spool]\npath = "{path}/spool"\n'), reactor)
    router.spool.open()
    return router


def reopen(router, path):
    """A clean stop's snapshot, then a new router that reads the window back."""
    from twisted.internet import reactor

    spin(reactor, router.spool.close())
    batch_digests, writers, events = router.dedupe.snapshot()
    dedupe.save_snapshot(router.snapshots.path, batch_digests, router.routed_end, writers, events)
    again = make_router(path)
    again.snapshots.load_ids()
    return again


def batch(n: int) -> Batch:
    return Batch("t", [(1, {"n": n})], source="pravega")


def test_a_writer_sequence_is_stored_once_and_its_last_number_survives_a_restart(tmp_path):
    from twisted.internet import reactor

    router = make_router(tmp_path)
    assert router.last_event_number("pravega", b"w1") is None
    spin(reactor, router.ingest(batch(1), writer=(b"w1", 10)))
    spin(reactor, router.ingest(batch(2), writer=(b"w1", 20)))
    events = router.intake.events_in
    # Resends of what was stored: acked without storing; a new number is stored.
    spin(reactor, router.ingest(batch(2), writer=(b"w1", 20)))
    spin(reactor, router.ingest(batch(1), writer=(b"w1", 10)))
    assert router.intake.events_in == events and router.intake.duplicates == 2
    spin(reactor, router.ingest(batch(3), writer=(b"w2", 5)))  # another writer is its own sequence
    assert router.last_event_number("pravega", b"w1") == 20
    assert router.last_event_number("other-source", b"w1") is None

    again = reopen(router, tmp_path)
    assert again.last_event_number("pravega", b"w1") == 20
    assert again.last_event_number("pravega", b"w2") == 5
    spin(reactor, again.ingest(batch(2), writer=(b"w1", 20)))
    assert again.intake.events_in == 0 and again.intake.duplicates == 1
    spin(reactor, again.spool.close())


def test_writer_numbers_are_read_back_from_the_spool_without_a_snapshot(tmp_path):
    from twisted.internet import reactor

    router = make_router(tmp_path)
    spin(reactor, router.ingest(batch(1), writer=(b"w1", 7)))
    spin(reactor, router.ingest(batch(2), b"chunk-a"))
    spin(reactor, router.spool.close())
    again = make_router(tmp_path)
    again.snapshots.load_ids()
    assert again.last_event_number("pravega", b"w1") == 7
    assert again.dedupe.lookup(("pravega", b"chunk-a")) is not None
    spin(reactor, again.spool.close())


def test_the_batch_id_window_keeps_the_last_ids_stored_per_source():
    window = dedupe.DedupeWindow(3)
    for n in range(5):
        window.finish(("fwd", b"c%d" % n), n)
    window.finish(("fwd", b"c4"), 9)  # stored again (a replay): still one id
    assert [window.lookup(("fwd", b"c%d" % n)) is not None for n in range(5)] == [False, False, True, True, True]
    assert window.lookup(("other", b"c4")) is None  # the same id from another source is another batch
    restored = dedupe.DedupeWindow(3)
    restored.restore(dedupe.SavedWindow(0, window.snapshot()[0], []))
    assert [restored.lookup(("fwd", b"c%d" % n)) is not None for n in range(5)] == [False, False, True, True, True]


@pytest.mark.parametrize("ids", [0, 1, 15, 16, 4095, 4096, 70_000])
def test_a_snapshot_writes_its_digests_as_msgpack_would(tmp_path, ids):
    """The digests go to the file as they are (no packed copy), under a ``bin`` head of
    each width: the file is what msgpack would have packed."""
    blob = b"".join(dedupe.batch_digest("fwd", b"%d" % n) for n in range(ids))
    path = str(tmp_path / "dedupe.msgpack")
    dedupe.save_snapshot(path, memoryview(blob), 7, [(("p", b"w"), 3)], [("b", "s", [b"x" * 16])])
    with open(path, "rb") as f:
        assert f.read() == msgpack.packb([4, 7, blob, [["p", b"w", 3]], [["b", "s", b"x" * 16]]])
    assert dedupe.load_snapshot(path) == (7, blob, [("p", b"w", 3), ("b", [["s", b"x" * 16]])])


def test_a_spool_record_with_a_damaged_batch_id_does_not_cut_the_replay_short(tmp_path):
    from twisted.internet import reactor

    router = make_router(tmp_path)
    spin(reactor, router.ingest(batch(1), b"chunk-a"))
    damaged = msgpack.packb((1, "pravega", "t", [[1, {"a": 1}]], ["pravega", 5]), use_bin_type=True)
    router.spool.append(damaged)
    spin(reactor, router.ingest(batch(2), b"chunk-b"))
    spin(reactor, router.spool.close())
    again = make_router(tmp_path)
    again.snapshots.load_ids()
    assert again.snapshots.loaded
    assert again.dedupe.lookup(("pravega", b"chunk-a")) is not None
    assert again.dedupe.lookup(("pravega", b"chunk-b")) is not None
    spin(reactor, again.spool.close())


def test_a_resend_while_the_first_copy_is_stored_waits_for_it():
    window = dedupe.DedupeWindow(10)
    key = ("s", b"w", 5)
    assert window.lookup(key) is None
    window.begin(key)
    earlier = window.lookup(("s", b"w", 3))  # covered by the batch being stored
    assert earlier is not None and not earlier.called
    assert window.lookup(("s", b"w", 6)) is None  # a later number is new
    window.finish(key, 100)
    assert earlier.called and window.last_event_number("s", b"w") == 5


def test_an_abandoned_writer_batch_fails_its_waiters_and_can_be_sent_again():
    window = dedupe.DedupeWindow(10)
    key = ("s", b"w", 5)
    window.begin(key)
    waiter = window.lookup(key)
    window.abandon(key, Failure(OSError("disk full")))
    failures: list = []
    waiter.addErrback(failures.append)
    assert failures and window.lookup(key) is None


def test_version_1_spool_records_and_snapshots_still_read(tmp_path):
    old = msgpack.packb((1, "fwd", "t", [[1, {"a": 1}]], ["fwd", b"chunk"]), use_bin_type=True)
    restored, key = decode_batch(old)
    assert restored.tag == "t" and restored.events == [[1, {"a": 1}]] and key == ("fwd", b"chunk")
    assert decode_key(old) == ("fwd", b"chunk")
    assert decode_key(encode_batch(batch(1), ("pravega", b"w", 9))) == ("pravega", b"w", 9)
    path = tmp_path / "dedupe.msgpack"
    path.write_bytes(msgpack.packb([1, 123, [["fwd", b"c", 5]]]))
    assert dedupe.load_snapshot(str(path)) == (123, dedupe.batch_digest("fwd", b"c"), [])


@pytest.mark.parametrize("damage", [
    b"", b"\xc1", msgpack.packb([2, 1]), msgpack.packb([9, 0, []]),
    # Well-formed msgpack of the wrong shapes: each raised out of the start before (an
    # integer where the digests go, `bytes(n)` allocating n bytes; a source not a string;
    # a position not a number).
    msgpack.packb([4, 0, 2**62, [], []]), msgpack.packb([4, 0, 2**40, [], []]),
    msgpack.packb([3, 0, [[5, b"c", 1]], [], []]), msgpack.packb([3, 0, [[b"src", b"c", 1]], [], []]),
    msgpack.packb([2, 0, [["s", 2**40, 1]], []]), msgpack.packb([4, "0", b"", [], []]),
    msgpack.packb([4, 0, b"", [["s", 2**40, 1]], []]), msgpack.packb([4, 0, b"", [], [["s", 7, b""]]]),
])
def test_a_damaged_snapshot_only_weakens_deduplication(tmp_path, damage):
    path = tmp_path / "dedupe.msgpack"
    path.write_bytes(damage)
    assert dedupe.load_snapshot(str(path)) == (0, b"", [])


def test_a_stop_whose_final_dedupe_snapshot_cannot_be_written_still_completes(tmp_path, monkeypatch, threaded_reactor):
    """A full disk at the stop (the snapshot's write fails) is logged, never an unhandled
    failure of the stop; the next start rebuilds the window from the spool."""
    reactor = threaded_reactor

    router = Router(load_string(f'[spool]\npath = "{tmp_path}/spool"\n'), reactor)
    spin(reactor, router.start())
    spin(reactor, router.ingest(batch(1), writer=(b"w1", 10)))

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dedupe, "save_snapshot", no_space)
    spin(reactor, router.stop())  # fails with OSError before the fix
    monkeypatch.undo()
    again = Router(load_string(f'[spool]\npath = "{tmp_path}/spool"\n'), reactor)
    spin(reactor, again.start())
    try:
        assert again.last_event_number("pravega", b"w1") == 10
    finally:
        spin(reactor, again.stop())

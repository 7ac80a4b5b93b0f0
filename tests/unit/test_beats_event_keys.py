"""Beats events stored once: per-event idempotency keys (``logrouter.sources.event_keys``),
the router's bounded windows of them (``logrouter.dedupe.EventWindows``), their spool
records and snapshot, and the lumberjack source handing them over.

A Beats client that lost an ack sends the events again on a new connection, maybe in other
windows; Filebeat 7.17 may even send newer events before the resent ones (its retryer and
its queue consumer feed the same output channel), so a resent event is recognised by its
own key, never by an offset high-water mark.
"""

from __future__ import annotations

import copy

import msgpack
import pytest
from twisted.python.failure import Failure

import source_fakes
from helpers import spin
from logrouter import dedupe
from logrouter.batch import Batch
from logrouter.config.load import ConfigError, load_string
from logrouter.failures import UnstorableBatch
from logrouter.router import Router
from logrouter.sources import event_keys
from logrouter.sources.lumberjack import LumberjackSource
from logrouter.spool.record import decode_batch, decode_key
from logrouter.wire import lumberjack as lj

AGENT = "58cb6718-d042-4e29-a5a3-f23318cf831f"
EPHEMERAL = "ec653db7-2405-408a-a74e-bbd50236b3a8"


def line(offset: int, *, stamp: str = "2026-11-27T03:54:32.124Z", path: str = "/var/log/app.log",
         ephemeral: str = EPHEMERAL, agent: str = AGENT, **extra) -> dict:
    """An event as Filebeat 7.17's log input sends it (fields as the real one sent them)."""
    record = {
        "@timestamp": stamp,
        "@metadata": {"beat": "filebeat", "type": "_doc", "version": "7.17.29"},
        "agent": {"id": agent, "name": "vm", "type": "filebeat", "version": "7.17.29", "hostname": "vm",
                  "ephemeral_id": ephemeral},
        "ecs": {"version": "1.12.0"},
        "host": {"name": "vm"},
        "input": {"type": "log"},
        "log": {"offset": offset, "file": {"path": path}},
        "message": f"line at {offset}",
    }
    record.update(extra)
    return record


AUTO = event_keys.key_maker("auto")


def key(record: dict):
    (k,) = AUTO([record])
    return k


# -- which fields name an event --------------------------------------------------------------


def test_auto_names_a_filebeat_line_by_its_reading_and_scopes_it_by_agent_id():
    k = key(line(7))
    assert k[0] == AGENT and len(k[1]) == event_keys.DIGEST_BYTES
    reordered = dict(reversed(list(line(7).items())))  # Go writes map keys in any order
    assert key(reordered) == k
    assert key(line(7, message="other text")) == k  # a resend is the same reading
    for other in (line(8), line(7, stamp="2026-11-27T03:54:32.125Z"), line(7, path="/var/log/b.log"),
                  line(7, ephemeral="another-run")):
        assert key(other)[1] != k[1]
    assert key(line(7, agent="other-agent"))[0] == "other-agent"


def test_auto_prefers_metadata_id_and_falls_back_to_nothing():
    with_id = line(7)
    with_id["@metadata"]["_id"] = "doc-1"
    same_id = line(99, message="else")
    same_id["@metadata"]["_id"] = "doc-1"
    assert key(with_id) == key(same_id) != key(line(7))
    empty_id = line(7)
    empty_id["@metadata"]["_id"] = ""
    assert key(empty_id) == key(line(7))
    no_agent = {"@metadata": {"_id": "doc-1"}, "message": "x"}
    assert key(no_agent) == ("", key(with_id)[1])
    assert key({"@metadata": {"_id": "doc-1"}, "agent": {"id": 5}}) == ("", key(with_id)[1])


@pytest.mark.parametrize("damage", [
    lambda r: r["log"].pop("offset"),
    lambda r: r["log"].update(offset="7"),
    lambda r: r["log"].update(offset=7.0),
    lambda r: r["log"].update(offset=True),
    lambda r: r["log"].pop("file"),
    lambda r: r["agent"].pop("ephemeral_id"),
    lambda r: r.pop("agent"),
    lambda r: r.pop("@timestamp"),
    lambda r: r.update({"@timestamp": 1}),
    lambda r: r["log"]["file"].update(path="/var/log/\ud800"),  # a lone surrogate: JSON lets a sender write one
])
def test_auto_gives_no_key_without_all_four_line_fields(damage):
    record = line(7)
    damage(record)
    assert AUTO([record]) is None  # no event has a key: the batch goes as before
    assert AUTO([record, line(8)])[0] is None


def test_a_field_list_names_events_by_those_fields():
    make = event_keys.key_maker(["winlog.channel", "winlog.record_id"])
    a = {"winlog": {"channel": "Security", "record_id": 41}, "agent": {"id": "w1"}}
    b = {"winlog": {"channel": "Security", "record_id": 42}, "agent": {"id": "w1"}}
    flat = {"winlog.channel": "Security", "winlog.record_id": 41}
    keys = make([a, b, flat, {"winlog": {"channel": "Security"}}, {"winlog": {"channel": {}, "record_id": 1}}])
    assert keys[0][0] == "w1" and keys[0][1] != keys[1][1]
    assert keys[2] == ("", keys[0][1])  # a top-level key with the dots is the same field
    assert keys[3] is None and keys[4] is None
    assert make([{"winlog": {"channel": "S", "record_id": 2**70}}]) is None  # beyond what is hashed
    assert event_keys.key_maker(["winlog.record_id", "winlog.channel"])([a])[0][1] != keys[0][1]
    assert event_keys.key_maker("off") is None


@pytest.mark.parametrize("value, problem", [
    ('"on"', 'must be "auto", "off" or a list'),
    ("[]", "at least one field"),
    ('["log..offset"]', "item 0 must be a field path"),
    ('["a", 3]', "item 1 must be a field path"),
    ("3", "must be a string or array"),
])
def test_the_option_is_checked_and_its_errors_name_the_key(value, problem):
    with pytest.raises(ConfigError) as e:
        load_string(f'[sources.beats]\ntype = "lumberjack"\nidempotency_key = {value}\n'
                    '[sinks.out]\ntype = "blackhole"\ninputs = ["beats"]\n')
    assert "sources.beats.idempotency_key" in str(e.value) and problem in str(e.value)


# -- the router's windows ------------------------------------------------------------------------


def windows(per_sender: int = 100, senders: int = 10) -> dedupe.EventWindows:
    return dedupe.EventWindows(lambda source: (per_sender, senders))


def k(n: int, sender: str = "a") -> tuple[str, bytes]:
    return sender, n.to_bytes(dedupe.DIGEST_BYTES, "big")


def test_a_window_keeps_stored_events_out_of_later_batches():
    w = windows()
    first = w.claim("beats", [k(1), k(2), None])
    assert first.keep == [0, 1, 2] and first.dropped == 0
    again = w.claim("beats", [k(2), k(3), None])
    assert again.keep == [1, 2] and again.dropped == 1  # 2 is being stored: wait for it
    (waiting,) = again.waiting
    assert not waiting.called
    first.finish(10)
    assert waiting.called
    again.finish(20)
    third = w.claim("beats", [k(1), k(2), k(3)])
    assert third.keep == [] and third.dropped == 3 and third.waiting == []
    assert w.claim("other-source", [k(1)]).keep == [0]  # keys are scoped by source
    assert w.claim("beats", [k(1, sender="b")]).keep == [0]  # and by sender


def test_an_abandoned_claim_fails_its_waiters_and_its_events_may_come_again():
    w = windows()
    first = w.claim("beats", [k(1)])
    again = w.claim("beats", [k(1)])
    failures: list = []
    again.waiting[0].addErrback(failures.append)
    first.abandon(Failure(OSError("disk full")))
    assert failures and failures[0].check(OSError)
    assert w.claim("beats", [k(1)]).keep == [0]


def test_windows_are_bounded_per_sender_and_in_senders():
    w = windows(per_sender=3, senders=2)
    for n in range(5):
        w.claim("beats", [k(n)]).finish(0)
    assert w.claim("beats", [k(1)]).keep == [0]  # fell out: only the last 3 are kept
    w = windows(per_sender=3, senders=2)
    for sender in "abc":
        w.claim("beats", [k(1, sender)]).finish(0)
    assert w.claim("beats", [k(1, "b"), k(1, "c")]).keep == []
    assert w.claim("beats", [k(1, "a")]).keep == [0]  # the least recently seen sender went first


def test_a_claims_record_key_refills_a_window_as_after_a_restart():
    w = windows()
    claim = w.claim("beats", [k(1), None, k(2, "b"), k(3)])
    key_ = claim.record_key()
    assert key_ == ("beats", [["a", k(1)[1] + k(3)[1]], ["b", k(2, "b")[1]]])
    assert dedupe.is_events_key(key_) and not dedupe.is_events_key(("beats", b"chunk"))
    assert windows().claim("beats", [None]).record_key() is None
    fresh = dedupe.DedupeWindow(10, lambda source: (100, 10))
    fresh.add(("beats", [["a"], [3, b"x"], "ab", ["a", None]]), 0)  # damaged rows are passed over
    fresh.add(key_, 0)
    assert fresh.events.claim("beats", [k(1), k(2, "b"), k(3), k(4)]).keep == [3]


def test_the_snapshot_keeps_event_windows_and_older_snapshots_still_load(tmp_path):
    w = windows()
    w.claim("beats", [k(1), k(2)]).finish(0)
    w.claim("beats", [k(9, "b")]).finish(0)
    path = str(tmp_path / "dedupe.msgpack")
    dedupe.save_snapshot(path, dedupe.batch_digest("fwd", b"c"), 123, [(("pv", b"w"), 7)], w.rows())
    saved = dedupe.load_snapshot(path)
    assert saved.position == 123
    restored = dedupe.DedupeWindow(10, lambda source: (100, 10))
    restored.restore(saved)
    assert restored.lookup(("fwd", b"c")) is not None and restored.last_event_number("pv", b"w") == 7
    assert restored.events.claim("beats", [k(1), k(2), k(9, "b"), k(3)]).keep == [3]
    (tmp_path / "v2").write_bytes(msgpack.packb([2, 5, [["fwd", b"c", 1]], [["pv", b"w", 3]]]))
    assert dedupe.load_snapshot(str(tmp_path / "v2")) == (5, dedupe.batch_digest("fwd", b"c"), [("pv", b"w", 3)])
    (tmp_path / "v3").write_bytes(msgpack.packb([3, 5, [["fwd", b"c", 1], ["fwd", b"d", 2]], [], []]))
    v3 = dedupe.load_snapshot(str(tmp_path / "v3"))
    assert v3.batch_digests == dedupe.batch_digest("fwd", b"c") + dedupe.batch_digest("fwd", b"d")


# -- the router: left out, acked, remembered across restarts ---------------------------------


@pytest.fixture
def make_router(tmp_path):
    """Routers on one spool folder (a second one is the restart after a kill -9); every
    spool opened is closed at the end, also when the test fails."""
    from twisted.internet import reactor

    opened: list[Router] = []

    def make(source_options: str = "") -> Router:
        router = Router(load_string(
            f'[spool]\npath = "{tmp_path}/spool"\n[sources.beats]\ntype = "lumberjack"\n{source_options}'
            '[sinks.out]\ntype = "blackhole"\ninputs = ["beats"]\n'), reactor)
        router.spool.open()
        opened.append(router)
        return router

    def close(router: Router) -> None:
        opened.remove(router)
        spin(reactor, router.spool.close())

    make.close = close  # type: ignore[attr-defined]
    yield make
    for router in opened:
        spin(reactor, router.spool.close())


def beats_batch(records: list[dict]) -> tuple[Batch, list]:
    return Batch("beats", [(1, r) for r in records], source="beats", json_values=True), AUTO(records)


def stored_events(router) -> list[dict]:
    records, _ = router.spool.read(router.spool.start, router.spool.end, 1 << 30)
    return [r for record in records for _, r in decode_batch(record.payload)[0].events]


def test_resent_events_are_acked_and_stored_once_also_after_a_kill(make_router):
    from twisted.internet import reactor

    router = make_router()
    lines = [line(n * 10) for n in range(6)]
    batch, keys = beats_batch(lines[:4])
    spin(reactor, router.ingest(batch, events=keys))
    # A resend in another window, with a new line and a line without a key.
    plain = {"message": "no key"}
    batch, keys = beats_batch([lines[2], lines[3], lines[4], plain])
    spin(reactor, router.ingest(batch, events=keys))
    assert router.intake.duplicate_events == 2 and router.intake.events_in == 6
    make_router.close(router)
    # kill -9: no snapshot; the windows come back from the spool records.
    again = make_router()
    again.snapshots.load_ids()
    batch, keys = beats_batch([*lines, plain])
    spin(reactor, again.ingest(batch, events=keys))
    assert again.intake.duplicate_events == 5 and again.intake.events_in == 2
    assert [r["message"] for r in stored_events(again)] == [
        *(r["message"] for r in lines[:4]), "line at 40", "no key", "line at 50", "no key"]


def test_older_lines_sent_after_newer_ones_and_a_rotated_file_are_stored(make_router):
    """What an offset high-water mark per file would drop: Filebeat 7.17 may send a newer
    batch before it resends an older one that was never stored, and a file rotated or
    truncated under the same path starts again at offset 0 (no inode in the events)."""
    from twisted.internet import reactor

    router = make_router()
    newer, keys = beats_batch([line(n * 10) for n in range(10, 20)])
    spin(reactor, router.ingest(newer, events=keys))
    older, keys = beats_batch([line(n * 10) for n in range(10)])
    spin(reactor, router.ingest(older, events=keys))
    rotated, keys = beats_batch([line(n * 10, stamp="2026-11-27T04:10:00.000Z") for n in range(5)])
    spin(reactor, router.ingest(rotated, events=keys))
    assert router.intake.events_in == 25 and router.intake.duplicate_events == 0


def test_a_batch_of_only_stored_events_is_acked_without_a_spool_record(make_router):
    from twisted.internet import reactor

    router = make_router()
    batch, keys = beats_batch([line(0), line(10)])
    spin(reactor, router.ingest(batch, events=keys))
    end = router.spool.end
    batch, keys = beats_batch([line(10), line(0)])
    d = router.ingest(batch, events=keys)
    assert d.called and router.spool.end == end and router.intake.duplicates == 1


def test_a_resend_while_the_first_copy_is_being_stored_is_acked_only_once_that_is_durable(make_router):
    from twisted.internet import reactor

    router = make_router()
    batch, keys = beats_batch([line(0), line(10)])
    first = router.ingest(batch, events=keys)
    batch, keys = beats_batch([line(10), line(20)])
    resent = router.ingest(batch, events=keys)
    assert not first.called and not resent.called
    spin(reactor, resent)
    assert first.called and router.intake.events_in == 3


def test_events_of_a_batch_that_cannot_be_stored_may_come_again(make_router, monkeypatch):
    from twisted.internet import reactor

    router = make_router()
    monkeypatch.setattr("logrouter.ingest.MAX_PAYLOAD", 2000)
    batch, keys = beats_batch([line(0, message="x" * 3000)])
    failures: list = []
    router.ingest(batch, events=keys).addErrback(failures.append)
    assert failures and failures[0].check(UnstorableBatch)
    resent, resent_keys = beats_batch([line(0)])  # claimed by the refused batch before the fix
    spin(reactor, router.ingest(resent, events=resent_keys))
    assert router.intake.events_in == 1 and router.intake.duplicate_events == 0


def test_the_window_sizes_are_the_sources_options(make_router):
    from twisted.internet import reactor

    router = make_router("idempotency_window = 2\nidempotency_senders = 1\n")
    assert dedupe.event_limits(router.config, "beats") == (2, 1)
    assert dedupe.event_limits(router.config, "gone") == (dedupe.EVENTS_PER_SENDER, dedupe.SENDERS)
    for n in range(3):
        batch, keys = beats_batch([line(n)])
        spin(reactor, router.ingest(batch, events=keys))
    batch, keys = beats_batch([line(0)])
    spin(reactor, router.ingest(batch, events=keys))
    assert router.intake.events_in == 4  # line 0 was forgotten: stored again (at least once)


# -- the lumberjack source hands the keys over -------------------------------------------------


class Conn(source_fakes.Conn):
    def acks(self) -> list[int]:
        return [a.seq for a in lj.AckDecoder().feed(self.replies())]

    def wait_acks(self, reactor, count: int) -> list[int]:
        """The next ``count`` acks, once the spool's thread made their windows durable."""
        data = b""
        for _ in range(3000):  # 30 s at most
            data += self.replies()
            if len(data) >= 6 * count:
                break
            reactor.iterate(0.01)
        return [a.seq for a in lj.AckDecoder().feed(data)]


def test_the_source_hands_each_batch_its_events_keys_taken_before_metadata_is_dropped():
    source, router, clock = source_fakes.make_source(
        LumberjackSource, "beats", tag="${input.type}", keep_metadata=False)
    records = [line(0), line(10, input={"type": "other"}), line(20)]
    records[0]["@metadata"]["_id"] = "doc-0"
    expected = AUTO(copy.deepcopy(records))
    Conn(source).send(lj.encode_window_frames(records))
    by_tag = {call.batch.tag: call for call in router.calls}
    assert set(by_tag) == {"log", "other"}
    assert by_tag["log"].events == [expected[0], expected[2]]
    assert by_tag["other"].events == [expected[1]]
    assert all("@metadata" not in r for call in router.calls for _, r in call.batch.events)


def test_the_source_hands_no_keys_when_off_or_when_no_event_has_one():
    source, router, clock = source_fakes.make_source(LumberjackSource, "beats", idempotency_key="off")
    Conn(source).send(lj.encode_window_frames([line(0)]))
    source, plain_router, clock = source_fakes.make_source(LumberjackSource, "beats")
    Conn(source).send(lj.encode_window_frames([{"message": "pylogbeat"}]))
    assert router.calls[0].events is None and plain_router.calls[0].events is None


def test_a_resent_window_on_a_new_connection_is_acked_and_not_stored_again(make_router):
    from twisted.internet import reactor

    router = make_router()
    source, _, clock = source_fakes.make_source(LumberjackSource, "beats", router=router, clock=reactor)
    records = [line(n * 10) for n in range(5)]
    first = Conn(source)
    first.send(lj.encode_window_frames(records[:3]))
    assert first.wait_acks(reactor, 1) == [3]
    first.lose()  # the ack died on the way: Beats sends the window again, then the rest
    second = Conn(source)
    try:
        second.send(lj.encode_window_frames(records[1:3]) + lj.encode_window_frames(records[3:]))
        assert second.wait_acks(reactor, 2) == [2, 2]
    finally:
        second.lose()
    assert router.intake.duplicate_events == 2
    assert [r["message"] for r in stored_events(router)] == [r["message"] for r in records]

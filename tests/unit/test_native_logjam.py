"""logjam bodies read natively agree with the Python path, the reference (issue 33).

For bodies hypothesis draws (records of every shape, time fields holding numbers,
stamps in every form the Python rules meet, nulls, booleans and containers, bodies that
hold a metadata field's key, JSON only Python reads, damaged and cut-off bytes), the
native read (``logjam_native.scan_bodies``) either declines, or gives what the Python
path (``decode_bodies``: ``dict(body)``, the metadata fields, ``time_from_fields``)
gives: the same events (times included, also as the transcoded entries decode), and the
lake the same file schema, learned types and table, ``_extra`` spliced from the bodies'
text. Through the source: the receiver thread's verdict on a body is the codec's
(a bad body is dropped by itself, counted per reason, as without the extension); a batch
stays packed into the spool record (``logjam-bodies``) and back; a spool record the
source wrote before (records) replays to the same events. Skipped where the extension
is not installed.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import msgpack
import pytest
from fuzz_helpers import fuzz_settings, mutated, same
from native_tables import assert_same_tables, lake_tables
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import task

import source_fakes
from logrouter.native import NATIVE, describe
from logrouter.sources import logjam_native
from logrouter.sources.logjam import LogjamSource
from logrouter.sources.logjam_native import (
    LOGJAM_BODIES, LogjamBatches, ScannedMessage, decode_bodies, events_of_bodies, scan_bodies,
)
from logrouter.sources.zmq_receiver import ROUTER, Received
from logrouter.spool.record import decode_batch, encode_batch
from logrouter.wire import json_text
from logrouter.wire import logjam as wire
from logrouter.wire.forward_lazy import PackedEvents
from logrouter.wire.json_lazy import DocumentEvents

pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"native decoding off: {describe()}")

NOW = 1_764_000_000_123_456_789
TIME_FIELDS = [["started_ms", "started_at"], ["started_at"], [], ["t", "logjam_sequence"]]
PREFIXES = ["logjam_", "", "x."]


# -- strategies ----------------------------------------------------------------------------

stamps = st.one_of(
    st.builds(
        lambda y, mo, d, h, mi, s, frac, sep, z: f"{y:04d}-{mo:02d}-{d:02d}{sep}{h:02d}:{mi:02d}:{s:02d}{frac}{z}",
        st.sampled_from([1, 1969, 1970, 2024, 2106, 2262, 2263]) | st.integers(1, 9999),
        st.integers(0, 13), st.integers(0, 32), st.integers(0, 24), st.integers(0, 60), st.integers(0, 60),
        st.sampled_from(["", ".", ".5", ".123", ".123456789", ".1234567891234", ".12a"]),
        st.sampled_from(["T", "t", " ", "x"]),
        st.sampled_from(["Z", "z", "", "+01:00", "Q"]),
    ),
    st.sampled_from(["2026-11-26T10:00:00.123Z", "1970-01-01T00:00:00Z", "hello", "", "2024", "2024-01-02"]),
    st.text(max_size=12),
)
valid_ms = st.integers(1, 4 * 10**12) | st.floats(1, 4e12)
times = (
    valid_ms | valid_ms | valid_ms | st.integers(-(2**63), 2**63 - 1) | st.integers(-5, 10**13) | st.sampled_from([0, 1, 1_700_000_000_123, 2**53, 9_223_372_036_854])
    | st.floats(allow_nan=False, allow_infinity=False) | st.floats(0, 4e12) | st.sampled_from([-0.0, 0.5, 1e300, 1.7e12 + 0.123])
    | st.none() | st.booleans() | stamps | st.just({"a": 1}) | st.just([1])
)
clean_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=6)
keys = st.sampled_from(["a", "n", "action", "request", "_extra", "started_ms", ""]) | clean_text | clean_text | st.text(max_size=4)
# mostly what the extension takes; now and then what it leaves to Python (a number beyond
# int64, NaN, a lone surrogate, a key of the metadata fields)
clean = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.integers(-5, 300) | st.floats(allow_nan=False, allow_infinity=False) | clean_text
scalars = st.one_of(*[clean] * 12, st.integers(2**63, 2**65) | st.floats() | st.text(max_size=6))
keys = st.one_of(keys, keys, keys, keys, keys, st.sampled_from(["logjam_app", "x.env", "logjam_sequence"]))
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3), max_leaves=8
)
records = st.tuples(
    st.dictionaries(keys, values, max_size=4),
    st.fixed_dictionaries({}, optional={"started_ms": times, "started_at": times, "t": times}),
).map(lambda parts: {**parts[1], **parts[0]})


def dumps(record: dict, ensure_ascii: bool, spaced: bool) -> bytes:
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps(record, ensure_ascii=ensure_ascii, separators=separators).encode("utf-8", "surrogatepass")


body_texts = st.builds(dumps, records, st.booleans(), st.booleans())
bodies = st.lists(
    st.one_of(*[body_texts] * 12)
    | st.sampled_from([
        b'{"a":1,"a":2}', b'{"a":NaN}', b'{"started_ms":1e400}', b'{"a":"\\ud800"}', b"[1]", b'"x"', b"{}",
        b'{"a":18446744073709551615}', b' \t{"started_ms":-0}\r\n', b'{"a":1}x', b'{"a":"\xff"}', b'\xef\xbb\xbf{"a":1}',
        b'{"started_at":"2024-01-02T03:04:05+01:00"}', b'{"started_ms":null,"started_at":"2024-01-02T03:04:05.5Z"}',
    ]),
    max_size=8,
)
metas = st.tuples(
    st.sampled_from(["shop", "a-b", "x"]), st.sampled_from(["prod", "dev"]), st.sampled_from(["logs", "events.x"]),
    st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
    st.sampled_from([NOW] * 6 + [1_700_000_000_000_000_000, 1, 4_294_967_296_000_000_000]),
)


# -- comparing ------------------------------------------------------------------------------


def python_events(docs: list[bytes], meta_list: list, prefix: str, time_fields: list[str]) -> list | None:
    """The Python path's events, or None where a body is no JSON object to Python (the
    codec drops those: never the native path's)."""
    decoded = []
    for doc in docs:
        try:
            value = json_text.loads(doc)
        except (ValueError, RecursionError):
            return None
        if type(value) is not dict:
            return None
        decoded.append(value)
    return decode_bodies(docs, meta_list, prefix, time_fields)


def check_bodies(docs: list[bytes], meta_list: list, prefix: str, time_fields: list[str]) -> bool:
    """Native and Python agree on ``docs`` (or native declines); True if native took them."""
    reference = python_events(docs, meta_list, prefix, time_fields)
    found = scan_bodies(docs, meta_list, prefix, time_fields)
    if reference is None:
        assert found is None
        assert not (docs and NATIVE.check_documents(docs))
        return False
    if found is None:
        return False
    assert NATIVE.check_documents(docs)  # what the scan takes the receiver thread keeps
    assert type(found) is DocumentEvents and len(found) == len(reference)
    transcoded = PackedEvents(found.entries, None, found.buckets)
    assert msgpack.packb(transcoded.events()) == msgpack.packb(reference)
    assert all(same(a[1], b[1]) for a, b in zip(transcoded.events(), reference))
    assert msgpack.packb(list(found)) == msgpack.packb(reference)
    assert_same_tables(*lake_tables(DocumentEvents(found.entries, found.buckets, lambda: reference), reference, packed=True))
    assert_same_tables(*lake_tables(found, reference, packed=True))  # _extra spliced from the bodies' text
    return True


# -- properties -------------------------------------------------------------------------------


@fuzz_settings(max_examples=200)
@given(st.data(), bodies, st.sampled_from(PREFIXES), st.sampled_from(TIME_FIELDS))
def test_native_and_python_read_bodies_the_same(data, docs, prefix, time_fields) -> None:
    meta_list = [data.draw(metas) for _ in docs]
    check_bodies(docs, meta_list, prefix, time_fields)


@fuzz_settings(max_examples=200)
@given(mutated(body_texts), st.sampled_from(TIME_FIELDS))
def test_damaged_bodies_are_declined_or_read_the_same(doc, time_fields) -> None:
    good = b'{"started_ms":1764000000123,"n":1}'
    check_bodies([good, doc], [("a", "b", "logs", 1, 2, NOW)] * 2, "logjam_", time_fields)


@fuzz_settings(max_examples=200)
@given(st.lists(st.binary(max_size=48) | st.text(max_size=24).map(lambda t: ("{" + t).encode("utf-8", "surrogatepass")), max_size=4))
def test_garbage_is_declined_or_read_the_same(docs) -> None:
    check_bodies(docs, [("a", "b", "logs", 1, 2, NOW)] * len(docs), "logjam_", ["started_ms", "started_at"])


@pytest.mark.parametrize(
    "body, time",
    [
        ({"started_ms": 1_764_000_000_123}, 1_764_000_000_123_000_000),
        ({"started_ms": 1_764_000_000_123.4567}, int(1_764_000_000_123.4567 * 1_000_000)),
        ({"started_ms": None, "started_at": "2024-01-02T03:04:05.678Z"}, 1_704_164_645_678_000_000),
        ({"started_ms": True, "started_at": [1]}, 1_700_000_000_000_000_000),  # neither gives one: the fallback
        ({"started_ms": 2**62}, 1_700_000_000_000_000_000),  # beyond int64 ns: the next name, the fallback
        ({"started_ms": 1e300}, 1_700_000_000_000_000_000),
        ({"started_at": "2024-01-02T03:04:05.Z"}, 1_700_000_000_000_000_000),  # no digits: no time
        ({"started_at": "2024-01-02T03:04:05+01:00"}, None),  # an offset: fromisoformat decides
        ({"started_ms": -1}, None),  # before EventTime's range: Python's path
        ({"logjam_env": "mine"}, None),  # Python keeps the body's key where it stands
    ],
)
def test_event_times(body, time) -> None:
    docs = [json.dumps(body).encode()]
    meta_list = [("shop", "prod", "logs", 1, 2, 1_700_000_000_000_000_000)]
    found = scan_bodies(docs, meta_list, "logjam_", ["started_ms", "started_at"])
    if time is None:
        assert found is None
    else:
        assert found is not None and found[0][0] == time == decode_bodies(docs, meta_list, "logjam_", ["started_ms", "started_at"])[0][0]
        assert PackedEvents(found.entries, None, found.buckets).events()[0][0] == time


def test_a_replay_of_stored_bodies_stays_packed() -> None:
    docs = [request_body(i) for i in range(10)]
    meta_list = [["shop", "prod", "logs", 1, i, NOW] for i in range(10)]  # lists, as msgpack gives them back
    events = events_of_bodies(docs, meta_list, "logjam_", ["started_ms", "started_at"])
    assert type(events) is DocumentEvents and events == decode_bodies(docs, meta_list, "logjam_", ["started_ms"])
    assert type(events_of_bodies([b'{"a":1,"a":2}'], meta_list[:1], "logjam_", [])) is list


# -- through the source -----------------------------------------------------------------------


def request_body(i: int) -> bytes:
    """A logjam request body as the Ruby agent sends one (~1.5 KB, nested)."""
    record = {
        "action": "ItemsController#show",
        "code": 200 if i % 5 else 404,
        "process_id": 4000 + i % 8,
        "request_id": "%032x" % (i * 7919),
        "started_at": "2026-11-26T10:%02d:%02d+01:00" % (i // 60 % 60, i % 60),
        "started_ms": 1_764_151_200_000 + i * 37,
        "total_time": 12.5 + i % 17,
        "view_time": 3.25,
        "db_time": 4.0 + i % 3,
        "db_calls": i % 11,
        "allocated_objects": 15000 + i,
        "heap_growth": 0,
        "host": "app-%02d.example.com" % (i % 3),
        "ip": "10.0.%d.%d" % (i % 4, i % 250),
        "user_id": i * 13,
        "caller_id": "", "caller_action": "",
        "request_info": {
            "method": "GET",
            "url": "/items/%06d?page=%d" % (i, i % 9),
            "headers": {"Accept": "application/json", "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0", "X-Request-Id": "r%d" % i},
            "query_parameters": {"page": str(i % 9)},
            "body_parameters": {},
        },
        "lines": [
            [1, "2026-11-26T10:00:00.123456", "Started GET \"/items/%06d\" for 10.0.0.1" % i],
            [1, "2026-11-26T10:00:00.124000", "Processing by ItemsController#show as JSON"],
            [0, "2026-11-26T10:00:00.130000", "  Item Load (0.4ms)  SELECT \"items\".* FROM \"items\" WHERE \"items\".\"id\" = $1 LIMIT $2"],
            [1, "2026-11-26T10:00:00.140000", "Completed 200 OK in 12ms (Views: 3.2ms | ActiveRecord: 4.0ms)"],
        ],
        "exceptions": [] if i % 5 else ["ActiveRecord::RecordNotFound"],
        "fe": 1.5 if i % 2 else 2,
    }
    return json.dumps(record, separators=(",", ":")).encode()


class FakeReceiver:
    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send(self, index: int, frames: list[bytes]) -> None:
        self.sent.append(frames)

    def done(self) -> None:
        pass


def make_source(**overrides: Any) -> tuple[LogjamSource, source_fakes.FakeRouter, FakeReceiver]:
    router = source_fakes.FakeRouter()
    clock = task.Clock()
    clock.advance(source_fakes.T0)
    options = {key: option.default for key, option in LogjamSource.OPTIONS.items()}
    options.update(listen_router="tcp://127.0.0.1:*", **overrides)
    source = LogjamSource("jam", options, source_fakes.fake_context(router, clock))
    source.receiver = FakeReceiver()  # type: ignore[assignment]
    return source, router, source.receiver  # type: ignore[return-value]


def receive(source: LogjamSource, messages: list[list[bytes]]) -> None:
    chunk = [
        Received(source.router_socket, b"agent-%d" % n, source.decode(ROUTER, [b"", *frames]), sum(map(len, frames)))
        for n, frames in enumerate(messages)
    ]
    source.received(chunk)


def frames_of(body: bytes, n: int, compression: int = wire.ZLIB_COMPRESSION) -> list[bytes]:
    return wire.encode_message("shop", "prod", "logs", body, wire.Meta(compression, 2, 0 if n % 3 else 1_764_000_000_000, n))


@pytest.mark.parametrize("prefix", ["logjam_", ""])
def test_a_read_stays_packed_into_the_spool_and_the_lake(prefix, monkeypatch) -> None:
    docs = [request_body(i) for i in range(60)]
    messages = [frames_of(doc, n, n % 4) for n, doc in enumerate(docs)]
    source, router, _ = make_source(metadata_prefix=prefix)
    receive(source, messages)
    [batch] = router.batches
    assert type(batch.events) is DocumentEvents and batch.packed[0] == LOGJAM_BODIES and batch.packed[1] == docs
    # Without the extension: the same batch of records, as before.
    monkeypatch.setattr(logjam_native, "NATIVE", None)
    plain, plain_router, _ = make_source(metadata_prefix=prefix)
    assert not plain.batches.native
    receive(plain, messages)
    [reference] = plain_router.batches
    monkeypatch.undo()
    assert type(reference.events) is list and reference.packed is None and reference.tag == batch.tag
    assert msgpack.packb(list(batch.events)) == msgpack.packb(reference.events)
    assert all(same(a[1], b[1]) for a, b in zip(batch.events, reference.events))
    # The spool stores the bodies; the replay reads them natively too, and a record the
    # source wrote before (the records) replays to the same events.
    replayed, _ = decode_batch(encode_batch(batch))
    assert type(replayed.events) is DocumentEvents
    # the joined pieces of the receiver thread's reads are the batch's scan whole
    assert (replayed.events.entries, replayed.events.buckets, replayed.events.texts) == (
        batch.events.entries, batch.events.buckets, batch.events.texts)
    old, _ = decode_batch(encode_batch(reference))
    assert msgpack.packb(list(replayed.events)) == msgpack.packb(old.events)
    assert_same_tables(*lake_tables(replayed.events, reference.events, packed=True))
    assert_same_tables(*lake_tables(batch.events, reference.events, packed=True))
    router.fire_all()
    assert [frames[1:] for frames in source.receiver.sent] == [[b"shop-prod", wire.ACCEPTED]] * 60


@fuzz_settings(max_examples=100)
@given(st.lists(mutated(st.sampled_from([request_body(1), request_body(2), b'{"started_ms":1,"a":[1,{}]}'])) | body_texts, min_size=1, max_size=6))
def test_the_receiver_thread_judges_each_body_as_the_codec(docs) -> None:
    """Each body is kept undecoded only where Python reads it as an object, else decoded or
    dropped exactly as the codec alone does; the reactor then drops only the bad ones,
    counted per reason, and the rest give the events the Python path gives."""
    source, router, receiver = make_source()
    messages = [frames_of(doc, n + 1) for n, doc in enumerate(docs)]
    for frames in messages:
        kept = source.decode(ROUTER, [b"", *frames]).decoded
        try:
            plain, _ = wire.decode_message_sized(frames)
        except wire.LogjamDecodeError as e:
            assert isinstance(kept, wire.LogjamDecodeError) and (kept.kind, kept.reason) == (e.kind, e.reason)
            continue
        if type(kept) is ScannedMessage:
            assert json_text.loads(kept.body) == plain.body and kept[:3] == plain[:3] and kept.meta == plain.meta
        else:
            assert kept == plain
    receive(source, messages)
    good = [doc for doc in docs if type(python_events([doc], [("a", "b", "c", 0, 0, 0)], "", [])) is list]
    stored = [event for batch in router.batches for event in batch.events]
    assert len(stored) == len(good)
    assert source.drops.total() == len(docs) - len(good)
    assert set(source.drops.counts) <= {"body"}
    bad_replies = [frames for frames in receiver.sent if frames[-1] == wire.BAD_REQUEST]
    assert len(bad_replies) == len(docs) - len(good)


def test_bad_bodies_cost_only_themselves() -> None:
    good = request_body(3)
    docs = [good, good[:-1], b"[1,2]", zlib.compress(good), good.replace(b"{", b"{\xff", 1), good]
    source, router, receiver = make_source()
    receive(source, [frames_of(doc, n + 1, wire.NONE) for n, doc in enumerate(docs)])
    [batch] = router.batches
    assert type(batch.events) is DocumentEvents and len(batch.events) == 2
    router.fire_all()
    replies = [frames[-1] for frames in receiver.sent]
    assert replies.count(wire.BAD_REQUEST) == 4 and replies.count(wire.ACCEPTED) == 2
    assert source.drops.counts == {"body": 4}


def test_a_batch_the_scan_declines_is_made_in_python() -> None:
    """A time-field string with an offset: the scan leaves the batch to Python, which
    makes it from the kept bodies, as records (stored as before)."""
    docs = [json.dumps({"started_at": "2026-11-26T10:00:00+01:00", "n": n}).encode() for n in range(3)]
    source, router, _ = make_source()
    receive(source, [frames_of(doc, n + 1) for n, doc in enumerate(docs)])
    [batch] = router.batches
    assert type(batch.events) is list and batch.packed is None
    assert [event[0] for event in batch.events] == [1_795_683_600_000_000_000] * 3
    assert [event[1]["n"] for event in batch.events] == [0, 1, 2]


def test_mixed_messages_are_made_in_python() -> None:
    """A batch holding a body the extension does not take (NaN) is made in Python whole."""
    batches = LogjamBatches("logjam_", ["started_ms"])
    meta = wire.Meta(wire.NONE, 1, 0, 5)
    messages = [
        batches.read(wire.UndecodedMessage("a", "b", "logs", b'{"started_ms":1764000000000,"k":[1]}', meta), NOW),
        batches.read(wire.UndecodedMessage("a", "b", "logs", b'{"x":NaN}', meta), NOW),
    ]
    assert [type(m) for m in messages] == [ScannedMessage, wire.LogjamMessage]
    batch = batches.batch("t", messages, NOW, "jam")
    assert type(batch.events) is list and batch.packed is None
    assert batch.events[0] == (1_764_000_000_000_000_000, {"started_ms": 1764000000000, "k": [1], "logjam_app": "a",
                                                           "logjam_env": "b", "logjam_topic": "logs", "logjam_device": 1,
                                                           "logjam_sequence": 5})

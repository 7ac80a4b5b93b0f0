"""Spool records of version 3 (what arrived, stored as received) and the older versions.

A PackedForward message's entries are stored as their bytes plus the clock reading
its time-0 entries got; decoding the record gives exactly the events the live path
routed. Records of versions 1 and 2 (decoded events) still decode and replay.
"""

from __future__ import annotations

import gzip
import struct

import msgpack
import pytest
from twisted.internet import defer

import source_fakes
from helpers import spin
from source_fakes import CursorSink
from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.load import load_string
from logrouter.router import Router
from logrouter.sinks.base import SINK_OPTIONS, SinkBase
from logrouter.spool.log import SpoolLog
from logrouter.sources.fluent_forward import FORWARD_ENTRIES, FluentForwardSource
from logrouter.spool.record import decode_batch, decode_key, encode_batch
from fixtures.forward_encode import encode_forward
from logrouter.wire import fluent_forward as wire
from logrouter.wire import forward_entries, forward_framing, forward_packed

NS = 1_000_000_000
T0 = 1_700_000_000
NOW_NS = 1_800_000_000_123_456_789


def stored(message: wire.EventMessage) -> tuple | None:
    """The ``Batch.packed`` the forward source makes of a decoded message."""
    return None if message.packed is None else (FORWARD_ENTRIES, *message.packed)


def event_time(seconds: int, nanos: int = 0) -> msgpack.ExtType:
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanos))


def packed_message(entries: list, options: dict | None = None, compress: bool = False) -> bytes:
    blob = b"".join(msgpack.packb(entry, use_bin_type=True, unicode_errors="surrogateescape") for entry in entries)
    options = dict(options or {})
    if compress:
        blob = gzip.compress(blob)
        options["compressed"] = "gzip"
    parts = [b"\x93", msgpack.packb("app.log"), b"\xdb", len(blob).to_bytes(4, "big"), blob, msgpack.packb(options)]
    return b"".join(parts)


ODD_ENTRIES = [
    [event_time(T0, 5), {"msg": "hello", "n": 1}],
    [0, {"msg": "time zero gets now"}],  # twice: one clock reading for the message
    [event_time(0, 0), {"msg": "EventTime zero is now too"}],
    [T0, {b"bin key": "int seconds", 7: "int key"}],
    ["bad time", {"msg": "invalid"}],
    [T0, "not a map"],
    "not an entry",
    [T0 + 1.5, {"float": True}],
    [event_time(T0, 9), {"nested": {"seen": event_time(T0, 1), "ext": msgpack.ExtType(5, b"xy")}}],
    [event_time(T0), {"bytes": b"\xff\x00", "text": b"caf\xc3\xa9 \xff".decode("utf-8", "surrogateescape")}],
]


def decode_live(data: bytes) -> wire.EventMessage:
    clock_reads = []

    def now_ns() -> int:
        clock_reads.append(NOW_NS)
        return NOW_NS

    (message,) = wire.ForwardDecoder(now_ns=now_ns).feed(data)
    assert len(clock_reads) <= 1
    return message


@pytest.mark.parametrize("compress", [False, True])
def test_a_packed_forward_message_is_stored_as_received_and_decodes_to_the_same_events(compress):
    message = decode_live(packed_message(ODD_ENTRIES, {"chunk": "c1"}, compress))
    assert message.invalid == 3 and len(message.events) == 7
    entries, now = message.packed
    assert now == NOW_NS
    assert entries == b"".join(msgpack.packb(e, use_bin_type=True, unicode_errors="surrogateescape") for e in ODD_ENTRIES)  # inflated, exact
    batch = Batch(message.tag, message.events, "fwd", packed=stored(message))
    payload = encode_batch(batch, ("fwd", b"c1"))
    assert msgpack.unpackb(payload, raw=False, strict_map_key=False)[0] == 3
    assert entries in payload  # a copy of the bytes, not an encoding of the events
    replayed, key = decode_batch(payload)
    assert key == ("fwd", b"c1") and decode_key(payload) == ("fwd", b"c1")
    assert (replayed.tag, replayed.source) == ("app.log", "fwd")
    assert replayed.events == message.events
    assert [type(t) for t, _ in replayed.events] == [int] * 7
    nested = replayed.events[5][1]["nested"]
    assert type(nested["seen"]) is wire.EventNanos and nested["ext"] == msgpack.ExtType(5, b"xy")


def test_without_time_zero_entries_no_clock_reading_is_stored():
    message = decode_live(packed_message([[event_time(T0), {"a": 1}]]))
    assert message.packed[1] is None
    replayed, key = decode_batch(encode_batch(Batch(message.tag, message.events, "fwd", packed=stored(message))))
    assert replayed.events == [(T0 * NS, {"a": 1})] and key is None


def test_other_carrier_modes_carry_nothing_packed_and_are_stored_as_version_2():
    forward = encode_forward("t", [(T0 * NS, {"a": 1})])
    (message,) = wire.ForwardDecoder().feed(forward)
    assert message.packed is None
    payload = encode_batch(Batch(message.tag, message.events, "fwd", packed=stored(message)))
    assert msgpack.unpackb(payload)[0] == 2
    assert decode_batch(payload)[0].events == [[T0 * NS, {"a": 1}]]


def test_a_replaced_batch_carries_no_packed_entries():
    batch = Batch("t", [(1, {"a": 1})], "s", packed=(FORWARD_ENTRIES, b"", None))
    assert batch.replace(tag="u").packed is None
    assert batch.replace(events=[]).packed is None


def test_the_packed_entries_match_however_the_message_was_split():
    data = packed_message(ODD_ENTRIES[:4], {"chunk": "c"})
    whole = decode_live(data)
    decoder = wire.ForwardDecoder(now_ns=lambda: NOW_NS)
    pieces = [m for i in range(len(data)) for m in decoder.feed(data[i : i + 1])]
    assert len(pieces) == 1 and pieces[0].packed == whole.packed and pieces[0].events == whole.events


@pytest.mark.parametrize("version", [1, 2])
def test_records_of_older_versions_still_decode(version):
    key = ["fwd", b"chunk"] if version == 1 else ["pravega", b"writer", 41]
    payload = msgpack.packb([version, "fwd", "app", [[T0 * NS, {"a": "b"}]], key], use_bin_type=True)
    batch, got = decode_batch(payload)
    assert (batch.tag, batch.source, got) == ("app", "fwd", tuple(key))
    assert [tuple(e) for e in batch.events] == [(T0 * NS, {"a": "b"})]
    assert decode_key(payload) == tuple(key)


def test_an_unknown_version_or_packed_format_is_refused():
    with pytest.raises(ValueError, match="version 9"):
        decode_batch(msgpack.packb([9, "s", "t", [], None]))
    with pytest.raises(ValueError, match="format 'lumberjack'"):
        decode_batch(msgpack.packb([3, "s", "t", ["lumberjack", b"", None], None], use_bin_type=True))
    assert decode_key(msgpack.packb([9, "s", "t", [], ["s", b"k"]])) is None


def test_the_forward_source_hands_the_router_the_entries_it_received():
    source, router, _ = source_fakes.make_source(FluentForwardSource, "fwd")
    conn = source_fakes.Conn(source)
    conn.send(packed_message([[event_time(T0), {"a": 1}], [event_time(T0, 1), {"b": 2}]], {"chunk": "k"}))
    (batch,) = router.batches
    assert batch.packed is not None and batch.source == "fwd"
    replayed, key = decode_batch(encode_batch(batch, ("fwd", b"k")))
    assert replayed.events == batch.events == [(T0 * NS, {"a": 1}), (T0 * NS + 1, {"b": 2})]


# -- replay through the router -----------------------------------------------------------


class ReplaySink(CursorSink, SinkBase):
    OPTIONS = dict(SINK_OPTIONS)
    TYPE = "v3_collect"
    got: list = []

    def write(self, batch, position, size):
        ReplaySink.got.extend((batch.tag, batch.source, tuple(event)) for event in batch.events)


@pytest.fixture
def collect():
    registry.load_builtin()
    registry.sink("v3_collect")(ReplaySink)
    ReplaySink.got = []
    yield ReplaySink.got
    del registry.SINKS["v3_collect"]


def collecting_router(tmp_path, reactor) -> Router:
    """A forward source into the ``v3_collect`` sink, spool under ``tmp_path``."""
    config = load_string(
        f'[spool]\npath = "{tmp_path}/spool"\n'
        '[sources.in]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[sinks.out]\ntype = "v3_collect"\ninputs = ["in"]\n'
    )
    return Router(config, reactor)


def test_a_spool_of_older_records_and_version_3_records_replays_in_order(tmp_path, collect, threaded_reactor):
    reactor = threaded_reactor
    packed = decode_live(packed_message([[event_time(T0, 3), {"v": 3}], [0, {"v": "now"}]]))
    payloads = [
        msgpack.packb([1, "in", "old", [[T0 * NS, {"v": 1}]], ["in", b"c1"]], use_bin_type=True),
        msgpack.packb([2, "in", "old", [[T0 * NS + 2, {"v": 2}]], None], use_bin_type=True),
        encode_batch(Batch(packed.tag, packed.events, "in", packed=stored(packed)), ("in", b"c3")),
    ]
    spool = SpoolLog(reactor, str(tmp_path / "spool"))
    spool.open()
    spin(reactor, defer.gatherResults([spool.append(p) for p in payloads]))
    spin(reactor, spool.close())

    router = collecting_router(tmp_path, reactor)
    try:
        spin(reactor, router.start())
        deadline = reactor.seconds() + 30
        while len(collect) < 4 and reactor.seconds() < deadline:
            spin(reactor, defer.Deferred().addTimeout(0.01, reactor).addErrback(lambda _: None))
        # the ids of every version are known again: a resend is not stored twice
        assert router.dedupe.lookup(("in", b"c1")) is not None
        assert router.dedupe.lookup(("in", b"c3")) is not None
    finally:
        spin(reactor, router.stop())
    assert collect == [
        ("old", "in", (T0 * NS, {"v": 1})),
        ("old", "in", (T0 * NS + 2, {"v": 2})),
        ("app.log", "in", (T0 * NS + 3, {"v": 3})),
        ("app.log", "in", (NOW_NS, {"v": "now"})),
    ]


# -- a str blob is fed as bin (the framer's shortcut) -------------------------------------


def blob_message(tag_header: bytes, blob_kind: int, entries: bytes, options: bytes = b"\x80") -> bytes:
    length = len(entries)
    size = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC6: 4}[blob_kind]
    return b"\x93" + tag_header + bytes((blob_kind,)) + length.to_bytes(size, "big") + entries + options


@pytest.mark.parametrize("tag_header", [b"\xa3a.b", b"\xd9\x03a.b", b"\xc4\x03a.b"])
@pytest.mark.parametrize("blob_kind", [0xD9, 0xDA, 0xDB])
def test_a_str_blob_decodes_like_the_same_bytes_sent_as_bin(tag_header, blob_kind):
    entries = b"".join(
        msgpack.packb([event_time(T0, i), {"i": i, "raw": b"\xdb\xd9\x92\x93", "t": "\u00e9"}], use_bin_type=True)
        for i in range(3)
    )
    as_bin = blob_message(tag_header, 0xC4 if blob_kind == 0xD9 else 0xC6, entries)
    (expected,) = wire.ForwardDecoder().feed(as_bin)
    stream = blob_message(tag_header, blob_kind, entries) * 3 + b"\xc0" + blob_message(tag_header, blob_kind, entries)
    for step in (len(stream), 1, 7, 50):
        decoder = wire.ForwardDecoder()
        got = [m for i in range(0, len(stream), step) for m in decoder.feed(stream[i : i + step])]
        messages = [m for m in got if isinstance(m, wire.EventMessage)]
        assert len(messages) == 4 and len(got) == 5
        for message in messages:
            assert message.tag == "a.b" and message.events == expected.events
            assert message.packed[0] == entries


# -- recent batches: a sink catching up takes them instead of decoding again ---------------


def test_recent_batches_keep_the_oldest_a_sink_reads_next_within_their_byte_bound():
    from logrouter.spool.record import RecentBatches

    recent = RecentBatches(limit=100)
    batches = [Batch("t", [(i, {"i": i})], "s") for i in range(4)]
    payloads = [encode_batch(b) for b in batches]
    for position, batch in enumerate(batches):
        recent.add(position * 1000, batch, 40)
    # the last two did not fit the 100-byte bound: decoded from their payloads
    assert recent.decode(0, payloads[0]) is batches[0]
    assert recent.decode(1000, payloads[1]) is batches[1]
    assert recent.decode(2000, payloads[2]) is not batches[2]
    assert [tuple(e) for e in recent.decode(2000, payloads[2]).events] == [(2, {"i": 2})]
    assert recent.hits == 2
    # every sink is past the first: it goes, and there is room for a newer one again
    recent.release(1000)
    assert recent.decode(0, payloads[0]) is not batches[0]
    recent.add(3000, batches[3], 40)
    assert recent.decode(1000, payloads[1]) is batches[1]
    assert recent.decode(3000, payloads[3]) is batches[3]
    recent.release(3001)
    assert recent.decode(3000, payloads[3]) is not batches[3]
    recent.add(4000, batches[0], 40)
    recent.clear()
    assert recent.decode(4000, payloads[0]) is not batches[0]


def test_with_every_sink_live_the_router_keeps_no_recent_batch(tmp_path, collect, threaded_reactor):
    # A live sink is handed each batch as it is stored: nothing is left to read back, so
    # the recent batches hold nothing (before, the newest 8 MiB stayed in memory).
    reactor = threaded_reactor
    router = collecting_router(tmp_path, reactor)
    try:
        spin(reactor, router.start())
        for i in range(5):
            spin(reactor, router.ingest(Batch("t", [(T0 * NS + i, {"i": i})], "in")))
        assert len(collect) == 5
        assert router.recent_batches._bytes == 0 and not router.recent_batches._batches
    finally:
        spin(reactor, router.stop())


def test_event_time_entries_read_their_times_from_the_bytes_like_the_general_path():
    entries = [
        [event_time(T0, 1), {"a": 1}],
        [event_time(0, 0), {"zero": "now"}],
        [event_time(T0, 2), {b"bin": {"seen": event_time(T0, 3)}, 5: "int key"}],
        [event_time(0xFFFFFFFF, 999_999_999), {"max": True}],
    ]
    blob = b"".join(msgpack.packb(e, use_bin_type=True) for e in entries)
    usual = forward_packed._event_time_entries(blob, lambda: NOW_NS)
    assert usual is not None
    unpacker = forward_entries.new_unpacker(len(blob) + 1)
    unpacker.feed(blob)
    assert usual == forward_entries.collect_events(unpacker, lambda: NOW_NS)
    assert usual[0][1] == (NOW_NS, {"zero": "now"})
    assert type(usual[0][2][1]["bin"]["seen"]) is wire.EventNanos
    # any other shape, or a cut, is left to the general path
    assert forward_packed._event_time_entries(blob + msgpack.packb([T0, {"a": 1}]), lambda: 0) is None
    assert forward_packed._event_time_entries(blob + msgpack.packb([event_time(T0), "no map"]), lambda: 0) is None
    assert forward_packed._event_time_entries(blob[:-1], lambda: 0) is None
    assert forward_packed._event_time_entries(blob + b"\x92\xd7\x00\x01", lambda: 0) is None


def test_the_scanner_stands_down_for_a_long_message_and_starts_again_after_it(monkeypatch):
    monkeypatch.setattr(forward_framing, "_SCAN_BYTES", 64)
    # The Python framer's look-ahead (the native one, where installed, needs none).
    monkeypatch.setattr(wire, "MsgpackFramer", lambda limit: forward_framing.MsgpackFramer(limit, None))
    small = blob_message(b"\xa1t", 0xDB, msgpack.packb([event_time(T0), {"a": 1}]))
    big_entries = b"".join(msgpack.packb([event_time(T0, i), {"i": i, "pad": "x" * 20}]) for i in range(20))
    big = blob_message(b"\xa1t", 0xDB, big_entries)
    stream = small + big + small * 3 + big + small
    expected = [len(m.events) for m in wire.ForwardDecoder().feed(stream)]
    assert expected == [1, 20, 1, 1, 1, 20, 1]
    for step in (1, 13, 100, 333):
        decoder = wire.ForwardDecoder()
        got = []
        stood_down = False
        for i in range(0, len(stream), step):
            got += decoder.feed(stream[i : i + step])
            stood_down = stood_down or decoder._framer._scanner is None
        assert [len(m.events) for m in got] == expected and stood_down
        assert all(m.packed is not None for m in got)
        assert decoder._framer._scanner is not None  # scanning again after the long ones

"""Beats windows and Log Courier payloads stored compressed, as they arrived
(``logrouter.sources.compressed_documents``): the codecs keep the payloads they inflated,
the sources store them only where that is exact, and a replay (through the spool, and
the catch-up read) gives the events the live path routed; a damaged record is refused
like any unreadable record."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import msgpack
import pytest
from fuzz_helpers import fuzz_settings, same
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import defer

import source_fakes
from helpers import spin
from source_fakes import T0
from logrouter.batch import Batch
from logrouter.catch_up import read_records
from logrouter.sources.compressed_documents import LOG_COURIER_ZLIB, LUMBERJACK_ZLIB
from logrouter.sources.events import DECODED_BYTES_PER_JSON_BYTE, JSON_DOCUMENTS, TagTemplate, batch_builder, held_bytes
from logrouter.sources.log_courier import LogCourierSource
from logrouter.sources.lumberjack import LumberjackSource
from logrouter.spool.log import SpoolLog
from logrouter.spool.record import RecentBatches, decode_batch, decode_deferred, encode_batch
from logrouter.wire import json_lazy
from logrouter.wire import log_courier as lc
from logrouter.wire import lumberjack as lj
from logrouter.wire.json_lazy import DocumentEvents, split_runs
from logrouter.wire.lumberjack_frames import json_frame_documents

NOW_NS = T0 * 1_000_000_000


def filebeat(i: int) -> dict[str, Any]:
    """An event shaped like Filebeat 8's (its keys and nesting; shorter)."""
    return {
        "@timestamp": "2026-11-26T10:%02d:%02d.%03dZ" % (i // 60 % 60, i % 60, i % 1000),
        "@metadata": {"beat": "filebeat", "type": "_doc", "version": "8.11.0"},
        "message": '10.0.%d.%d - - "GET /api/v1/items/%06d HTTP/1.1" 200' % (i % 256, i % 200, i),
        "log": {"offset": 1000 * i, "file": {"path": "/var/log/nginx/access.log"}},
        "host": {"name": "web-%02d" % (i % 3), "ip": ["10.0.0.%d" % (i % 17)], "containerized": False},
        "agent": {"ephemeral_id": "3f0a6c1e", "id": "b1c2d3e4", "type": "filebeat", "version": "8.11.0"},
    }


def beats(**options: Any) -> tuple[source_fakes.Conn, source_fakes.FakeRouter]:
    source, router, _ = source_fakes.make_source(LumberjackSource, "beats", tag="beats.${@metadata.beat}", **options)
    return source_fakes.Conn(source), router


def replayed(batch: Batch) -> Batch:
    again, _ = decode_batch(encode_batch(batch))
    assert (again.tag, again.source) == (batch.tag, batch.source)
    return again


def as_documents(batch: Batch) -> Batch:
    """``batch`` stored as ``json-documents``, the format of the code before."""
    (reference,) = batch_builder(TagTemplate(batch.tag), batch.packed[3])(
        [json.loads(d) for d in documents_of(batch)], batch.packed[2], documents_of(batch)
    )
    reference.source = batch.source
    return reference


def documents_of(batch: Batch) -> list[bytes]:
    return [d for p in batch.packed[1] for d in json_frame_documents(zlib.decompress(p))]


# -- the codec keeps what it inflated --------------------------------------------------------


def test_a_c_frame_s_payload_is_kept_as_it_arrived_whole_byte_by_byte_and_split_anywhere(monkeypatch):
    frames = b"".join(lj.encode_json(i + 1, filebeat(i)) for i in range(3))
    blob = zlib.compress(frames, 3)
    data = lj.encode_window(3) + b"2C" + struct.pack(">I", len(blob)) + blob
    inflated: list[Any] = []
    real = lj.inflate
    monkeypatch.setattr(lj, "inflate", lambda payload, limit: inflated.append(payload) or real(payload, limit))
    for cuts in [[], list(range(1, len(data))), *([k] for k in range(1, len(data)))]:
        decoder = lj.LumberjackDecoder(keep_documents=True)
        out: list[Any] = []
        start = 0
        for cut in [*cuts, len(data)]:
            out += decoder.feed(data[start:cut])
            start = cut
        _, events = out
        assert events.payloads == [blob] and events.payload_frames == events.frames == 3
        assert events.inflated_bytes == len(frames)
        assert events.payloads[0] is inflated[-1]  # the bytes it inflated: no copy for the spool


@pytest.mark.parametrize("native", [True, False])
def test_a_compressed_window_is_stored_as_it_came_and_replays_to_the_same_events(native, monkeypatch):
    if not native:
        monkeypatch.setattr(lj, "NATIVE", None)
        monkeypatch.setattr(json_lazy, "NATIVE", None)
    conn, router = beats()
    records = [filebeat(i) for i in range(200)]
    wire = lj.encode_window_frames(records)
    conn.send(wire)
    (call,) = router.calls
    batch = call.batch
    assert batch.packed[0] == LUMBERJACK_ZLIB and batch.packed[2:4] == (NOW_NS, False)
    assert (type(batch.events) is DocumentEvents) is native
    assert batch.packed[1][0] in wire
    record = encode_batch(batch)
    assert len(record) < len(wire) + 100  # the wire's bytes, not the documents (~20 times more)
    plain = as_documents(batch)
    assert len(encode_batch(plain)) > 10 * len(record)
    again = replayed(batch)
    assert (type(again.events) is DocumentEvents) is native
    assert list(again.events) == list(batch.events) == list(replayed(plain).events)
    # the keys came from the same records: the same whatever the record's format
    conn2, router2 = beats()
    conn2.send(lj.encode_window_frames(records, compress_level=None))
    assert router2.calls[0].batch.packed[0] == JSON_DOCUMENTS and router2.calls[0].events == call.events
    # what it holds in memory, live and read back
    inflated = batch.packed[4]
    if native:
        entries, texts = batch.events.entries, batch.events.texts
        # one C frame: one run, whose inflated buffer is the texts' (not counted twice),
        # and the compressed payload the batch keeps for the spool
        assert len(texts[1]) == inflated
        assert batch.held_bytes == len(entries) + len(texts[0]) + inflated + len(batch.packed[1][0]) + 41 * len(records)
    else:
        assert batch.held_bytes == inflated * DECODED_BYTES_PER_JSON_BYTE
    # read back, the same count over what the replay holds (its scan copies the objects'
    # text, where the live read indexes it in the inflated payload)
    assert again.held_bytes == held_bytes(again.events, inflated)
    assert batch.charge(len(record)) == batch.held_bytes


def test_several_c_frames_of_a_window_in_one_read_are_stored_together():
    conn, router = beats(keep_metadata=False)
    frames = [lj.encode_json(i + 1, filebeat(i)) for i in range(5)]
    conn.send(lj.encode_window(5) + lj.encode_compressed(frames[0] + frames[1]) + lj.encode_compressed(b"".join(frames[2:])))
    (batch,) = router.batches
    assert batch.packed[0] == LUMBERJACK_ZLIB and len(batch.packed[1]) == 2 and batch.packed[3] is True
    assert list(replayed(batch).events) == list(batch.events)
    assert all("@metadata" not in r for _, r in replayed(batch).events)


def _c(payload: bytes) -> bytes:
    blob = zlib.compress(payload)
    return b"2C" + struct.pack(">I", len(blob)) + blob


WINDOW_OF_2 = [lj.encode_json(1, filebeat(1)), lj.encode_json(2, filebeat(2))]
NOT_AS_ARRIVED = {
    "a plain J frame beside a C frame": lj.encode_window(2) + WINDOW_OF_2[0] + _c(WINDOW_OF_2[1]),
    "a W frame inside the C frame": _c(lj.encode_window(2) + WINDOW_OF_2[0] + WINDOW_OF_2[1]),
    "a C frame inside the C frame": lj.encode_window(2) + _c(_c(WINDOW_OF_2[0]) + WINDOW_OF_2[1]),
    "a document that is no object": lj.encode_window(3) + _c(WINDOW_OF_2[0] + lj.encode_json(3, b"[1]") + WINDOW_OF_2[1]),
    "a D frame": lj.encode_window(3) + _c(WINDOW_OF_2[0] + lj.encode_data(3, {"line": "D"}, version=2) + WINDOW_OF_2[1]),
}


@pytest.mark.parametrize("case", sorted(NOT_AS_ARRIVED))
def test_a_window_that_is_not_all_its_c_frames_keeps_its_documents(case):
    conn, router = beats()
    conn.send(NOT_AS_ARRIVED[case])
    for batch in router.batches:
        assert batch.packed is None or batch.packed[0] == JSON_DOCUMENTS, case
        assert [tuple(e) for e in replayed(batch).events] == [tuple(e) for e in batch.events]


def test_events_of_several_tags_are_stored_as_records():
    conn, router = beats()
    records = [filebeat(1), {**filebeat(2), "@metadata": {"beat": "other"}}]
    conn.send(lj.encode_window_frames(records))
    assert sorted(b.tag for b in router.batches) == ["beats.filebeat", "beats.other"]
    assert [b.packed for b in router.batches] == [None, None]


def test_a_window_over_several_reads_stores_each_read_as_it_came():
    conn, router = beats()
    frames = [lj.encode_json(i + 1, filebeat(i)) for i in range(4)]
    conn.send(lj.encode_window(4) + lj.encode_compressed(frames[0] + frames[1]))
    conn.send(frames[2] + lj.encode_compressed(frames[3]))  # the plain J and the C frame in one read
    first, second = router.batches
    assert first.packed[0] == LUMBERJACK_ZLIB and second.packed[0] == JSON_DOCUMENTS
    assert [len(b.events) for b in (first, second)] == [2, 2]


# -- Log Courier -------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
def test_a_log_courier_payload_is_stored_as_its_zlib_stream(streamed):
    source, router, _ = source_fakes.make_source(LogCourierSource, "courier")
    conn = source_fakes.Conn(source)
    records = [filebeat(i) for i in range(50)]
    encode = lc.encode_evnt if streamed else lc.encode_jdat
    data = encode(b"n" * 16, records) + lc.encode_ping()
    stream = data[8 + 16 : -8]  # the zlib stream, as the shipper sent it
    for i in range(0, len(data), 7 if streamed else len(data)):  # an EVNT streams in over many reads
        conn.send(data[i : i + 7] if streamed else data)
    (batch,) = router.batches
    assert batch.packed[0] == LOG_COURIER_ZLIB and batch.packed[1] == [stream]
    assert batch.packed[4] == len(zlib.decompress(stream))
    assert list(replayed(batch).events) == list(batch.events)
    assert conn.transport.value().endswith(lc.encode_pong())  # the PING after the stream was read


# -- a spool round trip, and what a replay makes of a damaged record ---------------------------------


def test_compressed_records_through_the_spool_replay_the_same(tmp_path, threaded_reactor):
    reactor = threaded_reactor
    conn, router = beats()
    for w in range(3):
        conn.send(lj.encode_window_frames([filebeat(w * 100 + i) for i in range(100)]))
    batches = router.batches
    assert all(b.packed[0] == LUMBERJACK_ZLIB for b in batches)
    spool = SpoolLog(reactor, str(tmp_path / "spool"))
    spool.open()
    try:
        spin(reactor, defer.gatherResults([spool.append(encode_batch(b)) for b in batches]))
        records, _ = spool.read(0, spool.end)
    finally:
        spin(reactor, spool.close())
    assert len(records) == 3
    for record, batch in zip(records, batches):
        assert list(decode_batch(record.payload)[0].events) == list(batch.events)
        assert list(decode_deferred(record.payload).events) == list(batch.events)


def _record(packed: list) -> bytes:
    return msgpack.packb([3, "beats", "t", packed, None], use_bin_type=True)


def _good_packed() -> list:
    frames = b"".join(lj.encode_json(i + 1, filebeat(i)) for i in range(3))
    return [LUMBERJACK_ZLIB, [zlib.compress(frames)], NOW_NS, False, len(frames)]


def _damaged(change):
    packed = _good_packed()
    change(packed)
    return packed


DAMAGED = {
    "a payload cut short": lambda p: p[1].__setitem__(0, p[1][0][:-9]),
    "a payload's byte changed": lambda p: p[1].__setitem__(0, p[1][0][:20] + bytes([p[1][0][20] ^ 0xFF]) + p[1][0][21:]),
    "more inflated than stored": lambda p: p.__setitem__(4, p[4] - 1),
    "less inflated than stored": lambda p: p.__setitem__(4, p[4] + 1),
    "no payloads list": lambda p: p.__setitem__(1, b"x"),
    "a payload that is text": lambda p: p.__setitem__(1, ["x"]),
    "no inflated size": lambda p: p.__setitem__(4, None),
    "no J frames inside": lambda p: p.__setitem__(1, [zlib.compress(b"2W\x00\x00\x00\x01")]),
    "a J frame cut inside": lambda p: (p[1].__setitem__(0, zlib.compress(lj.encode_json(1, b"{}")[:-1])), p.__setitem__(4, 11)),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_compressed_record_is_refused_as_unreadable(case):
    payload = _record(_damaged(DAMAGED[case]))
    with pytest.raises(ValueError):
        decode_batch(payload)
    with pytest.raises(ValueError):
        list(decode_deferred(payload).events)


def test_a_catch_up_read_reports_a_damaged_compressed_record_and_reads_on():
    good = _record(_good_packed())
    bad = _record(_damaged(DAMAGED["a payload cut short"]))

    class Spool:
        def read(self, start, end, max_bytes):
            from logrouter.spool.segment import Record

            return [Record(0, 100, good), Record(100, 200, bad), Record(200, 300, good)], 300

    decoded, end = read_records(Spool().read, RecentBatches().decode, 0, 300, False, frozenset())
    kinds = [type(batch).__name__ for _, batch in decoded]
    assert kinds == ["Batch", "ValueError", "Batch"] and end == 300


@fuzz_settings(max_examples=100)
@given(st.data())
def test_a_mutated_compressed_record_replays_or_is_refused_never_worse(data):
    packed = _good_packed()
    blob = packed[1][0]
    cut = data.draw(st.integers(0, len(blob)))
    flip = data.draw(st.integers(0, len(blob) - 1))
    changed = bytearray(blob[:cut] + blob[cut:])
    if data.draw(st.booleans()):
        changed[flip] ^= data.draw(st.integers(1, 255))
    if data.draw(st.booleans()):
        del changed[cut:]
    packed[1] = [bytes(changed)]
    packed[4] = data.draw(st.sampled_from([packed[4], packed[4] - 1, 0, 2**40]))
    try:
        batch, _ = decode_batch(_record(packed))
        list(batch.events)
    except ValueError:
        pass


# -- stored compressed or as documents: the same events --------------------------------------------

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
STAMPS = st.one_of(
    st.none(),
    st.builds(lambda n: f"2026-11-24T06:00:{n % 60:02d}.{n:09d}Z", st.integers(0, 999_999_999)),
    st.sampled_from(["2026-11-24T06:00:00Z", "2026-11-24T08:00:00+02:00", "junk", "2026-02-30T00:00:00.1Z"]),
    st.integers(),
)


@fuzz_settings(max_examples=60)
@given(
    st.lists(st.tuples(STAMPS, st.dictionaries(st.text(max_size=4), VALUES, max_size=4)), min_size=1, max_size=80),
    st.lists(st.integers(1, 79), max_size=3),
    st.booleans(),
    st.booleans(),
)
def test_a_window_stored_compressed_replays_to_what_its_documents_stored_plainly_give(rows, cuts, keep_metadata, native):
    records = []
    for stamp, fields in rows:
        record = {**fields, "@metadata": {"beat": "b"}}
        if stamp is not None:
            record["@timestamp"] = stamp
        records.append(record)
    frames = [lj.encode_json(i + 1, r) for i, r in enumerate(records)]
    edges = sorted({0, len(frames), *(c for c in cuts if c < len(frames))})
    wire = lj.encode_window(len(frames)) + b"".join(
        lj.encode_compressed(b"".join(frames[a:b])) for a, b in zip(edges, edges[1:])
    )
    saved = lj.NATIVE, json_lazy.NATIVE
    if not native:
        lj.NATIVE = json_lazy.NATIVE = None
    try:
        conn, router = beats(keep_metadata=keep_metadata)
        conn.send(wire)
        (batch,) = router.batches
        assert batch.packed[0] == LUMBERJACK_ZLIB and len(batch.packed[1]) == len(edges) - 1
        compressed = replayed(batch).events
        plainly = replayed(as_documents(batch)).events
    finally:
        lj.NATIVE, json_lazy.NATIVE = saved
    assert len(compressed) == len(plainly) == len(batch.events) == len(records)
    for got, want, live in zip(compressed, plainly, batch.events):
        assert got[0] == want[0] == live[0]
        assert same(got[1], want[1]) and same(got[1], live[1])


# -- the codecs keep the same payloads however the stream is split ------------------------------------

PIECES = st.sampled_from(["plain", "c", "c", "w-in-c", "nested", "bad-doc", "w"])


@fuzz_settings(max_examples=60)
@given(st.lists(PIECES, min_size=1, max_size=6), st.lists(st.integers(1, 4000), max_size=4))
def test_kept_payloads_are_all_of_their_group_however_the_stream_is_split(pieces, cuts):
    """Whatever mix of frames arrives, split anywhere: a group whose frames all came in
    kept payloads has exactly the documents those inflate to."""
    data = bytearray(lj.encode_window(3))
    seq = 0

    def j(doc: Any = None) -> bytes:
        nonlocal seq
        seq += 1
        return lj.encode_json(seq, {"n": seq} if doc is None else doc)

    for piece in pieces:
        if piece == "plain":
            data += j()
        elif piece == "c":
            data += _c(j() + j())
        elif piece == "w-in-c":
            data += _c(lj.encode_window(2) + j())
        elif piece == "nested":
            data += _c(_c(j()) + j())
        elif piece == "bad-doc":
            data += _c(j() + j(b"[1]"))
        else:
            data += lj.encode_window(2)
    data = bytes(data)
    decoder = lj.LumberjackDecoder(keep_documents=True)
    out: list[Any] = []
    start = 0
    for cut in sorted({c for c in cuts if c < len(data)} | {len(data)}):
        out += decoder.feed(data[start:cut])
        start = cut
    for events in out:
        if not isinstance(events, lj.Events) or not events.payloads or events.payload_frames != events.frames:
            continue
        inflated = [zlib.decompress(p) for p in events.payloads]
        assert sum(map(len, inflated)) == events.inflated_bytes
        documents = [d for part in inflated for d in json_frame_documents(part)]
        assert len(documents) == events.frames
        if events.undecoded:  # the documents are where the runs say (no bytes object each)
            assert split_runs(events.runs)[0] == documents


@fuzz_settings(max_examples=40)
@given(st.lists(st.integers(1, 3000), max_size=5), st.booleans())
def test_a_log_courier_payload_s_stream_is_kept_whole_however_it_is_split(cuts, streamed):
    encode = lc.encode_evnt if streamed else lc.encode_jdat
    first = encode(b"a" * 16, [filebeat(i) for i in range(20)])
    second = encode(b"b" * 16, [filebeat(i) for i in range(20, 25)])
    data = first + second + lc.encode_ping()
    decoder = lc.LogCourierDecoder()
    out: list[Any] = []
    start = 0
    for cut in sorted({c for c in cuts if c < len(data)} | {len(data)}):
        out += decoder.feed(data[start:cut])
        start = cut
    payloads = [f for f in out if isinstance(f, lc.Payload)]
    assert [p.compressed for p in payloads] == [first[24:], second[24:]]
    assert [p.inflated_bytes for p in payloads] == [len(zlib.decompress(first[24:])), len(zlib.decompress(second[24:]))]


@pytest.mark.skipif(json_lazy.NATIVE is None, reason="the native extension is not installed")
def test_a_window_stored_compressed_makes_no_bytes_object_per_document_until_decoded(monkeypatch):
    from logrouter.sources import json_native

    splits = []
    real = json_native.split_runs
    monkeypatch.setattr(json_native, "split_runs", lambda runs: splits.append(len(runs)) or real(runs))
    conn, router = beats()
    records = [filebeat(i) for i in range(50)]
    conn.send(lj.encode_window_frames(records))
    (call,) = router.calls
    assert call.batch.packed[0] == LUMBERJACK_ZLIB and splits == []  # read and stored from the runs
    events = list(call.batch.events)  # something reads the records: the reference decode
    assert splits == [1] and events == list(replayed(call.batch).events)
    # a window of plain J frames is stored as its documents: made at once
    conn2, router2 = beats()
    conn2.send(lj.encode_window_frames(records, compress_level=None))
    assert router2.calls[0].batch.packed[0] == JSON_DOCUMENTS and len(splits) == 2

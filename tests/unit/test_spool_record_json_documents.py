"""Spool records of Beats windows and Log Courier payloads: the JSON texts as they arrived
(the packed form ``json-documents``), turned back into exactly the events the live path
routed."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import msgpack
import pytest
from fuzz_helpers import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

import source_fakes
from source_fakes import T0
from logrouter.batch import Batch
from logrouter.sources.compressed_documents import LOG_COURIER_ZLIB
from logrouter.sources.events import JSON_DOCUMENTS, TagTemplate, batch_builder
from logrouter.sources.log_courier import LogCourierSource
from logrouter.sources.lumberjack import LumberjackSource
from logrouter.spool.record import decode_batch, encode_batch
from logrouter.wire import log_courier as lc
from logrouter.wire import lumberjack as lj

NOW_NS = T0 * 1_000_000_000


def stored_again(batch: Batch) -> list:
    replayed, _ = decode_batch(encode_batch(batch))
    assert (replayed.tag, replayed.source) == (batch.tag, batch.source)
    return replayed.events


def beats_source(**options: Any) -> tuple[source_fakes.Conn, source_fakes.FakeRouter]:
    source, router, _ = source_fakes.make_source(LumberjackSource, "beats", **options)
    return source_fakes.Conn(source), router


def test_a_beats_window_is_stored_as_its_documents_and_decodes_to_the_same_events():
    conn, router = beats_source(tag="beats.${@metadata.beat}")
    records = [
        {"@timestamp": "2026-11-24T06:00:00.123Z", "@metadata": {"beat": "filebeat"}, "message": "a", "host": {"name": "h"}},
        {"@metadata": {"beat": "filebeat"}, "message": "no stamp: the arrival time"},
        {"@timestamp": "2026-11-24T07:00:00+02:00", "@metadata": {"beat": "filebeat"}, "n": 2**70, "f": 1.5},
    ]
    frames = [lj.encode_json(i + 1, r) for i, r in enumerate(records)]
    conn.send(lj.encode_window(4) + lj.encode_compressed(frames[0] + lj.encode_json(9, b"[1]") + frames[1] + frames[2]))
    (batch,) = router.batches
    assert batch.tag == "beats.filebeat"
    form, documents, now, drop_metadata = batch.packed
    assert (form, now, drop_metadata) == (JSON_DOCUMENTS, NOW_NS, False)
    assert [bytes(d) for d in documents] == [json.dumps(r, separators=(",", ":")).encode() for r in records]  # not the invalid one
    payload = encode_batch(batch)
    assert all(bytes(d) in payload for d in documents)  # a copy of the texts, not an encoding of the records
    assert stored_again(batch) == batch.events
    assert batch.events[1][0] == NOW_NS


def test_dropped_metadata_stays_dropped_in_the_stored_batch():
    conn, router = beats_source(tag="beats.${@metadata.beat}", keep_metadata=False)
    conn.send(lj.encode_window_frames([{"@metadata": {"beat": "x"}, "m": 1}, {"@metadata": {"beat": "x"}, "m": 2}]))
    (batch,) = router.batches
    assert batch.tag == "beats.x" and batch.packed[3] is True
    assert [r for _, r in batch.events] == [{"m": 1}, {"m": 2}]
    assert stored_again(batch) == batch.events


def test_events_of_several_tags_or_of_v1_frames_are_stored_as_records():
    conn, router = beats_source(tag="beats.${type}")
    conn.send(lj.encode_window_frames([{"type": "a"}, {"type": "b"}]))
    assert [b.packed for b in router.batches] == [None, None]
    assert msgpack.unpackb(encode_batch(router.batches[0]))[0] == 2
    conn2, router2 = beats_source()
    conn2.send(lj.encode_window_frames([{"k": "v"}], version=1, compress_level=None))
    assert router2.batches[0].packed is None


def test_a_log_courier_payload_is_stored_as_it_came_unless_a_record_was_not_an_object():
    source, router, _ = source_fakes.make_source(LogCourierSource, "courier")
    conn = source_fakes.Conn(source)
    records = [{"@timestamp": "2024-01-02T03:04:05.5Z", "message": "a"}, {"message": "b", "n": [1, {"x": None}]}]
    conn.send(lc.encode_jdat(b"n" * 16, records) + lc.encode_jdat(b"m" * 16, [*records, "not an object"]))
    stored, with_invalid = router.batches
    assert stored.packed[0] == LOG_COURIER_ZLIB and len(stored.packed[1]) == 1  # its zlib stream (test_compressed_documents)
    assert stored_again(stored) == stored.events
    assert with_invalid.packed is None  # its third record is {"message": "not an object"}
    assert stored_again(with_invalid) == [list(e) for e in with_invalid.events]


def test_a_window_with_a_d_frame_among_its_j_frames_is_stored_as_records_even_after_a_bad_c_frame():
    # J 1, D 2, then a C frame with a good J 3 and a cut frame: the C frame's events are
    # taken back, and what is left pairs two records with one document.
    conn, router = beats_source()
    inner = lj.encode_json(3, {"from_the_bad_c": 1}) + b"2J\x00\x00\x00\x04\x00\x00\x00\x10{"
    compressed = zlib.compress(inner)
    conn.send(lj.encode_window(4) + lj.encode_json(1, {"a": 1}) + lj.encode_data(2, {"line": "D"}, version=2)
              + b"2C" + struct.pack(">I", len(compressed)) + compressed)
    (batch,) = router.batches
    assert batch.packed is None
    assert [r for _, r in batch.events] == [{"a": 1}, {"line": "D"}]
    assert stored_again(batch) == [list(e) for e in batch.events]


def test_a_deep_document_replays_however_deep_the_replaying_stack_is():
    # JSON decoders count nesting against the recursion limit: a document the source
    # decoded must decode again from a deeper stack (it is retried in a thread of its own).
    deep: Any = 1
    for _ in range(700):
        deep = [deep]
    conn, router = beats_source()
    conn.send(lj.encode_window_frames([{"deep": deep}, {"flat": 1}]))
    (batch,) = router.batches
    assert batch.packed is not None
    payload = encode_batch(batch)

    def from_depth(n: int) -> list:
        return from_depth(n - 1) if n else decode_batch(payload)[0].events

    assert from_depth(600) == batch.events


def test_a_batch_whose_documents_are_bigger_than_a_spool_record_is_stored_as_records(tmp_path, monkeypatch):
    from twisted.internet import reactor

    from helpers import spin
    from logrouter import ingest
    from logrouter.config.load import load_string
    from logrouter.router import Router

    config = load_string(f'[spool]\npath = "{tmp_path}/spool"\n[sources.b]\ntype = "lumberjack"\nlisten = "tcp:0:interface=127.0.0.1"\n'
                         '[sinks.out]\ntype = "blackhole"\ninputs = ["b"]\n')
    router = Router(config, reactor)
    router.spool.open()
    try:
        records = [{"message": "x" * 40, "n": i} for i in range(100)]
        documents = [json.dumps(r, indent=8).encode() for r in records]  # the texts much bigger than msgpack
        (batch,) = batch_builder(TagTemplate("t"))(records, NOW_NS, documents)
        limit = len(encode_batch(Batch(batch.tag, batch.events, "b"))) + 100
        monkeypatch.setattr(ingest, "MAX_PAYLOAD", limit)
        assert len(encode_batch(batch)) > limit
        batch.source = "b"
        spin(reactor, router.ingest(batch))  # stored, not refused
        assert batch.packed is None and router.intake.unstorable_batches == 0
    finally:
        spin(reactor, router.spool.close())  # its thread pool too: a test leaves no thread behind


def test_a_batch_packed_in_a_format_replay_could_not_read_is_not_stored():
    with pytest.raises(ValueError, match="unknown packed events format 'nope'"):
        encode_batch(Batch("t", [(1, {})], "s", packed=("nope", b"", 0)))


def test_a_stored_document_that_is_not_an_object_is_refused():
    payload = msgpack.packb([3, "s", "t", [JSON_DOCUMENTS, [b"[1]"], 0, False], None], use_bin_type=True)
    with pytest.raises(ValueError, match="not an object"):
        decode_batch(payload)


STAMPS = st.one_of(
    st.none(),
    st.just("2026-11-24T06:00:00.123Z"),
    st.builds(lambda n: f"2026-11-24T06:00:{n % 60:02d}.{n:09d}Z", st.integers(0, 999_999_999)),
    st.sampled_from(["2026-02-30T00:00:00.1Z", "2026-11-24T06:00:00Z", "2026-11-24 06:00:00.5Z", "junk", "2262-04-12T00:00:00.0Z"]),
    st.integers(),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@fuzz_settings(max_examples=60)
@given(
    st.lists(st.tuples(STAMPS, st.dictionaries(st.text(max_size=3), JSON_VALUES, max_size=3)), min_size=1, max_size=80),
    st.booleans(),
    st.sampled_from(["beats", "beats.${type}", "beats.${@metadata.beat}"]),
)
def test_stored_documents_give_the_events_the_live_path_made(rows, drop_metadata, tag):
    records = []
    for stamp, fields in rows:
        record = dict(fields)
        record["type"] = "t"
        record["@metadata"] = {"beat": "b"}
        if stamp is not None:
            record["@timestamp"] = stamp
        records.append(record)
    documents = [json.dumps(r).encode() for r in records]
    live = batch_builder(TagTemplate(tag), drop_metadata)(records, NOW_NS, documents)
    for batch in live:
        assert batch.packed is not None
        assert stored_again(batch) == batch.events


def test_a_json_documents_record_written_today_still_gives_the_same_events():
    # The bytes of a record as this version writes it (three documents with @metadata,
    # dropped; the clock reading T0; tag beats.filebeat; no key): they must replay to
    # the same events whatever changes later.
    batch, key = decode_batch(bytes.fromhex(GOLDEN))
    assert (batch.tag, batch.source, key) == ("beats.filebeat", "beats", None)
    assert batch.events == [
        (1795500000123000000, {"@timestamp": "2026-11-24T06:00:00.123Z", "message": "a", "n": 2**70}),
        (NOW_NS, {"message": "no stamp", "f": 1.5, "deep": [{"x": None}]}),
        (1795500000000000000, {"@timestamp": "2026-11-24T08:00:00+02:00", "m": "caf\u00e9"}),
    ]


GOLDEN = (
    "9503a56265617473ae62656174732e66696c656265617494ae6a736f6e2d646f63756d656e747393c4727b224074696d"
    "657374616d70223a22323032362d31312d32345430363a30303a30302e3132335a222c22406d65746164617461223a7b"
    "2262656174223a2266696c6562656174227d2c226d657373616765223a2261222c226e223a3131383035393136323037"
    "31373431313330333432347dc4527b22406d65746164617461223a7b2262656174223a2266696c6562656174227d2c22"
    "6d657373616765223a226e6f207374616d70222c2266223a312e352c2264656570223a5b7b2278223a6e756c6c7d5d7d"
    "c45a7b224074696d657374616d70223a22323032362d31312d32345430383a30303a30302b30323a3030222c22406d65"
    "746164617461223a7b2262656174223a2266696c6562656174227d2c226d223a226361665c7530306539227dcf17979c"
    "fe362a0000c3c0"
)


VALUE_TEXTS = st.sampled_from([
    "1", "-0", "1.5", "2e400", "NaN", "-Infinity", "123456789012345678901234567890", "null", "true",
    '"caf\\u00e9"', '"\\ud800"', '"a\\"b"', '[1,{"a":null}]', '{"beat":"b"}', '"2026-11-24T06:00:00.5Z"',
    '"2026-11-24T06:00:00Z"', '"2026-11-24T08:00:00.123456789+02:00"',
])


@fuzz_settings(max_examples=60)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from(["@timestamp", "@metadata", "type", "m", "m"]), VALUE_TEXTS), max_size=5),
        min_size=1,
        max_size=70,
    ),
    st.booleans(),
)
def test_documents_as_sent_replay_to_what_the_live_path_decoded(objects, drop_metadata):
    # Texts as a sender may write them (duplicate keys, escapes, big and odd numbers, lone
    # surrogates), decoded as the source decodes them.
    from logrouter.wire import json_text

    documents, records = [], []
    for pairs in objects:
        text = ("{" + ",".join(f'"{key}":{value}' for key, value in pairs) + "}").encode()
        record = json_text.loads(text)
        documents.append(text)
        records.append(record)
    for batch in batch_builder(TagTemplate("beats"), drop_metadata)(records, NOW_NS, documents):
        assert batch.packed is not None
        assert repr(list(stored_again(batch))) == repr(list(batch.events))  # repr: NaN is not equal to itself

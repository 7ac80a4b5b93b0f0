"""Spool records of Beats windows and Log Courier payloads: the JSON texts as they arrived
(the packed form ``json-documents``), turned back into exactly the events the live path
routed."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest
from fuzz_helpers import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

import source_fakes
from source_fakes import T0
from logrouter.batch import Batch
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


def test_a_log_courier_payload_is_stored_as_its_documents_unless_a_record_was_not_an_object():
    source, router, _ = source_fakes.make_source(LogCourierSource, "courier")
    conn = source_fakes.Conn(source)
    records = [{"@timestamp": "2024-01-02T03:04:05.5Z", "message": "a"}, {"message": "b", "n": [1, {"x": None}]}]
    conn.send(lc.encode_jdat(b"n" * 16, records) + lc.encode_jdat(b"m" * 16, [*records, "not an object"]))
    stored, with_invalid = router.batches
    assert stored.packed[0] == JSON_DOCUMENTS and len(stored.packed[1]) == 2
    assert stored_again(stored) == stored.events
    assert with_invalid.packed is None  # its third record is {"message": "not an object"}
    assert stored_again(with_invalid) == [list(e) for e in with_invalid.events]


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

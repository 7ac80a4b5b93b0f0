"""Beats / Log Courier JSON documents read natively agree with the Python path, the reference.

For document lists hypothesis draws (records of every shape, ``@timestamp`` in every
form the Python rules meet, tag and key fields, NaN literals, huge numbers, keys twice,
lone surrogates, damaged bytes), the native read (``json_native.NativeReads``) either
declines, or gives what ``events.batch_builder`` and ``event_keys.key_maker`` give the
decoded records: the same tag, the same idempotency keys, the same events (times
included, also as the transcoded entries decode), and the lake the same file schema,
learned types and table. The codecs keep runs undecoded where the extension is
installed, and decoding one later gives the records (and the invalid count) they would
have decoded. A lumberjack read stays packed from the socket through the spool's record
into the lake. Skipped where the extension is not installed.
"""

from __future__ import annotations

import json

import msgpack
import pytest
from fuzz_helpers import fuzz_settings, mutated
from native_tables import assert_same_tables, lake_tables
from hypothesis import given
from hypothesis import strategies as st

import source_fakes
from source_fakes import T0
from logrouter.native import NATIVE, describe
from logrouter.sources import event_keys
from logrouter.sources.compressed_documents import LUMBERJACK_ZLIB
from logrouter.sources.events import TagTemplate, batch_builder, decode_documents, events_of_documents
from logrouter.sources.json_native import NativeReads
from logrouter.sources.log_courier import LogCourierSource
from logrouter.sources.lumberjack import LumberjackSource
from logrouter.spool.record import decode_batch, encode_batch
from logrouter.wire import json_text
from logrouter.wire import log_courier as lc
from logrouter.wire import lumberjack as lj
from logrouter.wire.forward_lazy import PackedEvents
from logrouter.wire.json_lazy import DocumentEvents, split_runs

pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"native decoding off: {describe()}")

NOW = 1_764_000_000_123_456_789
TEMPLATES = ["beats", "beats.${@metadata.beat}", "x.${a.b:-none}.${n}", "${host.name}-${flag}"]
SPECS = ["auto", "off", ["log.offset", "a.b"], ["n"]]


# -- strategies ----------------------------------------------------------------------------

digits = st.integers(0, 10**12)
stamps = st.one_of(
    st.builds(
        lambda y, mo, d, h, mi, s, frac, sep, z: f"{y:04d}-{mo:02d}-{d:02d}{sep}{h:02d}:{mi:02d}:{s:02d}{frac}{z}",
        st.sampled_from([1, 1677, 1969, 1970, 2024, 2106, 2262, 2263, 9999]) | st.integers(1, 9999),
        st.integers(0, 13), st.integers(0, 32), st.integers(0, 24), st.integers(0, 60), st.integers(0, 60),
        st.sampled_from(["", ".", ".5", ".123", ".123456", ".123456789", ".1234567891234", ".12a", ".１"]),
        st.sampled_from(["T", "t", " ", "x"]),
        st.sampled_from(["Z", "z", "", "+01:00", "-05:30", "Q"]),
    ),
    st.sampled_from([
        "2026-11-26T10:00:00.123Z", "1970-01-01T00:00:00Z", "1970-01-01T00:00:00.000000001Z",
        "2024-02-29T12:00:00Z", "2023-02-29T12:00:00Z", "hello", "", "2024", "2024-01-02",
        "２０２４-01-02T03:04:05Z", "2024-01-02T03:04:05.123456Z\u00e9", "1677-09-21T00:12:44Z",
        "2262-04-11T23:47:16.854775807Z", "2262-04-11T23:47:17Z", "2106-02-07T06:28:16Z",
    ]),
    st.text(max_size=30),
    st.integers() | st.none() | st.floats(allow_nan=False) | st.just({"a": 1}),
)
keys = st.sampled_from(["a", "b", "n", "msg", "flag", "message", "_extra", "a.b", "host.name", ""]) | st.text(max_size=4)
scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.integers(-5, 300) | st.integers(2**63, 2**65)
    | st.floats() | st.text(max_size=6)
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8
)
metadata = st.fixed_dictionaries({"beat": st.sampled_from(["filebeat", "winlogbeat"]) | values}, optional={"_id": values})
agents = st.fixed_dictionaries({}, optional={"id": st.sampled_from(["a1", "a2"]) | values, "ephemeral_id": st.just("e") | values})
logs = st.fixed_dictionaries({}, optional={"offset": st.integers(0, 99) | values, "file": st.fixed_dictionaries({}, optional={"path": st.just("/p") | values})})
records = st.tuples(
    st.dictionaries(keys, values, max_size=5),
    st.fixed_dictionaries(
        {}, optional={"@timestamp": stamps, "@metadata": metadata | values, "agent": agents, "log": logs, "a": st.dictionaries(st.just("b"), values)}
    ),
).map(lambda parts: {**parts[1], **parts[0]})


def dumps(record, ensure_ascii: bool, spaced: bool) -> bytes:
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps(record, ensure_ascii=ensure_ascii, separators=separators).encode("utf-8", "surrogatepass")


documents = st.lists(
    st.builds(dumps, records, st.booleans(), st.booleans())
    | st.sampled_from([
        b'{"a":1,"a":2}', b'{"a":NaN}', b'{"a":1e400}', b'{"a":"\\ud800"}', b'{"a":"\\udc00\\ud800"}', b"[1]", b'"x"',
        b'{"a":18446744073709551615}', b'{"a":-0}', b'{"a":-0.0,"b":1E2,"c":0.1e-400}', b' \t{"a":"\\u00e9\\n\\/"}\r\n',
        b'{"a":1}x', b'{"a":01}', b'{"a":"\x01"}', b'{"a":"\xff"}', b'\xef\xbb\xbf{"a":1}', b'{"a":[1,]}', b"{}",
        b'{"@timestamp":"2024-01-02T03:04:05.678Z","@metadata":{"beat":"f","_id":"x"},"a.b":null,"a":{"b":[1]}}',
        b'{"a.b":"top","a":{"b":"nested"},"host.name":1.5,"flag":true}', b'{"a":{"b":{"c":1},"b":2}}',
    ]),
    max_size=10,
)


# -- comparing ------------------------------------------------------------------------------


def python_read(docs: list[bytes], now: int, template: str, drop: bool, spec):
    """(tag or None for several, events, keys) as the Python path gives them, or None when
    some document is not an object (the codec counts those: never the native path's)."""
    verdicts = json_text.objects_or_reasons(docs)
    if not all(type(v) is dict for v in verdicts):
        return None
    maker = event_keys.key_maker(spec)
    keys = maker(verdicts) if maker is not None and verdicts else None
    batches = batch_builder(TagTemplate(template), drop)(verdicts, now, docs)
    if len(batches) != 1:
        return None, None, keys
    return batches[0].tag, batches[0].events, keys


def check_read(docs: list[bytes], template: str, drop: bool, spec, now: int = NOW) -> bool:
    """Native and Python agree on ``docs`` (or native declines); True if native took it."""
    reference = python_read(docs, now, template, drop, spec)
    read = NativeReads(TagTemplate(template), drop, spec).read(docs, now)
    taken = bool(docs) and NATIVE.check_documents(docs)
    if reference is None:
        assert read is None and not taken
        return False
    if read is None:
        return False
    assert taken  # what the scan takes the codec's check takes
    batch, keys = read
    tag, events, python_keys = reference
    assert batch.tag == tag and keys == python_keys
    assert batch.packed == ("json-documents", docs, now, drop)
    assert type(batch.events) is DocumentEvents and len(batch.events) == len(events)
    transcoded = PackedEvents(batch.events.entries, None, batch.events.buckets)
    assert msgpack.packb(transcoded.events()) == msgpack.packb(events)
    assert msgpack.packb(list(batch.events)) == msgpack.packb(events)
    assert batch.events.texts is not None
    assert_same_tables(*lake_tables(DocumentEvents(batch.events.entries, batch.events.buckets, lambda: events), events))
    # The JSON text of top-level objects and arrays taken into _extra as it came.
    spliced = DocumentEvents(batch.events.entries, batch.events.buckets, lambda: events, batch.events.texts)
    assert_same_tables(*lake_tables(spliced, events))
    return True


# -- properties -------------------------------------------------------------------------------


@fuzz_settings(max_examples=200)
@given(documents, st.sampled_from(TEMPLATES), st.booleans(), st.sampled_from(SPECS))
def test_native_and_python_read_documents_the_same(docs, template, drop, spec) -> None:
    check_read(docs, template, drop, spec)


@fuzz_settings(max_examples=200)
@given(mutated(st.builds(dumps, records, st.booleans(), st.booleans())), st.sampled_from(TEMPLATES), st.sampled_from(SPECS))
def test_damaged_documents_are_declined_or_read_the_same(document, template, spec) -> None:
    check_read([document, b'{"@timestamp":"2026-11-26T10:00:00.5Z","n":1}'], template, True, spec)


@fuzz_settings(max_examples=200)
@given(st.lists(st.binary(max_size=48) | st.text(max_size=24).map(lambda t: ("{" + t).encode("utf-8", "surrogatepass")), max_size=4))
def test_garbage_is_declined_or_read_the_same(docs) -> None:
    check_read(docs, "x.${a.b:-none}.${n}", False, ["a.b"])


@fuzz_settings(max_examples=50)
@given(st.lists(stamps, min_size=1, max_size=4), st.integers(64, 70), st.sampled_from(["filebeat", "x", 1]))
def test_reads_of_many_events_take_the_column_wise_python_path_too(some_stamps, count, beat) -> None:
    # 64 events and more: the Python path parses the stamps and reads the tag column-wise.
    docs = [
        json.dumps({"@timestamp": some_stamps[i % len(some_stamps)], "@metadata": {"beat": beat}, "n": i}).encode()
        for i in range(count)
    ]
    check_read(docs, "beats.${@metadata.beat}", False, "auto")


def test_filebeat_events_are_taken_natively() -> None:
    docs = [filebeat(i) for i in range(100)]
    for drop in (False, True):
        assert check_read(docs, "beats.${@metadata.beat}", drop, "auto")
    assert check_read(docs, "${host.name}", False, ["log.offset"]) is False  # 3 hosts: a batch per tag, Python's


@pytest.mark.parametrize(
    "stamp, time",
    [
        ("2024-01-02T03:04:05.678Z", 1_704_164_645_678_000_000),
        ("2024-01-02t03:04:05.123456789123z", 1_704_164_645_123_456_789),
        ("2024-01-02 03:04:05Z", 1_704_164_645_000_000_000),
        ("2024-01-02T03:04:05.Z", NOW),  # no digits: the arrival time
        ("1969-12-31T23:59:59Z", None),  # before EventTime's range: Python's path
        ("2024-01-02T03:04:05+01:00", None),  # an offset: fromisoformat decides
        ("nonsense", NOW),
        (12, NOW),
    ],
)
def test_event_times(stamp, time) -> None:
    docs = [json.dumps({"@timestamp": stamp}).encode()]
    read = NativeReads(TagTemplate("t"), False).read(docs, NOW)
    if time is None:
        assert read is None
    else:
        assert read is not None and read[0].events[0][0] == time == decode_documents(docs, NOW, False)[0][0]
        assert PackedEvents(read[0].events.entries, None, read[0].events.buckets).events()[0][0] == time


def test_a_replay_of_stored_documents_stays_packed() -> None:
    docs = [filebeat(i) for i in range(10)]
    events = events_of_documents(docs, NOW, True)
    assert type(events) is DocumentEvents and events == decode_documents(docs, NOW, True)
    assert type(events_of_documents([b'{"a":1,"a":2}'], NOW, True)) is list


# -- the codecs -------------------------------------------------------------------------------


@fuzz_settings(max_examples=100)
@given(documents, st.integers(1, 5))
def test_the_lumberjack_codec_keeps_documents_that_decode_later_as_they_would_have(docs, per_frame) -> None:
    frames = lj.encode_window(len(docs)) + b"".join(lj.encode_json(i + 1, d) for i, d in enumerate(docs))
    if per_frame > 3:
        frames = lj.encode_window(len(docs)) + lj.encode_compressed(frames[6:])
    kept = lj.LumberjackDecoder(keep_documents=True).feed(frames)
    plain = lj.LumberjackDecoder().feed(frames)
    for message in kept:
        if isinstance(message, lj.Events):
            if message.undecoded:
                assert message.records == message.documents == [] and message.invalid == 0
            lj.decode_group(message)
    assert kept == plain


def test_a_d_frame_after_kept_documents_decodes_them() -> None:
    data = lj.encode_window(2) + lj.encode_json(1, {"a": 1}) + lj.encode_data(2, {"b": "2"}, version=2)
    decoder = lj.LumberjackDecoder(keep_documents=True)
    (window, events) = decoder.feed(data)
    assert not events.undecoded and events.records == [{"a": 1}, {"b": "2"}]


def test_a_bad_compressed_frame_takes_back_kept_documents() -> None:
    decoder = lj.LumberjackDecoder(keep_documents=True)
    good = lj.encode_window(3) + lj.encode_json(1, {"a": 1})
    bad = lj.encode_compressed(lj.encode_json(2, {"b": 2}) + b"2Z")
    with pytest.raises(lj.DecodeError) as caught:
        decoder.feed(good + bad)
    (window, events) = caught.value.messages
    assert events.undecoded and split_runs(events.runs) == ([b'{"a":1}'], [1])


def test_log_courier_payloads_are_kept_and_decode_later_as_they_would_have() -> None:
    content = lc.encode_records([{"a": 1}, {"@timestamp": "2024-01-02T03:04:05Z"}])
    kept = lc.decode_records(content, "JDAT", b"n" * 16, 1 << 20, 100, keep_documents=True)
    assert kept.undecoded and kept.events == kept.documents
    lc.decode_payload(kept)
    assert kept.events == lc.decode_records(content, "JDAT", b"n" * 16, 1 << 20, 100).events
    content = lc.encode_records(["[1]", {"a": 1}])
    invalid = lc.decode_records(content, "JDAT", b"n" * 16, 1 << 20, 100, keep_documents=True)
    assert invalid.undecoded and invalid.invalid == 0
    lc.decode_payload(invalid)
    assert invalid == lc.decode_records(content, "JDAT", b"n" * 16, 1 << 20, 100) and invalid.invalid == 1


# -- the sources, end to end into the lake ------------------------------------------------------


def filebeat(i: int) -> bytes:
    record = {
        "@timestamp": "2026-11-26T10:%02d:%02d.%03dZ" % (i // 60 % 60, i % 60, i % 1000),
        "@metadata": {"beat": "filebeat", "type": "_doc", "version": "8.11.0"},
        "message": "GET /api/v1/items/%06d 200" % i,
        "log": {"offset": 1000 * i, "file": {"path": "/var/log/nginx/access.log"}},
        "host": {"name": "web-%02d" % (i % 3), "ip": ["10.0.0.%d" % (i % 17)], "containerized": False},
        "agent": {"ephemeral_id": "3f0a", "id": "b1c2", "type": "filebeat"},
        "n": i if i % 7 else 1.5,
    }
    return json.dumps(record, separators=(",", ":")).encode()


class Conn(source_fakes.Conn):
    pass


@pytest.mark.parametrize("keep_metadata, compressed", [(True, True), (False, True), (True, False)])
def test_a_lumberjack_read_stays_packed_into_the_lake(keep_metadata, compressed) -> None:
    docs = [filebeat(i) for i in range(120)]
    source, router, clock = source_fakes.make_source(
        LumberjackSource, "beats", tag="beats.${@metadata.beat}", keep_metadata=keep_metadata
    )
    conn = Conn(source)
    frames = b"".join(lj.encode_json(i + 1, d) for i, d in enumerate(docs))
    conn.send(lj.encode_window(len(docs)) + (lj.encode_compressed(frames) if compressed else frames))
    [call] = router.calls
    batch = call.batch
    assert batch.tag == "beats.filebeat" and type(batch.events) is DocumentEvents
    records = [json.loads(d) for d in docs]
    assert call.events == event_keys.key_maker("auto")(records)
    now = T0 * 1_000_000_000
    [reference] = batch_builder(TagTemplate("beats.${@metadata.beat}"), not keep_metadata)(records, now, docs)
    if compressed:  # stored as the C frame's payload, as it came (test_compressed_documents)
        assert batch.packed[0] == LUMBERJACK_ZLIB and batch.packed[2:4] == reference.packed[2:]
    else:
        assert batch.packed == reference.packed
    # The spool stores what arrived; the replay reads the documents back natively too.
    replayed, _ = decode_batch(encode_batch(batch))
    assert type(replayed.events) is DocumentEvents
    assert_same_tables(*lake_tables(replayed.events, reference.events))
    assert_same_tables(*lake_tables(batch.events, reference.events))
    router.fire(0)


def test_a_log_courier_payload_stays_packed() -> None:
    docs = [filebeat(i) for i in range(5)]
    source, router, clock = source_fakes.make_source(LogCourierSource, "courier")
    conn = Conn(source)
    conn.send(lc.encode_jdat(b"n" * 16, docs))
    [call] = router.calls
    assert type(call.batch.events) is DocumentEvents and call.key == b"n" * 16
    assert call.batch.events == decode_documents(docs, T0 * 1_000_000_000, False)


def test_filtered_documents_take_their_objects_text_into_extra_as_python_writes_them() -> None:
    """Filters' edits and selections over a read whose objects' JSON text the build
    splices into ``_extra``: a renamed object keeps its text, a set one is written
    from the edit, a removed one is gone; the rows are what Python makes of them."""
    from logrouter.filters.columnar import remove_edit, rename_edit, set_edit

    docs = [b' { "host" : { "a" : [ 1 , 2.50 , "\\u00e9" ] } , "@timestamp":"2026-11-26T10:00:00Z","x":[],"y":{}} ']
    docs += [filebeat(i) for i in range(40)]
    events = events_of_documents(docs, NOW, False)
    assert type(events) is DocumentEvents and events.texts is not None
    edited = events.narrowed([0, 3, 5, 39, 40])
    for edit in (rename_edit([("host", "machine")]), remove_edit(["agent"]), set_edit({"log": {"k": [1, None]}})):
        edited = edited.edited(edit)
    reference = [(time, dict(record)) for time, record in edited]
    assert reference[0][1]["machine"] == {"a": [1, 2.5, "é"]}
    native, python = lake_tables(edited, reference)
    assert_same_tables(native, python)
    assert '"machine":{ "a" : [ 1 , 2.50 , "\\u00e9" ] }' in native.column("_extra")[0].as_py()  # spliced


def test_misfit_objects_take_their_text_whatever_order_the_build_asks_for_them() -> None:
    """``_extra`` asks for the spliced texts in blob order (unknown fields) and then in
    column order (misfits), which can run backwards: each object's text is found either
    way (``columns::Texts::of``), as it came, and the rows are what Python makes."""
    docs = [b'{"@timestamp":"2026-11-26T10:00:00Z","b":"x","a":"y"}']
    docs += [b'{"@timestamp":"2026-11-26T10:00:01Z","a":{ "k" : 1 },"c":[ 2 ],"b":[ 3 ],"d":{ }}'] * 3
    events = events_of_documents(docs, NOW, False)
    assert type(events) is DocumentEvents and events.texts is not None
    reference = [(time, dict(record)) for time, record in events]
    native, python = lake_tables(events, reference)
    assert native.column_names[2:4] == ["b", "a"]  # columns b, a; the records have a before b
    assert_same_tables(native, python)
    for text in native.column("_extra").to_pylist()[1:]:
        assert text == '{"c":[ 2 ],"d":{ },"b":[ 3 ],"a":{ "k" : 1 }}'  # every text spliced

"""The Beats arrival path's native pieces agree with the Python ones, the reference.

- The Lumberjack codec keeping ``J`` runs undecoded cuts them out natively
  (``logrouter_native.json_frames``, ``Events.runs``): for valid, damaged, garbage and
  compressed-garbage streams fed whole, byte by byte and split anywhere, with small
  limits and the defaults, decoding what it kept (``decode_group``) gives the frames,
  records, acks, invalid counts and the error (reason and place) of the decoder that
  decodes as it goes.
- The native read of those runs (``NativeReads.read_runs``) is the read of the same
  documents as bytes (``read``).
- The idempotency keys the native scan makes are ``event_keys.key_maker``'s for events
  whose key fields take every msgpack head size, unicode, ints, floats, bools, null,
  objects and missing fields.

Skipped where the extension is not installed.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from fuzz_helpers import MAX_INPUT, cuts, decode_all_ways, fuzz_settings, mutated
from hypothesis import given
from hypothesis import strategies as st

from logrouter.native import NATIVE, describe
from logrouter.sources import event_keys
from logrouter.sources.events import TagTemplate
from logrouter.sources.json_native import NativeReads
from logrouter.wire import lumberjack as lj
from logrouter.wire.json_lazy import split_runs

pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"native decoding off: {describe()}")

NOW = 1_764_000_000_123_456_789
LIMITS = [
    {},
    dict(max_window_size=20, max_frame_bytes=1500, max_decompressed_bytes=3000, max_event_bytes=400, max_data_fields=6),
    dict(max_frame_bytes=300, max_event_bytes=5000, max_data_fields=1),
    dict(max_window_size=2, max_event_bytes=20),
]


def summarize(messages: list, kept: bool) -> list:
    """What a feed gave, per message, the kept runs decoded first (as the source does
    when the native read declines)."""
    out: list = []
    for m in messages:
        if isinstance(m, lj.Window):
            out.append(("W", m.version, m.size, m.window, m.missing))
            continue
        assert kept or not m.undecoded
        lj.decode_group(m)
        assert not m.runs and m.frames == len(m.records) + m.invalid
        documents = list(m.documents) if m.documents_match else None
        if out and out[-1][0] == "E" and out[-1][1] == m.window:  # one window over several feeds
            _, _, records, before, _, frames, invalid, reason, _ = out.pop()
            documents = None if before is None or documents is None else before + documents
            entry = (records + m.records, documents, m.ack_seq, frames + m.frames, invalid + m.invalid, reason or m.invalid_reason)
        else:
            entry = (list(m.records), documents, m.ack_seq, m.frames, m.invalid, m.invalid_reason)
        out.append(("E", m.window, *entry, m.complete))
    return out


def both_ways(data: bytes, chosen_cuts: list[int], limits: dict) -> None:
    """The keeping decoder (native walk) and the decoding one (Python walk) agree, fed
    every way (each way on its own gives the same too)."""
    kept = decode_all_ways(lambda: lj.LumberjackDecoder(keep_documents=True, **limits), data, chosen_cuts, normalize=lambda m: summarize(m, True), every_offset=len(data) <= 64)
    plain = decode_all_ways(lambda: lj.LumberjackDecoder(**limits), data, chosen_cuts, normalize=lambda m: summarize(m, False), every_offset=len(data) <= 64)
    assert kept == plain


json_records = st.dictionaries(
    st.text(max_size=6),
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=10) | st.just({"a": [1]}),
    max_size=4,
)
documents = st.lists(
    json_records.map(lambda r: json.dumps(r, separators=(",", ":")).encode()) | st.sampled_from([b"[1]", b"{", b'{"a":1,"a":2}', b"", b'"x"']),
    max_size=6,
)


@st.composite
def streams(draw: Any) -> bytes:
    """Windows of J frames as Beats send them (a C frame), plain, spread over both,
    nested, after a D frame, with a W frame inside the C frame."""
    version = draw(st.sampled_from([1, 2]))
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        docs = draw(documents)
        frames = b"".join(lj.encode_json(i + 1, d, version) for i, d in enumerate(docs))
        shape = draw(st.sampled_from(["c", "plain", "spread", "nested", "data first", "w inside"]))
        if shape == "c":
            body = lj.encode_compressed(frames, 3, version)
        elif shape == "spread" and docs:
            cut = draw(st.integers(0, len(frames)))
            body = lj.encode_compressed(frames[:cut], 1, version) + frames[cut:]
        elif shape == "nested":
            body = lj.encode_compressed(lj.encode_compressed(frames, 1, version), 1, version)
        elif shape == "data first":
            body = lj.encode_data(0, {"k": "v"}, version) + frames
        elif shape == "w inside":
            body = lj.encode_compressed(lj.encode_window(len(docs), version) + frames, 1, version)
        else:
            body = frames
        parts.append((b"" if shape == "w inside" else lj.encode_window(len(docs), version)) + body)
    return b"".join(parts)


@fuzz_settings(max_examples=150)
@given(streams(), cuts, st.sampled_from(LIMITS))
def test_kept_runs_decode_as_the_python_walk_every_way(data, chosen_cuts, limits) -> None:
    both_ways(data, chosen_cuts, limits)


@fuzz_settings(max_examples=150)
@given(mutated(streams().filter(lambda b: len(b) <= MAX_INPUT)), cuts, st.sampled_from(LIMITS))
def test_damaged_streams_give_the_same_frames_and_error_kept_or_not(data, chosen_cuts, limits) -> None:
    both_ways(data, chosen_cuts, limits)


@fuzz_settings(max_examples=100)
@given(
    st.sampled_from([1, 2]),
    st.lists(st.sampled_from([b"J", b"J", b"W", b"D", b"C"]).flatmap(lambda k: st.tuples(st.just(k), st.binary(max_size=14))), max_size=20),
    st.booleans(),
    cuts,
    st.sampled_from(LIMITS),
)
def test_frame_shaped_garbage_kept_or_not(version, pieces, compress, chosen_cuts, limits) -> None:
    v = b"%d" % version
    data = b"".join(v + kind + body for kind, body in pieces)
    if compress:
        data = lj.encode_window(3, version) + lj.encode_compressed(data, 1, version)
    both_ways(data, chosen_cuts, limits)


def test_the_run_holds_the_inflated_payload_or_a_copy_of_the_plain_frames() -> None:
    docs = [b'{"a":1}', b'{"b":"\xc3\xa9"}']
    frames = b"".join(lj.encode_json(i + 7, d) for i, d in enumerate(docs))
    for data in (lj.encode_window(2) + lj.encode_compressed(frames), lj.encode_window(2) + frames):
        (_, events) = lj.LumberjackDecoder(keep_documents=True).feed(data)
        assert events.undecoded and len(events.runs) == 1 and type(events.runs[0][0]) is bytes
        assert split_runs(events.runs) == (docs, [7, 8]) and events.ack_seq == 8 and events.frames == 2


# -- the native read of runs --------------------------------------------------------------


@fuzz_settings(max_examples=60)
@given(documents, st.sampled_from(["beats", "x.${a:-none}"]), st.sampled_from(["auto", ["a"]]))
def test_a_read_of_runs_is_the_read_of_its_documents(docs, template, spec) -> None:
    data = lj.encode_window(len(docs)) + lj.encode_compressed(b"".join(lj.encode_json(i + 1, d) for i, d in enumerate(docs)))
    messages = lj.LumberjackDecoder(keep_documents=True).feed(data)
    kept = [m for m in messages if isinstance(m, lj.Events)]
    if not kept:
        assert docs == []
        return
    reads = NativeReads(TagTemplate(template), False, spec)
    of_runs, of_documents = reads.read_runs(kept[0].runs, NOW), reads.read(docs, NOW)
    if of_documents is None:
        assert of_runs is None
        return
    (batch, keys), (reference, reference_keys) = of_runs, of_documents
    assert keys == reference_keys and batch.tag == reference.tag and batch.packed == reference.packed
    # Of one run the containers' text is indexed where it lies in the inflated payload.
    assert batch.events.entries == reference.events.entries and spliced(batch.events.texts) == spliced(reference.events.texts)
    assert batch.events.texts[1] is kept[0].runs[0][0]
    assert list(batch.events) == list(reference.events)


def spliced(texts: tuple[bytes, bytes]) -> list[tuple[int, bytes]]:
    """Where each indexed container's msgpack starts in the blob, and its JSON text."""
    index, data = texts
    words = struct.unpack(f"={len(index) // 4}I", index)
    return [(words[i], data[words[i + 1] : words[i + 2]]) for i in range(0, len(words), 3)]


# -- idempotency keys ---------------------------------------------------------------------

# Values at every msgpack head size msgspec picks, and the types a key reads.
boundary_ints = st.sampled_from(
    [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]
)
texts = st.text(max_size=4) | st.sampled_from([n * "x" for n in (31, 32, 255, 256, 65535, 65536)]) | st.sampled_from(["é", "日本", "😀", "\u2028", "a\"b\\c\n"])
key_values = st.none() | st.booleans() | boundary_ints | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([-0.0, 5e-324, 1e308]) | texts | st.just({"x": 1}) | st.just([1])
line = st.fixed_dictionaries(
    {},
    optional={
        # Strings the scan reads a time of (or none): others send the read to Python.
        "@timestamp": st.sampled_from(["2026-11-27T10:00:00.123Z", "2026-11-27T10:00:00.123456789Z", "hello", ""]) | st.none() | boundary_ints | st.floats(allow_nan=False, allow_infinity=False) | st.just({"x": 1}),
        "@metadata": st.fixed_dictionaries({}, optional={"_id": texts | key_values}),
        "agent": st.fixed_dictionaries({}, optional={"id": texts | key_values, "ephemeral_id": texts | key_values}),
        "log": st.fixed_dictionaries({}, optional={"offset": boundary_ints | key_values, "file": st.fixed_dictionaries({}, optional={"path": texts | key_values})}),
        "a": key_values,
        "a.b": key_values,
        "n": key_values,
    },
)
SPECS = ["auto", ["log.offset"], ["a", "n", "@timestamp"], ["a.b"], ["log.file.path", "agent.ephemeral_id", "log.offset", "a", "n", "x", "y", "z", "p", "q", "r", "s", "t", "u", "v", "w"]]


@fuzz_settings(max_examples=300)
@given(st.lists(line, min_size=1, max_size=5), st.sampled_from(SPECS), st.booleans())
def test_native_keys_are_the_python_key_makers(records, spec, ascii_only) -> None:
    docs = [json.dumps(r, ensure_ascii=ascii_only).encode() for r in records]
    read = NativeReads(TagTemplate("t"), False, spec).read(docs, NOW)
    assert read is not None
    assert read[1] == event_keys.key_maker(spec)([json.loads(d) for d in docs])


def test_keys_of_filebeat_lines() -> None:
    records = [
        {"@timestamp": "2026-11-27T10:00:00.123Z", "agent": {"id": "a", "ephemeral_id": "e"}, "log": {"offset": 2**40, "file": {"path": "/var/log/é"}}},
        {"@metadata": {"_id": "doc-1"}, "agent": {"id": "b"}},
        {"@metadata": {"_id": ""}, "log": {"offset": 1}},
    ]
    docs = [json.dumps(r).encode() for r in records]
    _, keys = NativeReads(TagTemplate("t"), False, "auto").read(docs, NOW)
    assert keys == event_keys.key_maker("auto")(records) and keys[0][0] == "a" and keys[1][0] == "b" and keys[2] is None


@fuzz_settings(max_examples=100)
@given(st.lists(st.tuples(texts, texts, boundary_ints | st.integers(-(2**63), 2**63 - 1), texts | st.none()), min_size=1, max_size=4))
def test_native_line_keys_are_the_python_key_makers(lines) -> None:
    # "auto"'s line rule with every field present: every int and str head msgspec picks.
    records = [
        {"@timestamp": "2026-11-27T10:00:00.5Z", "agent": {"ephemeral_id": e, "id": sender}, "log": {"file": {"path": p}, "offset": o}}
        for e, p, o, sender in lines
    ]
    docs = [json.dumps(r).encode() for r in records]
    _, keys = NativeReads(TagTemplate("t"), False, "auto").read(docs, NOW)
    assert keys is not None and keys == event_keys.key_maker("auto")(records)


def test_a_run_the_native_walk_declines_is_decoded_by_the_python_walk() -> None:
    # json_frames answers None where an offset would not fit in 32 bits (a read of 4 GiB).
    docs = [b'{"a":1}', b"[2]"]
    data = lj.encode_window(2) + lj.encode_compressed(b"".join(lj.encode_json(i + 1, d) for i, d in enumerate(docs)))
    decoder = lj.LumberjackDecoder(keep_documents=True)
    decoder._json_frames_native = lambda *args: None
    (_, events) = decoder.feed(data)
    assert not events.undecoded and not events.runs
    assert events == lj.LumberjackDecoder().feed(data)[1] and events.invalid == 1 and events.records == [{"a": 1}]

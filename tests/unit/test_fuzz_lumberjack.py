"""Fuzzing the Lumberjack codec (server decoder v1 and v2, and the ack reader) with hypothesis.

For arbitrary bytes and for mutations of valid streams built with the module's encoders:
only ``DecodeError`` ever escapes, and the bytes give the same frames and the same error
whether fed whole, byte by byte or split anywhere. Valid streams also decode back to the
records they were built from. Inputs stay within a few KB and each example has a deadline,
so a pathological input shows up as a failure, not as a slow suite. More examples:
``LOGROUTER_FUZZ_EXAMPLES=20000`` (bench/FUZZ.md).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from fuzz_helpers import MAX_INPUT, cuts, decode_all_ways, fuzz_settings, mixed_documents, mutated, split_at
from hypothesis import given
from hypothesis import strategies as st

from logrouter.wire import json_text
from logrouter.wire import lumberjack as lj

# Small limits so that examples reach every limit check; and the defaults.
LIMITS = [
    {},
    dict(max_window_size=20, max_frame_bytes=1500, max_decompressed_bytes=3000, max_event_bytes=400, max_data_fields=6),
    dict(max_frame_bytes=300, max_event_bytes=5000, max_data_fields=1),
]


def summarize(messages: list) -> list:
    """Decoder output independent of how the input was split into feed calls: windows, and
    per run of events of one window the records, the last ack value and completeness."""
    out: list = []
    for m in messages:
        if isinstance(m, lj.Window):
            out.append(("W", m.version, m.size, m.window, m.missing))
            continue
        assert isinstance(m, lj.Events) and m.frames == len(m.records) + m.invalid
        if out and out[-1][0] == "E" and out[-1][1] == m.window:
            _, _, records, _, frames, invalid, _ = out.pop()
            records, frames, invalid = records + m.records, frames + m.frames, invalid + m.invalid
        else:
            records, frames, invalid = list(m.records), m.frames, m.invalid
        out.append(("E", m.window, records, m.ack_seq, frames, invalid, m.complete))
    return out


def decoder_factory(limits: dict) -> Any:
    return lambda: lj.LumberjackDecoder(**limits)


# -- valid streams ---------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8
)
json_records = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
kv_records = st.dictionaries(st.text(max_size=8), st.text(max_size=16), max_size=4)
levels = st.sampled_from([None, 1, 3, 9])


@st.composite
def valid_stream(draw: Any) -> tuple[bytes, int, list[list[dict]]]:
    """(bytes, version, records per window) for windows as real clients send them, plus
    the odd empty window, empty C frame and nested C frame."""
    version = draw(st.sampled_from([1, 2]))
    records = kv_records if version == 1 else json_records
    encode = lj.encode_data if version == 1 else lj.encode_json
    parts: list[bytes] = []
    windows: list[list[dict]] = []
    for _ in range(draw(st.integers(1, 4))):
        shape = draw(st.sampled_from(["beats", "beats", "empty", "nested", "spread"]))
        batch = draw(st.lists(records, max_size=5))
        if shape == "empty":
            parts.append(lj.encode_window(0, version) + (lj.encode_compressed(b"", version=version) if draw(st.booleans()) else b""))
            windows.append([])
        elif shape == "nested" and batch:
            frames = b"".join(encode(i + 1, r, version) for i, r in enumerate(batch))
            inner = lj.encode_compressed(frames, draw(st.integers(0, 9)), version)
            parts.append(lj.encode_window(len(batch), version) + lj.encode_compressed(inner, 1, version))
            windows.append(batch)
        elif shape == "spread" and len(batch) > 1:
            # One window over a C frame and plain frames, as pylogbeat-like clients may.
            cut = draw(st.integers(1, len(batch) - 1))
            first = b"".join(encode(i + 1, r, version) for i, r in enumerate(batch[:cut]))
            rest = b"".join(encode(cut + i + 1, r, version) for i, r in enumerate(batch[cut:]))
            parts.append(lj.encode_window(len(batch), version) + lj.encode_compressed(first, 6, version) + rest)
            windows.append(batch)
        else:
            parts.append(lj.encode_window_frames(batch, version, draw(levels)))
            windows.append(batch)
    return b"".join(parts), version, windows


def valid_bytes() -> st.SearchStrategy[bytes]:
    return valid_stream().map(lambda t: t[0]).filter(lambda b: len(b) <= MAX_INPUT)


limits = st.sampled_from(LIMITS)


# -- the server decoder ----------------------------------------------------------------------


@fuzz_settings()
@given(valid_stream(), cuts)
def test_valid_streams_decode_to_their_records_every_way(stream, cuts):
    data, version, windows = stream
    frames, reason = decode_all_ways(decoder_factory({}), data, cuts, normalize=summarize, every_offset=len(data) <= 128)
    assert reason is None
    got_windows = [m for m in frames if m[0] == "W"]
    assert [(w[1], w[2]) for w in got_windows] == [(version, len(w)) for w in windows]
    by_window = {m[1]: m[2] for m in frames if m[0] == "E"}
    assert [by_window.get(i + 1, []) for i in range(len(windows))] == windows


@fuzz_settings()
@given(mutated(valid_bytes()), cuts, limits)
def test_mutated_streams_give_the_same_frames_and_error_every_way(data, cuts, limits):
    decode_all_ways(decoder_factory(limits), data, cuts, normalize=summarize)


@fuzz_settings()
@given(st.sampled_from([b"", b"1", b"2"]), st.binary(max_size=MAX_INPUT), cuts, limits)
def test_arbitrary_bytes_give_the_same_frames_and_error_every_way(prefix, data, cuts, limits):
    decode_all_ways(decoder_factory(limits), prefix + data, cuts, normalize=summarize)


@fuzz_settings()
@given(
    st.sampled_from([1, 2]),
    st.lists(st.sampled_from([b"W", b"D", b"J", b"C", b"A", b"x"]).flatmap(lambda k: st.tuples(st.just(k), st.binary(max_size=12))), max_size=30),
    cuts,
    limits,
)
def test_frame_shaped_garbage_every_way(version, pieces, cuts, limits):
    # Random bodies behind real headers reach deeper than uniformly random bytes.
    v = b"%d" % version
    data = b"".join(v + kind + body for kind, body in pieces)
    if data and pieces and pieces[0][0] == b"C":
        data += lj.encode_compressed(data, 1, version)
    decode_all_ways(decoder_factory(limits), data, cuts, normalize=summarize)


@fuzz_settings()
@given(st.sampled_from([1, 2]), st.binary(max_size=600), cuts, limits)
def test_compressed_garbage_every_way(version, inner, cuts, limits):
    # Whatever a C frame inflates to must be decoded as frames, or refused, the same way.
    v = b"%d" % version
    data = lj.encode_window(3, version) + lj.encode_compressed(v + inner, 6, version)
    decode_all_ways(decoder_factory(limits), data, cuts, normalize=summarize)
    blob = zlib.compress(inner)
    decode_all_ways(decoder_factory(limits), v + b"C" + struct.pack(">I", len(blob)) + blob, cuts, normalize=summarize)


def reference_run(documents: list[bytes], first_seq: int) -> tuple[list, list, int, str | None]:
    """What decoding each document on its own gives: the objects, the documents kept
    (those of the objects), the invalid count, and the reason the decoder reports (the
    first invalid one's)."""
    records, kept, invalid, reason = [], [], 0, None
    for seq, document in enumerate(documents, first_seq):
        probe = lj.LumberjackDecoder()
        (events,) = probe.feed(lj.encode_json(seq, document))
        records += events.records
        kept += events.documents
        if events.invalid:
            invalid += 1
            reason = reason or events.invalid_reason
    return records, kept, invalid, reason


@fuzz_settings()
@given(mixed_documents(), st.sampled_from([None, 3]), cuts)
def test_a_run_of_documents_decodes_as_each_document_alone(documents, level, cuts):
    """A run of J frames is decoded in one pass while every document is an object, and
    document by document once one is not: either way each gets the verdict it gets
    alone, the invalid ones counted, the first one's seq in the reason."""
    body = b"".join(lj.encode_json(i + 5, d) for i, d in enumerate(documents))
    data = lj.encode_window(len(documents)) + (lj.encode_compressed(body, level) if level and body else body)
    records, kept, invalid, reason = reference_run(documents, 5)
    for feeds in ([data], split_at(data, cuts)):
        decoder = lj.LumberjackDecoder()
        events = [m for feed in feeds for m in decoder.feed(feed) if isinstance(m, lj.Events)]
        # repr: NaN is not equal to itself, and 1 must stay apart from 1.0
        assert repr([r for e in events for r in e.records]) == repr(records)
        assert [d for e in events for d in e.documents] == kept
        assert sum(e.invalid for e in events) == invalid
        assert next((e.invalid_reason for e in events if e.invalid_reason), None) == reason


def test_a_run_of_objects_is_decoded_in_one_call(monkeypatch):
    """The usual window (every document an object msgspec reads) takes the one-call path:
    the per-document decoder is never called."""
    def per_document(document):
        raise AssertionError("decoded one by one")

    monkeypatch.setattr(json_text, "fast_loads", per_document)
    monkeypatch.setattr(json_text, "standard_loads", per_document)
    records = [{"n": i, "msg": "x" * i} for i in range(50)]
    for level in (None, 3):
        (_, events) = lj.LumberjackDecoder().feed(lj.encode_window_frames(records, 2, level))
        assert events.records == records and events.invalid == 0 and events.complete


# -- the ack reader ----------------------------------------------------------------------------

acks = st.lists(st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([1, 2])), max_size=20).map(
    lambda xs: b"".join(lj.encode_ack(seq, version) for seq, version in xs)
)


@fuzz_settings()
@given(acks, cuts)
def test_ack_stream_decodes_every_way(data, cuts):
    frames, reason = decode_all_ways(lj.AckDecoder, data, cuts)
    assert reason is None and len(frames) == len(data) // 6


@fuzz_settings()
@given(mutated(acks) | st.binary(max_size=MAX_INPUT), cuts)
def test_ack_garbage_gives_the_same_acks_and_error_every_way(data, cuts):
    decode_all_ways(lj.AckDecoder, data, cuts)

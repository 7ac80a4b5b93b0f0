"""Fuzzing the Log Courier codec (server decoder and the client's ACKN reader) with hypothesis.

For arbitrary bytes, frame-shaped garbage and mutations of valid sessions built with the
module's encoders: only ``DecodeError`` escapes, and the bytes give the same frames and
the same error whether fed whole, byte by byte or split anywhere. Valid sessions decode
back to what they were built from. Inputs stay within a few KB and every example has a
deadline. More examples: ``LOGROUTER_FUZZ_EXAMPLES=20000`` (bench/FUZZ.md).
"""

from __future__ import annotations

import zlib
from typing import Any

from fuzz_helpers import MAX_INPUT, cuts, decode_all_ways, fuzz_settings, mixed_documents, mutated, split_at
from hypothesis import given
from hypothesis import strategies as st

from logrouter.wire import json_text
from logrouter.wire import log_courier as lc
from logrouter.wire.log_courier_records import add_invalid

# Small limits so that examples reach every limit check; and the defaults.
LIMITS = [
    {},
    dict(max_payload_bytes=300, max_event_bytes=60, max_decompressed_bytes=500, max_payload_events=5, max_unknown_bytes=8),
    dict(max_decompressed_bytes=100, max_unknown_bytes=None),
]
limits = st.sampled_from(LIMITS)


def factory(limits: dict) -> Any:
    return lambda: lc.LogCourierDecoder(**limits)


scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8
)
json_records = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
nonces = st.binary(min_size=16, max_size=16)


@st.composite
def session(draw: Any) -> tuple[bytes, list[Any]]:
    """(bytes, expected frames) for a session as real clients send it."""
    parts: list[bytes] = []
    frames: list[Any] = []
    if draw(st.booleans()):
        evnt = draw(st.booleans())
        version = (2, draw(st.integers(0, 20)), draw(st.integers(0, 9)))
        size = draw(st.sampled_from([20, 32]))
        parts.append(lc.encode_helo(evnt, version, "LCOR", size=size))
        frames.append(lc.Helo(lc.EVNT_FLAG if evnt else 0, version, "LCOR", size))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["JDAT", "EVNT", "PING", "????"]))
        if kind == "PING":
            parts.append(lc.encode_ping())
            frames.append(lc.Ping())
        elif kind == "????":
            parts.append(lc.encode_unknown())
            frames.append(lc.Unknown())
        else:
            nonce = draw(nonces)
            records = draw(st.lists(json_records, max_size=5))
            encode = lc.encode_jdat if kind == "JDAT" else lc.encode_evnt
            parts.append(encode(nonce, records, draw(st.sampled_from([0, 1, 3, 9]))))
            frames.append(lc.Payload(kind, nonce, records))
    return b"".join(parts), frames


def session_bytes() -> st.SearchStrategy[bytes]:
    return session().map(lambda t: t[0]).filter(lambda b: len(b) <= MAX_INPUT)


@fuzz_settings()
@given(session(), cuts)
def test_valid_sessions_decode_to_their_frames_every_way(s, cuts):
    data, expected = s
    frames, reason = decode_all_ways(factory({}), data, cuts, every_offset=len(data) <= 128)
    assert reason is None and frames == expected


@fuzz_settings()
@given(mutated(session_bytes()), cuts, limits)
def test_mutated_sessions_give_the_same_frames_and_error_every_way(data, cuts, limits):
    decode_all_ways(factory(limits), data, cuts)


@fuzz_settings()
@given(st.binary(max_size=MAX_INPUT), cuts, limits)
def test_arbitrary_bytes_give_the_same_frames_and_error_every_way(data, cuts, limits):
    decode_all_ways(factory(limits), data, cuts)


codes = st.sampled_from([b"HELO", b"PING", b"????", b"JDAT", b"EVNT", b"ACKN", b"ABCD", b"\0\0\0\0"])
lengths = st.sampled_from([0, 1, 16, 17, 20, 32, 33, 0xFFFFFFFF]) | st.integers(0, 64)


@fuzz_settings()
@given(st.lists(st.tuples(codes, lengths, st.binary(max_size=40)), max_size=12), cuts, limits)
def test_frame_shaped_garbage_every_way(pieces, cuts, limits):
    data = b"".join(code + n.to_bytes(4, "big") + body for code, n, body in pieces)
    decode_all_ways(factory(limits), data, cuts)


@fuzz_settings()
@given(nonces, st.binary(max_size=600), st.booleans(), cuts, limits)
def test_compressed_garbage_every_way(nonce, content, evnt, cuts, limits):
    # Whatever a payload inflates to must be decoded as records, or refused, the same way.
    blob = zlib.compress(content, 6)
    if evnt:
        data = b"EVNT\xff\xff\xff\xff" + nonce + blob + lc.encode_ping()
    else:
        data = b"JDAT" + (16 + len(blob)).to_bytes(4, "big") + nonce + blob + lc.encode_ping()
    decode_all_ways(factory(limits), data, cuts)


acks = st.lists(
    st.one_of(
        st.builds(lc.encode_ackn, nonces, st.integers(0, 2**32 - 1)),
        st.just(lc.encode_pong()),
        st.just(lc.encode_unknown()),
        st.builds(lambda e, s: lc.encode_vers(e, (2, 12, 0), "LCVR", size=s), st.booleans(), st.integers(0, 32)),
    ),
    max_size=20,
).map(b"".join)


@fuzz_settings()
@given(acks, cuts)
def test_server_messages_decode_every_way(data, cuts):
    frames, reason = decode_all_ways(lc.AcknDecoder, data, cuts)
    assert reason is None


@fuzz_settings()
@given(mutated(acks) | st.binary(max_size=MAX_INPUT), cuts)
def test_server_garbage_gives_the_same_frames_and_error_every_way(data, cuts):
    decode_all_ways(lc.AcknDecoder, data, cuts)


@fuzz_settings()
@given(mixed_documents(), st.sampled_from(["JDAT", "EVNT"]), cuts)
def test_a_payload_of_mixed_records_decodes_as_record_by_record(documents, kind, cuts):
    """A payload's records are decoded in one pass while every one is an object, else one
    by one: either way each gets the verdict it gets alone (a non-object kept as its
    text and counted), in order, with the first invalid one's number in the reason."""
    nonce = bytes(range(16))
    encode = lc.encode_jdat if kind == "JDAT" else lc.encode_evnt
    data = encode(nonce, documents)
    reference = lc.Payload(kind, nonce)
    for document in documents:
        try:
            record = json_text.loads(document)
        except (ValueError, RecursionError) as e:
            record = e
        if type(record) is dict:
            reference.events.append(record)
            reference.documents.append(document)
        else:
            add_invalid(reference, json_text.why_not_an_object(record), document)
    for feeds in ([data], split_at(data, cuts)):
        decoder = lc.LogCourierDecoder()
        (payload,) = [m for feed in feeds for m in decoder.feed(feed)]
        assert repr(payload.events) == repr(reference.events)  # repr: NaN, and 1 apart from 1.0
        assert payload.documents == reference.documents
        assert (payload.invalid, payload.invalid_reason) == (reference.invalid, reference.invalid_reason)


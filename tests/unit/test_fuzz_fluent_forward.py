"""Fuzzing the forward codec's ``ForwardDecoder`` with hypothesis.

Inputs: valid streams built with the module's encoders and with msgpack/JSON by hand
(every carrier mode, gzip and zstd blobs, options, heartbeats, times of every kind and
range), mutations of those, and arbitrary bytes; msgpack and JSON connections. For each:

- only ``ForwardDecodeError`` ever escapes ``feed`` or a ``DeferredMessage``'s parts;
- the same messages and the same error whether fed whole, byte by byte or split at random
  offsets (``ForwardDecodeError.messages`` holds what the failing call decoded first);
- a decoder that defers big messages (``offload_bytes``) gives, once its deferred messages
  are decoded, exactly what the decoder that decodes everything in ``feed`` gives, and a
  deferred message's parts add up to its whole;
- every message decoded can be stored as the spool stores it, and its chunk acked;
- each input is decoded in bounded time (hypothesis' deadline, and an explicit bound).

Counts stay small in the normal suite; ``LOGROUTER_FUZZ_EXAMPLES=20000`` raises them.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import time
from typing import Any

import msgpack
import zstandard
from fuzz_helpers import MAX_INPUT, cuts, decode_all_ways, feed_pieces, fuzz_settings, mutated
from hypothesis import given
from hypothesis import strategies as st

from logrouter.batch import Batch
from logrouter.spool.record import encode_batch
from fixtures import forward_encode as fe
from logrouter.wire import fluent_forward as ff
from logrouter.wire.forward_entries import NANOS_PER_SECOND

NOW_NS = 1_700_000_000_000_000_000
MAX_SECONDS_PER_INPUT = 10.0  # generous: a shared 2-core box; a pathological input takes far longer

# Small limits so that examples reach the limit checks, and roomy ones.
LIMITS = [
    dict(max_message_bytes=1 << 16, max_decompressed_bytes=1 << 20),
    dict(max_message_bytes=300, max_decompressed_bytes=600),
]


def inline_factory(limits: dict) -> Any:
    return lambda: ff.ForwardDecoder(now_ns=lambda: NOW_NS, **limits)


def offload_factory(limits: dict) -> Any:
    return lambda: ff.ForwardDecoder(now_ns=lambda: NOW_NS, offload_bytes=40, **limits)


def by_value(frame: Any) -> Any:
    """A message with its events as a list: the codec keeps a PackedForward message's
    events packed (``PackedEvents``) where the native extension takes them, and a deferred
    message's parts build lists; either is a sequence of the same events, and the repr of
    the list shows them (repr, not ==: a NaN inside a record never equals itself)."""
    if isinstance(frame, ff.EventMessage) and type(frame.events) is not list:
        events = list(frame.events)
        assert len(frame.events) == len(events)  # the extension's count is the decode's
        return dataclasses.replace(frame, events=events)
    return frame


def by_values(frames: list) -> str:
    return repr([by_value(frame) for frame in frames])


def outcome(frames: list, reason: str | None = None, check_parts: bool = False) -> list:
    """Frames with deferred messages decoded; a failing deferred message ends the list
    with its error, as decoding everything in feed would have."""
    out: list = []
    for frame in frames:
        if isinstance(frame, ff.DeferredMessage):
            try:
                whole = frame.decode()
                parts = list(frame.parts(part_bytes=64)) if check_parts else [whole]
            except ff.ForwardDecodeError as error:
                assert error.reason
                return out + [("error", error.reason)]
            assert parts and repr([e for p in parts for e in p.events]) == repr(whole.events)
            assert sum(p.invalid for p in parts) == whole.invalid
            frame = whole
        if isinstance(frame, ff.EventMessage):
            # What the router does with it: every decoded message can be stored and acked.
            encode_batch(Batch(frame.tag, frame.events, "fwd"), None if frame.chunk is None else ("fwd", frame.chunk))
            if frame.chunk is not None:
                assert fe.decode_ack(ff.encode_ack(frame.chunk)) == frame.chunk
        out.append(by_value(frame))
    return out + ([("error", reason)] if reason else [])


def found_while_building(reason: str) -> bool:
    """A fault only building the values shows (an array as a map key, a bad Timestamp).

    Decoding in feed meets faults in stream order; a deferred message first reads its
    entries through without building them (so a bad message yields no part) and so may
    report a fault further on instead. Both refuse the message.
    """
    return "not valid msgpack" in reason and "FormatError" not in reason and "StackError" not in reason


def normalize(frames: list) -> str:
    # repr: a NaN inside a record never equals itself
    return repr(outcome(frames))


def check(data: bytes, split: list[int], limits: dict) -> None:
    started = time.perf_counter()
    decode_all_ways(inline_factory(limits), data, split, normalize=by_values)
    # Deferred messages are decoded for every way too: not at every offset, for time.
    decode_all_ways(offload_factory(limits), data, split, normalize=normalize, every_offset=False)
    # The same input, decoded in feed or deferred, gives the same events and error.
    inline = outcome(*feed_pieces(inline_factory(limits), [data]))
    deferred = outcome(*feed_pieces(offload_factory(limits), [data]), check_parts=True)
    inline_error = inline[-1][1] if inline and type(inline[-1]) is tuple else None
    if inline_error and found_while_building(inline_error) and repr(deferred[-1:]) != repr(inline[-1:]):
        assert type(deferred[-1]) is tuple, deferred[-1]  # refused too, for another fault
        inline, deferred = inline[:-1], deferred[:-1]
    elif inline_error and inline_error.startswith("bad zstd data") and deferred and type(deferred[-1]) is tuple:
        # zstandard names a fault in a damaged frame by where its decoder stood, which
        # depends on how much it was asked to inflate at a time; the offloading decoder
        # asks in smaller steps. Refused both ways, worded alike up to the library's words.
        assert deferred[-1][1].startswith("bad zstd data"), deferred[-1]
        inline, deferred = inline[:-1], deferred[:-1]
    assert repr(deferred) == repr(inline), f"deferred {deferred!r:.400} != inline {inline!r:.400}"
    assert time.perf_counter() - started < MAX_SECONDS_PER_INPUT


# -- valid streams -------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=10)
    | st.binary(max_size=10)
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6
)
records = st.dictionaries(st.text(max_size=6) | st.binary(max_size=4) | st.integers(0, 9), values, max_size=3)
seconds = st.integers(-(2**63), 2**64 - 1) | st.integers(-(2**34), 2**34) | st.just(0)
event_times = st.builds(
    lambda s, n: msgpack.ExtType(0, (s % 2**32).to_bytes(4, "big") + (n % 2**32).to_bytes(4, "big")),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
)
times = (
    seconds
    | event_times
    | st.floats()
    | st.builds(msgpack.Timestamp, st.integers(-(2**40), 2**40), st.integers(0, 999_999_999))
    | st.builds(lambda t, meta: [t, meta], seconds | event_times, st.dictionaries(st.text(max_size=3), st.integers(-9, 9), max_size=2))
    | st.sampled_from(["yesterday", None, True, []])
)
entries = st.lists(st.tuples(times, records | st.sampled_from(["not a map", 5, None])).map(list), max_size=6)
tags = st.text(max_size=12) | st.binary(max_size=6)
chunks = st.none() | st.text(max_size=26) | st.binary(max_size=16)


@st.composite
def options(draw: Any, compressed: str | None = None) -> dict | None:
    result: dict = {}
    chunk = draw(chunks)
    if chunk is not None:
        result["chunk"] = chunk
    if draw(st.booleans()):
        result["size"] = draw(st.integers(0, 10) | st.text(max_size=2))
    if compressed is not None:
        result["compressed"] = compressed
    elif draw(st.booleans()):
        result["compressed"] = "text"
    if draw(st.booleans()):
        result["fluent_signal"] = draw(st.integers(0, 2))
    return result or draw(st.sampled_from([None, {}]))


def pack(message: Any) -> bytes:
    return msgpack.packb(message, use_bin_type=True, unicode_errors="surrogateescape")


@st.composite
def forward_message(draw: Any) -> bytes:
    message = [draw(tags), draw(entries)]
    opts = draw(options())
    return pack(message if opts is None else message + [opts])


@st.composite
def message_mode(draw: Any) -> bytes:
    # (a str or a list there would make it a PackedForward or Forward message)
    time_value = draw(seconds | event_times | st.floats() | st.sampled_from([True, None, {}]))
    message = [draw(tags), time_value, draw(records | st.just("not a map"))]
    opts = draw(options())
    return pack(message if opts is None else message + [opts])


def compress(blob: bytes, how: str, members: int) -> bytes:
    if how == "gzip":
        step = max(1, len(blob) // members)
        return b"".join(gzip.compress(blob[i : i + step], mtime=0) for i in range(0, len(blob), step)) or gzip.compress(b"")
    if how == "zstd":
        return zstandard.ZstdCompressor().compress(blob)
    return blob


@st.composite
def packed_message(draw: Any) -> bytes:
    how = draw(st.sampled_from([None, "text", "gzip", "zstd"]))
    blob = b"".join(pack(entry) for entry in draw(entries))
    blob = compress(blob, how or "text", draw(st.integers(1, 3)))
    opts = draw(options(compressed=how))
    carrier = blob if draw(st.booleans()) else blob.decode("utf-8", "surrogateescape")  # bin or str32
    message = [draw(tags), carrier]
    return pack(message if opts is None else message + [opts])


@st.composite
def encoder_message(draw: Any) -> bytes:
    """A message written by the module's own encoders (times they can encode)."""
    events = draw(
        st.lists(st.tuples(st.integers(0, (2**32 - 1) * NANOS_PER_SECOND), st.dictionaries(st.text(max_size=5), scalars, max_size=3)), max_size=5)
    )
    tag = draw(st.text(max_size=10))
    opts = draw(st.none() | st.fixed_dictionaries({"chunk": st.text(max_size=10)}))
    as_int = draw(st.booleans())
    kind = draw(st.sampled_from(["message", "forward", "packed", "gzip", "zstd"]))
    if kind == "message":
        time_ns, record = events[0] if events else (0, {})
        return fe.encode_message(tag, time_ns, record, opts, time_as_integer=as_int)
    if kind == "forward":
        return fe.encode_forward(tag, events, opts, time_as_integer=as_int)
    compressed = None if kind == "packed" else kind
    return fe.encode_packed_forward(
        tag, events, opts, compressed, time_as_integer=as_int, blob_as_bin=draw(st.booleans())
    )


one_message = forward_message() | message_mode() | packed_message() | encoder_message() | st.just(b"\xc0")
streams = st.lists(one_message, min_size=1, max_size=3).map(b"".join).map(lambda data: data[:MAX_INPUT])


@st.composite
def json_stream(draw: Any) -> bytes:
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        json_times = st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.just("bad")
        json_records = st.dictionaries(st.text(max_size=5), st.none() | st.integers(-(2**80), 2**80) | st.text(max_size=8) | st.floats(), max_size=3)
        if draw(st.booleans()):
            message: list = [draw(st.text(max_size=8)), [[draw(json_times), draw(json_records)] for _ in range(draw(st.integers(0, 4)))]]
        else:
            message = [draw(st.text(max_size=8)), draw(json_times), draw(json_records)]
        if draw(st.booleans()):
            message.append({"chunk": draw(st.text(max_size=10))})
        parts.append(json.dumps(message, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass"))
    return draw(st.sampled_from([b"", b"\n", b" \r\n"])).join(parts)[:MAX_INPUT]


# -- the properties --------------------------------------------------------------------------


@fuzz_settings()
@given(streams, cuts, st.sampled_from(LIMITS))
def test_valid_msgpack_streams(data, split, limits):
    check(data, split, limits)
    if len(data) < MAX_INPUT:  # not cut short: nothing in it is refused
        for frame in inline_factory(LIMITS[0])().feed(data):
            if isinstance(frame, ff.EventMessage):
                assert all(type(t) is int and ff.MIN_TIME_NS <= t <= ff.MAX_TIME_NS for t, _ in frame.events)
                assert all(type(k) is str for _, record in frame.events for k in record)
                # the spool can store them (record.encode_batch packs events kept packed as a list)
                msgpack.packb([list(frame.events)], use_bin_type=True, unicode_errors="surrogateescape")


@fuzz_settings()
@given(mutated(streams), cuts, st.sampled_from(LIMITS))
def test_mutated_msgpack_streams(data, split, limits):
    check(data, split, limits)


@fuzz_settings()
@given(json_stream(), cuts, st.sampled_from(LIMITS))
def test_valid_json_streams(data, split, limits):
    check(data, split, limits)


@fuzz_settings()
@given(mutated(json_stream()), cuts, st.sampled_from(LIMITS))
def test_mutated_json_streams(data, split, limits):
    check(data, split, limits)


@fuzz_settings()
@given(st.binary(max_size=MAX_INPUT), cuts, st.sampled_from(LIMITS))
def test_arbitrary_bytes(data, split, limits):
    check(data, split, limits)


@fuzz_settings()
@given(st.sampled_from([b"[", b"{", b"\x93", b"\x92", b"\xdd"]), st.binary(max_size=600), cuts, st.sampled_from(LIMITS))
def test_arbitrary_bytes_after_a_plausible_start(start, rest, split, limits):
    check(start + rest, split, limits)

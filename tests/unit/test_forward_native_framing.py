"""The native forward framer (``logrouter_native.forward_frames`` inside ``MsgpackFramer``)
against the Python one, the reference.

For streams of every message shape (PackedForward with every str/bin width of tag and
blob, options nil, scalar and otherwise, Message and Forward modes, heartbeats,
garbage), their mutations and arbitrary bytes, under a small and a roomy limit: each
``frames`` call yields the same messages (a blob as bytes either way, a tag as text),
the same error at the same call, and leaves the same ``pending_bytes``, whether the
stream is fed whole, byte by byte, split at every offset or at random ones.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from fuzz_helpers import EVERY_OFFSET_UP_TO, MAX_INPUT, fuzz_settings, mutated, split_at
from hypothesis import given
from hypothesis import strategies as st

from logrouter.wire.forward_entries import ForwardDecodeError
from logrouter.wire.forward_framing import NATIVE_FRAMES, MsgpackFramer

pytestmark = pytest.mark.skipif(NATIVE_FRAMES is None, reason="logrouter_native with forward_frames is not installed")

LIMITS = [40, 300, 1 << 16]


def normal(obj: Any) -> Any:
    """What the codec reads alike: a tag as text, a PackedForward blob as bytes (the
    Python framer leaves a str blob as text when its scanner stood down)."""
    if type(obj) is list and obj:
        obj = list(obj)
        if type(obj[0]) is bytes:
            obj[0] = obj[0].decode("utf-8", "surrogateescape")
        if len(obj) > 1 and type(obj[1]) is str:
            obj[1] = obj[1].encode("utf-8", "surrogateescape")
    return repr(obj)  # repr: a NaN never equals itself


def run(native: bool, limit: int, pieces: list[bytes]) -> list:
    framer = MsgpackFramer(limit, NATIVE_FRAMES if native else None)
    calls: list = []
    for piece in pieces:
        got = []
        try:
            for obj, size in framer.frames(piece):
                got.append((normal(obj), size))
        except ForwardDecodeError as error:
            calls.append((got, error.reason))
            return calls
        calls.append((got, framer.pending_bytes))
    return calls


def same_both_ways(limit: int, pieces: list[bytes]) -> None:
    assert run(True, limit, pieces) == run(False, limit, pieces)


def check(data: bytes, limit: int, cuts: list[int] = ()) -> None:
    same_both_ways(limit, [data])
    same_both_ways(limit, [data[i : i + 1] for i in range(len(data))])
    if cuts:
        same_both_ways(limit, split_at(data, cuts))
    if len(data) <= EVERY_OFFSET_UP_TO:
        for at in range(1, len(data)):
            same_both_ways(limit, [data[:at], data[at:]])


def text_header(n: int, width: int, binary: bool) -> bytes:
    if width == 0 and not binary and n < 32:
        return bytes([0xA0 | n])
    width = max(width, 1)
    while n >= 1 << (8 * width):
        width *= 2
    code = {1: 0xC4, 2: 0xC5, 4: 0xC6}[width] if binary else {1: 0xD9, 2: 0xDA, 4: 0xDB}[width]
    return bytes([code]) + n.to_bytes(width, "big")


@st.composite
def texts(draw: Any, max_size: int = 40) -> bytes:
    body = draw(st.binary(max_size=max_size))
    return text_header(len(body), draw(st.sampled_from([0, 1, 2, 4])), draw(st.booleans())) + body


SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1), st.floats(), st.text(max_size=12),
    st.binary(max_size=12),
)
ODD_VALUES = st.one_of(st.lists(st.integers(0, 9), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
                       st.just(msgpack.ExtType(0, b"\x00" * 8)))


@st.composite
def options(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["nil", "scalars", "odd", "fluent"]))
    if kind == "nil":
        return b"\xc0"
    if kind == "fluent":
        value = {"chunk": draw(st.text(max_size=30)), "size": draw(st.integers(0, 1 << 40)),
                 "compressed": draw(st.sampled_from(["gzip", "text", "zstd"]))}
    else:
        value = draw(st.dictionaries(st.text(max_size=8), SCALARS if kind == "scalars" else ODD_VALUES, max_size=4))
    return msgpack.packb(value, use_bin_type=draw(st.booleans()))


@st.composite
def messages(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["packed", "packed", "packed", "message", "forward", "nil", "garbage"]))
    if kind == "packed":
        head = draw(st.sampled_from([b"\x92", b"\x93", b"\xdc\x00\x03"]))
        out = head + draw(texts(12)) + draw(texts(200))
        return out + draw(options()) if head != b"\x92" else out
    if kind == "message":
        return msgpack.packb(["tag", draw(st.integers(0, 1 << 33)), {"a": draw(SCALARS)}])
    if kind == "forward":
        return msgpack.packb(["tag", [[1, {"a": 1}]] * draw(st.integers(0, 3))])
    if kind == "nil":
        return b"\xc0"
    return draw(st.sampled_from([b"\xc1", b"\x93\xa1t\xc1", struct.pack(">BI", 0xDD, 1 << 30)]))


STREAMS = st.lists(messages(), min_size=1, max_size=4).map(b"".join)


@fuzz_settings()
@given(STREAMS, st.sampled_from(LIMITS), st.lists(st.integers(0, MAX_INPUT), max_size=6))
def test_streams_frame_alike(data: bytes, limit: int, cuts: list[int]) -> None:
    check(data, limit, cuts)


@fuzz_settings()
@given(mutated(STREAMS), st.sampled_from(LIMITS), st.lists(st.integers(0, MAX_INPUT), max_size=6))
def test_mutated_streams_frame_alike(data: bytes, limit: int, cuts: list[int]) -> None:
    check(data, limit, cuts)


@fuzz_settings()
@given(st.binary(max_size=300), st.sampled_from(LIMITS))
def test_arbitrary_bytes_frame_alike(data: bytes, limit: int) -> None:
    check(b"\x92" + data, limit)


def test_a_blob_over_the_limit_is_refused_as_in_python() -> None:
    pieces = [b"\x92\xa1t\xdb" + (1000).to_bytes(4, "big"), b"x" * 60, b"x" * 60]
    assert run(True, 100, pieces) == run(False, 100, pieces)
    assert "exceeds max_message_bytes" in run(True, 100, pieces)[-1][1]


def test_packed_then_message_mode_then_packed_again() -> None:
    packed = b"\x93\xa1t\xc4\x03abc\x81\xa4size\x01"
    stream = packed + msgpack.packb(["t", 1, {"a": 1}]) + packed + b"\xc0" + packed
    check(stream, 1 << 16, [5, 17, 30])
    framer = MsgpackFramer(1 << 16)
    assert [obj for obj, _ in framer.frames(stream)][:1] == [["t", b"abc", {"size": 1}]]
    assert framer.pending_bytes == 0


def test_native_framing_takes_the_packed_messages_and_hands_back() -> None:
    taken = []

    def counting(buf: Any, limit: int) -> Any:
        found, used, need = NATIVE_FRAMES(buf, limit)
        taken.extend(found)
        return found, used, need

    packed = b"\x93\xa1t\xdb\x00\x00\x00\x03abc\x82\xa5chunk\xa2c1\xa4size\x01"
    stream = packed * 2 + msgpack.packb(["t", 1, {"a": 1}]) + packed
    framer = MsgpackFramer(1 << 16, counting)
    first = [obj for obj, _ in framer.frames(stream[:-5])]
    assert first == [["t", b"abc", {"chunk": "c1", "size": 1}]] * 2 + [["t", 1, {"a": 1}]]
    assert len(taken) == 2  # the Message-mode one went to the Python framer...
    assert [obj for obj, _ in framer.frames(stream[-5:])] == [first[0]]
    assert len(taken) == 2  # ...which kept the stream: it stood inside a message at the end of the read
    assert [obj for obj, _ in framer.frames(packed)] == [first[0]]
    assert len(taken) == 3  # back to native between messages

"""Fuzzing the forward client's reply reader (``fluent_client.ReplyReader``) with hypothesis.

For arbitrary bytes and mutations of valid reply streams (acks, HELO, PONG, any msgpack
value): only ``ReplyError`` escapes, and the same replies and the same error come out
whether the bytes are fed whole, byte by byte or split anywhere; the size bound refuses
exactly the replies longer than it. More examples: ``LOGROUTER_FUZZ_EXAMPLES`` (bench/FUZZ.md).
"""

from __future__ import annotations

import io
import math
import struct
from typing import Any

import msgpack
from fuzz_helpers import MAX_INPUT, cuts, decode_all_ways, feed_pieces, fuzz_settings, mutated
from hypothesis import given
from hypothesis import strategies as st

from logrouter.wire import fluent_client as wire
from logrouter.wire.fluent_handshake import encode_helo, encode_pong


def canon(messages: list[Any]) -> list[Any]:
    """Replies as flat tokens that compare equal when the replies are the same: NaN equals
    itself, and nesting 1000 deep (msgpack allows it) needs no recursion."""
    tokens: list[Any] = []
    stack: list[Any] = [messages]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is list or kind is tuple:
            tokens.append((kind.__name__, len(value)))
            stack.extend(reversed(value))
        elif kind is dict:
            tokens.append(("dict", len(value)))
            for key, item in reversed(list(value.items())):
                stack += [item, key]
        elif kind is float:
            tokens.append(("float", struct.pack(">d", value) if not math.isnan(value) else "nan"))
        else:
            tokens.append((kind.__name__, value))
    return tokens


def reader(max_bytes: int = wire.MAX_REPLY_BYTES) -> Any:
    return lambda: wire.ReplyReader(max_bytes)


keys = st.text(max_size=6) | st.integers(-5, 5) | st.binary(max_size=6)
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=10,
)
replies = st.one_of(
    st.binary(min_size=1, max_size=30).map(lambda b: msgpack.packb({"ack": b.hex()})),
    st.binary(max_size=20).map(lambda n: encode_helo(n, b"", True)),
    st.booleans().map(lambda ok: encode_pong(ok, "" if ok else "shared_key mismatch", "server", "ab" * 64)),
    values.map(lambda v: msgpack.packb(v, use_bin_type=True)),
)
streams = st.lists(replies, max_size=12).map(b"".join).filter(lambda b: len(b) <= MAX_INPUT)


@fuzz_settings()
@given(streams, cuts)
def test_reply_streams_decode_every_way(data, cuts):
    messages, reason = decode_all_ways(reader(), data, cuts, normalize=canon)
    assert reason is None
    assert canon(list(msgpack.Unpacker(io.BytesIO(data), raw=False, strict_map_key=False))) == messages


@fuzz_settings()
@given(mutated(streams) | st.binary(max_size=MAX_INPUT), cuts)
def test_garbage_gives_the_same_replies_and_error_every_way(data, cuts):
    decode_all_ways(reader(), data, cuts, normalize=canon)


@fuzz_settings()
@given(st.lists(st.integers(1, 300), min_size=1, max_size=12), st.integers(16, 400), cuts)
def test_the_size_bound_refuses_exactly_the_replies_longer_than_it(lengths, bound, cuts):
    stream = b"".join(msgpack.packb("x" * n) for n in lengths)
    frames, reason = decode_all_ways(reader(bound), stream, cuts, normalize=canon, every_offset=False)
    sizes = [len(msgpack.packb("x" * n)) for n in lengths]
    fits = next((i for i, size in enumerate(sizes) if size > bound), len(sizes))
    assert frames[0] == ("list", fits)
    assert (reason is None) == (fits == len(sizes))
    if reason is not None:
        assert reason == f"reply longer than {bound} bytes"


def test_pending_bytes_counts_the_reply_being_assembled():
    reply = msgpack.packb({"ack": "abc"})
    r = wire.ReplyReader()
    assert r.pending_bytes == 0
    r.feed(reply + reply[:4])
    assert r.pending_bytes == 4
    assert r.feed(reply[4:]) == [{"ack": "abc"}] and r.pending_bytes == 0
    frames, reason = feed_pieces(reader(), [reply + b"\xc1"])
    assert frames == [{"ack": "abc"}] and reason.startswith("undecodable reply")

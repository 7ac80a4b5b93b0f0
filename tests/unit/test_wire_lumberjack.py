"""The Lumberjack codec: frames whole, byte by byte, split at every offset, truncated,
oversized, garbage, nested and spread compressed frames, and the protocol doc's vectors
(``docs/protocols/lumberjack.md`` section 10)."""

from __future__ import annotations

import json
import random
import struct
import sys
import types
import zlib

import pytest

from logrouter.wire import lumberjack as lj
from logrouter.wire.errors import DecodeError


def hexbytes(text: str) -> bytes:
    return bytes.fromhex(" ".join(text.split()))


# The protocol doc's test vectors.
V1 = hexbytes("32 57 00 00 00 01")
V2 = hexbytes("32 4a 00 00 00 01 00 00 00 0f 7b 22 6d 73 67 22 3a 22 68 65 6c 6c 6f 22 7d")
V3 = hexbytes("32 41 00 00 00 01 32 41 00 00 00 00")
V4 = hexbytes(
    "31 57 00 00 00 01 "
    "31 44 00 00 00 01 00 00 00 01 00 00 00 04 6c 69 6e 65 00 00 00 02 68 69"
)
V5_ZLIB = hexbytes("78 9c 33 f2 62 60 60 60 04 62 66 17 ff 60 00 07 e0 01 67")
V6 = hexbytes(
    "32 57 00 00 00 01 "
    "32 43 00 00 00 1f "
    "78 9c 33 f2 62 60 60 60 04 62 fe 6a a5 dc e2 74 25 2b a5 8c d4 9c 9c 7c a5 5a 00 34 d8 05 a2"
)


def summarize(messages: list) -> list:
    """Decoder output in a form independent of how the input was split into feed calls:
    windows, then per window its events in order, the last ack value and completeness."""
    out: list = []
    for m in messages:
        if isinstance(m, lj.Window):
            out.append(("W", m.version, m.size, m.window, m.missing))
        else:
            if out and out[-1][0] == "E" and out[-1][1] == m.window:
                _, window, records, _, frames, invalid, _ = out.pop()
                records = records + m.records
                frames += m.frames
                invalid += m.invalid
            else:
                window, records, frames, invalid = m.window, list(m.records), m.frames, m.invalid
            out.append(("E", window, records, m.ack_seq, frames, invalid, m.complete))
    return out


def decode(chunks, **limits) -> list:
    decoder = lj.LumberjackDecoder(**limits)
    messages = []
    for chunk in chunks:
        messages += decoder.feed(chunk)
    assert decoder.buffered == 0, "bytes left over"
    return messages


def check_every_split(data: bytes, **limits) -> list:
    """Decode ``data`` whole, byte by byte and split at every offset: same result each time."""
    whole = summarize(decode([data], **limits))
    assert summarize(decode([data[i : i + 1] for i in range(len(data))], **limits)) == whole
    for cut in range(1, len(data)):
        assert summarize(decode([data[:cut], data[cut:]], **limits)) == whole, f"split at {cut}"
    return whole


def records(n: int, start: int = 0) -> list[dict]:
    return [{"message": f"event {i}", "n": i, "nested": {"a": [1, 2, {"b": None}]}} for i in range(start, start + n)]


# -- the protocol doc's vectors ------------------------------------------------------------


def test_vector_v1_v2_window_and_json_frame():
    assert lj.encode_window(1) == V1
    assert lj.encode_json(1, {"msg": "hello"}) == V2
    messages = decode([V1 + V2])
    assert messages == [
        lj.Window(version=2, size=1, window=1),
        lj.Events(version=2, window=1, records=[{"msg": "hello"}], ack_seq=1, frames=1, complete=True),
    ]


def test_vector_v3_acks():
    assert lj.encode_ack(1) + lj.encode_ack(0) == V3
    acks = lj.AckDecoder().feed(V3)
    assert acks == [lj.Ack(2, 1), lj.Ack(2, 0)]


def test_vector_v4_v1_data_frame():
    assert lj.encode_window(1, version=1) + lj.encode_data(1, {"line": "hi"}) == V4
    whole = check_every_split(V4)
    assert whole == [("W", 1, 1, 1, 0), ("E", 1, [{"line": "hi"}], 1, 1, 0, True)]


def test_vector_v5_compressed_frame_cut_short_is_an_error():
    # LS BeatsParserTest.testInvalidCompression: the C header claims 9 bytes, which cuts
    # the zlib stream; LS fails with "Insufficient bytes in compressed content".
    assert zlib.decompress(V5_ZLIB) == hexbytes("32 4a 00 00 00 01 00 00 00 03 44 4f 53")
    data = lj.encode_window(1) + b"2C" + struct.pack(">I", 9) + V5_ZLIB
    with pytest.raises(DecodeError, match="truncated zlib stream"):
        decode([data])


def test_vector_v5_with_its_real_length_is_one_invalid_event():
    # Whole, the block inflates to one J frame whose body "DOS" is not JSON: the framing
    # is intact, so the event is counted invalid (and covered by the ack) and decoding goes on.
    data = lj.encode_window(1) + b"2C" + struct.pack(">I", len(V5_ZLIB)) + V5_ZLIB + lj.encode_window(0)
    (window, events, empty) = decode([data])
    assert events.records == [] and events.invalid == 1 and events.ack_seq == 1 and events.complete
    assert "event seq 1: payload is not JSON" in events.invalid_reason
    assert empty == lj.Window(2, 0, 2)


def test_vector_v6_compressed_window():
    assert check_every_split(V6) == [("W", 2, 1, 1, 0), ("E", 1, [{"msg": "hello"}], 1, 1, 0, True)]


# -- splitting -----------------------------------------------------------------------------


def test_every_split_of_a_mixed_v2_stream():
    stream = (
        lj.encode_window_frames(records(3), compress_level=None)  # plain J frames
        + lj.encode_window_frames(records(4, 3), compress_level=6)  # one C frame
        + lj.encode_window(0)  # an empty window
        + lj.encode_window(5)  # a window spread over two C frames and a plain frame
        + lj.encode_compressed(b"".join(lj.encode_json(i + 1, r) for i, r in enumerate(records(2, 7))))
        + lj.encode_compressed(b"".join(lj.encode_json(i + 3, r) for i, r in enumerate(records(2, 9))))
        + lj.encode_json(5, {"last": True})
    )
    whole = check_every_split(stream)
    assert whole == [
        ("W", 2, 3, 1, 0),
        ("E", 1, records(3), 3, 3, 0, True),
        ("W", 2, 4, 2, 0),
        ("E", 2, records(4, 3), 4, 4, 0, True),
        ("W", 2, 0, 3, 0),
        ("W", 2, 5, 4, 0),
        ("E", 4, records(4, 7) + [{"last": True}], 5, 5, 0, True),
    ]


def test_every_split_of_a_v1_stream():
    pairs = [{"line": f"line {i}", "file": "/var/log/x", "offset": str(i * 10)} for i in range(3)]
    stream = lj.encode_window_frames(pairs, version=1, compress_level=None) + lj.encode_window_frames(
        pairs[:2], version=1, compress_level=1
    )
    assert check_every_split(stream) == [
        ("W", 1, 3, 1, 0),
        ("E", 1, pairs, 3, 3, 0, True),
        ("W", 1, 2, 2, 0),
        ("E", 2, pairs[:2], 2, 2, 0, True),
    ]


def test_events_never_span_feed_calls_and_carry_the_running_ack_value():
    frames = [lj.encode_json(i + 1, r) for i, r in enumerate(records(4))]
    decoder = lj.LumberjackDecoder()
    assert decoder.feed(lj.encode_window(4) + frames[0]) == [
        lj.Window(2, 4, 1),
        lj.Events(2, 1, records(1), ack_seq=1, frames=1),
    ]
    assert decoder.window_pending
    (second,) = decoder.feed(frames[1] + frames[2][:5])
    assert (second.records, second.ack_seq, second.complete) == (records(2)[1:], 2, False)
    assert decoder.buffered == 5
    (third,) = decoder.feed(frames[2][5:] + frames[3])
    assert (third.records, third.ack_seq, third.complete) == (records(4)[2:], 4, True)
    assert not decoder.window_pending


def test_a_large_compressed_frame_arriving_in_pieces_is_decoded_once():
    many = records(2000)
    data = lj.encode_window_frames(many)
    decoder = lj.LumberjackDecoder()
    out = []
    for i in range(0, len(data), 1000):
        out += decoder.feed(data[i : i + 1000])
    assert [type(m) for m in out] == [lj.Window, lj.Events]
    assert out[1].records == many and out[1].ack_seq == 2000


# -- windows, sequence numbers, acks -------------------------------------------------------


def test_ack_value_is_the_highest_seq_of_the_window():
    # pylogbeat and the Node v1 client keep counting across windows: ack the highest seq.
    stream = lj.encode_window(2) + lj.encode_json(11, {"a": 1}) + lj.encode_json(12, {"a": 2})
    stream += lj.encode_window(2) + lj.encode_json(9, {"a": 3}) + lj.encode_json(4, {"a": 4})
    _, first, _, second = decode([stream])
    assert (first.window, first.ack_seq, second.window, second.ack_seq) == (1, 12, 2, 9)


def test_new_window_before_the_previous_one_is_complete_reports_the_missing_events():
    stream = lj.encode_window(5) + lj.encode_json(1, {}) + lj.encode_json(2, {}) + lj.encode_window(1)
    assert decode([stream])[-1] == lj.Window(2, 1, 2, missing=3)
    # A window that received nothing is simply replaced.
    assert decode([lj.encode_window(5) + lj.encode_window(1)])[-1] == lj.Window(2, 1, 2, missing=0)


def test_data_beyond_the_window_or_before_any_window_is_accepted():
    # logstash-forwarder style: one W per connection, then D frames that keep counting.
    stream = lj.encode_data(1, {"a": "x"}) + lj.encode_window(1, version=1)
    stream += lj.encode_data(2, {"a": "y"}) + lj.encode_data(3, {"a": "z"})
    assert summarize(decode([stream])) == [
        ("E", 0, [{"a": "x"}], 1, 1, 0, False),
        ("W", 1, 1, 1, 0),
        ("E", 1, [{"a": "y"}, {"a": "z"}], 3, 2, 0, True),
    ]


def test_empty_window_and_empty_compressed_frame():
    # pylogbeat sends W 0 plus a C frame of nothing for an empty list.
    stream = lj.encode_window(0) + lj.encode_compressed(b"")
    assert decode([stream]) == [lj.Window(2, 0, 1)]


def test_w_inside_c_is_accepted_like_logstash_does():
    inner = lj.encode_window(2) + lj.encode_json(1, {"x": 1}) + lj.encode_json(2, {"x": 2})
    assert summarize(decode([lj.encode_compressed(inner)])) == [
        ("W", 2, 2, 1, 0),
        ("E", 1, [{"x": 1}, {"x": 2}], 2, 2, 0, True),
    ]


def test_nested_compressed_frames():
    inner = lj.encode_compressed(lj.encode_json(1, {"deep": 1}) + lj.encode_json(2, {"deep": 2}))
    middle = lj.encode_compressed(inner + lj.encode_json(3, {"deep": 3}))
    stream = lj.encode_window(3) + middle
    assert check_every_split(stream) == [
        ("W", 2, 3, 1, 0),
        ("E", 1, [{"deep": 1}, {"deep": 2}, {"deep": 3}], 3, 3, 0, True),
    ]


def test_nesting_is_bounded():
    frame = lj.encode_json(1, {})
    for _ in range(lj.MAX_NESTING):
        frame = lj.encode_compressed(frame)
    assert decode([lj.encode_window(1) + frame])[-1].records == [{}]
    with pytest.raises(DecodeError, match="nested more than"):
        decode([lj.encode_window(1) + lj.encode_compressed(frame)])


def test_invalid_payloads_are_counted_not_fatal():
    stream = lj.encode_window(6)
    stream += lj.encode_json(1, b'{"ok": 1}  \n')  # trailing whitespace is fine
    stream += lj.encode_json(2, b'["not", "an", "object"]')
    stream += lj.encode_json(3, b'{"a": 1} trailing')
    stream += lj.encode_json(4, b"\xff\xfe{}")
    stream += lj.encode_json(5, b"")
    stream += lj.encode_json(6, b' {"leading": "space"}')
    (_, events) = decode([stream])
    assert events.records == [{"ok": 1}, {"leading": "space"}]
    assert (events.invalid, events.frames, events.ack_seq, events.complete) == (4, 6, 6, True)
    assert events.invalid_reason == "event seq 2: payload is a JSON list, not an object"
    (_, events) = decode([lj.encode_window(1) + lj.encode_json(7, b"\xff")])
    assert events.invalid_reason == "event seq 7: payload is not valid UTF-8"


def test_v1_fields_decode_as_utf8_with_replacement():
    frame = b"1D" + struct.pack(">II", 1, 2)
    for key, value in ((b"line", b"caf\xe9"), (b"empty", b"")):
        frame += struct.pack(">I", len(key)) + key + struct.pack(">I", len(value)) + value
    (_, events) = decode([lj.encode_window(1, version=1) + frame])
    assert events.records == [{"line": "caf\ufffd", "empty": ""}]
    # Zero pairs: go-lumber accepts an empty map; so do we.
    (events,) = decode([b"1D" + struct.pack(">II", 1, 0)])
    assert events.records == [{}]


def test_unicode_survives():
    doc = {"msg": "héllo \u2603 \U0001f600", "k\u00e9y": "v"}
    (_, events) = decode([lj.encode_window_frames([doc])])
    assert events.records == [doc]


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"3W\x00\x00\x00\x01", "invalid protocol version byte 0x33"),
        (b"GET / HTTP/1.1\r\n", "invalid protocol version byte 0x47"),
        (b"\x16\x03\x01\x02\x00", "invalid protocol version byte 0x16"),  # a TLS ClientHello on a plain port
        (b"2W\x00\x00\x00\x011W\x00\x00\x00\x01", "differs from the connection's version '2'"),
        (b"2X\x00\x00\x00\x01", r"unknown frame type 0x58 \('X'\)"),
        (b"2A\x00\x00\x00\x01", r"unknown frame type 0x41 \('A'\)"),
        (b"2C\x00\x00\x00\x04abcd", "bad zlib data in compressed frame"),
        (b"2C\x00\x00\x00\x00", "truncated zlib stream"),
        (b"2C" + struct.pack(">I", len(zlib.compress(b"")) + 3) + zlib.compress(b"") + b"xyz", "3 bytes after the end"),
        (
            lj.encode_compressed(lj.encode_json(1, {"a": 1})[:-3]),
            r"compressed frame ends inside a frame \(14 bytes left over\)",
        ),
        (lj.encode_compressed(b"2"), r"ends inside a frame \(1 bytes left over\)"),
        (lj.encode_compressed(b"1W\x00\x00\x00\x01"), "differs from the connection's version '2'"),
    ],
)
def test_bad_input_raises_decode_error(data, reason):
    with pytest.raises(DecodeError, match=reason) as info:
        decode([data])
    assert info.value.fatal
    # The same error however the bytes arrive.
    with pytest.raises(DecodeError, match=reason):
        decode([data[i : i + 1] for i in range(len(data))])


def test_garbage_is_caught_at_once_not_buffered():
    decoder = lj.LumberjackDecoder()
    decoder.feed(lj.encode_window(1))
    with pytest.raises(DecodeError):
        decoder.feed(b"\x00")  # a version byte that cannot start a frame: no need to wait
    decoder = lj.LumberjackDecoder()
    with pytest.raises(DecodeError, match="unknown frame type"):
        decoder.feed(b"2x")  # nor a frame type that does not exist


@pytest.mark.parametrize("seed", range(200))
def test_random_garbage_only_ever_raises_decode_error(seed):
    rng = random.Random(seed)
    valid = lj.encode_window_frames(records(3)) + lj.encode_window_frames(records(2), compress_level=None)
    data = bytearray(valid)
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    if seed % 4 == 0:
        data = bytearray(rng.randbytes(rng.randint(1, 300)))
    decoder = lj.LumberjackDecoder(max_frame_bytes=1 << 20, max_decompressed_bytes=1 << 20)
    try:
        for i in range(0, len(data), 7):
            decoder.feed(bytes(data[i : i + 7]))
    except DecodeError as e:
        assert e.reason and e.fatal


def test_truncated_input_waits_for_more():
    data = lj.encode_window_frames(records(5), compress_level=None) + lj.encode_window_frames(records(5))
    for cut in range(len(data)):
        decoder = lj.LumberjackDecoder()
        messages = decoder.feed(data[:cut])
        got = sum(len(m.records) for m in messages if isinstance(m, lj.Events))
        assert got <= 10
        assert decoder.buffered <= cut


# -- limits --------------------------------------------------------------------------------


def test_window_size_limit():
    assert decode([lj.encode_window(10_000)]) == [lj.Window(2, 10_000, 1)]
    with pytest.raises(DecodeError, match="window size 10001 exceeds max_window_size 10000"):
        decode([lj.encode_window(10_001)])
    with pytest.raises(DecodeError, match="window size 3 exceeds max_window_size 2"):
        decode([lj.encode_compressed(lj.encode_window(3))], max_window_size=2)


def test_json_frame_size_limit_is_checked_from_the_header():
    decoder = lj.LumberjackDecoder(max_frame_bytes=100)
    decoder.feed(lj.encode_window(1))
    # Only the header has arrived: the announced size alone is refused, nothing is buffered.
    with pytest.raises(DecodeError, match="JSON frame of 101 bytes exceeds max_frame_bytes 100"):
        decoder.feed(b"2J" + struct.pack(">II", 1, 101))
    big = lj.encode_json(1, {"x": "y" * 200})
    with pytest.raises(DecodeError, match="exceeds max_frame_bytes 100"):
        decode([lj.encode_window(1) + lj.encode_compressed(big)], max_frame_bytes=100)


def test_compressed_frame_size_limit():
    with pytest.raises(DecodeError, match="compressed frame of 1000000 bytes exceeds max_frame_bytes 65536"):
        decode([b"2C" + struct.pack(">I", 1_000_000)], max_frame_bytes=65536)


def test_data_frame_limits():
    with pytest.raises(DecodeError, match="data frame with 1000 fields exceeds max_frame_bytes 100"):
        decode([b"1D" + struct.pack(">II", 1, 1000)], max_frame_bytes=100)
    frame = lj.encode_data(1, {"line": "x" * 200})
    with pytest.raises(DecodeError, match="data frame exceeds max_frame_bytes 100"):
        decode([frame[:30]], max_frame_bytes=100)  # refused from the value's length alone


def test_zip_bomb_is_stopped_at_the_limit():
    # 64 MiB of one JSON string inflates from ~64 KiB; the limit stops it after one step.
    bomb = lj.encode_compressed(b"2J" + struct.pack(">II", 1, 64 << 20) + b'"' + b" " * ((64 << 20) - 2) + b'"', 9)
    assert len(bomb) < 200_000
    with pytest.raises(DecodeError, match="inflates to more than max_decompressed_bytes 1048576"):
        decode([lj.encode_window(1) + bomb], max_decompressed_bytes=1 << 20, max_frame_bytes=128 << 20)


def test_inflated_limit_counts_nested_frames_together():
    payload = lj.encode_json(1, {"x": "y" * 3000})
    nested = lj.encode_compressed(lj.encode_compressed(payload) + lj.encode_compressed(payload))
    decode([lj.encode_window(2) + nested], max_decompressed_bytes=10_000)
    with pytest.raises(DecodeError, match="max_decompressed_bytes 6000"):
        decode([lj.encode_window(2) + nested], max_decompressed_bytes=6000)
    # The budget is per top-level C frame: two separate frames each get all of it.
    two = lj.encode_compressed(payload) + lj.encode_compressed(lj.encode_json(2, {"x": "y" * 3000}))
    decode([lj.encode_window(2) + two], max_decompressed_bytes=4000)


# -- encoders and the ack reader -----------------------------------------------------------


def test_encode_window_frames_like_beats():
    data = lj.encode_window_frames([{"a": 1}, {"b": 2}], compress_level=3)
    assert data[:6] == b"2W\x00\x00\x00\x02" and data[6:8] == b"2C"
    inner = zlib.decompress(data[12:])
    assert inner == lj.encode_json(1, {"a": 1}) + lj.encode_json(2, {"b": 2})
    plain = lj.encode_window_frames([{"a": 1}], compress_level=0, first_seq=7)
    assert plain == lj.encode_window(1) + b"2J" + struct.pack(">II", 7, 7) + b'{"a":1}'
    with pytest.raises(ValueError):
        lj.encode_ack(1, version=3)


def test_ack_decoder():
    decoder = lj.AckDecoder()
    stream = lj.encode_ack(5) + lj.encode_ack(0, version=1) + lj.encode_ack(2**32 - 1)
    got = []
    for byte in stream:
        got += decoder.feed(bytes([byte]))
    assert got == [lj.Ack(2, 5), lj.Ack(1, 0), lj.Ack(2, 2**32 - 1)]
    with pytest.raises(DecodeError, match="expected an ACK frame"):
        lj.AckDecoder().feed(lj.encode_window(1))
    with pytest.raises(DecodeError, match="invalid protocol version"):
        lj.AckDecoder().feed(b"3A\x00\x00\x00\x00")


def test_json_roundtrip_of_awkward_values():
    doc = {"n": 1.5e300, "big": 2**70, "neg": -1, "t": True, "f": False, "z": None, "s": "\x00\u2028", "l": []}
    (_, events) = decode([lj.encode_window_frames([doc])])
    assert events.records == [json.loads(json.dumps(doc))]


# -- the same result however the bytes arrive (issue #9) -----------------------------------


def decode_or_error(chunks, **limits) -> tuple[list, str | None]:
    """Every frame decoded, including those an error carries, and the error's reason."""
    decoder = lj.LumberjackDecoder(**limits)
    messages: list = []
    for chunk in chunks:
        try:
            messages += decoder.feed(chunk)
        except DecodeError as e:
            return summarize(messages + e.messages), e.reason
    return summarize(messages), None


def every_way(data: bytes, **limits) -> tuple[list, str | None]:
    whole = decode_or_error([data], **limits)
    assert decode_or_error([data[i : i + 1] for i in range(len(data))], **limits) == whole
    for cut in range(1, len(data)):
        assert decode_or_error([data[:cut], data[cut:]], **limits) == whole, f"split at {cut}"
    return whole


@pytest.mark.parametrize("data", [b"2x", b"2W\x00\x00\x00\x002A", b"1W\x00\x00\x00\x001\x00\x00"])
def test_a_partial_header_with_a_bad_type_is_refused_however_it_arrives(data):
    (reason,) = {every_way(data)[1]}
    assert reason.startswith("unknown frame type")


def test_frames_before_a_fatal_one_come_with_the_error():
    good = lj.encode_window(3) + lj.encode_json(1, {"a": 1}) + lj.encode_json(2, {"a": 2})
    decoder = lj.LumberjackDecoder()
    with pytest.raises(DecodeError, match="unknown frame type") as info:
        decoder.feed(good + b"2Z\x00\x00\x00\x00")
    assert summarize(info.value.messages) == [("W", 2, 3, 1, 0), ("E", 1, [{"a": 1}, {"a": 2}], 2, 2, 0, False)]
    assert every_way(good + b"2Z\x00\x00\x00\x00")[0] == summarize(info.value.messages)
    # An oversized J frame right after a run of good ones: the run is accounted first.
    frames, reason = every_way(good + b"2J" + struct.pack(">II", 3, 101), max_frame_bytes=100)
    assert frames[-1] == ("E", 1, [{"a": 1}, {"a": 2}], 2, 2, 0, False)
    assert reason == "JSON frame of 101 bytes exceeds max_frame_bytes 100"
    # And later calls are refused: the stream is out of sync.
    with pytest.raises(DecodeError, match="decoder already failed: unknown frame type"):
        decoder.feed(lj.encode_window(1))


def test_a_bad_compressed_frame_gives_none_of_its_frames():
    inner = lj.encode_json(1, {"in": 1}) + lj.encode_json(2, {"in": 2}) + b"2J\x00"
    data = lj.encode_window(2) + lj.encode_json(1, {"before": 0}) + lj.encode_compressed(inner)
    frames, reason = every_way(data)
    assert reason == "compressed frame ends inside a frame (3 bytes left over)"
    assert frames == [("W", 2, 2, 1, 0), ("E", 1, [{"before": 0}], 1, 1, 0, False)]
    # A window announced inside the bad frame is taken back too.
    frames, reason = every_way(lj.encode_compressed(lj.encode_window(1) + b"2?"))
    assert (frames, reason) == ([], "unknown frame type 0x3f ('?')")


def test_pending_bytes_counts_the_incomplete_frame_only():
    decoder = lj.LumberjackDecoder()
    data = lj.encode_window(2) + lj.encode_json(1, {"a": 1}) + lj.encode_data(2, {"k": "v"}, version=2)
    assert decoder.pending_bytes == 0
    decoder.feed(data[:6])
    assert decoder.pending_bytes == 0
    decoder.feed(data[6:9])
    assert decoder.pending_bytes == 3
    decoder.feed(data[9:-2])
    assert decoder.pending_bytes == len(lj.encode_data(2, {"k": "v"})) - 2  # mid-way through the D frame
    decoder.feed(data[-2:])
    assert decoder.pending_bytes == 0


# -- bounded, linear cost per frame (issue #9) ---------------------------------------------


def count_calls(name: str, fn) -> int:
    """How many times ``fn`` calls a builtin called ``name``: work, counted without a clock."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "c_call" and getattr(arg, "__name__", None) == name:
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def test_a_large_data_frame_arriving_in_many_reads_is_scanned_once():
    # Each read used to rescan the frame from its start: 48 MiB of empty pairs took minutes.
    fields = {f"k{i}": "v" for i in range(2000)}
    frame = lj.encode_data(1, fields)
    reads = [frame[i : i + 64] for i in range(0, len(frame), 64)]
    decoder = lj.LumberjackDecoder(max_data_fields=len(fields))
    out: list = []
    work = count_calls("unpack_from", lambda: [out.extend(decoder.feed(r)) for r in reads])
    assert out[-1].records == [fields]
    assert work <= 2 * len(fields) + 2 * len(reads)  # one length field each, plus a header per read


def test_data_frame_field_count_is_refused_from_the_header():
    with pytest.raises(DecodeError, match="data frame with 1025 fields exceeds max_data_fields 1024"):
        lj.LumberjackDecoder().feed(b"1D" + struct.pack(">II", 1, 1025))
    frame = lj.encode_data(1, {str(i): "" for i in range(5)})
    assert decode([frame], max_data_fields=5)[0].records == [{str(i): "" for i in range(5)}]
    with pytest.raises(DecodeError, match="exceeds max_data_fields 4"):
        decode([lj.encode_compressed(frame, version=1)], max_data_fields=4)


def test_event_size_limit():
    small = {"x": "y" * 80}
    assert decode([lj.encode_window_frames([small])], max_event_bytes=100)[1].records == [small]
    big = lj.encode_json(1, {"x": "y" * 200})
    with pytest.raises(DecodeError, match="JSON frame of 208 bytes exceeds max_event_bytes 100"):
        decode([big[:10]], max_event_bytes=100)  # from the header alone
    with pytest.raises(DecodeError, match="exceeds max_event_bytes 100"):
        decode([lj.encode_compressed(big)], max_event_bytes=100)
    with pytest.raises(DecodeError, match="data frame exceeds max_event_bytes 100"):
        decode([lj.encode_data(1, {"line": "x" * 200})[:30]], max_event_bytes=100)
    # The smaller of the two limits applies, and is the one named.
    with pytest.raises(DecodeError, match="exceeds max_frame_bytes 50"):
        decode([big], max_event_bytes=100, max_frame_bytes=50)


class _CountingInflater:
    """A zlib decompressor that adds up the input bytes it is handed."""

    def __init__(self, counts: list[int]) -> None:
        self._inner = zlib.decompressobj()
        self._counts = counts

    def decompress(self, data, max_length=0):
        self._counts.append(len(data))
        return self._inner.decompress(data, max_length)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_ack_decoder_refuses_at_the_bad_byte_and_keeps_earlier_acks():
    for data, reason in ((lj.encode_ack(7) + b"3", "invalid protocol version byte 0x33"), (lj.encode_ack(7) + b"2W", "expected an ACK frame")):
        for pieces in ([data], [data[:6], data[6:]]):
            decoder = lj.AckDecoder()
            got = []
            with pytest.raises(DecodeError, match=reason) as info:
                for piece in pieces:
                    got += decoder.feed(piece)
            assert got + info.value.messages == [lj.Ack(2, 7)]
    decoder = lj.AckDecoder()
    assert decoder.feed(lj.encode_ack(1) + b"2A\x00") == [lj.Ack(2, 1)] and decoder.pending_bytes == 3
    assert decoder.feed(b"\x00\x00\x02") == [lj.Ack(2, 2)] and decoder.pending_bytes == 0


def test_a_compressed_frame_holds_at_most_one_window_of_frames():
    # 6-byte W frames or 12-byte {} events inflate from a tiny payload into millions of
    # objects: a C frame is refused past one window of frames (and the W of it).
    window = lj.encode_window(3) + b"".join(lj.encode_json(i + 1, {}) for i in range(3))
    assert summarize(decode([lj.encode_compressed(window)], max_window_size=3))[-1][2] == [{}] * 3
    with pytest.raises(DecodeError, match=r"compressed frame holds more than 4 frames \(max_window_size 3 and a W frame\)"):
        decode([lj.encode_compressed(window + lj.encode_json(4, {}))], max_window_size=3)
    with pytest.raises(DecodeError, match="holds more than 4 frames"):
        decode([lj.encode_compressed(lj.encode_window(0) * 5)], max_window_size=3)
    nested = lj.encode_compressed(lj.encode_json(1, {}) + lj.encode_compressed(lj.encode_json(2, {}) * 2))
    with pytest.raises(DecodeError, match="holds more than 2 frames"):  # the nested C frame counts too
        decode([lj.encode_compressed(nested)], max_window_size=1)
    # Outside C frames, the count does not apply: plain frames arrive at the network's pace.
    plain = lj.encode_window(1) + lj.encode_json(1, {}) * 10
    assert summarize(decode([plain], max_window_size=1))[-1][4] == 10


def test_compressed_frames_go_through_the_shared_bounded_inflate(monkeypatch):
    # The C frame is inflated by logrouter.wire.inflate, which hands zlib the payload in
    # slices (each byte once) and stops one byte past the budget.
    from logrouter.wire import inflate as inflate_module

    pad = random.Random(9).randbytes(1 << 19).hex()
    frame = lj.encode_compressed(b"".join(lj.encode_json(i + 1, {"pad": pad[i:]}) for i in range(8)), 1)
    counts: list[int] = []
    monkeypatch.setattr(
        inflate_module,
        "zlib",
        types.SimpleNamespace(decompressobj=lambda *args: _CountingInflater(counts), error=zlib.error),
    )
    (events,) = decode([frame])
    assert len(events.records) == 8 and counts and sum(counts) <= 2 * len(frame)
    with pytest.raises(DecodeError, match="inflates to more than max_decompressed_bytes 1000000"):
        decode([frame], max_decompressed_bytes=1_000_000, max_frame_bytes=64 << 20)

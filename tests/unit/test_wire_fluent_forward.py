"""Tests for the pure Fluentd forward codec (logrouter.wire.fluent_forward).

Every frame is decoded whole, byte by byte and split at every offset, and the results
must agree. Vectors F1/F2/F3/F5 are listed in docs/protocols/fluent_forward.md section 12.

Measured speed (ForwardDecoder.feed of one whole message, best of 1500 runs, 2-core VM,
CPython 3.11, msgpack C extension), 1000 events of ~90 bytes each:
  out_forward PackedForward (str32 blob, EventTime)   ~1.45 us/event
  same with integer-second times                     ~0.95 us/event
  Fluent Bit gzip PackedForward (bin blob, EventTime) ~1.35 us/event
  Fluent Bit Forward mode (EventTime)                 ~1.2 us/event
About 0.5 us/event is the ext hook call per EventTime, and ~0.35 us/event the
surrogateescape decode + re-encode of a str32 blob (binary data inside a msgpack str).
"""

from __future__ import annotations

import gzip
import json
import struct

import msgpack
import pytest

from logrouter.wire.errors import DecodeError
from logrouter.wire.fluent_forward import (
    DeferredMessage,
    EventMessage,
    EventNanos,
    ForwardDecodeError,
    ForwardDecoder,
    Heartbeat,
    encode_ack,
)
from fixtures.forward_encode import decode_ack, encode_event_time, encode_forward, encode_message, encode_packed_forward

NS = 1_000_000_000
NOW_NS = 1_700_000_000_123_456_789
T0 = 1441588984  # the protocol doc's example time, in seconds

F1 = bytes.fromhex("93 a8 74 61 67 2e 6e 61 6d 65 ce 55 ec e6 f8 81 a7 6d 65 73 73 61 67 65 a3 62 61 72")
F2 = bytes.fromhex("d7 00 55 ec e6 f8 07 5b cd 15")
F3 = bytes.fromhex(
    "93 a8 74 61 67 2e 6e 61 6d 65"
    "db 00 00 00 13 92 ce 55 ec e6 f8 81 a7 6d 65 73 73 61 67 65 a3 66 6f 6f"
    "83 a4 73 69 7a 65 01 aa 63 6f 6d 70 72 65 73 73 65 64 a4 74 65 78 74"
    "a5 63 68 75 6e 6b b9 70 38 6e 39 67 6d 78 54 51 56 43 38 2f 6e 68 32 77 6c 4b 4b 65 51 3d 3d 0a"
)
F3_ACK = bytes.fromhex(
    "81 a3 61 63 6b b9 70 38 6e 39 67 6d 78 54 51 56 43 38 2f 6e 68 32 77 6c 4b 4b 65 51 3d 3d 0a"
)
F3_CHUNK = b"p8n9gmxTQVC8/nh2wlKKeQ==\n"
F5 = b"\xc0"

TAG_NAME = b"\xa8tag.name"  # msgpack fixstr "tag.name"


# -- helpers -----------------------------------------------------------------------------


def new_decoder(**limits: int) -> ForwardDecoder:
    return ForwardDecoder(now_ns=lambda: NOW_NS, **limits)


def feed_whole(data: bytes, **limits: int) -> list:
    return new_decoder(**limits).feed(data)


def feed_bytewise(data: bytes, **limits: int) -> list:
    decoder = new_decoder(**limits)
    out = []
    for i in range(len(data)):
        out += decoder.feed(data[i : i + 1])
    return out


def feed_split(data: bytes, at: int, **limits: int) -> list:
    decoder = new_decoder(**limits)
    return decoder.feed(data[:at]) + decoder.feed(data[at:])


def feeding_ways(data: bytes, **limits: int):
    """(name, thunk) for every way a test feeds ``data``."""
    yield "whole", lambda: feed_whole(data, **limits)
    yield "bytewise", lambda: feed_bytewise(data, **limits)
    for at in range(len(data) + 1):
        yield f"split at {at}", lambda at=at: feed_split(data, at, **limits)


def decode_every_way(data: bytes, **limits: int) -> list:
    """Decode ``data`` every way; all must agree. Returns the messages."""
    expected = feed_whole(data, **limits)
    for name, decode in feeding_ways(data, **limits):
        assert decode() == expected, name
    return expected


def assert_fatal_every_way(data: bytes, reason_part: str, **limits: int) -> None:
    for name, decode in feeding_ways(data, **limits):
        with pytest.raises(ForwardDecodeError) as info:
            decode()
        assert info.value.fatal, name
        assert reason_part in info.value.reason, (name, info.value.reason)


def only(messages: list) -> EventMessage:
    assert len(messages) == 1
    return messages[0]


def packed_message(tag: str, blob: bytes | str, options: dict | None = None) -> bytes:
    """A PackedForward message around a ready-made blob (bytes -> bin, str -> str)."""
    return msgpack.packb([tag, blob] if options is None else [tag, blob, options])


def entries_blob(*entries) -> bytes:
    return b"".join(msgpack.packb(entry) for entry in entries)


# -- test vectors ------------------------------------------------------------------------


def test_f1_message_mode():
    message = only(decode_every_way(F1))
    assert message == EventMessage(
        tag="tag.name",
        events=[(T0 * NS, {"message": "bar"})],
        chunk=None,
        options={},
        invalid=0,
        size_bytes=len(F1),
    )
    assert type(message.events[0][0]) is int


def test_f1_is_what_encode_message_writes_with_integer_times():
    assert encode_message("tag.name", T0 * NS, {"message": "bar"}, time_as_integer=True) == F1


def test_f2_event_time_fixext8():
    data = b"\x93" + TAG_NAME + F2 + b"\x81\xa1k\xa1v"
    message = only(decode_every_way(data))
    assert message.events == [(T0 * NS + 123456789, {"k": "v"})]
    assert type(message.events[0][0]) is int  # not the EventNanos marker type


def test_f2_is_what_encode_event_time_writes():
    assert msgpack.packb(encode_event_time(T0 * NS + 123456789)) == F2


def test_event_time_ext8_form():
    ext8 = b"\xc7\x08\x00" + F2[2:]
    data = b"\x93" + TAG_NAME + ext8 + b"\x81\xa1k\xa1v"
    assert only(decode_every_way(data)).events == [(T0 * NS + 123456789, {"k": "v"})]


def test_f3_out_forward_packed_forward_and_its_ack():
    message = only(decode_every_way(F3))
    assert message.tag == "tag.name"
    assert message.events == [(T0 * NS, {"message": "foo"})]
    assert message.chunk == F3_CHUNK
    assert message.options == {"size": 1, "compressed": "text", "chunk": F3_CHUNK.decode()}
    assert message.size_bytes == len(F3)
    assert encode_ack(message.chunk) == F3_ACK
    assert decode_ack(F3_ACK) == F3_CHUNK


def test_f3_is_what_encode_packed_forward_writes():
    options = {"size": 1, "compressed": "text", "chunk": F3_CHUNK.decode()}
    events = [(T0 * NS, {"message": "foo"})]
    assert encode_packed_forward("tag.name", events, options, time_as_integer=True) == F3


def test_f5_nil_is_a_heartbeat():
    assert decode_every_way(F5) == [Heartbeat()]
    assert decode_every_way(F5 + F1 + F5) == [Heartbeat(), feed_whole(F1)[0], Heartbeat()]


# -- carrier modes -----------------------------------------------------------------------


def test_forward_mode_round_trip():
    events = [(T0 * NS + i, {"n": i, "msg": "x" * i}) for i in range(5)]
    data = encode_forward("app.web", events, {"chunk": "0123456789abcdef0123456789abcdef", "size": 5})
    message = only(decode_every_way(data))
    assert message.tag == "app.web"
    assert message.events == events
    assert message.chunk == b"0123456789abcdef0123456789abcdef"
    assert message.invalid == 0


def test_forward_mode_without_options():
    data = encode_forward("t", [(T0 * NS, {"a": 1})])
    assert data[0] == 0x92
    message = only(decode_every_way(data))
    assert (message.chunk, message.options) == (None, {})


def test_message_mode_with_options():
    data = encode_message("t", T0 * NS + 5, {"a": 1}, {"chunk": "c1"})
    message = only(decode_every_way(data))
    assert message.events == [(T0 * NS + 5, {"a": 1})]
    assert message.chunk == b"c1"


def test_packed_forward_str32_blob_with_non_utf8_bytes():
    events = [
        (T0 * NS + 987654321, {"raw": b"\xff\xfe\x80", "text": "h\u00e9llo"}),
        (T0 * NS + 1, {"level": "info"}),
    ]
    data = encode_packed_forward("t", events, {"size": 2, "compressed": "text"})
    assert data[1 + 2] == 0xDB  # after 0x93 and fixstr "t": str32 like out_forward
    blob = data[8 : 8 + int.from_bytes(data[4:8], "big")]
    with pytest.raises(UnicodeDecodeError):
        blob.decode("utf-8")
    assert only(decode_every_way(data)).events == events


def test_packed_forward_bin_blob():
    events = [(T0 * NS + 7, {"k": "v"}), (T0 * NS + 8, {"k": "w"})]
    data = encode_packed_forward("t", events, blob_as_bin=True)
    assert data[:3] == b"\x92\xa1t" and data[3] in (0xC4, 0xC5, 0xC6)
    assert only(decode_every_way(data)).events == events


def test_several_messages_in_one_feed():
    forward = encode_forward("fw", [(T0 * NS, {"a": 1})])
    messages = decode_every_way(F1 + F3 + F5 + forward + F1)
    kinds = [type(m).__name__ for m in messages]
    assert kinds == ["EventMessage", "EventMessage", "Heartbeat", "EventMessage", "EventMessage"]
    tags = [m.tag for m in messages if isinstance(m, EventMessage)]
    assert tags == ["tag.name", "tag.name", "fw", "tag.name"]


def test_non_minimal_msgpack_widths_from_fluent_bit():
    # array32 top level, str8 tag, map16 options holding one key, array16 entries
    data = (
        b"\xdd\x00\x00\x00\x03"
        + b"\xd9\x01t"
        + b"\xdc\x00\x01" + b"\x92" + F2 + b"\x81\xa1k\xa1v"
        + b"\xde\x00\x01\xa5chunk\xa2id"
    )
    message = only(decode_every_way(data))
    assert message.events == [(T0 * NS + 123456789, {"k": "v"})]
    assert message.chunk == b"id"


def test_bin_tag_is_accepted():
    data = msgpack.packb([b"bin.tag", T0, {"a": 1}])
    assert only(decode_every_way(data)).tag == "bin.tag"


# -- compression -------------------------------------------------------------------------


EVENTS_A = [(T0 * NS + i, {"seq": i, "message": "alpha " * 3}) for i in range(3)]
EVENTS_B = [(T0 * NS + 100 + i, {"seq": 100 + i, "message": "beta"}) for i in range(2)]


def raw_entries(events) -> bytes:
    return entries_blob(*([encode_event_time(t), record] for t, record in events))


def test_gzip_with_two_concatenated_members():
    blob = gzip.compress(raw_entries(EVENTS_A)) + gzip.compress(raw_entries(EVENTS_B))
    data = packed_message("t", blob, {"chunk": "abc", "size": 5, "compressed": "gzip"})
    message = only(decode_every_way(data))
    assert message.events == EVENTS_A + EVENTS_B
    assert message.chunk == b"abc"


def test_gzip_round_trip_through_encoder():
    data = encode_packed_forward("t", EVENTS_A, compressed="gzip")
    message = only(decode_every_way(data))
    assert message.events == EVENTS_A
    assert message.options == {"compressed": "gzip"}


def test_zstd_with_two_frames():
    zstandard = pytest.importorskip("zstandard", reason="zstandard is not importable; zstd not tested")
    compressor = zstandard.ZstdCompressor()
    blob = compressor.compress(raw_entries(EVENTS_A)) + compressor.compress(raw_entries(EVENTS_B))
    data = packed_message("t", blob, {"compressed": "zstd"})
    assert only(decode_every_way(data)).events == EVENTS_A + EVENTS_B
    round_trip = encode_packed_forward("t", EVENTS_B, compressed="zstd")
    assert only(feed_whole(round_trip)).events == EVENTS_B


def test_decompressed_size_exactly_at_the_limit_is_accepted():
    entries = raw_entries(EVENTS_A)
    data = packed_message("t", gzip.compress(entries), {"compressed": "gzip"})
    assert only(feed_whole(data, max_decompressed_bytes=len(entries))).events == EVENTS_A
    with pytest.raises(ForwardDecodeError, match="max_decompressed_bytes"):
        feed_whole(data, max_decompressed_bytes=len(entries) - 1)


def test_gzip_bomb_is_fatal():
    bomb = gzip.compress(b"\x00" * (8 << 20))  # 8 MiB of zeros in ~8 KiB
    data = packed_message("t", bomb, {"compressed": "gzip"})
    with pytest.raises(ForwardDecodeError, match="max_decompressed_bytes") as info:
        feed_whole(data, max_decompressed_bytes=64 * 1024)
    assert info.value.fatal


def test_zstd_bomb_is_fatal():
    zstandard = pytest.importorskip("zstandard", reason="zstandard is not importable; zstd not tested")
    bomb = zstandard.ZstdCompressor().compress(b"\x00" * (8 << 20))
    data = packed_message("t", bomb, {"compressed": "zstd"})
    with pytest.raises(ForwardDecodeError, match="max_decompressed_bytes") as info:
        feed_whole(data, max_decompressed_bytes=64 * 1024)
    assert info.value.fatal


def test_decompression_limit_is_checked_every_way():
    data = packed_message("t", gzip.compress(b"\x00" * 5000), {"compressed": "gzip"})
    assert_fatal_every_way(data, "max_decompressed_bytes", max_decompressed_bytes=1000)


def test_unknown_compression_is_fatal_and_named():
    data = packed_message("t", raw_entries(EVENTS_A), {"compressed": "lz4"})
    assert_fatal_every_way(data, "'lz4'")


def test_bad_gzip_is_fatal():
    data = packed_message("t", b"this is not gzip", {"compressed": "gzip"})
    assert_fatal_every_way(data, "bad gzip")


def test_truncated_gzip_is_fatal():
    blob = gzip.compress(raw_entries(EVENTS_A))[:-6]
    data = packed_message("t", blob, {"compressed": "gzip"})
    assert_fatal_every_way(data, "bad gzip")


# -- times -------------------------------------------------------------------------------


def message_with_time(time_bytes: bytes) -> bytes:
    return b"\x93\xa1t" + time_bytes + b"\x81\xa1k\xa1v"


def test_msgpack_timestamp_ext_minus_one():
    data = msgpack.packb(["t", msgpack.Timestamp(T0, 42), {"k": "v"}])
    assert b"\xd7\xff" in data
    assert only(decode_every_way(data)).events == [(T0 * NS + 42, {"k": "v"})]


def test_float_time_is_accepted_as_seconds():
    data = msgpack.packb(["t", T0 + 0.5, {"k": "v"}])
    assert only(decode_every_way(data)).events == [(T0 * NS + 500_000_000, {"k": "v"})]


def test_fluent_bit_time_with_metadata():
    entries = [
        [[encode_event_time(T0 * NS + 3), {"otlp": {"severity": 9}}], {"k": "v"}],
        [[T0, {}], {"k": "w"}],
    ]
    forward = msgpack.packb(["t", entries])
    packed = packed_message("t", entries_blob(*entries))
    expected = [(T0 * NS + 3, {"k": "v"}), (T0 * NS, {"k": "w"})]
    assert only(decode_every_way(forward)).events == expected
    assert only(decode_every_way(packed)).events == expected


def test_time_zero_means_now_with_one_clock_read_per_message():
    reads = []

    def clock() -> int:
        reads.append(1)
        return NOW_NS

    decoder = ForwardDecoder(now_ns=clock)
    entries = [[0, {"a": 1}], [encode_event_time(0), {"a": 2}], [T0, {"a": 3}]]
    messages = decoder.feed(msgpack.packb(["t", entries]) + msgpack.packb(["t", 0, {"a": 4}]))
    assert messages[0].events == [(NOW_NS, {"a": 1}), (NOW_NS, {"a": 2}), (T0 * NS, {"a": 3})]
    assert messages[1].events == [(NOW_NS, {"a": 4})]
    assert len(reads) == 2


def test_event_time_survives_inside_record_values_as_an_int():
    data = msgpack.packb(["t", T0, {"seen": encode_event_time(T0 * NS + 1)}])
    (_, record), = only(feed_whole(data)).events
    assert record["seen"] == T0 * NS + 1 and isinstance(record["seen"], EventNanos)


# -- invalid events ----------------------------------------------------------------------


def test_invalid_events_are_counted_and_the_rest_kept():
    good = [encode_event_time(T0 * NS), {"ok": 1}]
    entries = [
        good,
        [T0, "not a map"],
        ["yesterday", {"bad": "time"}],
        [True, {"bad": "bool time"}],
        [None, {"bad": "nil time"}],
        [[], {"bad": "empty time array"}],
        [msgpack.ExtType(0, b"\x00" * 4), {"bad": "short EventTime"}],
        [T0],
        [T0, {}, "extra"],
        "not an entry",
        42,
        [T0, {"ok": 2}],
    ]
    expected = [(T0 * NS, {"ok": 1}), (T0 * NS, {"ok": 2})]
    forward = msgpack.packb(["t", entries, {"chunk": "c"}])
    packed = packed_message("t", entries_blob(*entries), {"chunk": "c"})
    for data in (forward, packed):
        message = only(decode_every_way(data))
        assert message.events == expected
        assert message.invalid == len(entries) - 2
        assert message.chunk == b"c"  # still acked, as fluentd does


def test_invalid_message_mode_event_is_counted_and_still_acked():
    data = msgpack.packb(["t", T0, "not a map", {"chunk": "c"}])
    message = only(decode_every_way(data))
    assert (message.events, message.invalid, message.chunk) == ([], 1, b"c")


def test_record_keys_become_str():
    data = msgpack.packb(["t", T0, {b"bin\xff": 1, 2: "two", "s": 3}])
    (_, record), = only(decode_every_way(data)).events
    assert record == {"bin\udcff": 1, "2": "two", "s": 3}


# -- fatal input -------------------------------------------------------------------------


def test_decode_errors_are_the_shared_decode_error():
    assert issubclass(ForwardDecodeError, DecodeError)


@pytest.mark.parametrize(
    "top_level",
    [{"tag": "t"}, 5, "t", True, 1.5],
    ids=["map", "int", "str", "bool", "float"],
)
def test_non_array_top_level_is_fatal(top_level):
    assert_fatal_every_way(msgpack.packb(top_level), "not an array")


@pytest.mark.parametrize("tag", [5, None, ["t"], {"t": 1}])
def test_non_string_tag_is_fatal(tag):
    assert_fatal_every_way(msgpack.packb([tag, T0, {"k": "v"}]), "tag is not a string")


@pytest.mark.parametrize(
    "message",
    [[], ["t"], ["t", T0], ["t", T0, {}, {}, {}], ["t", [], {}, {}]],
    ids=["empty", "tag only", "no record", "too long", "forward too long"],
)
def test_wrong_message_shape_is_fatal(message):
    assert_fatal_every_way(msgpack.packb(message), "message")


def test_options_must_be_a_map_and_chunk_a_string():
    assert_fatal_every_way(msgpack.packb(["t", [], 5]), "options is not a map")
    assert_fatal_every_way(msgpack.packb(["t", [], {"chunk": 5}]), "chunk option is not a string")


def test_garbage_bytes_are_fatal():
    assert_fatal_every_way(b"\xc1", "invalid msgpack")
    assert_fatal_every_way(b"\x92\xa1t\xc1", "invalid msgpack")


def test_messages_before_garbage_travel_with_the_error():
    decoder = new_decoder()
    with pytest.raises(ForwardDecodeError) as info:
        decoder.feed(F1 + b"\xc1")
    assert info.value.messages == feed_whole(F1)
    with pytest.raises(ForwardDecodeError, match="already failed"):
        decoder.feed(F1)


def test_truncated_input_waits_for_more():
    decoder = new_decoder()
    assert decoder.feed(F3[:-1]) == []
    assert only(decoder.feed(F3[-1:])).chunk == F3_CHUNK


def test_truncated_packed_forward_blob_is_fatal():
    blob = raw_entries(EVENTS_A)
    for cut in (1, 5, len(blob) - 1):
        assert_fatal_every_way(packed_message("t", blob[:cut]), "truncated")


def test_garbage_packed_forward_blob_is_fatal():
    assert_fatal_every_way(packed_message("t", raw_entries(EVENTS_A) + b"\xc1"), "not valid msgpack")


# -- size limits -------------------------------------------------------------------------


def test_oversize_message_of_many_small_items_is_fatal():
    data = msgpack.packb(["t", [[T0, {"i": i}] for i in range(40)]])
    assert len(data) > 200
    assert_fatal_every_way(data, "exceeds max_message_bytes", max_message_bytes=200)


def test_oversize_message_with_one_long_string_is_fatal():
    data = msgpack.packb(["t", T0, {"msg": "x" * 500}])
    assert_fatal_every_way(data, "exceeds max_message_bytes", max_message_bytes=200)


def test_oversize_message_is_caught_before_it_is_complete():
    # array16 of 90 arrays, only 20 sent: no single header is over the limit
    unfinished = b"\xdc\x00\x5a" + (b"\x9f" + b"\x01" * 15) * 20
    decoder = new_decoder(max_message_bytes=100)
    with pytest.raises(ForwardDecodeError, match="max_message_bytes"):
        decoder.feed(unfinished)
    bytewise = new_decoder(max_message_bytes=100)
    with pytest.raises(ForwardDecodeError, match="max_message_bytes"):
        for i in range(len(unfinished)):
            bytewise.feed(unfinished[i : i + 1])
    assert i == 100  # the 101st byte of the message is refused


def test_oversize_blob_is_refused_without_waiting_for_all_of_it():
    header = b"\x93\xa1t\xdb\x00\x01\x00\x00"  # str32 blob of 64 KiB announced
    decoder = new_decoder(max_message_bytes=100)
    assert decoder.feed(header) == []
    with pytest.raises(ForwardDecodeError, match="max_message_bytes"):
        decoder.feed(b"x" * 200)


def test_oversize_array_header_is_refused_at_once():
    # msgpack preallocates a list for an array header, so it checks the count up front
    assert_fatal_every_way(b"\xdd\x00\x01\x00\x00", "exceeds max_message_bytes", max_message_bytes=100)


def test_message_exactly_at_the_limit_is_accepted():
    assert only(decode_every_way(F3, max_message_bytes=len(F3))).chunk == F3_CHUNK
    assert_fatal_every_way(F3, "max_message_bytes", max_message_bytes=len(F3) - 1)


def test_many_small_messages_beyond_the_limit_in_one_feed_are_fine():
    data = F1 * 50  # 1400 bytes, each message 28
    decoder = new_decoder(max_message_bytes=len(F1))
    assert len(decoder.feed(data)) == 50
    assert len(decoder.feed(F1[:10])) == 0
    assert len(decoder.feed(F1[10:] + F1 * 3)) == 4


# -- JSON mode ---------------------------------------------------------------------------


JSON_MESSAGE = b'["tag.name", 1441588984, {"k": "v"}]'
# brackets, an escaped quote and backslash inside strings; multi-byte UTF-8; a chunk with \n
JSON_FORWARD = (
    b'["app", [[1441588984, {"a": "[]{}\\"\\\\"}], [1441588985, {"b": "\xc3\xa9\xe2\x82\xac"}]],'
    b' {"chunk": "p8n9gmxTQVC8/nh2wlKKeQ==\\n"}]'
)


def test_json_message_mode():
    decoder = new_decoder()
    message = only(decoder.feed(JSON_MESSAGE))
    assert decoder.json_mode
    assert message.events == [(T0 * NS, {"k": "v"})]
    assert message.chunk is None


def test_json_forward_mode_split_every_way_with_ack():
    data = JSON_FORWARD + b"\n  " + JSON_MESSAGE + b"\r\n" + JSON_FORWARD
    messages = decode_every_way(data)
    assert len(messages) == 3
    forward = messages[0]
    assert forward.tag == "app"
    assert forward.events == [(T0 * NS, {"a": '[]{}"\\'}), ((T0 + 1) * NS, {"b": "\u00e9\u20ac"})]
    assert forward.chunk == F3_CHUNK
    ack = encode_ack(forward.chunk, json_mode=True)
    assert ack == b'{"ack":"p8n9gmxTQVC8/nh2wlKKeQ==\\n"}'
    assert decode_ack(ack) == F3_CHUNK


def test_json_mode_is_chosen_by_the_first_byte_only():
    decoder = new_decoder()
    assert decoder.feed(b"") == [] and not decoder.json_mode
    decoder.feed(b"[")
    assert decoder.json_mode
    msgpack_decoder = new_decoder()
    msgpack_decoder.feed(F1)
    assert not msgpack_decoder.json_mode


def test_json_garbage_is_fatal():
    assert_fatal_every_way(b'["t", 1, {"k": v}]', "invalid JSON")
    assert_fatal_every_way(JSON_MESSAGE + b" nonsense", "invalid JSON stream")
    assert_fatal_every_way(b'{"tag": "t"}', "not an array")


def test_json_oversize_is_fatal():
    data = b'["t", 1, {"k": "' + b"x" * 300 + b'"}]'
    assert_fatal_every_way(data, "max_message_bytes", max_message_bytes=100)


def test_json_non_utf8_chunk_round_trips():
    chunk = b"id-\xff"
    message = only(feed_whole(b'["t", 1, {}, {"chunk": "id-\xff"}]'))
    assert message.chunk == chunk
    assert decode_ack(encode_ack(chunk, json_mode=True)) == chunk


# -- chunk echo --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "chunk",
    [
        b"p8n9gmxTQVC8/nh2wlKKeQ==\n",  # Ruby Base64.encode64 of out_forward's chunk id
        b"0f1e2d3c4b5a69788796a5b4c3d2e1f0",  # Fluent Bit: 32 hex chars
        b"\x00\xffraw\x80",  # bytes that are not UTF-8 must survive too
        b"c" * 300,  # a str16 header
    ],
    ids=["base64-newline", "fluent-bit-hex", "non-utf8", "long"],
)
def test_chunk_is_echoed_byte_exact(chunk):
    as_str = chunk.decode("utf-8", "surrogateescape")
    wire_str = b"\x93\xa1t\x90" + msgpack.Packer(unicode_errors="surrogateescape").pack({"chunk": as_str})
    wire_bin = msgpack.packb(["t", [], {"chunk": chunk}])
    for data in (wire_str, wire_bin):
        message = only(decode_every_way(data))
        assert message.chunk == chunk
        ack = encode_ack(message.chunk)
        assert ack[:5] == b"\x81\xa3ack"
        assert ack.endswith(chunk)
        assert decode_ack(ack) == chunk


def test_ack_is_a_msgpack_map_with_a_str():
    assert msgpack.unpackb(encode_ack(F3_CHUNK)) == {"ack": F3_CHUNK.decode()}


def test_decode_ack_rejects_other_replies():
    with pytest.raises(ForwardDecodeError):
        decode_ack(msgpack.packb({"nack": "x"}))
    with pytest.raises(ForwardDecodeError):
        decode_ack(b"\xc1")
    with pytest.raises(ForwardDecodeError):
        decode_ack(json.dumps(["ack"]).encode())


# -- encoders ----------------------------------------------------------------------------


def test_encoders_write_event_time_with_nanoseconds():
    data = encode_message("t", T0 * NS + 123456789, {"k": "v"})
    assert F2 in data
    packed = encode_packed_forward("t", [(T0 * NS + 123456789, {"k": "v"})])
    assert F2 in packed
    assert struct.unpack(">II", F2[2:]) == (T0, 123456789)


# -- time range (issue #9: 5) ------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_time",
    [
        1e308,
        -1e308,
        float("inf"),
        9.3e9,
        2**64 - 1,
        2**63,
        -(2**63),
        9_223_372_037,
        -9_223_372_037,
        msgpack.Timestamp(2**40, 0),
        [2**64 - 1, {}],
    ],
    ids=str,
)
def test_time_outside_int64_nanoseconds_is_an_invalid_event(bad_time):
    entries = [[T0, {"ok": 1}], [bad_time, {"bad": 1}], [T0, {"ok": 2}]]
    for data in (msgpack.packb(["t", entries]), packed_message("t", entries_blob(*entries))):
        message = only(decode_every_way(data))
        assert message.events == [(T0 * NS, {"ok": 1}), (T0 * NS, {"ok": 2})]
        assert message.invalid == 1
    if type(bad_time) is not list:  # a list there would make it Forward mode
        message = only(feed_whole(msgpack.packb(["t", bad_time, {"bad": 1}, {"chunk": "c"}])))
        assert (message.events, message.invalid, message.chunk) == ([], 1, b"c")


@pytest.mark.parametrize(
    "time, time_ns",
    [
        (9_223_372_036, 9_223_372_036 * NS),
        (-9_223_372_036, -9_223_372_036 * NS),
        (-1, -NS),  # before 1970: a real date, kept
        (9.2e9, 9_200_000_000 * NS),
        (msgpack.Timestamp(-5, 0), -5 * NS),
    ],
    ids=str,
)
def test_times_at_the_edges_of_the_range_are_kept(time, time_ns):
    data = msgpack.packb(["t", [[time, {"k": "v"}]]])
    assert only(decode_every_way(data)).events == [(time_ns, {"k": "v"})]


def test_json_integers_msgpack_cannot_hold_are_kept_as_text():
    data = (
        b'["t", 1441588984, {"small": 5, "u64": 18446744073709551615, "i64": -9223372036854775808,'
        b' "big": 18446744073709551616, "long": ' + b"7" * 5000 + b"}]"
    )
    (_, record), = only(feed_whole(data)).events
    assert record["small"] == 5 and record["u64"] == 2**64 - 1 and record["i64"] == -(2**63)
    assert record["big"] == "18446744073709551616" and record["long"] == "7" * 5000
    msgpack.packb(record)  # what the spool does with it


def test_json_lone_surrogate_escapes_become_replacement_characters():
    data = b'["t\\ud800", 1, {"k\\udfff": ["\\ud83d\\ude00 \\ud800x", {"n": "\\udc80"}]}, {"chunk": "c\\udbff"}]'
    message = only(decode_every_way(data))
    assert message.tag == "t\ufffd" and message.chunk == "c\ufffd".encode()
    # a pair is one character; U+DC80 stands for a byte that was not UTF-8 and is kept
    assert message.events[0][1] == {"k\ufffd": ["\U0001f600 \ufffdx", {"n": "\udc80"}]}
    msgpack.packb(message.events, unicode_errors="surrogateescape")  # what the spool does


def test_json_nested_too_deep_is_a_decode_error():
    data = b'["t", 1, {"k": ' + b"[" * 3000 + b"]" * 3000 + b"}]"
    for decode in (lambda: feed_whole(data), lambda: feed_split(data, 3000)):
        with pytest.raises(ForwardDecodeError, match="invalid JSON: nested too deep"):
            decode()


# -- error reasons (issue #9: 10) --------------------------------------------------------


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\xc1", "invalid msgpack: FormatError (unexpected byte 0xc1 at offset 0)"),
        (F1 + b"\x92\xa1t\xc1", f"invalid msgpack: FormatError (unexpected byte 0xc1 at offset {len(F1) + 3})"),
        (b"\x91" * 1100, "invalid msgpack: StackError (nested more than 1024 levels deep)"),
        (b"\x81\x92\x01\x02\x01", "invalid msgpack: unhashable type: 'list'"),
        (
            packed_message("t", entries_blob([T0, {"k": "v"}]) + b"\xc1"),
            "PackedForward entries are not valid msgpack: FormatError (unexpected byte 0xc1 at offset 11)",
        ),
    ],
    ids=["c1", "c1-after-a-message", "too-deep", "list-key", "packed-c1"],
)
def test_every_decode_error_says_what_was_wrong(data, reason):
    for name, decode in feeding_ways(data):
        with pytest.raises(ForwardDecodeError) as info:
            decode()
        assert info.value.reason == reason, name


# -- pending bytes -----------------------------------------------------------------------


def test_pending_bytes_counts_an_incomplete_message():
    decoder = new_decoder()
    assert decoder.pending_bytes == 0
    decoder.feed(F1 + F3[:7])
    assert decoder.pending_bytes == 7
    decoder.feed(F3[7:])
    assert decoder.pending_bytes == 0
    json_decoder = new_decoder()
    json_decoder.feed(JSON_MESSAGE[:10] + b"\xc3")  # and half of a two-byte character
    assert json_decoder.pending_bytes == 11
    json_decoder.feed(b"\xa9")
    assert json_decoder.pending_bytes == 11  # now one character


# -- deferred messages (issue #9: 4) -------------------------------------------------------


BIG_EVENTS = [(T0 * NS + i, {"seq": i, "pad": "p" * 30}) for i in range(300)]


def deferring_decoder(**limits: int) -> ForwardDecoder:
    return ForwardDecoder(now_ns=lambda: NOW_NS, offload_bytes=1000, **limits)


@pytest.mark.parametrize(
    "data",
    [
        encode_forward("t", BIG_EVENTS, {"chunk": "c", "size": 300}),
        encode_packed_forward("t", BIG_EVENTS, {"chunk": "c"}),
        encode_packed_forward("t", BIG_EVENTS, {"chunk": "c"}, blob_as_bin=True),
        encode_packed_forward("t", BIG_EVENTS, {"chunk": "c"}, compressed="gzip"),
        encode_packed_forward("t", BIG_EVENTS, {"chunk": "c"}, compressed="zstd"),
        json.dumps(["t", [[t // NS, r] for t, r in BIG_EVENTS], {"chunk": "c"}]).encode(),
    ],
    ids=["forward", "packed-str32", "packed-bin", "gzip", "zstd", "json"],
)
def test_big_messages_are_deferred_and_their_parts_add_up(data):
    inline = only(feed_whole(data))
    deferred = only(deferring_decoder().feed(data))
    assert isinstance(deferred, DeferredMessage) and deferred.size_bytes == len(data)
    assert deferred.decode() == inline
    parts = list(deferred.parts(part_bytes=2000))
    assert len(parts) > 2
    assert [e for p in parts for e in p.events] == inline.events
    assert all((p.tag, p.chunk, p.options) == (inline.tag, inline.chunk, inline.options) for p in parts)
    assert [p.size_bytes for p in parts] == [len(data)] + [0] * (len(parts) - 1)
    # A resend is split the same way (the parts' dedupe keys depend on it).
    again = list(only(deferring_decoder().feed(data)).parts(part_bytes=2000))
    assert [len(p.events) for p in again] == [len(p.events) for p in parts]


def test_small_messages_are_not_deferred():
    small = encode_packed_forward("t", BIG_EVENTS[:3], compressed="gzip")
    assert isinstance(only(deferring_decoder().feed(small)), EventMessage)
    assert isinstance(only(deferring_decoder().feed(F1)), EventMessage)


def test_a_small_blob_that_inflates_big_is_deferred():
    entries = raw_entries([(T0 * NS, {"pad": "p" * 30})] * 300)
    data = packed_message("t", gzip.compress(entries), {"compressed": "gzip"})
    assert len(data) < 1000 < len(entries)
    assert isinstance(only(deferring_decoder().feed(data)), DeferredMessage)


@pytest.mark.parametrize(
    "blob, options, reason",
    [
        (gzip.compress(b"\x00" * 100_000), {"compressed": "gzip"}, "max_decompressed_bytes"),
        (gzip.compress(raw_entries(BIG_EVENTS))[:-6], {"compressed": "gzip"}, "bad gzip"),
        (raw_entries(BIG_EVENTS)[:-3], {}, "truncated"),
        (raw_entries(BIG_EVENTS) + b"\xc1", {}, "FormatError (unexpected byte 0xc1"),
    ],
    ids=["bomb", "truncated-gzip", "truncated-entries", "garbage-entries"],
)
def test_a_bad_deferred_message_yields_no_part(blob, options, reason):
    data = packed_message("t", blob, {**options, "chunk": "c"})
    deferred = only(deferring_decoder(max_decompressed_bytes=50_000).feed(data))
    parts = deferred.parts(part_bytes=1000)
    with pytest.raises(ForwardDecodeError, match=reason.replace("(", r"\(")):
        next(parts)


def test_gzip_pieces_keep_their_256_kib_input_slices():
    # Deferred parts end on inflated pieces, and a piece ends where zlib's input slice
    # did: the slices stay 256 KiB so that a resend splits the same way as it always has
    # (part dedupe keys), whatever the shared inflate's default.
    import os

    from logrouter.wire import forward_packed

    data = os.urandom(1 << 20)
    pieces = list(forward_packed._gunzip_pieces(gzip.compress(data, 0), 1 << 21, 1 << 20))
    assert b"".join(pieces) == data
    assert 64 << 10 < max(map(len, pieces)) <= 256 << 10


def test_an_unknown_compression_is_refused_by_feed_even_for_a_big_blob():
    data = packed_message("t", raw_entries(BIG_EVENTS), {"compressed": "lz4"})
    with pytest.raises(ForwardDecodeError, match="'lz4'"):
        deferring_decoder().feed(data)


def test_deferred_message_framing_agrees_every_way():
    data = F1 + encode_packed_forward("t", BIG_EVENTS, compressed="gzip") + F5
    results = []
    for name, pieces in [("whole", [data]), ("bytewise", [data[i : i + 1] for i in range(len(data))])]:
        decoder = deferring_decoder()
        frames = [f for piece in pieces for f in decoder.feed(piece)]
        results.append([f.decode() if isinstance(f, DeferredMessage) else f for f in frames])
    assert results[0] == results[1] and len(results[0]) == 3


def test_a_str32_blob_with_multibyte_text_is_deferred_by_its_bytes_however_it_arrives():
    # Fed whole, the framer hands the str32 blob over as bytes; fed byte by byte it cannot
    # see the str header whole and the unpacker gives text, whose length counts a
    # multibyte character once. The entries' size in bytes decides either way (found by
    # the fuzz test: the same message was deferred whole and decoded in feed bytewise).
    events = [(T0 * NS, {"m": "\u00e9" * 40})]
    data = encode_packed_forward("t", events, {"chunk": "c"})  # str32 blob
    entries = raw_entries(events)
    text_length = len(entries.decode("utf-8", "surrogateescape"))
    assert text_length < len(entries)
    for offload in (text_length, len(entries) - 1, len(entries)):
        kinds = []
        for pieces in ([data], [data[i : i + 1] for i in range(len(data))]):
            decoder = ForwardDecoder(now_ns=lambda: NOW_NS, offload_bytes=offload)
            (frame,) = [f for piece in pieces for f in decoder.feed(piece)]
            kinds.append(type(frame))
            decoded = frame.decode() if isinstance(frame, DeferredMessage) else frame
            assert decoded.events == events
        expected = DeferredMessage if len(entries) > offload else EventMessage
        assert kinds == [expected, expected], offload

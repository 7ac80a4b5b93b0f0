"""The logjam message codec: docs/protocols/logjam.md vectors (section 8), round trips, and
truncated, garbage, oversized and over-compressed messages."""

from __future__ import annotations

import struct
import zlib

import cramjam
import pytest

from logrouter.wire import logjam as lj
from logrouter.wire.errors import DecodeError

L1 = bytes.fromhex("ca bd 00 01 00 00 00 00 00 00 01 8b cf e5 68 00 00 00 00 00 00 00 00 01")
L2 = bytes.fromhex("ca bd 03 01 00 00 00 07 00 00 01 8b cf e5 68 7b 00 00 00 00 00 00 00 2a")
L3 = {
    lj.NONE: bytes.fromhex("7b 7d"),
    lj.ZLIB_COMPRESSION: bytes.fromhex("78 9c ab ae 05 00 01 75 00 f9"),
    lj.SNAPPY: bytes.fromhex("02 04 7b 7d"),
    lj.LZ4: bytes.fromhex("00 00 00 02 20 7b 7d"),
}
L4 = [
    b"heartbeat",
    bytes.fromhex("74 63 70 3a 2f 2f 68 2e 65 78 61 6d 70 6c 65 3a 39 36 30 36"),
    b"{}",
    bytes.fromhex("ca bd 00 01 00 00 00 03 00 00 01 8b cf e5 68 00 00 00 00 00 00 00 00 0a"),
]
ALL = sorted(lj.COMPRESSION_NAMES)


def meta_with(compression: int, device: int = 0) -> bytes:
    return lj.encode_meta(lj.Meta(compression, device, 1_700_000_000_000, 1))


def message(body: bytes, compression: int = lj.NONE, stream: bytes = b"my-app-prod", topic: bytes = b"logs.app") -> list[bytes]:
    return [stream, topic, body, meta_with(compression)]


def error(frames: list[bytes], **limits: int) -> lj.LogjamDecodeError:
    with pytest.raises(lj.LogjamDecodeError) as info:
        lj.decode_message(frames, **limits)
    assert info.value.kind in lj.ERROR_KINDS and info.value.reason and not info.value.fatal
    return info.value


# --- vectors ---------------------------------------------------------------------------


def test_meta_vector_l1() -> None:
    assert lj.decode_meta(L1) == lj.Meta(lj.NONE, 0, 1_700_000_000_000, 1, 1, 0xCABD)
    assert lj.encode_meta(lj.Meta(lj.NONE, 0, 1_700_000_000_000, 1)) == L1


def test_meta_vector_l2_lz4_device_7() -> None:
    assert lj.decode_meta(L2) == lj.Meta(lj.LZ4, 7, 1_700_000_000_123, 42)
    assert lj.encode_meta(lj.Meta(lj.LZ4, 7, 1_700_000_000_123, 42)) == L2


def test_device_number_is_u32_big_endian_at_offset_4() -> None:
    meta = lj.decode_meta(L1[:4] + bytes.fromhex("ff fe fd fc") + L1[8:])
    assert meta.device == 0xFFFEFDFC
    assert lj.encode_meta(lj.Meta(device=2**32 - 1))[4:8] == b"\xff\xff\xff\xff"


@pytest.mark.parametrize("compression", ALL)
def test_body_vector_l3_decodes_in_every_encoding(compression: int) -> None:
    got = lj.decode_message(message(L3[compression], compression))
    assert isinstance(got, lj.LogjamMessage)
    assert got.body == {} and got.meta.compression == compression


@pytest.mark.parametrize("compression", ALL)
def test_body_vector_l3_is_what_the_encoder_writes(compression: int) -> None:
    assert lj.compress_body(b"{}", compression) == L3[compression]
    assert lj.encode_message("my-app", "prod", "logs", {}, lj.Meta(compression))[2] == L3[compression]


def test_heartbeat_vector_l4() -> None:
    got = lj.decode_message(L4)
    assert got == lj.Heartbeat("tcp://h.example:9606", lj.Meta(lj.NONE, 3, 1_700_000_000_000, 10))
    assert lj.encode_heartbeat("tcp://h.example:9606", device=3, sequence=10, created_ms=1_700_000_000_000) == L4


def test_full_message_with_l2_meta() -> None:
    body = struct.pack(">I", 2) + bytes(cramjam.lz4.compress_block(b'{"a":1}', store_size=False))
    frames = [b"my-app-prod", b"logs.my_app", struct.pack(">I", 7) + body[4:], L2]
    got = lj.decode_message(frames)
    assert got == lj.LogjamMessage("my-app", "prod", "logs.my_app", {"a": 1}, lj.Meta(lj.LZ4, 7, 1_700_000_000_123, 42))
    assert got.stream == "my-app-prod"


def test_byte_swapped_tag_is_tolerated_like_the_c_code() -> None:
    meta = lj.decode_meta(b"\xbd\xca" + L1[2:])
    assert meta.tag == lj.META_TAG_SWAPPED and meta.sequence == 1 and meta.created_ms == 1_700_000_000_000


# --- replies ---------------------------------------------------------------------------


def test_router_replies_are_the_devices_frames() -> None:
    assert lj.encode_accepted(b"my-app-prod") == [b"my-app-prod", b"202 Accepted"]
    assert lj.encode_pong("h.example") == [b"ping", b"200 OK", b"h.example"]
    assert lj.encode_bad_request(b"ping") == [b"ping", b"400 Bad Request"]
    assert lj.encode_bad_request(b"my-app-prod") == [b"my-app-prod", b"400 Bad Request"]


# --- names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stream, app, env",
    [(b"app-prod", "app", "prod"), (b"my-app-prod", "my-app", "prod"), (b"-x", "", "x"), (b"a-", "a", ""), (b"a b~-e", "a b~", "e")],
)
def test_stream_name_splits_at_the_last_dash(stream: bytes, app: str, env: str) -> None:
    got = lj.decode_message(message(b"{}", stream=stream))
    assert (got.app, got.env) == (app, env)


@pytest.mark.parametrize("stream", [b"", b"noenv", b"app-pr\x00d", b"app-pr\xc3\xa9d", b"app\n-prod"])
def test_bad_stream_names(stream: bytes) -> None:
    assert error(message(b"{}", stream=stream)).kind == "stream"


def test_topic_prefix_is_not_checked_but_can_be() -> None:
    got = lj.decode_message(message(b"{}", topic=b"whatever"))
    assert got.topic == "whatever" and not lj.is_well_formed_topic(got.topic)
    assert all(lj.is_well_formed_topic(p + ".x") for p in lj.TOPIC_PREFIXES)
    assert lj.is_well_formed_topic("frontend.page") and not lj.is_well_formed_topic("frontend")
    assert error(message(b"{}", topic=b"logs\xff")).kind == "topic"


# --- round trips -----------------------------------------------------------------------


BODY = {"action": "Users#show", "code": 200, "request_id": "0" * 32, "text": "h\u00e9llo \u2603", "n": [1, 2.5, None, True]}


@pytest.mark.parametrize("compression", ALL)
def test_round_trip_every_compression(compression: int) -> None:
    meta = lj.Meta(compression, 12, 1_700_000_000_999, 2**64 - 1)
    frames = lj.encode_message("my-app", "prod", "logs.my_app.x", BODY, meta)
    assert len(frames) == 4 and frames[0] == b"my-app-prod" and frames[3] == lj.encode_meta(meta)
    assert lj.decode_message(frames) == lj.LogjamMessage("my-app", "prod", "logs.my_app.x", BODY, meta)


@pytest.mark.parametrize("compression", ALL)
def test_round_trip_large_body(compression: int) -> None:
    body = {"message": "x" * 1_000_000, "i": list(range(1000))}
    frames = lj.encode_message("a", "b", "logs", body, lj.Meta(compression))
    assert lj.decode_message(frames).body == body


def test_encode_message_takes_ready_json_bytes() -> None:
    frames = lj.encode_message("a", "b", "logs", b'{"k": "v"}', lj.Meta(lj.SNAPPY))
    assert lj.decompress_body(frames[2], lj.SNAPPY) == b'{"k": "v"}'


def test_frames_may_be_memoryviews_or_bytearrays() -> None:
    frames = lj.encode_message("a", "b", "logs", BODY, lj.Meta(lj.LZ4))
    assert lj.decode_message([memoryview(f) for f in frames]).body == BODY
    assert lj.decode_message([bytearray(f) for f in frames]).body == BODY


def test_error_is_a_decode_error_and_not_fatal() -> None:
    e = error([b"x"])
    assert isinstance(e, DecodeError) and e.kind == "frames" and "1 frames" in e.reason


# --- bad frames and meta ---------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 3, 5, 6])
def test_wrong_frame_count(count: int) -> None:
    frames = (message(b"{}") + [b"extra", b"more"])[:count]
    assert error(frames).kind == "frames"


@pytest.mark.parametrize("size", [0, 1, 8, 16, 23, 25, 28, 32])
def test_meta_must_be_24_bytes(size: int) -> None:
    meta = (L1 * 2)[:size]
    e = error(message(b"{}")[:3] + [meta])
    assert e.kind == "meta" and str(size) in e.reason


@pytest.mark.parametrize("tag", [b"\x00\x00", b"\xca\xbe", b"\xbd\xcb", b"\xab\xcd"])
def test_bad_meta_tag(tag: bytes) -> None:
    e = error(message(b"{}")[:3] + [tag + L1[2:]])
    assert e.kind == "meta" and "tag" in e.reason


@pytest.mark.parametrize("version", [0, 2, 255])
def test_bad_meta_version(version: int) -> None:
    e = error(message(b"{}")[:3] + [L1[:3] + bytes([version]) + L1[4:]])
    assert e.kind == "meta" and "version" in e.reason


@pytest.mark.parametrize("compression", [4, 5, 0x7F, 0xFF])
def test_unknown_compression(compression: int) -> None:
    e = error(message(b"{}", compression))
    assert e.kind == "compression" and str(compression) in e.reason


def test_heartbeat_with_bad_meta_or_endpoint() -> None:
    assert error(L4[:3] + [L4[3][:20]]).kind == "meta"
    assert error([L4[0], b"tcp://h\xff:1", L4[2], L4[3]]).kind == "stream"
    assert error(L4[:3]).kind == "frames"


# --- bad bodies ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b"{}x", "not JSON"),
        (b"[]", "list"),
        (b'"s"', "str"),
        (b"1", "int"),
        (b"null", "NoneType"),
        (b'{"a": "\xff"}', "UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, ""),
    ],
)
def test_bad_json_bodies(body: bytes, needle: str) -> None:
    for compression in ALL:
        e = error(message(lj.compress_body(body, compression), compression))
        assert e.kind == "body" and needle in e.reason


@pytest.mark.parametrize("compression", [lj.ZLIB_COMPRESSION, lj.SNAPPY, lj.LZ4])
def test_truncated_compressed_bodies(compression: int) -> None:
    blob = lj.compress_body(b'{"message": "' + b"abc" * 300 + b'"}', compression)
    for cut in range(0, len(blob), 7):
        assert error(message(blob[:cut], compression)).kind == "compression", cut


@pytest.mark.parametrize("compression", [lj.ZLIB_COMPRESSION, lj.SNAPPY, lj.LZ4])
def test_garbage_compressed_bodies(compression: int) -> None:
    for garbage in [b"\x00" * 10, b"\xff" * 10, bytes(range(256)), b"{}"]:
        e = error(message(garbage, compression))
        assert e.kind in ("compression", "bomb", "body")


def test_trailing_bytes_after_zlib_stream() -> None:
    assert error(message(zlib.compress(b"{}") + b"x", lj.ZLIB_COMPRESSION)).kind == "compression"


def test_lz4_declared_length_must_match() -> None:
    block = bytes(cramjam.lz4.compress_block(b'{"a": 1}', store_size=False))
    assert lj.decode_message(message(struct.pack(">I", 8) + block, lj.LZ4)).body == {"a": 1}
    for declared in (0, 7, 9, 100):
        assert error(message(struct.pack(">I", declared) + block, lj.LZ4)).kind == "compression", declared


def test_snappy_declared_length_must_match() -> None:
    assert error(message(b"\x05\x04{}", lj.SNAPPY)).kind == "compression"
    assert error(message(b"\xff\xff\xff\xff\xff\x01", lj.SNAPPY)).kind == "compression"  # 6-byte varint


# --- limits ----------------------------------------------------------------------------


def test_body_frame_over_max_body_bytes() -> None:
    body = b'{"m": "' + b"x" * 100 + b'"}'
    assert lj.decode_message(message(body), max_body_bytes=len(body)).body["m"] == "x" * 100
    e = error(message(body), max_body_bytes=len(body) - 1)
    assert e.kind == "too_big" and str(len(body)) in e.reason


@pytest.mark.parametrize("compression", ALL)
def test_decompressed_limit_is_inclusive(compression: int) -> None:
    data = b'{"m": "' + b"x" * 1000 + b'"}'
    frames = message(lj.compress_body(data, compression), compression)
    assert lj.decode_message(frames, max_decompressed_bytes=len(data)).body["m"] == "x" * 1000
    assert error(frames, max_decompressed_bytes=len(data) - 1).kind == "bomb"


@pytest.mark.parametrize("compression", [lj.ZLIB_COMPRESSION, lj.SNAPPY, lj.LZ4])
def test_compression_bomb(compression: int) -> None:
    data = b'{"m": "' + b"\x00" * (20 << 20) + b'"}'  # 20 MiB in a few KB
    blob = lj.compress_body(data, compression)
    assert len(blob) < 2 << 20
    e = error(message(blob, compression), max_decompressed_bytes=1 << 20)
    assert e.kind == "bomb"


@pytest.mark.parametrize("declared", [(64 << 20) + 1, 2**32 - 1])
def test_lz4_declared_size_over_limit_is_refused_before_allocating(declared: int) -> None:
    e = error(message(struct.pack(">I", declared) + b"\x20{}", lj.LZ4))
    assert e.kind == "bomb" and str(declared) in e.reason


def test_snappy_declared_size_over_limit_is_refused_before_decompressing() -> None:
    e = error(message(b"\xff\xff\xff\xff\x0f\x04{}", lj.SNAPPY))
    assert e.kind == "bomb" and str(2**32 - 1) in e.reason
    assert error(message(b"\x80\x80\x80\x80\x10", lj.SNAPPY), max_decompressed_bytes=10).kind == "bomb"


def test_heartbeat_body_is_bounded_but_not_decoded() -> None:
    assert isinstance(lj.decode_message(L4[:2] + [b"not json"] + L4[3:]), lj.Heartbeat)
    assert error(L4, max_body_bytes=1).kind == "too_big"

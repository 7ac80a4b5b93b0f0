"""The Log Courier codec: the protocol doc's vectors C1-C4
(``docs/protocols/log_courier.md`` section 10), messages whole, byte by byte and
split at every offset, EVNT streams ending exactly at their zlib end, truncated,
oversized, bombs, garbage, wrong lengths, bad JSON records, unknown types."""

from __future__ import annotations

import os
import struct
import zlib

import pytest
from fuzz_helpers import decode_all_ways, feed_pieces

from logrouter.wire import log_courier as lc
from logrouter.wire.errors import DecodeError


def hexbytes(text: str) -> bytes:
    return bytes.fromhex(" ".join(text.split()))


NONCE = bytes(range(16))
C1 = hexbytes("50 49 4e 47 00 00 00 00  50 4f 4e 47 00 00 00 00  3f 3f 3f 3f 00 00 00 00")
C2_HELO = hexbytes(
    "48 45 4c 4f 00 00 00 20 00 00 00 00 00 00 00 02 00 00 00 0c 00 00 00 00 4c 43 4f 52"
    "00 00 00 00 00 00 00 00 00 00 00 00"
)
C2_VERS_GO = hexbytes(
    "56 45 52 53 00 00 00 20 01 00 00 00 00 00 00 02 00 00 00 0c 00 00 00 00 4c 43 56 52"
    "00 00 00 00 00 00 00 00 00 00 00 00"
)
C2_VERS_RB = hexbytes("56 45 52 53 00 00 00 14 00 00 00 00 00 00 00 02 00 00 00 0c 00 00 00 00 52 59 4c 43")
C3_ZLIB = hexbytes("78 5e 63 60 60 10 a8 56 ca 4d 2d 2e 4e 4c 4f 55 b2 52 ca c8 54 aa 05 00 31 5f 05 81")
C3_JDAT = hexbytes("4a 44 41 54 00 00 00 2c") + NONCE + C3_ZLIB
C3_EVNT = hexbytes("45 56 4e 54 ff ff ff ff") + NONCE + C3_ZLIB
C4 = hexbytes(
    "41 43 4b 4e 00 00 00 14 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f 00 00 00 01"
    "41 43 4b 4e 00 00 00 14 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f 00 00 00 00"
)

HI = [{"message": "hi"}]


def decode(data: bytes, **limits):
    """Decoded every way (whole, byte by byte, every offset for short inputs)."""
    return decode_all_ways(lambda: lc.LogCourierDecoder(**limits), data, every_offset=len(data) <= 2048)


def ok(data: bytes, **limits) -> list:
    frames, reason = decode(data, **limits)
    assert reason is None
    return frames


def refused(data: bytes, match: str, **limits) -> list:
    frames, reason = decode(data, **limits)
    assert reason is not None and match in reason, reason
    return frames


# -- the doc's vectors ------------------------------------------------------------------------


def test_c1_encoders_and_decoders():
    assert lc.encode_ping() + lc.encode_pong() + lc.encode_unknown() == C1
    assert ok(C1[:8] + C1[16:]) == [lc.Ping(), lc.Unknown()]
    frames, reason = decode_all_ways(lc.AcknDecoder, C1[8:])
    assert frames == [lc.Pong(), lc.Unknown()] and reason is None


def test_c2_handshakes():
    assert lc.encode_helo(False, (2, 12, 0), "LCOR") == C2_HELO
    assert lc.encode_vers(True, (2, 12, 0), "LCVR") == C2_VERS_GO
    assert lc.encode_vers(False, (2, 12, 0), "RYLC", size=20) == C2_VERS_RB
    (helo,) = ok(C2_HELO)
    assert helo == lc.Helo(0, (2, 12, 0), "LCOR", 32) and not helo.supports_evnt
    frames, reason = decode_all_ways(lc.AcknDecoder, C2_VERS_GO + C2_VERS_RB)
    assert reason is None
    assert frames == [lc.Vers(0x01000000, (2, 12, 0), "LCVR", 32), lc.Vers(0, (2, 12, 0), "RYLC", 20)]
    assert frames[0].supports_evnt and not frames[1].supports_evnt


def test_helo_short_bodies_are_zero_filled():
    assert ok(lc.encode_helo(True, (2, 7, 2), "RYLC", size=20)) == [lc.Helo(0x01000000, (2, 7, 2), "RYLC", 20)]
    assert ok(b"HELO\0\0\0\0") == [lc.Helo(0, (0, 0, 0), "", 0)]
    assert ok(b"HELO\0\0\0\x01\x01") == [lc.Helo(0x01000000, (0, 0, 0), "", 1)]
    assert ok(lc.encode_helo(flags=1))[0].supports_evnt is False  # the bit is in the first byte
    refused(b"HELO\0\0\0\x21" + bytes(33), "HELO message of 33 bytes")


def test_c3_jdat_and_evnt():
    assert zlib.decompress(C3_ZLIB) == hexbytes("00 00 00 10 7b 22 6d 65 73 73 61 67 65 22 3a 22 68 69 22 7d")
    assert lc.encode_jdat(NONCE, HI, level=3) == C3_JDAT
    assert lc.encode_evnt(NONCE, HI, level=3) == C3_EVNT
    assert ok(C3_JDAT) == [lc.Payload("JDAT", NONCE, HI)]
    assert ok(C3_EVNT) == [lc.Payload("EVNT", NONCE, HI)]


def test_c4_ackn():
    assert lc.encode_ackn(NONCE, 1) + lc.encode_ackn(NONCE, 0) == C4
    frames, reason = decode_all_ways(lc.AcknDecoder, C4)
    assert reason is None and frames == [lc.Ackn(NONCE, 1), lc.Ackn(NONCE, 0)]


# -- sessions ---------------------------------------------------------------------------------


def events(n: int) -> list[dict]:
    return [{"message": f"line {i}", "offset": i, "path": "/var/log/x", "fields": {"a": [1, None]}} for i in range(n)]


def test_a_session_every_way():
    data = (
        C2_HELO
        + lc.encode_jdat(NONCE, events(3))
        + lc.encode_evnt(b"b" * 16, events(5))
        + lc.encode_evnt(b"c" * 16, [])
        + lc.encode_ping()
        + lc.encode_jdat(b"d" * 16, events(2), level=0)
    )
    frames = ok(data)
    assert [type(f).__name__ for f in frames] == ["Helo", "Payload", "Payload", "Payload", "Ping", "Payload"]
    assert [(f.kind, f.nonce, f.events) for f in frames if isinstance(f, lc.Payload)] == [
        ("JDAT", NONCE, events(3)),
        ("EVNT", b"b" * 16, events(5)),
        ("EVNT", b"c" * 16, []),
        ("JDAT", b"d" * 16, events(2)),
    ]


def test_messages_count_and_pending_bytes():
    d = lc.LogCourierDecoder()
    assert d.feed(C2_HELO[:10]) == [] and d.pending_bytes == 10
    assert len(d.feed(C2_HELO[10:])) == 1 and d.pending_bytes == 0 and d.messages == 1
    assert d.feed(C3_EVNT[:30]) == [] and d.pending_bytes == 30
    assert d.feed(C3_EVNT[30:] + C1[:3]) == [lc.Payload("EVNT", NONCE, HI)]
    assert d.pending_bytes == 3 and d.messages == 2


def test_big_evnt_streams_across_many_reads():
    big = events(5000)
    data = lc.encode_evnt(NONCE, big, level=1) + lc.encode_ping()
    for size in (1, 1000, 65536):
        frames, reason = feed_pieces(lc.LogCourierDecoder, [data[i : i + size] for i in range(0, len(data), size)])
        assert reason is None and frames == [lc.Payload("EVNT", NONCE, big), lc.Ping()]


def test_many_small_evnts_in_one_read():
    data = b"".join(lc.encode_evnt(struct.pack(">16xI", i)[-16:], [{"n": i}]) for i in range(3000))
    frames = lc.LogCourierDecoder().feed(data)
    assert [f.events for f in frames] == [[{"n": i}] for i in range(3000)]


# -- bad records ------------------------------------------------------------------------------


def test_bad_json_records_become_message_events_and_keep_their_place():
    records = [{"a": 1}, "not json", b"\xff\xfe bad utf8", "[1, 2]", '"a string"', ' {"b": 2} ', "{}"]
    for encode in (lc.encode_jdat, lc.encode_evnt):
        (payload,) = ok(encode(NONCE, records))
        assert payload.events == [
            {"a": 1},
            {"message": "not json"},
            {"message": "\ufffd\ufffd bad utf8"},
            {"message": "[1, 2]"},
            {"message": '"a string"'},
            {"b": 2},
            {},
        ]
        assert payload.invalid == 4 and payload.invalid_reason.startswith("event 2: not JSON")


def test_record_framing_errors():
    def jdat(content: bytes) -> bytes:
        body = NONCE + zlib.compress(content)
        return b"JDAT" + struct.pack(">I", len(body)) + body

    refused(jdat(b"\0\0\0"), "ends inside a record length")
    refused(jdat(b"\0\0\0\x05{}"), "ends inside event 1")
    refused(jdat(lc.encode_records(HI) + b"\0\0\0\x09" + b"x" * 9), "exceeds max_event_bytes 8", max_event_bytes=8)
    refused(jdat(lc.encode_records([{}] * 11)), "more than max_payload_events 10", max_payload_events=10)
    assert ok(jdat(lc.encode_records([{}] * 10)), max_payload_events=10)[0].events == [{}] * 10


# -- limits, bombs, truncation, garbage -------------------------------------------------------


def test_jdat_over_max_payload_bytes_is_refused_from_the_header():
    d = lc.LogCourierDecoder(max_payload_bytes=1000)
    with pytest.raises(DecodeError, match="exceeds max_payload_bytes 1000"):
        d.feed(b"JDAT" + struct.pack(">I", 1001))
    data = lc.encode_jdat(NONCE, [{"x": os.urandom(300).hex()}])
    assert ok(data, max_payload_bytes=len(data) - 8)
    refused(data, "exceeds max_payload_bytes", max_payload_bytes=len(data) - 9)


def test_evnt_over_max_payload_bytes_is_refused_as_it_streams():
    data = lc.encode_evnt(NONCE, [{"x": os.urandom(300).hex()}])
    assert ok(data, max_payload_bytes=len(data) - 8)
    refused(data, "EVNT payload exceeds max_payload_bytes", max_payload_bytes=len(data) - 9)
    # An endless stream of empty stored blocks produces nothing but is still cut off.
    endless = b"EVNT\xff\xff\xff\xff" + NONCE + b"\x78\x01" + b"\x00\x00\x00\xff\xff" * 400
    refused(endless, "exceeds max_payload_bytes", max_payload_bytes=1000)


@pytest.mark.parametrize("encode", [lc.encode_jdat, lc.encode_evnt])
def test_bombs(encode):
    bomb = encode(NONCE, [{"message": "a" * 5_000_000}], level=9)
    assert len(bomb) < 10_000
    d = lc.LogCourierDecoder(max_decompressed_bytes=1 << 20)
    with pytest.raises(DecodeError, match="inflates to more than max_decompressed_bytes 1048576"):
        for i in range(0, len(bomb), 100):
            d.feed(bomb[i : i + 100])
    with pytest.raises(DecodeError, match="already failed"):
        d.feed(b"PING\0\0\0\0")


def test_decompressed_limit_is_exact():
    data = lc.encode_jdat(NONCE, HI)
    assert ok(data, max_decompressed_bytes=20)
    refused(data, "inflates to more than", max_decompressed_bytes=19)
    refused(lc.encode_evnt(NONCE, HI), "inflates to more than", max_decompressed_bytes=19)


def test_truncated_jdat_and_evnt_wait_for_more():
    for data in (C3_JDAT, C3_EVNT, C2_HELO):
        for cut in range(len(data)):
            d = lc.LogCourierDecoder()
            assert d.feed(data[:cut]) == [] and d.pending_bytes == cut


def test_bad_zlib():
    body = NONCE + b"\x78\x9c\x07garbage"
    refused(b"JDAT" + struct.pack(">I", len(body)) + body, "JDAT payload: bad compressed data")
    refused(b"EVNT\xff\xff\xff\xff" + body, "EVNT payload: bad compressed data")
    body = NONCE + C3_ZLIB[:-1]
    refused(b"JDAT" + struct.pack(">I", len(body)) + body, "JDAT payload: compressed data is truncated")
    body = NONCE + C3_ZLIB + b"zz"
    refused(b"JDAT" + struct.pack(">I", len(body)) + body, "2 bytes after the end")


def test_wrong_lengths():
    refused(b"PING\0\0\0\x01x", "PING message with a 1-byte body")
    refused(b"????\0\0\0\x04abcd", "???? message with a 4-byte body")
    refused(b"JDAT\0\0\0\x10" + NONCE, "shorter than 17")
    refused(b"EVNT\0\0\0\x2c" + NONCE, "must be 0xFFFFFFFF")
    for code in (b"VERS", b"PONG", b"ACKN"):
        refused(code + b"\0\0\0\0", "server message")
    # The client side.
    for data, match in [
        (b"ACKN\0\0\0\x13" + bytes(19), "must be 20"),
        (b"ACKN\0\0\0\x15" + bytes(21), "must be 20"),
        (b"PONG\0\0\0\x01x", "1-byte body"),
        (b"VERS\0\0\0\x21", "exceeds 32"),
        (C3_JDAT, "client message"),
        (b"XXXX\0\0\0\0", "unknown message type"),
    ]:
        frames, reason = decode_all_ways(lc.AcknDecoder, C4[:28] + data)
        assert frames == [lc.Ackn(NONCE, 1)] and match in reason


def test_unknown_types_are_skipped_while_the_framing_is_sane():
    data = b"ABCD\0\0\0\x03xyz" + b"WHAT\0\0\0\0" + lc.encode_ping()
    assert ok(data) == [lc.UnrecognizedMessage(b"ABCD", 3), lc.UnrecognizedMessage(b"WHAT", 0), lc.Ping()]
    frames = refused(lc.encode_ping() + b"ABCD\0\0\x04\x01", "exceeds max_unknown_bytes 1024")
    assert frames == [lc.Ping()]
    refused(b"\x16\x03\x01\x02\0\0\0\0", "unknown message type 0x16030102")  # a TLS hello
    refused(b"GET / HTTP/1.1\r\n", "exceeds max_unknown_bytes")
    refused(data, "unknown message type ABCD", max_unknown_bytes=None)


def test_messages_before_an_error_are_returned_with_it():
    data = C2_HELO + C3_JDAT + b"PING\0\0\0\x01"
    frames = refused(data, "PING message with a 1-byte body")
    assert frames == [lc.Helo(0, (2, 12, 0), "LCOR", 32), lc.Payload("JDAT", NONCE, HI)]


def test_encoder_arguments_are_checked():
    with pytest.raises(ValueError):
        lc.encode_ackn(b"short", 1)
    with pytest.raises(ValueError):
        lc.encode_helo(client_id="TOOLONG")
    with pytest.raises(ValueError):
        lc.encode_vers(size=33)

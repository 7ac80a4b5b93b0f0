"""The Pravega wire codec: the vectors P1-P5 (``docs/protocols/pravega.md`` section 11) and the
frames captured from the Rust client (section 9 there), fed whole, byte by byte
and split at every offset; append blocks with partial events and padding; every validation
error; truncated, oversized and garbage input; modified UTF-8; trailing-field tolerance;
the client decoder for every reply."""

from __future__ import annotations

import struct
import uuid

import pytest
from fuzz_helpers import decode_all_ways

from logrouter.wire import pravega as pw
from logrouter.wire.errors import DecodeError


def hexbytes(text: str) -> bytes:
    return bytes.fromhex(" ".join(text.split()))


W = uuid.UUID(int=(1 << 64) | 2)  # UUID(1, 2): most significant 1, least significant 2
W2 = uuid.UUID(int=(3 << 64) | 4)
SEGMENT = "sc/st/0.#epoch.0"

P1 = hexbytes(
    """ff ff ff 81 00 00 00 08 00 00 00 11 00 00 00 05
    00 00 00 64 00 00 00 00"""
)
P2_SETUP_APPEND = hexbytes(
    """00 00 00 01 00 00 00 2c 00 00 00 00 00 00 00 01
    00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 02
    00 10 73 63 2f 73 74 2f 30 2e 23 65 70 6f 63 68 2e 30 00 00"""
)
P2_APPEND_SETUP = hexbytes(
    """00 00 00 02 00 00 00 32 00 00 00 00 00 00 00 01
    00 10 73 63 2f 73 74 2f 30 2e 23 65 70 6f 63 68 2e 30
    00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 02 80 00 00 00 00 00 00 00"""
)
P3_BLOCK = hexbytes(
    """00 00 00 03 00 00 00 1a 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 02
    00 00 00 00 00 00 00 02 68 69"""
)
P3_BLOCK_END = hexbytes(
    """00 00 00 04 00 00 00 2c 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 02
    00 00 00 0a 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 01"""
)
P3_ACK = hexbytes(
    """00 00 00 07 00 00 00 30 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 02
    00 00 00 00 00 00 00 01 80 00 00 00 00 00 00 00 00 00 00 00 00 00 00 01
    00 00 00 00 00 00 00 0a"""
)
P4_BLOCK = hexbytes(
    """00 00 00 03 00 00 00 28 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 02
    00 00 00 00 00 00 00 02 68 69 ff ff ff ff 00 00 00 06 00 00 00 00 00 00"""
)
P5_READ_SEGMENT = hexbytes(
    """00 00 00 09 00 00 00 28 00 10 73 63 2f 73 74 2f 30 2e 23 65 70 6f 63 68 2e 30
    00 00 00 00 00 00 00 00 00 00 04 00 00 00 00 00 00 00 00 00 00 02"""
)
P5_SEGMENT_READ = hexbytes(
    """00 00 00 0a 00 00 00 32 00 10 73 63 2f 73 74 2f 30 2e 23 65 70 6f 63 68 2e 30
    00 00 00 00 00 00 00 00 01 00 00 00 00 0a 00 00 00 00 00 00 00 02 68 69
    00 00 00 00 00 00 00 02"""
)

RUST_WRITER = uuid.UUID("9d804867-8b23-f632-a7f7-8ad5528cc282")
RUST_HELLO = hexbytes("ff ff ff 81 00 00 00 08 00 00 00 0f 00 00 00 05")
RUST_SETUP_APPEND = hexbytes(
    """00 00 00 01 00 00 00 31 00 00 00 00 00 00 00 01 9d 80 48 67 8b 23 f6 32
    a7 f7 8a d5 52 8c c2 82 00 15 70 72 6f 62 65 2f 6c 6f 67 73 2f 30 2e 23
    65 70 6f 63 68 2e 30 00 00"""
)
RUST_BLOCK_END = hexbytes(
    """00 00 00 04 00 00 00 3b 9d 80 48 67 8b 23 f6 32 a7 f7 8a d5 52 8c c2 82
    00 00 00 0f 00 00 00 0f 00 00 00 00 00 00 00 07 65 76 65 6e 74 2d 30 00
    00 00 01 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 02"""
)


def server(**limits):
    return lambda: pw.PravegaServerDecoder(**limits)


def client(**limits):
    return lambda: pw.PravegaClientDecoder(**limits)


def decode_every_way(factory, data: bytes) -> list:
    """Decode ``data`` whole, byte by byte and split at every offset: same commands each
    time, no error, and nothing left pending."""
    commands, reason = decode_all_ways(factory, data, every_offset=True)
    assert reason is None, reason
    decoder = factory()
    assert decoder.feed(data) == commands
    assert decoder.pending_bytes == 0
    return commands


def error_every_way(factory, data: bytes) -> tuple[list, str]:
    """The error ``data`` ends in, the same however it is split (and the commands before it)."""
    commands, reason = decode_all_ways(factory, data, every_offset=len(data) <= 512)
    assert reason is not None, f"no error; decoded {commands!r:.300}"
    return commands, reason


def event_frames(*payloads: bytes) -> bytes:
    return b"".join(pw.encode_event(p) for p in payloads)


def setup(writer=W) -> bytes:
    return pw.encode_setup_append(1, writer, SEGMENT)


# -- the protocol doc's vectors ------------------------------------------------------------


def test_vector_p1_hello_and_keepalive():
    assert pw.encode_hello() + pw.encode_keep_alive() == P1
    assert pw.encode_hello(17, 5) == P1[:16]
    expected = [pw.Hello(17, 5), pw.KeepAlive()]
    assert decode_every_way(server(), P1) == expected
    assert decode_every_way(client(), P1) == expected


def test_vector_p2_setup_append_and_new_writer_answer():
    assert pw.encode_setup_append(1, W, SEGMENT, "") == P2_SETUP_APPEND
    assert pw.encode_append_setup(1, SEGMENT, W, pw.NO_EVENT_NUMBER) == P2_APPEND_SETUP
    assert decode_every_way(server(), P2_SETUP_APPEND) == [pw.SetupAppend(1, W, SEGMENT, "")]
    assert decode_every_way(client(), P2_APPEND_SETUP) == [pw.AppendSetup(1, SEGMENT, W, pw.NO_EVENT_NUMBER)]


def test_vector_p3_simple_block_and_ack():
    hi = pw.encode_event(b"hi")
    assert hi == hexbytes("00 00 00 00 00 00 00 02 68 69")
    assert pw.encode_append_block(W, hi) == P3_BLOCK
    assert pw.encode_append_block_end(W, 10, b"", 1, 1, 1) == P3_BLOCK_END
    assert pw.encode_data_appended(W, 1, pw.NO_EVENT_NUMBER, 1, 10) == P3_ACK
    append = pw.Append(W, (b"hi",), num_events=1, last_event_number=1, request_id=1, size=10)
    assert decode_every_way(server(), P2_SETUP_APPEND + P3_BLOCK + P3_BLOCK_END) == [
        pw.SetupAppend(1, W, SEGMENT, ""),
        append,
    ]
    assert decode_every_way(client(), P3_ACK) == [pw.DataAppended(W, 1, pw.NO_EVENT_NUMBER, 1, 10)]


def test_vector_p4_batched_block_closed_by_padding():
    assert pw.encode_append_block(W, pw.encode_event(b"hi") + pw.encode_padding(6)) == P4_BLOCK
    assert pw.encode_padding(6) == hexbytes("ff ff ff ff 00 00 00 06 00 00 00 00 00 00")
    (append,) = decode_every_way(server(), P4_BLOCK + P3_BLOCK_END)
    assert append == pw.Append(W, (b"hi",), 1, 1, 1, 10)


def test_vector_p5_read_commands_are_refused_by_name():
    # ReadSegment/SegmentRead are not part of what either decoder takes: named, fatal.
    _, reason = error_every_way(server(), P5_READ_SEGMENT)
    assert reason.startswith("ReadSegment (9) is not a command")
    _, reason = error_every_way(client(), P5_SEGMENT_READ)
    assert reason.startswith("SegmentRead (10) is not a command")
    # The data SegmentRead carries is the stored Event frame, as written by an append.
    assert P5_SEGMENT_READ[-18:-8] == pw.encode_event(b"hi")
    assert P5_SEGMENT_READ[-22:-18] == struct.pack(">i", 10)


def test_rust_client_capture():
    assert pw.encode_hello(15, 5) == RUST_HELLO
    assert pw.encode_setup_append(1, RUST_WRITER, "probe/logs/0.#epoch.0") == RUST_SETUP_APPEND
    data = pw.encode_event(b"event-0")
    assert pw.encode_append_block_end(RUST_WRITER, len(data), data, 1, 1, 2) == RUST_BLOCK_END
    commands = decode_every_way(server(), RUST_HELLO + RUST_SETUP_APPEND + RUST_BLOCK_END)
    assert commands == [
        pw.Hello(15, 5),
        pw.SetupAppend(1, RUST_WRITER, "probe/logs/0.#epoch.0", ""),
        pw.Append(RUST_WRITER, (b"event-0",), num_events=1, last_event_number=1, request_id=2, size=15),
    ]


def test_rust_client_standalone_blocks_with_many_events():
    payloads = [f"routed {i}".encode() for i in range(114)]
    data = event_frames(*payloads)
    first = pw.encode_append_block_end(RUST_WRITER, len(data), data, 114, 114, 2)
    second = pw.encode_append_block_end(RUST_WRITER, 15, event_frames(b"routed!"), 1, 115, 3)
    decoder = pw.PravegaServerDecoder()
    out = decoder.feed(RUST_HELLO + RUST_SETUP_APPEND + first + second)
    assert out[2] == pw.Append(RUST_WRITER, tuple(payloads), 114, 114, 2, len(data))
    assert out[3] == pw.Append(RUST_WRITER, (b"routed!",), 1, 115, 3, 15)


# -- append blocks -------------------------------------------------------------------------


def test_partial_event_joined_with_the_block_end_data():
    whole = event_frames(b"first", b"second")
    third = pw.encode_event(b"the third event, cut in two")
    block = whole + pw.encode_partial_event(third[:11])
    data = setup() + pw.encode_append_block(W, block) + pw.encode_append_block_end(W, len(whole), third[11:], 3, 7, 9)
    commands = decode_every_way(server(), data)
    assert commands[1] == pw.Append(
        W, (b"first", b"second", b"the third event, cut in two"), 3, 7, 9, len(whole) + len(third)
    )


@pytest.mark.parametrize("cut", [0, 3, 8, 9, 20])
def test_partial_event_cut_anywhere_even_in_its_header(cut):
    event = pw.encode_event(b"twelve bytes")
    block = pw.encode_partial_event(event[:cut])
    data = pw.encode_append_block(W, block) + pw.encode_append_block_end(W, 0, event[cut:], 1, 1, 1)
    assert decode_every_way(server(), data) == [pw.Append(W, (b"twelve bytes",), 1, 1, 1, len(event))]


def test_block_with_only_padding_and_standalone_empty_events():
    # Empty payloads are events too; a block may be all padding before a partial.
    data = (
        pw.encode_append_block(W, event_frames(b"", b"x") + pw.encode_padding(0))
        + pw.encode_append_block_end(W, 17, b"", 2, 2, 1)
        + pw.encode_append_block_end(W, 8, pw.encode_event(b""), 1, 3, 2)
    )
    assert decode_every_way(server(), data) == [
        pw.Append(W, (b"", b"x"), 2, 2, 1, 17),
        pw.Append(W, (b"",), 1, 3, 2, 8),
    ]


def test_top_level_padding_is_skipped():
    data = pw.encode_padding(5) + pw.encode_hello() + pw.encode_padding(0) + pw.encode_keep_alive()
    assert decode_every_way(server(), data) == [pw.Hello(17, 5), pw.KeepAlive()]


def test_interleaved_writers_and_blocks_in_flight():
    data = setup(W) + setup(W2)
    expected = [pw.SetupAppend(1, W, SEGMENT, ""), pw.SetupAppend(1, W2, SEGMENT, "")]
    for n in range(1, 5):
        writer = W if n % 2 else W2
        frames = event_frames(b"e%d" % n)
        data += pw.encode_append_block(writer, frames) + pw.encode_append_block_end(writer, len(frames), b"", 1, n, n)
        expected.append(pw.Append(writer, (b"e%d" % n,), 1, n, n, len(frames)))
    assert decode_every_way(server(), data) == expected


def test_conditional_append_round_trip():
    data = pw.encode_conditional_append(W, 5, 1234, b"payload", 77)
    assert decode_every_way(server(), data) == [pw.ConditionalAppend(W, 5, 1234, b"payload", 77)]


def test_held_append_block_counts_as_pending():
    block = pw.encode_append_block(W, event_frames(b"abc"))
    end = pw.encode_append_block_end(W, 11, b"", 1, 1, 1)
    decoder = pw.PravegaServerDecoder()
    assert decoder.feed(block) == []
    assert decoder.pending_bytes == len(block)
    assert decoder.feed(end[:5]) == []
    assert decoder.pending_bytes == len(block) + 5
    assert decoder.feed(end[5:]) == [pw.Append(W, (b"abc",), 1, 1, 1, 11)]
    assert decoder.pending_bytes == 0


# -- validation errors ---------------------------------------------------------------------


def block_end(writer=W, whole=0, data=b"", num=1, last=1, request=1) -> bytes:
    return pw.encode_append_block_end(writer, whole, data, num, last, request)


HI = pw.encode_event(b"hi")
BAD_APPENDS = {
    "keepalive after block": (
        pw.encode_append_block(W, HI) + pw.encode_keep_alive(),
        "KeepAlive (100) following an AppendBlock (only AppendBlockEnd may follow)",
    ),
    "block after block": (
        pw.encode_append_block(W, HI) * 2,
        "AppendBlock (3) following an AppendBlock",
    ),
    "writer mismatch": (
        pw.encode_append_block(W, HI) + block_end(W2, 10),
        f"writer id mismatch: AppendBlock of {W}, AppendBlockEnd of {W2}",
    ),
    "zero events": (pw.encode_append_block(W, HI) + block_end(whole=10, num=0), "invalid number of events 0"),
    "negative events": (block_end(data=HI, num=-3), "invalid number of events -3"),
    "size of whole events past block": (
        pw.encode_append_block(W, HI) + block_end(whole=11),
        "invalid sizeOfWholeEvents 11 in an append block of 10 bytes",
    ),
    "negative size of whole events": (
        pw.encode_append_block(W, HI) + block_end(whole=-1),
        "invalid sizeOfWholeEvents -1",
    ),
    "event frame as block tail": (
        pw.encode_append_block(W, HI + HI) + block_end(whole=10),
        "found Event (0) at the end of an append block, expected a PartialEvent or Padding",
    ),
    "block tail shorter than a header": (
        pw.encode_append_block(W, HI + b"\xff\xff\xff") + block_end(whole=10),
        "append block ends with 3 bytes after its whole events, not a whole frame",
    ),
    "two frames in block tail": (
        pw.encode_append_block(W, HI + pw.encode_padding(2) + pw.encode_padding(2)) + block_end(whole=10),
        "the Padding (-1) at the end of an append block says 2 bytes, 12 remain in the block",
    ),
    "padding then end data": (
        pw.encode_append_block(W, HI + pw.encode_padding(4)) + block_end(whole=10, data=HI, num=2),
        "AppendBlockEnd carries 10 bytes of data after a Padding block end",
    ),
    "end data without partial event": (
        pw.encode_append_block(W, HI) + block_end(whole=10, data=HI, num=2),
        "AppendBlockEnd carries 10 bytes of data but its block ends without a PartialEvent",
    ),
    "top-level event": (HI, "Event (0) frame outside an append block"),
    "top-level partial event": (pw.encode_partial_event(b"x"), "PartialEvent (-2) frame outside an append block"),
    "not an event frame in data": (
        block_end(data=pw.encode_keep_alive()),
        "expected an Event (0) frame in the append data, found KeepAlive (100)",
    ),
    "event longer than data": (block_end(data=HI[:-1]), "append data ends inside event 1 (1 of 2 bytes)"),
    "event header cut": (block_end(data=HI + HI[:5], num=2), "append data ends inside the header of event 2"),
    "negative event length": (block_end(data=struct.pack(">ii", 0, -2)), "Event frame with negative length -2"),
    "too few events": (block_end(data=HI, num=2), "AppendBlockEnd says 2 events, its data holds 1"),
    "too many events": (block_end(data=HI * 3, num=2), "AppendBlockEnd says 2 events, its data holds 3"),
    "negative data length": (
        pw.encode_append_block_end(W, 0, b"", 1, 1, 1)[:28] + struct.pack(">i", -1) + b"\0" * 20,
        "AppendBlockEnd with negative data length -1",
    ),
    "block end cut in its fields": (
        struct.pack(">ii", pw.APPEND_BLOCK_END, 30) + W.bytes + struct.pack(">ii", 0, 0) + b"\0" * 6,
        "AppendBlockEnd frame of 30 bytes ends inside its fields",
    ),
    "block end shorter than its sizes": (
        struct.pack(">ii", pw.APPEND_BLOCK_END, 20) + b"\0" * 20,
        "AppendBlockEnd frame of 20 bytes ends inside its fields",
    ),
    "block end data past the frame": (
        struct.pack(">ii", pw.APPEND_BLOCK_END, 40) + W.bytes + struct.pack(">ii", 0, 10) + b"\0" * 16,
        "AppendBlockEnd frame of 40 bytes ends inside its fields",
    ),
    "append block without writer id": (
        struct.pack(">ii", pw.APPEND_BLOCK, 15) + b"\0" * 15,
        "AppendBlock frame of 15 bytes is shorter than its 16-byte writer id",
    ),
    "conditional append holding a padding": (
        pw.encode_conditional_append(W, 1, 0, b"x", 1)[:40] + struct.pack(">i", -1) + pw.encode_conditional_append(W, 1, 0, b"x", 1)[44:],
        "ConditionalAppend holds Padding (-1), expected an Event (0) frame",
    ),
    "conditional append event past the frame": (
        struct.pack(">ii", pw.CONDITIONAL_APPEND, 42) + W.bytes + struct.pack(">qqii", 1, 0, 0, 3) + b"ab",
        "ConditionalAppend frame of 42 bytes ends inside its event (3 bytes)",
    ),
    "conditional append negative event length": (
        struct.pack(">ii", pw.CONDITIONAL_APPEND, 40) + W.bytes + struct.pack(">qqii", 1, 0, 0, -1),
        "ConditionalAppend with a negative event length -1",
    ),
    "conditional append cut": (
        struct.pack(">ii", pw.CONDITIONAL_APPEND, 30) + b"\0" * 30,
        "ConditionalAppend frame of 30 bytes ends inside its fields",
    ),
    "short hello": (struct.pack(">iii", pw.HELLO, 4, 17), "Hello frame of 4 bytes ends inside its fields"),
    "setup append cut in its segment": (
        struct.pack(">ii", pw.SETUP_APPEND, 28) + b"\0" * 24 + b"\x00\x10ab",
        "SetupAppend frame of 28 bytes ends inside its fields",
    ),
    "setup append with a bad segment": (
        pw.encode_setup_append(1, W, "ab").replace(b"\x00\x02ab", b"\x00\x02\xc3a"),
        "SetupAppend: invalid modified UTF-8 string",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_APPENDS))
def test_validation_errors_name_the_problem(name):
    bad, reason = BAD_APPENDS[name]
    prefix = pw.encode_hello() + setup()
    commands, got = error_every_way(server(), prefix + bad)
    assert reason in got
    assert commands == [pw.Hello(17, 5), pw.SetupAppend(1, W, SEGMENT, "")]


def test_event_over_max_event_bytes():
    big = event_frames(b"x" * 101)
    _, reason = error_every_way(server(max_event_bytes=100), block_end(data=big))
    assert reason == "event of 101 bytes exceeds max_event_bytes 100"
    _, reason = error_every_way(server(max_event_bytes=100), pw.encode_conditional_append(W, 1, 0, b"x" * 101, 1))
    assert reason == "event of 101 bytes exceeds max_event_bytes 100"
    assert decode_every_way(server(max_event_bytes=101), block_end(data=big)) == [pw.Append(W, (b"x" * 101,), 1, 1, 1, 109)]


@pytest.mark.parametrize(
    "code, reason",
    [
        (pw.DATA_APPENDED, "DataAppended (7) is not a command a client sends to a segment store"),
        (pw.APPEND_SETUP, "AppendSetup (2) is not a command"),
        (pw.WRONG_HOST, "WrongHost (50) is not a command"),
        (89, "ConditionalBlockEnd (89) is not a command"),
        (70, "table-segment command 70 (70) is not a command"),
        (42, "OffsetLocated (42) is not a command"),
        (43, "unknown wire command type 43"),
        (-128, "unknown wire command type -128"),
    ],
)
def test_types_the_server_does_not_take(code, reason):
    # Refused from the header alone, before the body arrives.
    decoder = pw.PravegaServerDecoder()
    with pytest.raises(DecodeError, match="^" + __import__("re").escape(reason)) as info:
        decoder.feed(struct.pack(">ii", code, 1000))
    assert info.value.fatal


def test_client_decoder_refuses_client_commands_and_unknown_types():
    for data, reason in [
        (setup(), "SetupAppend (1) is not a command this writer-side decoder takes"),
        (pw.encode_append_block(W, HI), "AppendBlock (3) is not a command"),
        (struct.pack(">ii", 61, 0), "ErrorMessage (61) is not a command"),
        (struct.pack(">ii", 6, 0), "unknown wire command type 6"),
        (pw.encode_padding(3), "Padding (-1) is not a command"),
    ]:
        _, got = error_every_way(client(), pw.encode_hello() + data)
        assert got.startswith(reason)


# -- truncated, oversized, garbage ---------------------------------------------------------


def test_truncated_input_gives_nothing_and_counts_pending_bytes():
    frames = [pw.encode_hello(), setup(), pw.encode_conditional_append(W, 1, 0, b"abc", 4), RUST_BLOCK_END]
    stream = b"".join(frames)
    boundaries = [0]
    for f in frames:
        boundaries.append(boundaries[-1] + len(f))
    for cut in range(len(stream)):
        decoder = pw.PravegaServerDecoder()
        out = decoder.feed(stream[:cut])
        complete = max(i for i, b in enumerate(boundaries) if b <= cut)
        assert len(out) == complete, cut
        assert decoder.pending_bytes == cut - boundaries[complete], cut


def test_truncated_reply_gives_nothing():
    ack = pw.encode_data_appended(W, 1, pw.NO_EVENT_NUMBER, 1, 10)
    decoder = pw.PravegaClientDecoder()
    assert decoder.feed(ack[:-1]) == []
    assert decoder.pending_bytes == len(ack) - 1
    assert decoder.feed(ack[-1:]) == [pw.DataAppended(W, 1, pw.NO_EVENT_NUMBER, 1, 10)]
    assert decoder.pending_bytes == 0


@pytest.mark.parametrize("make", [server, client])
def test_oversized_frame_is_refused_from_its_header(make):
    too_big = pw.MAX_FRAME_BYTES - 8 + 1
    decoder = make()()
    decoder.feed(pw.encode_keep_alive()[:4])
    with pytest.raises(DecodeError) as info:
        decoder.feed(struct.pack(">ii", pw.KEEP_ALIVE, too_big)[4:])
    assert info.value.reason == f"KeepAlive (100) frame of {pw.MAX_FRAME_BYTES + 1} bytes exceeds max_frame_bytes {pw.MAX_FRAME_BYTES}"
    assert info.value.fatal
    # Exactly the limit is a frame like any other: it waits for its body.
    decoder = make()()
    assert decoder.feed(struct.pack(">ii", pw.KEEP_ALIVE, too_big - 1)) == []
    assert decoder.pending_bytes == 8


def test_frame_at_a_small_limit_decodes_and_one_more_byte_does_not():
    frame = pw.encode_append_block_end(W, 10, HI, 1, 1, 1)
    assert decode_every_way(server(max_frame_bytes=len(frame)), frame) == [pw.Append(W, (b"hi",), 1, 1, 1, 10)]
    _, reason = error_every_way(server(max_frame_bytes=len(frame) - 1), frame)
    assert reason == f"AppendBlockEnd (4) frame of {len(frame)} bytes exceeds max_frame_bytes {len(frame) - 1}"


@pytest.mark.parametrize("make", [server, client])
def test_negative_length_is_fatal(make):
    _, reason = error_every_way(make(), pw.encode_hello() + struct.pack(">ii", pw.KEEP_ALIVE, -1))
    assert reason == "KeepAlive (100) frame with negative length -1"


@pytest.mark.parametrize(
    "garbage, reason, client_reason",
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "unknown wire command type 1195725856", None),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "unknown wire command type 369295618", None),  # TLS
        # Type -1 (Padding) with length -1: the server takes Padding, the client does not.
        (b"\xff" * 16, "Padding (-1) frame with negative length -1", "Padding (-1) is not a command this writer-side decoder takes"),
    ],
)
def test_garbage(garbage, reason, client_reason):
    _, got = error_every_way(server(), garbage)
    assert got == reason
    _, got = error_every_way(client(), garbage)
    assert got == (client_reason or reason)


def test_messages_carry_commands_before_the_bad_frame_and_later_feeds_fail():
    decoder = pw.PravegaServerDecoder()
    assert decoder.feed(pw.encode_hello()) == [pw.Hello(17, 5)]
    with pytest.raises(DecodeError) as info:
        decoder.feed(setup() + pw.encode_keep_alive() + HI + pw.encode_keep_alive())
    assert info.value.messages == [pw.SetupAppend(1, W, SEGMENT, ""), pw.KeepAlive()]
    assert info.value.reason == "Event (0) frame outside an append block"
    assert decoder.pending_bytes == 0
    with pytest.raises(DecodeError, match="decoder already failed: Event"):
        decoder.feed(pw.encode_keep_alive())


def test_an_append_block_is_dropped_with_the_error():
    decoder = pw.PravegaServerDecoder()
    with pytest.raises(DecodeError) as info:
        decoder.feed(pw.encode_append_block(W, HI) + block_end(W2, 10))
    assert info.value.messages == []
    assert decoder.pending_bytes == 0


# -- modified UTF-8 ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, body",
    [
        ("", ""),
        ("abc", "61 62 63"),
        ("a\0b", "61 c0 80 62"),
        ("\u00e9", "c3 a9"),
        ("\u20ac", "e2 82 ac"),
        ("\uffff", "ef bf bf"),
        ("\U0001f600", "ed a0 bd ed b8 80"),  # U+1F600 as the surrogates D83D DE00, 3 bytes each
        ("\U0010ffff", "ed af bf ed bf bf"),
    ],
)
def test_modified_utf8(text, body):
    raw = hexbytes(body)
    encoded = pw.encode_modified_utf8(text)
    assert encoded == struct.pack(">H", len(raw)) + raw
    assert pw.decode_modified_utf8(encoded) == text


def test_modified_utf8_accepts_what_java_readutf_and_other_peers_send():
    assert pw.decode_modified_utf8(b"\x00\x03a\x00b") == "a\0b"  # a raw 00 byte (Java's readUTF takes it)
    assert pw.decode_modified_utf8(b"\x00\x04\xf0\x9f\x98\x80") == "\U0001f600"  # standard 4-byte UTF-8


@pytest.mark.parametrize(
    "body",
    [
        "ff",
        "80",  # a lone continuation byte
        "e2 82",  # cut short
        "c1 81",  # overlong 'A'
        "e0 80 80",  # overlong NUL in 3 bytes
        "ed a0 bd",  # a high surrogate alone
        "ed b8 80 ed a0 bd",  # the pair the wrong way round
    ],
)
def test_invalid_modified_utf8(body):
    raw = hexbytes(body)
    with pytest.raises(DecodeError, match="invalid modified UTF-8"):
        pw.decode_modified_utf8(struct.pack(">H", len(raw)) + raw)
    # In a frame: fatal, naming the command.
    bad = frame(pw.WRONG_HOST, q(1) + struct.pack(">H", len(raw)) + raw + utf("host") + utf(""))
    _, reason = error_every_way(client(), bad)
    assert reason.startswith("WrongHost: invalid modified UTF-8 string")


def test_modified_utf8_length_limits():
    assert len(pw.encode_modified_utf8("a" * 65535)) == 65537
    with pytest.raises(ValueError, match="65536 bytes"):
        pw.encode_modified_utf8("a" * 65536)
    with pytest.raises(ValueError, match="more than 65535"):
        pw.encode_modified_utf8("\u20ac" * 21846)  # 65538 bytes from 21846 characters
    with pytest.raises(ValueError, match="more than 65535"):
        pw.encode_modified_utf8("\0" * 32768)  # NUL takes two bytes
    with pytest.raises(ValueError, match="unpaired surrogate"):
        pw.encode_modified_utf8("a\ud800")
    with pytest.raises(DecodeError, match="length field says 5 bytes, 3 follow"):
        pw.decode_modified_utf8(b"\x00\x05abc")
    with pytest.raises(DecodeError, match="shorter than its 2-byte length"):
        pw.decode_modified_utf8(b"\x00")


def test_segment_names_with_nul_and_non_bmp_characters_travel():
    segment = "sc\0pe/str\u00e9am/\U0001f600.#epoch.0"
    commands = decode_every_way(server(), pw.encode_setup_append(5, W, segment, "tok\0en"))
    assert commands == [pw.SetupAppend(5, W, segment, "tok\0en")]
    assert decode_every_way(client(), pw.encode_append_setup(5, segment, W, 3)) == [pw.AppendSetup(5, segment, W, 3)]


# -- trailing-field tolerance --------------------------------------------------------------


def frame(code: int, body: bytes) -> bytes:
    return struct.pack(">ii", code, len(body)) + body


def utf(text: str) -> bytes:
    return pw.encode_modified_utf8(text)


def q(*values: int) -> bytes:
    return b"".join(struct.pack(">q", v) for v in values)


def test_server_trailing_fields():
    # A SetupAppend without its delegation token (Java would refuse it; nothing is lost).
    assert decode_every_way(server(), frame(pw.SETUP_APPEND, q(1) + W.bytes + utf(SEGMENT))) == [
        pw.SetupAppend(1, W, SEGMENT, "")
    ]
    # Unknown trailing bytes are skipped.
    extra = b"\x01\x02\x03"
    assert decode_every_way(server(), frame(pw.SETUP_APPEND, q(1) + W.bytes + utf(SEGMENT) + utf("t") + extra)) == [
        pw.SetupAppend(1, W, SEGMENT, "t")
    ]
    assert decode_every_way(server(), frame(pw.HELLO, struct.pack(">ii", 17, 5) + extra)) == [pw.Hello(17, 5)]
    assert decode_every_way(server(), frame(pw.KEEP_ALIVE, extra)) == [pw.KeepAlive()]
    # AppendBlockEnd and ConditionalAppend without a request id: -1, as Java reads them.
    end = pw.encode_append_block_end(W, 10, HI, 1, 1, 8)
    assert decode_every_way(server(), frame(pw.APPEND_BLOCK_END, end[8:-8])) == [pw.Append(W, (b"hi",), 1, 1, -1, 10)]
    assert decode_every_way(server(), frame(pw.APPEND_BLOCK_END, end[8:-3])) == [pw.Append(W, (b"hi",), 1, 1, -1, 10)]
    assert decode_every_way(server(), frame(pw.APPEND_BLOCK_END, end[8:] + extra)) == [pw.Append(W, (b"hi",), 1, 1, 8, 10)]
    cond = pw.encode_conditional_append(W, 2, 30, b"x", 9)
    assert decode_every_way(server(), frame(pw.CONDITIONAL_APPEND, cond[8:-8])) == [pw.ConditionalAppend(W, 2, 30, b"x", -1)]
    assert decode_every_way(server(), frame(pw.CONDITIONAL_APPEND, cond[8:] + extra)) == [
        pw.ConditionalAppend(W, 2, 30, b"x", 9)
    ]


@pytest.mark.parametrize(
    "body_code, body, expected",
    [
        (pw.DATA_APPENDED, W.bytes + q(4), pw.DataAppended(W, 4, -1, -1, -1)),
        (pw.DATA_APPENDED, W.bytes + q(4, 3), pw.DataAppended(W, 4, 3, -1, -1)),
        (pw.DATA_APPENDED, W.bytes + q(4, 3, 2) + b"\0" * 7, pw.DataAppended(W, 4, 3, 2, -1)),
        (pw.DATA_APPENDED, W.bytes + q(4, 3, 2, 1) + b"extra", pw.DataAppended(W, 4, 3, 2, 1)),
        (pw.CONDITIONAL_CHECK_FAILED, W.bytes + q(4), pw.ConditionalCheckFailed(W, 4, -1)),
        (pw.WRONG_HOST, q(1) + utf("s") + utf("h"), pw.WrongHost(1, "s", "h", "")),
        (pw.NO_SUCH_SEGMENT, q(1) + utf("s"), pw.NoSuchSegment(1, "s", "", -1)),
        (pw.NO_SUCH_SEGMENT, q(1) + utf("s") + utf("trace"), pw.NoSuchSegment(1, "s", "trace", -1)),
        (pw.SEGMENT_IS_SEALED, q(1) + utf("s"), pw.SegmentIsSealed(1, "s", "", -1)),
        (pw.SEGMENT_IS_SEALED, q(1) + utf("s") + utf("") + q(99) + b"zz", pw.SegmentIsSealed(1, "s", "", 99)),
        (pw.INVALID_EVENT_NUMBER, W.bytes + q(1), pw.InvalidEventNumber(W, 1, "", -1)),
        (pw.AUTH_TOKEN_CHECK_FAILED, q(1), pw.AuthTokenCheckFailed(1, "", -1)),
        (pw.AUTH_TOKEN_CHECK_FAILED, q(1) + utf("t") + b"\0\0", pw.AuthTokenCheckFailed(1, "t", -1)),
        (pw.OPERATION_UNSUPPORTED, q(1) + utf("op"), pw.OperationUnsupported(1, "op", "")),
        (pw.APPEND_SETUP, q(1) + utf("s") + W.bytes + q(5) + b"more", pw.AppendSetup(1, "s", W, 5)),
    ],
)
def test_client_trailing_fields(body_code, body, expected):
    assert decode_every_way(client(), frame(body_code, body)) == [expected]


@pytest.mark.parametrize(
    "code, body, what",
    [
        (pw.APPEND_SETUP, q(1) + utf("s") + W.bytes, "AppendSetup"),  # lastEventNumber is not optional
        (pw.DATA_APPENDED, W.bytes + b"\0" * 7, "DataAppended"),
        (pw.WRONG_HOST, q(1) + utf("s"), "WrongHost"),
        (pw.NO_SUCH_SEGMENT, q(1) + utf("s") + b"\x00", "NoSuchSegment"),  # one byte: Java tries readUTF
        (pw.HELLO, b"\0\0\0\x11", "Hello"),
    ],
)
def test_client_required_fields(code, body, what):
    _, reason = error_every_way(client(), frame(code, body))
    assert reason == f"{what} frame of {len(body)} bytes ends inside its fields"


# -- the client decoder --------------------------------------------------------------------


def test_client_decoder_every_reply():
    replies = [
        (pw.encode_hello(), pw.Hello(17, 5)),
        (pw.encode_keep_alive(), pw.KeepAlive()),
        (pw.encode_append_setup(1, SEGMENT, W, 41), pw.AppendSetup(1, SEGMENT, W, 41)),
        (pw.encode_data_appended(W, 42, 41, 2, 4096), pw.DataAppended(W, 42, 41, 2, 4096)),
        (pw.encode_conditional_check_failed(W, 43, 3), pw.ConditionalCheckFailed(W, 43, 3)),
        (pw.encode_wrong_host(4, SEGMENT, "host:12345", "trace"), pw.WrongHost(4, SEGMENT, "host:12345", "trace")),
        (pw.encode_wrong_host(4, SEGMENT), pw.WrongHost(4, SEGMENT, "", "")),
        (pw.encode_no_such_segment(5, SEGMENT, "", 10), pw.NoSuchSegment(5, SEGMENT, "", 10)),
        (pw.encode_no_such_segment(5, SEGMENT), pw.NoSuchSegment(5, SEGMENT, "", -1)),
        (pw.encode_segment_is_sealed(6, SEGMENT, "t", 77), pw.SegmentIsSealed(6, SEGMENT, "t", 77)),
        (pw.encode_invalid_event_number(W, 7, "", 3), pw.InvalidEventNumber(W, 7, "", 3)),
        (pw.encode_auth_token_check_failed(8, "", 1), pw.AuthTokenCheckFailed(8, "", 1)),
        (pw.encode_auth_token_check_failed(8), pw.AuthTokenCheckFailed(8, "", -1)),
        (pw.encode_operation_unsupported(9, "conditionalAppend", ""), pw.OperationUnsupported(9, "conditionalAppend", "")),
    ]
    data = b"".join(encoded for encoded, _ in replies)
    assert decode_every_way(client(), data) == [expected for _, expected in replies]


def test_encoders_refuse_what_cannot_be_sent():
    with pytest.raises(ValueError):
        pw.encode_padding(-1)
    with pytest.raises(ValueError):
        pw.encode_setup_append(1, W, "x" * 70000)


def test_command_names():
    assert pw.command_name(pw.HELLO) == "Hello (-127)"
    assert pw.command_name(6) == "unknown type 6"

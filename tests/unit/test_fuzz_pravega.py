"""Fuzzing the Pravega wire codec (server and client decoders) with hypothesis.

For arbitrary bytes, frame-shaped garbage and mutations of valid sessions built with the
module's encoders: only ``DecodeError`` escapes, and the bytes give the same commands and
the same error whether fed whole, byte by byte or split anywhere. Valid sessions (every
append form: simple blocks, batched blocks closed by padding or a partial event, the Rust
client's standalone ``AppendBlockEnd``) decode back to what they were built from. Inputs
stay within a few KB and every example has a deadline. More examples:
``LOGROUTER_FUZZ_EXAMPLES=20000`` (bench/FUZZ.md).
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from fuzz_helpers import MAX_INPUT, cuts, decode_all_ways, fuzz_settings, mutated
from hypothesis import given
from hypothesis import strategies as st

from logrouter.wire import pravega as pw
from logrouter.wire.errors import DecodeError

# Small limits so that examples reach every limit check; and the defaults.
LIMITS = [{}, dict(max_frame_bytes=200, max_event_bytes=40), dict(max_event_bytes=0)]
limits = st.sampled_from(LIMITS)


def server(limits: dict) -> Any:
    return lambda: pw.PravegaServerDecoder(**limits)


def client(limits: dict) -> Any:
    return lambda: pw.PravegaClientDecoder(max_frame_bytes=limits.get("max_frame_bytes", pw.MAX_FRAME_BYTES))


writers = st.sampled_from([uuid.UUID(int=(1 << 64) | 2), uuid.UUID("9d804867-8b23-f632-a7f7-8ad5528cc282")]) | st.uuids()
longs = st.integers(-(2**63), 2**63 - 1)
ints = st.integers(-(2**31), 2**31 - 1)
texts = st.text(max_size=20)
payloads = st.binary(max_size=60)


# -- client->server sessions -------------------------------------------------------------------


@st.composite
def append_command(draw: Any) -> tuple[bytes, list[Any]]:
    """One append in any of the forms clients send, and what it decodes to."""
    writer = draw(writers)
    events = draw(st.lists(payloads, min_size=1, max_size=6))
    last, request = draw(longs), draw(longs)
    frames = [pw.encode_event(e) for e in events]
    data = b"".join(frames)
    expected = pw.Append(writer, tuple(events), len(events), last, request, len(data))
    shape = draw(st.sampled_from(["simple", "padding", "partial", "standalone"]))
    if shape == "standalone":  # the Rust client's form
        wire = pw.encode_append_block_end(writer, len(data), data, len(events), last, request)
    elif shape == "simple":
        wire = pw.encode_append_block(writer, data) + pw.encode_append_block_end(writer, len(data), b"", len(events), last, request)
    elif shape == "padding":
        block = data + pw.encode_padding(draw(st.integers(0, 20)))
        wire = pw.encode_append_block(writer, block) + pw.encode_append_block_end(writer, len(data), b"", len(events), last, request)
    else:  # the last event cut anywhere: its start in a PartialEvent, the rest in the end's data
        head = data[: len(data) - len(frames[-1])]
        cut = draw(st.integers(0, len(frames[-1])))
        block = head + pw.encode_partial_event(frames[-1][:cut])
        wire = pw.encode_append_block(writer, block) + pw.encode_append_block_end(
            writer, len(head), frames[-1][cut:], len(events), last, request
        )
    return wire, [expected]


@st.composite
def server_command(draw: Any) -> tuple[bytes, list[Any]]:
    kind = draw(st.sampled_from(["hello", "keepalive", "setup", "append", "append", "conditional", "padding"]))
    if kind == "hello":
        high, low = draw(ints), draw(ints)
        return pw.encode_hello(high, low), [pw.Hello(high, low)]
    if kind == "keepalive":
        return pw.encode_keep_alive(), [pw.KeepAlive()]
    if kind == "setup":
        request, writer, segment, token = draw(longs), draw(writers), draw(texts), draw(texts)
        return pw.encode_setup_append(request, writer, segment, token), [pw.SetupAppend(request, writer, segment, token)]
    if kind == "conditional":
        writer, number, offset, payload, request = draw(writers), draw(longs), draw(longs), draw(payloads), draw(longs)
        return (
            pw.encode_conditional_append(writer, number, offset, payload, request),
            [pw.ConditionalAppend(writer, number, offset, payload, request)],
        )
    if kind == "padding":
        return pw.encode_padding(draw(st.integers(0, 16))), []
    return draw(append_command())


@st.composite
def server_session(draw: Any) -> tuple[bytes, list[Any]]:
    parts = draw(st.lists(server_command(), min_size=1, max_size=8))
    return b"".join(p[0] for p in parts), [c for p in parts for c in p[1]]


@given(server_session(), cuts)
@fuzz_settings()
def test_valid_client_sessions_round_trip(session: tuple[bytes, list[Any]], cut: list[int]) -> None:
    data, expected = session
    commands, reason = decode_all_ways(server({}), data, cut)
    assert reason is None, reason
    assert commands == expected
    decoder = pw.PravegaServerDecoder()
    decoder.feed(data)
    assert decoder.pending_bytes == 0


# -- server->client sessions -------------------------------------------------------------------


@st.composite
def reply(draw: Any) -> tuple[bytes, Any]:
    kind = draw(st.integers(0, 10))
    w, r, s, t = draw(writers), draw(longs), draw(texts), draw(texts)
    n1, n2, n3 = draw(longs), draw(longs), draw(longs)
    if kind == 0:
        high, low = draw(ints), draw(ints)
        return pw.encode_hello(high, low), pw.Hello(high, low)
    if kind == 1:
        return pw.encode_keep_alive(), pw.KeepAlive()
    if kind == 2:
        return pw.encode_append_setup(r, s, w, n1), pw.AppendSetup(r, s, w, n1)
    if kind == 3:
        return pw.encode_data_appended(w, n1, n2, r, n3), pw.DataAppended(w, n1, n2, r, n3)
    if kind == 4:
        return pw.encode_conditional_check_failed(w, n1, r), pw.ConditionalCheckFailed(w, n1, r)
    if kind == 5:
        return pw.encode_wrong_host(r, s, t, "trace"), pw.WrongHost(r, s, t, "trace")
    if kind == 6:
        return pw.encode_no_such_segment(r, s, t, n1), pw.NoSuchSegment(r, s, t, n1)
    if kind == 7:
        return pw.encode_segment_is_sealed(r, s, t, n1), pw.SegmentIsSealed(r, s, t, n1)
    if kind == 8:
        return pw.encode_invalid_event_number(w, r, t, n1), pw.InvalidEventNumber(w, r, t, n1)
    if kind == 9:
        code = draw(ints)
        return pw.encode_auth_token_check_failed(r, t, code), pw.AuthTokenCheckFailed(r, t, code)
    return pw.encode_operation_unsupported(r, s, t), pw.OperationUnsupported(r, s, t)


@given(st.lists(reply(), min_size=1, max_size=8), cuts)
@fuzz_settings()
def test_valid_server_replies_round_trip(replies: list[tuple[bytes, Any]], cut: list[int]) -> None:
    data = b"".join(r[0] for r in replies)
    commands, reason = decode_all_ways(client({}), data, cut)
    assert reason is None, reason
    assert commands == [r[1] for r in replies]


# -- garbage and mutations ---------------------------------------------------------------------


@given(st.binary(max_size=MAX_INPUT), cuts, limits)
@fuzz_settings()
def test_arbitrary_bytes_raise_only_decode_error(data: bytes, cut: list[int], limit: dict) -> None:
    decode_all_ways(server(limit), data, cut)
    decode_all_ways(client(limit), data, cut)


# Frame-shaped garbage: a plausible header (known types, small lengths) with random bodies,
# so that examples get past the header checks into the field readers.
KNOWN = sorted({pw.HELLO, pw.KEEP_ALIVE, pw.PADDING, pw.PARTIAL_EVENT, pw.EVENT, 1, 2, 3, 4, 5, 7, 8, 50, 51, 53, 55, 57, 60})


@st.composite
def garbage_frame(draw: Any) -> bytes:
    body = draw(st.binary(max_size=80))
    length = draw(st.sampled_from([len(body), len(body), max(len(body) - 1, 0), len(body) + 1, -1]))
    return struct.pack(">ii", draw(st.sampled_from(KNOWN)), length) + body


@given(st.lists(garbage_frame(), min_size=1, max_size=10), cuts, limits)
@fuzz_settings()
def test_frame_shaped_garbage_raises_only_decode_error(frames: list[bytes], cut: list[int], limit: dict) -> None:
    data = b"".join(frames)
    decode_all_ways(server(limit), data, cut)
    decode_all_ways(client(limit), data, cut)


@given(mutated(server_session().map(lambda s: s[0])), cuts, limits)
@fuzz_settings()
def test_mutated_client_sessions_raise_only_decode_error(data: bytes, cut: list[int], limit: dict) -> None:
    commands, _ = decode_all_ways(server(limit), data, cut)
    for command in commands:
        if isinstance(command, pw.Append):
            assert command.num_events == len(command.events) > 0
            assert command.size == sum(len(e) + 8 for e in command.events)


@given(mutated(append_command().map(lambda a: a[0])), cuts)
@fuzz_settings()
def test_mutated_appends_raise_only_decode_error(data: bytes, cut: list[int]) -> None:
    decode_all_ways(server({}), data, cut)


@given(mutated(st.lists(reply(), min_size=1, max_size=6).map(lambda rs: b"".join(r[0] for r in rs))), cuts, limits)
@fuzz_settings()
def test_mutated_server_replies_raise_only_decode_error(data: bytes, cut: list[int], limit: dict) -> None:
    decode_all_ways(client(limit), data, cut)


@given(st.text(max_size=40))
@fuzz_settings()
def test_modified_utf8_round_trip(text: str) -> None:
    assert pw.decode_modified_utf8(pw.encode_modified_utf8(text)) == text


@given(st.binary(max_size=40))
@fuzz_settings()
def test_arbitrary_modified_utf8_raises_only_decode_error(raw: bytes) -> None:
    try:
        text = pw.decode_modified_utf8(struct.pack(">H", len(raw)) + raw)
    except DecodeError:
        return
    text.encode("utf-8")  # whatever decodes is a str that can travel on

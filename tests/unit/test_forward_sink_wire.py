"""Tests for the forward client codec (logrouter.wire.fluent_client) and the client handshake.

What the sink sends is decoded with our own in_forward-style decoder (``ForwardDecoder``)
and checked against the F3 layout (str32 entries, EventTime fixext8, options); replies
are fed whole, byte by byte and split at every offset.
"""

from __future__ import annotations

import gzip

import msgpack
import pytest

from logrouter.wire import fluent_client as wire
from logrouter.wire.fluent_forward import ForwardDecoder, encode_ack
from logrouter.wire.fluent_handshake import (
    ClientHandshake,
    HandshakeError,
    Security,
    ServerHandshake,
    encode_helo,
    encode_pong,
    shared_key_digest,
)

T0 = 1_441_588_984 * 10**9


def decode(data: bytes):
    messages = ForwardDecoder().feed(data)
    assert len(messages) == 1
    return messages[0]


def test_chunk_ids_are_deterministic_and_distinct():
    entries = wire.pack_entries([(T0, {"a": 1})], 1 << 20)[0][1]
    a = wire.chunk_id(b"spool-1", "out", 1234, 0, "t", entries)
    assert a == wire.chunk_id(b"spool-1", "out", 1234, 0, "t", entries)
    assert len(a) == 24 and a.endswith(b"==")  # 16 bytes, base64
    others = {
        wire.chunk_id(b"spool-2", "out", 1234, 0, "t", entries),
        wire.chunk_id(b"spool-1", "out2", 1234, 0, "t", entries),
        wire.chunk_id(b"spool-1", "out", 1235, 0, "t", entries),
        wire.chunk_id(b"spool-1", "out", 1234, 1, "t", entries),
        wire.chunk_id(b"spool-1", "out", 1234, 0, "t2", entries),
        wire.chunk_id(b"spool-1", "out", 1234, 0, "t", entries + entries),  # other events: another id
        wire.chunk_id(b"spool-", "1out", 1234, 0, "t", entries),  # fields cannot run into each other
    }
    assert a not in others and len(others) == 7


def test_vector_f3_layout():
    groups = wire.pack_entries([(T0, {"message": "foo"})], 1 << 20)
    assert groups == [(1, b"\x92\xd7\x00" + bytes.fromhex("55ece6f800000000") + b"\x81\xa7message\xa3foo")]
    data = wire.encode_chunk("tag.name", groups[0][1], 1, b"p8n9gmxTQVC8/nh2wlKKeQ==")
    assert data.startswith(b"\x93\xa8tag.name\xdb\x00\x00\x00\x18\x92\xd7\x00")
    assert data.endswith(b"\x83\xa4size\x01\xaacompressed\xa4text\xa5chunk\xb8p8n9gmxTQVC8/nh2wlKKeQ==")  # F3 option order
    message = decode(data)
    assert message.tag == "tag.name"
    assert message.events == [(T0, {"message": "foo"})]
    assert message.chunk == b"p8n9gmxTQVC8/nh2wlKKeQ=="
    assert message.options == {"size": 1, "compressed": "text", "chunk": "p8n9gmxTQVC8/nh2wlKKeQ=="}


def test_nanoseconds_binary_and_invalid_utf8_survive():
    events = [
        (T0 + 123_456_789, {"bin": b"\xff\x00", "bad": "caf\udce9", "nested": {"a": [1, 2.5, None, True]}}),
        (5 * 10**18, {"far": "future"}),  # beyond u32 seconds: integer seconds instead of EventTime
    ]
    (count, entries), = wire.pack_entries(events, 1 << 20)
    message = decode(wire.encode_chunk("t.\udcff", entries, count, None))
    assert message.tag == "t.\udcff"
    assert message.chunk is None and "chunk" not in message.options
    assert message.events[0] == events[0]
    assert message.events[1] == (5 * 10**18, {"far": "future"})


def test_values_msgpack_cannot_pack_go_as_text():
    import datetime

    when = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    (count, entries), = wire.pack_entries([(T0, {"at": when, "s": {1, 2} and (1, 2)})], 1 << 20)
    record = decode(wire.encode_chunk("t", entries, count, None)).events[0][1]
    assert record == {"at": "2024-01-02T03:04:05+00:00", "s": [1, 2]}


def test_split_at_max_bytes_is_deterministic():
    events = [(T0 + i, {"n": i, "pad": "x" * 90}) for i in range(50)]
    groups = wire.pack_entries(events, 1000)
    assert groups == wire.pack_entries([list(e) for e in events], 1000)  # lists from the spool: same bytes
    assert sum(n for n, _ in groups) == 50 and len(groups) > 5
    assert all(len(blob) <= 1000 for _, blob in groups)
    decoded = []
    for n, blob in groups:
        message = decode(wire.encode_chunk("t", blob, n, None))
        assert len(message.events) == n == message.options["size"]
        decoded += message.events
    assert decoded == events
    # A single event larger than the bound travels alone.
    big = wire.pack_entries([(T0, {"big": "y" * 5000}), (T0, {"small": 1})], 1000)
    assert [n for n, _ in big] == [1, 1]


def test_gzip_chunk_decodes_and_is_stable():
    events = [(T0 + i, {"msg": f"line {i}", "pad": "z" * 50}) for i in range(200)]
    (count, entries), = wire.pack_entries(events, 1 << 20)
    data = wire.encode_chunk("gz", entries, count, b"id", "gzip")
    assert data == wire.encode_chunk("gz", entries, count, b"id", "gzip")  # mtime 0: same bytes on a resend
    assert len(data) < len(entries) / 3
    message = decode(data)
    assert message.options["compressed"] == "gzip" and message.events == events
    blob = msgpack.unpackb(data, raw=True)[1]
    assert gzip.decompress(blob) == entries
    with pytest.raises(ValueError, match="unknown compression"):
        wire.encode_chunk("t", entries, count, None, "lz4")


def test_ack_of():
    assert wire.ack_of({"ack": "abc"}) == b"abc"
    assert wire.ack_of({b"ack": b"abc"}) == b"abc"
    assert wire.ack_of({"ack": "p8n9\n"}) == b"p8n9\n"
    assert wire.ack_of({"nack": "x"}) is None
    assert wire.ack_of(["HELO", {}]) is None
    assert wire.ack_of({"ack": 1}) is None


def test_reply_reader_whole_bytewise_and_split():
    stream = encode_ack(b"one") + encode_ack(b"two==") + encode_helo(b"n" * 16, b"") + encode_ack(b"\xffraw")
    expected = wire.ReplyReader().feed(stream)
    assert [wire.ack_of(m) for m in expected] == [b"one", b"two==", None, b"\xffraw"]
    reader = wire.ReplyReader()
    assert [m for b in stream for m in reader.feed(bytes([b]))] == expected
    for cut in range(len(stream) + 1):
        reader = wire.ReplyReader()
        assert reader.feed(stream[:cut]) + reader.feed(stream[cut:]) == expected


def test_reply_reader_refuses_garbage_and_oversize():
    with pytest.raises(wire.ReplyError, match="undecodable"):
        wire.ReplyReader().feed(b"\xc1")
    reader = wire.ReplyReader(max_bytes=200_000)
    with pytest.raises(wire.ReplyError):
        reader.feed(b"\xdb" + (10**6).to_bytes(4, "big") + b"x" * 300_000)


# -- the client side of the handshake ------------------------------------------------------

SECURITY = Security(shared_key="secret", self_hostname="server.example")


def run_handshake(server: ServerHandshake, client: ClientHandshake) -> bytes:
    ping = client.receive(msgpack.unpackb(server.helo(), raw=False))
    result = server.feed(ping)
    assert result is not None
    assert client.receive(msgpack.unpackb(result.pong, raw=False)) is None
    return result.pong


def test_client_handshake_against_our_server():
    client = ClientHandshake("client.example", "secret")
    run_handshake(ServerHandshake(SECURITY), client)
    assert client.established and client.server_hostname == "server.example"


def test_client_handshake_with_user():
    server = ServerHandshake(Security("secret", "server.example", {"alice": "pw"}))
    client = ClientHandshake("client.example", "secret", username="alice", password="pw")
    run_handshake(server, client)
    assert client.established
    wrong = ClientHandshake("client.example", "secret", username="alice", password="nope")
    with pytest.raises(HandshakeError, match="authentication failed.*username/password mismatch"):
        run_handshake(ServerHandshake(Security("secret", "server.example", {"alice": "pw"})), wrong)


def test_client_handshake_vector_digest():
    nonce = bytes(range(16))
    salt = b"0123456789abcdef0123456789abcdef"
    client = ClientHandshake("client.example", "secret", salt=salt)
    ping = msgpack.unpackb(client.receive(msgpack.unpackb(encode_helo(nonce, b""), raw=False)), raw=False)
    assert ping == [
        "PING",
        "client.example",
        salt.decode(),
        "3a680037d3979b4f789647cd22e7e55f2197791eb498799823c424e2213124ed"
        "63938d1c422f50e08ec02957ef44df338e46c77e8ea164b0dde6d64e171b30df",
        "",
        "",
    ]
    pong = ["PONG", True, "", "server.example", shared_key_digest(salt, "server.example", nonce, "secret")]
    assert client.receive(pong) is None and client.established


@pytest.mark.parametrize(
    "pong, match",
    [
        (["PONG", False, "shared_key mismatch", "", ""], "authentication failed.*shared_key mismatch"),
        (["PONG", True, "", "client.example", "x"], "same hostname between input and output"),
        (["PONG", True, "", "server.example", "0" * 128], "shared_key mismatch"),
        (["PONG", True], "invalid PONG"),
        ({"ack": "x"}, "invalid PONG"),
    ],
)
def test_client_handshake_refuses_bad_pongs(pong, match):
    client = ClientHandshake("client.example", "secret")
    client.receive(msgpack.unpackb(encode_helo(b"n" * 16, b""), raw=False))
    with pytest.raises(HandshakeError, match=match):
        client.receive(pong)
    assert not client.established


def test_client_handshake_refuses_a_pong_or_garbage_first():
    with pytest.raises(HandshakeError, match="invalid HELO"):
        ClientHandshake("c", "k").receive(msgpack.unpackb(encode_pong(True, "", "s", "d"), raw=False))
    with pytest.raises(HandshakeError, match="invalid HELO"):
        ClientHandshake("c", "k").receive({"ack": "x"})


def test_reply_reader_hands_over_replies_before_bad_bytes():
    stream = encode_ack(b"one") + encode_ack(b"two") + b"\xc1"
    with pytest.raises(wire.ReplyError, match="undecodable reply") as info:
        wire.ReplyReader().feed(stream)
    assert [wire.ack_of(m) for m in info.value.messages] == [b"one", b"two"]
    with pytest.raises(wire.ReplyError, match="reader already failed"):
        reader = wire.ReplyReader()
        with pytest.raises(wire.ReplyError):
            reader.feed(b"\xc1")
        reader.feed(encode_ack(b"x"))


def test_reply_reader_bound_is_per_reply_however_the_bytes_are_split():
    # A 100 KB reply after a 60 KB one, under a 128 KiB bound: fed whole, the old fixed
    # 64 KiB steps put most of the long reply and a whole step in the buffer and refused it.
    replies = ["a" * 60_000, "b" * 100_000, "c" * 40_000]
    stream = b"".join(msgpack.packb(r) for r in replies)
    for pieces in ([stream], [stream[i : i + 4096] for i in range(0, len(stream), 4096)]):
        reader = wire.ReplyReader(max_bytes=128 << 10)
        assert [m for p in pieces for m in reader.feed(p)] == replies
        assert reader.pending_bytes == 0
    reader = wire.ReplyReader(max_bytes=1000)
    assert reader.feed(msgpack.packb("c" * 995)) == ["c" * 995]  # 998 bytes: fits
    with pytest.raises(wire.ReplyError, match="reply longer than 1000 bytes"):
        reader.feed(msgpack.packb("d" * 998)[:600] + msgpack.packb("d" * 998)[600:])


def test_reply_reader_pending_bytes():
    reply = encode_ack(b"abc")
    reader = wire.ReplyReader()
    assert reader.feed(reply + reply[:3]) == [{"ack": "abc"}] and reader.pending_bytes == 3
    assert reader.feed(reply[3:]) == [{"ack": "abc"}] and reader.pending_bytes == 0

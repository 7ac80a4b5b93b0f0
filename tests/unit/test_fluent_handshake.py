"""Tests for the pure forward handshake codec (logrouter.wire.fluent_handshake).

Vector F4 and its digests are listed in docs/protocols/fluent_forward.md section 12. A PING is fed
whole, byte by byte and split at every offset, and must give the same verdict; the
salts real peers send (out_forward's hex text, Fluent Bit's raw bytes inside a msgpack
str, bin) are hashed exactly as received.
"""

from __future__ import annotations

import msgpack
import pytest

from logrouter.wire.fluent_handshake import (
    INVALID_PING,
    SHARED_KEY_MISMATCH,
    USER_MISMATCH,
    HandshakeError,
    Helo,
    Security,
    ServerHandshake,
    check_pong,
    client_ping,
    decode_helo,
    encode_helo,
    encode_ping,
    encode_pong,
    parse_ping,
    password_digest,
    shared_key_digest,
)

NONCE = bytes(range(0x00, 0x10))
AUTH = bytes(range(0x10, 0x20))
SALT = b"0123456789abcdef0123456789abcdef"
F4 = bytes.fromhex(
    "92 a4 48 45 4c 4f 83 a5 6e 6f 6e 63 65 c4 10 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f"
    "a4 61 75 74 68 c4 10 10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f a9 6b 65 65 70 61 6c 69 76 65 c3"
)
PING_DIGEST = (
    "3a680037d3979b4f789647cd22e7e55f2197791eb498799823c424e2213124ed"
    "63938d1c422f50e08ec02957ef44df338e46c77e8ea164b0dde6d64e171b30df"
)
PONG_DIGEST = (
    "3389a63bef56054281d75fb7b05965b0d1b1ea9eba25b4594ed8e06a02e725af"
    "1fbf401cdbe697423c388ac1948566570a6f592284a536370ca36a5ccf88cbbd"
)
USER_DIGEST = (
    "175443d1726b2836999b8b7b54c1fcf0a2ec1071f20fbec9f6e0a7594cf70f20"
    "8e7ed315db82d7e4f45981d04990e9b9b46ea8f69444a5cf5e25601d72aa83e5"
)

SECURITY = Security(shared_key="secret", self_hostname="server.example")
USERS = Security(shared_key="secret", self_hostname="server.example", users={"alice": "pw", "bob": "other"})


def server(security: Security = SECURITY, **kwargs) -> ServerHandshake:
    return ServerHandshake(security, nonce=NONCE, auth_salt=AUTH, **kwargs)


def f4_ping(username: str = "", user_digest: str = "", digest: str = PING_DIGEST) -> bytes:
    return encode_ping("client.example", SALT, digest, username, user_digest)


def unpack(data: bytes):
    return msgpack.unpackb(data, raw=False)


# -- vectors -----------------------------------------------------------------------------


def test_helo_is_vector_f4():
    assert encode_helo(NONCE, AUTH, True) == F4
    assert server().helo() == F4


def test_digests_match_the_vectors():
    assert shared_key_digest(SALT, "client.example", NONCE, "secret") == PING_DIGEST
    assert shared_key_digest(SALT, "server.example", NONCE, "secret") == PONG_DIGEST
    assert password_digest(AUTH, "alice", "pw") == USER_DIGEST
    assert shared_key_digest(SALT, b"client.example", NONCE, b"secret") == PING_DIGEST  # bytes too


def test_good_ping_gets_the_vector_pong():
    result = server().feed(f4_ping())
    assert result.ok and result.reason == "" and result.rest == b""
    assert result.client_hostname == "client.example"
    assert unpack(result.pong) == ["PONG", True, "", "server.example", PONG_DIGEST]


def test_good_ping_with_user():
    result = server(USERS).feed(f4_ping("alice", USER_DIGEST))
    assert result.ok and result.username == "alice"
    assert unpack(result.pong) == ["PONG", True, "", "server.example", PONG_DIGEST]


# -- failures ----------------------------------------------------------------------------


def assert_failed(result, reason: str) -> None:
    assert result is not None and not result.ok
    assert result.reason == reason
    assert unpack(result.pong) == ["PONG", False, reason, "", ""]
    assert result.rest == b""


def test_wrong_shared_key():
    wrong = shared_key_digest(SALT, "client.example", NONCE, "not-the-key")
    result = server().feed(f4_ping(digest=wrong))
    assert_failed(result, SHARED_KEY_MISMATCH)
    assert result.describe() == "shared_key mismatch (client hostname 'client.example')"


def test_digest_compared_exactly():
    assert_failed(server().feed(f4_ping(digest=PING_DIGEST.upper())), SHARED_KEY_MISMATCH)
    assert_failed(server().feed(f4_ping(digest=PING_DIGEST[:-1])), SHARED_KEY_MISMATCH)


def test_wrong_password_unknown_user_and_missing_user():
    assert_failed(server(USERS).feed(f4_ping("alice", password_digest(AUTH, "alice", "nope"))), USER_MISMATCH)
    result = server(USERS).feed(f4_ping("mallory", password_digest(AUTH, "mallory", "pw")))
    assert_failed(result, USER_MISMATCH)
    assert result.describe() == "username/password mismatch (unknown user, client hostname 'client.example', username 'mallory')"
    assert_failed(server(USERS).feed(f4_ping()), USER_MISMATCH)
    # bob's digest computed with alice's password
    assert_failed(server(USERS).feed(f4_ping("bob", password_digest(AUTH, "bob", "pw"))), USER_MISMATCH)


def test_user_fields_ignored_without_users():
    assert server().feed(f4_ping("whoever", "garbage")).ok
    # npm fluent-logger sends nil for the username when it has none
    ping = msgpack.packb(["PING", "client.example", SALT.decode(), PING_DIGEST, None, "x" * 128])
    assert server().feed(ping).ok


@pytest.mark.parametrize(
    "message",
    [
        ["PING", "client.example", SALT.decode(), PING_DIGEST, ""],  # 5 elements
        ["PING", "client.example", SALT.decode(), PING_DIGEST, "", "", ""],  # 7 elements
        ["PONG", "client.example", SALT.decode(), PING_DIGEST, "", ""],
        ["PING", 7, SALT.decode(), PING_DIGEST, "", ""],
        ["PING", "client.example", None, PING_DIGEST, "", ""],
        ["PING", "client.example", SALT.decode(), 1.5, "", ""],
        ["PING", "client.example", SALT.decode(), PING_DIGEST, 3, ""],
        {"PING": 1},
        None,
        [],
        # a forward event sent instead of the PING
        ["app.tag", 1441588984, {"message": "too early"}],
        ["app.tag", 1441588984, {"message": "too early"}, {"chunk": "c1"}],
    ],
)
def test_invalid_ping_messages(message):
    result = server().feed(msgpack.packb(message))
    assert_failed(result, INVALID_PING)
    assert result.detail


def test_garbage_and_json_are_invalid_pings():
    assert_failed(server().feed(b"\xc1garbage"), INVALID_PING)
    # A handshake session is msgpack: a JSON PING is a positive fixint 0x5b, not a PING.
    assert_failed(server().feed(b'["PING","h","s","d","",""]'), INVALID_PING)


def test_oversized_ping_fails_without_buffering_more():
    handshake = server(max_ping_bytes=64)
    assert handshake.feed(b"\x96\xa4PING\xda\x01\x00" + b"x" * 40) is None  # str16 of 256 bytes, incomplete
    assert_failed(handshake.feed(b"x" * 40), INVALID_PING)
    # one big read that holds more than the limit fails at once too
    assert_failed(server(max_ping_bytes=64).feed(b"\x96\xa4PING\xda\x01\x00" + b"x" * 300), INVALID_PING)


def test_feed_after_the_result_is_a_bug():
    handshake = server()
    handshake.feed(f4_ping())
    with pytest.raises(RuntimeError):
        handshake.feed(b"\xc0")


# -- framing -----------------------------------------------------------------------------


def feed_pieces(pieces: list[bytes], security: Security) -> tuple:
    """Feed ``pieces`` until a verdict; what follows the PING is its ``rest`` plus the unfed pieces."""
    handshake = server(security)
    for i, piece in enumerate(pieces):
        result = handshake.feed(piece)
        if result is not None:
            after = result.rest + b"".join(pieces[i + 1 :]) if result.ok else b""
            return (result.ok, result.reason, result.pong, after)
    return None


def verdicts(data: bytes, security: Security = SECURITY) -> dict[str, tuple]:
    """The verdict when ``data`` is fed whole, byte by byte and split at every offset."""
    out = {"whole": feed_pieces([data], security)}
    out["bytewise"] = feed_pieces([data[i : i + 1] for i in range(len(data))], security)
    for at in range(1, len(data)):
        out[f"split {at}"] = feed_pieces([data[:at], data[at:]], security)
    return out


def test_ping_whole_bytewise_and_split_agree():
    data = f4_ping("alice", USER_DIGEST)
    results = set(verdicts(data, USERS).values())
    assert len(results) == 1
    ok, _, pong, rest = results.pop()
    assert ok and rest == b""
    assert unpack(pong) == ["PONG", True, "", "server.example", PONG_DIGEST]


def test_failed_ping_whole_bytewise_and_split_agree():
    data = f4_ping("alice", password_digest(AUTH, "alice", "wrong"))
    results = set(verdicts(data, USERS).values())
    assert results == {(False, USER_MISMATCH, encode_pong(False, USER_MISMATCH, "", ""), b"")}


def test_truncated_ping_waits():
    data = f4_ping()
    for cut in range(len(data)):
        assert server().feed(data[:cut]) is None


def test_bytes_after_the_ping_are_the_transport_phase():
    event = msgpack.packb(["app.tag", 1441588984, {"k": "v"}, {"chunk": "c1"}])
    data = f4_ping() + event + b"\xc0"
    results = set(verdicts(data).values())
    assert len(results) == 1
    ok, _, _, after = results.pop()
    assert ok and after == event + b"\xc0"


def test_rest_beyond_the_ping_limit_is_kept():
    """A client may pipeline a big first message after its PING: it is not the PING's to bound."""
    event = msgpack.packb(["app.tag", 1441588984, {"k": "v" * 5000}])
    result = server(max_ping_bytes=1024).feed(f4_ping() + event)
    assert result.ok and result.rest == event


# -- real peers' salts -------------------------------------------------------------------


def test_fluent_bit_raw_binary_salt_inside_a_str():
    """Fluent Bit sends 16 random bytes as a msgpack str: hashed as the bytes received."""
    salt = bytes([0xFF, 0x00, 0xC3, 0x28, 0x80]) + bytes(range(0xF0, 0xFB))
    digest = shared_key_digest(salt, "fluent-bit", NONCE, "secret")
    ping = b"\x96\xa4PING\xaafluent-bit" + bytes([0xA0 | len(salt)]) + salt + b"\xd9\x80" + digest.encode() + b"\xa0\xa0"
    result = server().feed(ping)
    assert result.ok, result.describe()
    pong = unpack(result.pong)
    assert pong[4] == shared_key_digest(salt, "server.example", NONCE, "secret")


def test_salt_as_bin_and_str8_encodings():
    digest = shared_key_digest(SALT, "client.example", NONCE, "secret")
    as_bin = msgpack.packb(["PING", "client.example", SALT, digest, "", ""], use_bin_type=True)
    assert server().feed(as_bin).ok
    # non-minimal str widths (str16 for a short hostname) are accepted
    ping = b"\x96\xa4PING\xda\x00\x0eclient.example\xd9\x20" + SALT + b"\xd9\x80" + digest.encode() + b"\xa0\xa0"
    assert server().feed(ping).ok


def test_parse_ping_keeps_raw_bytes():
    ping = parse_ping(["PING", "h\udcff", b"\x00\x01", "d", None, None])
    assert ping.hostname == b"h\xff" and ping.salt == b"\x00\x01"
    assert ping.username == b"" and ping.password_digest == b""


def test_random_nonce_and_salt_per_connection():
    a, b = ServerHandshake(SECURITY), ServerHandshake(SECURITY)
    assert len(a.nonce) == len(a.auth_salt) == 16
    assert a.nonce != b.nonce and a.auth_salt != b.auth_salt and a.nonce != a.auth_salt
    helo = decode_helo(unpack(a.helo()))
    assert helo == Helo(a.nonce, a.auth_salt, True)


# -- client side -------------------------------------------------------------------------


def test_client_side_round_trip():
    handshake = ServerHandshake(USERS)
    helo = decode_helo(msgpack.unpackb(handshake.helo(), raw=False))
    ping, salt = client_ping(helo, "client.example", "secret", username="alice", password="pw")
    assert len(salt) == 32  # out_forward style hex salt
    result = handshake.feed(ping)
    assert result.ok
    assert check_pong(unpack(result.pong), helo, salt, "client.example", "secret") == "server.example"


def test_client_checks_pong():
    helo = Helo(NONCE, AUTH, True)
    good = ["PONG", True, "", "server.example", PONG_DIGEST]
    assert check_pong(good, helo, SALT, "client.example", "secret") == "server.example"
    with pytest.raises(HandshakeError, match="authentication failed"):
        check_pong(["PONG", False, "shared_key mismatch", "", ""], helo, SALT, "client.example", "secret")
    with pytest.raises(HandshakeError, match="shared_key mismatch"):
        check_pong(good, helo, SALT, "client.example", "other")
    with pytest.raises(HandshakeError, match="same hostname"):
        check_pong(good, helo, SALT, "server.example", "secret")
    with pytest.raises(HandshakeError, match="invalid PONG"):
        check_pong(["PONG", True, ""], helo, SALT, "client.example", "secret")


def test_decode_helo_variants():
    assert decode_helo(unpack(F4)) == Helo(NONCE, AUTH, True)
    assert decode_helo(["HELO", {"nonce": "abc"}]) == Helo(b"abc", b"", True)
    for bad in (["HELO"], ["HELO", {"auth": ""}], ["HELO", {"nonce": "n", "keepalive": 1}], ["PONG", {}], None):
        with pytest.raises(HandshakeError):
            decode_helo(bad)


def test_pong_encoding():
    assert unpack(encode_pong(False, "shared_key mismatch", "", "")) == ["PONG", False, "shared_key mismatch", "", ""]


def test_deeply_nested_messages_are_refused_not_crashed_on():
    # msgpack nests 1000 deep; repr() of that raised RecursionError in the error message.
    deep = msgpack.unpackb(b"\x91" * 1000 + b"\xc0")
    with pytest.raises(HandshakeError, match="invalid HELO message"):
        decode_helo(deep)
    helo = decode_helo(unpack(F4))
    with pytest.raises(HandshakeError, match="invalid PONG message"):
        check_pong(deep, helo, SALT, "client.example", "secret")
    result = server().feed(b"\x91" * 1000 + b"\xc0")
    assert not result.ok and result.reason == INVALID_PING


def test_server_handshake_pending_bytes():
    handshake = server()
    ping = f4_ping()
    assert handshake.feed(ping[:7]) is None and handshake.pending_bytes == 7
    result = handshake.feed(ping[7:] + b"\x93")
    assert result.ok and result.rest == b"\x93" and handshake.pending_bytes == 0

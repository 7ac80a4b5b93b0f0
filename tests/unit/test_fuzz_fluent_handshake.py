"""Fuzzing the forward handshake (``fluent_handshake``) with hypothesis.

Server side: whatever bytes a client sends in place of its PING, ``ServerHandshake.feed``
never raises; it returns the same verdict (PONG, reason, and the bytes that followed a
good PING) however the bytes are split, or keeps waiting for all of them the same way.
Client side: whatever replies a server sends in place of HELO and PONG, decoded by the
reply reader, ``ClientHandshake`` raises nothing but ``HandshakeError``/``ReplyError``.
More examples: ``LOGROUTER_FUZZ_EXAMPLES`` (bench/FUZZ.md).
"""

from __future__ import annotations

from typing import Any

import msgpack
from fuzz_helpers import MAX_INPUT, cuts, fuzz_settings, mutated, split_at
from hypothesis import given
from hypothesis import strategies as st

from logrouter.wire import fluent_client
from logrouter.wire.fluent_handshake import (
    ClientHandshake,
    HandshakeError,
    Security,
    ServerHandshake,
    encode_helo,
    encode_ping,
    encode_pong,
    password_digest,
    shared_key_digest,
)

NONCE = bytes(range(16))
AUTH = bytes(range(16, 32))
SALT = b"0123456789abcdef0123456789abcdef"
SECURITIES = [
    Security("secret", "server.example"),
    Security("secret", "server.example", {"alice": "pw"}),
]

text_or_bytes = st.text(max_size=20) | st.binary(max_size=20)
anything = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | text_or_bytes,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def good_ping(hostname: str = "client.example", username: str = "", password: str = "") -> bytes:
    digest = shared_key_digest(SALT, hostname, NONCE, "secret")
    user = password_digest(AUTH, username, password) if username else ""
    return encode_ping(hostname, SALT, digest, username, user)


pings = st.one_of(
    st.just(good_ping()),
    st.just(good_ping(username="alice", password="pw")),
    st.tuples(text_or_bytes, text_or_bytes, text_or_bytes, text_or_bytes | st.none(), text_or_bytes | st.none()).map(
        lambda f: msgpack.packb(["PING", *f], use_bin_type=False)
    ),
    st.lists(anything, max_size=7).map(lambda xs: msgpack.packb(["PING", *xs], use_bin_type=True)),
    anything.map(lambda v: msgpack.packb(v, use_bin_type=True)),
)
# What a client sends: a PING, then (when it is accepted) the start of the transport phase.
client_bytes = st.tuples(pings, st.binary(max_size=64)).map(lambda t: t[0] + t[1]).filter(lambda b: len(b) <= MAX_INPUT)


def verdict(security: Security, pieces: list[bytes], max_ping_bytes: int) -> Any:
    """The handshake's outcome for ``pieces``: the result's fields, with the bytes after the
    PING (what the transport phase gets: ``rest`` plus every piece not fed), or what is
    still pending when no verdict came."""
    handshake = ServerHandshake(security, nonce=NONCE, auth_salt=AUTH, max_ping_bytes=max_ping_bytes)
    for i, piece in enumerate(pieces):
        result = handshake.feed(piece)
        if result is not None:
            assert handshake.pending_bytes == 0
            after = result.rest + b"".join(pieces[i + 1 :]) if result.ok else b""
            assert result.ok or not result.rest
            return (result.ok, result.pong, result.reason, result.detail, result.client_hostname, result.username, after)
    return ("pending", handshake.pending_bytes)


def same_verdict_every_way(security: Security, data: bytes, cut_points: list[int], max_ping_bytes: int) -> Any:
    whole = verdict(security, [data], max_ping_bytes)
    ways = [[data[i : i + 1] for i in range(len(data))], split_at(data, cut_points)]
    if len(data) <= 200:
        ways += [[data[:i], data[i:]] for i in range(1, len(data))]
    for pieces in ways:
        assert verdict(security, pieces, max_ping_bytes) == whole, f"split into {[len(p) for p in pieces]}"
    if whole[0] == "pending":
        assert whole[1] == len(data) < max_ping_bytes
    return whole


@fuzz_settings()
@given(st.sampled_from(SECURITIES), client_bytes | mutated(client_bytes) | st.binary(max_size=MAX_INPUT), cuts, st.sampled_from([64 * 1024, 300, 40]))
def test_server_verdict_is_the_same_every_way(security, data, cut_points, max_ping_bytes):
    same_verdict_every_way(security, data, cut_points, max_ping_bytes)


@fuzz_settings()
@given(st.sampled_from(SECURITIES), st.binary(max_size=64), cuts)
def test_a_good_ping_is_accepted_every_way_and_the_rest_handed_on(security, rest, cut_points):
    ping = good_ping(username="alice", password="pw")
    whole = same_verdict_every_way(security, ping + rest, cut_points, 64 * 1024)
    assert whole[0] is True and whole[-1] == rest


# -- the client side ---------------------------------------------------------------------------

helos = st.one_of(
    st.tuples(text_or_bytes, text_or_bytes, st.booleans()).map(lambda t: encode_helo(*t)),
    st.dictionaries(st.sampled_from(["nonce", "auth", "keepalive", "other"]), anything, max_size=4).map(
        lambda d: msgpack.packb(["HELO", d], use_bin_type=True)
    ),
    anything.map(lambda v: msgpack.packb(v, use_bin_type=True)),
)
pongs = st.one_of(
    st.tuples(st.booleans(), text_or_bytes, text_or_bytes, text_or_bytes).map(
        lambda t: msgpack.packb(["PONG", *t], use_bin_type=True)
    ),
    st.just(encode_pong(True, "", "server.example", "x")),
    st.lists(anything, max_size=6).map(lambda xs: msgpack.packb(["PONG", *xs], use_bin_type=True)),
    anything.map(lambda v: msgpack.packb(v, use_bin_type=True)),
)
server_bytes = st.tuples(helos, pongs).map(b"".join).filter(lambda b: len(b) <= MAX_INPUT)


def client_outcome(pieces: list[bytes]) -> Any:
    """Run a client handshake over the server's bytes: only the codecs' errors may escape."""
    client = ClientHandshake("client.example", "secret", salt=SALT)
    reader = fluent_client.ReplyReader()
    sent: list[bytes | None] = []

    def receive(messages: list) -> Any:
        for message in messages:
            if client.established:
                return ("established", client.server_hostname, sent)
            try:
                sent.append(client.receive(message))
            except HandshakeError as error:
                assert str(error)
                return ("handshake error", error.reason, sent)
        return None

    for piece in pieces:
        try:
            messages = reader.feed(piece)
        except fluent_client.ReplyError as error:
            # Replies decoded before the bad bytes are acted on first, as if read apart.
            return receive(error.messages) or ("reply error", error.reason, sent)
        outcome = receive(messages)
        if outcome is not None:
            return outcome
    return ("established" if client.established else "waiting", client.server_hostname, sent)


@fuzz_settings()
@given(server_bytes | mutated(server_bytes) | st.binary(max_size=MAX_INPUT), cuts)
def test_client_handshake_raises_only_handshake_errors(data, cut_points):
    whole = client_outcome([data])
    # Replies before the failing one are acted on, so the outcome does not depend on reads.
    assert client_outcome([data[i : i + 1] for i in range(len(data))]) == whole
    assert client_outcome(split_at(data, cut_points)) == whole


def test_client_handshake_survives_deeply_nested_replies():
    deep = b"\x91" * 1000 + b"\xc0"  # msgpack nests this deep; repr() of it does not
    assert client_outcome([deep])[0] == "handshake error"
    assert client_outcome([encode_helo(NONCE, b"") + deep])[0] == "handshake error"


def test_server_handshake_pending_bytes():
    handshake = ServerHandshake(SECURITIES[0], nonce=NONCE, auth_salt=AUTH)
    ping = good_ping()
    assert handshake.pending_bytes == 0
    assert handshake.feed(ping[:10]) is None and handshake.pending_bytes == 10
    result = handshake.feed(ping[10:])
    assert result is not None and result.ok and handshake.pending_bytes == 0

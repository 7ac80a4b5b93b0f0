"""The fluent_forward source's protocol glue, with StringTransport and a fake router.

Covers the handshake (success, each failure, events before it, a PING pipelined with
events), acks only after durability, the ``size`` hint, ``fluent_signal``, compressed
payloads through the source, the UDP heartbeat, and TLS failures turned into log lines.
"""

from __future__ import annotations

import gzip
import struct

import msgpack
import pytest
import zstandard
from OpenSSL import SSL
from twisted.internet import error
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

import source_fakes
from source_fakes import T0, Conn, FakePort, FakeRouter, log_lines  # noqa: F401  (log_lines is a fixture)
from logrouter.sources.fluent_forward import FluentForwardSource, HeartbeatProtocol
from logrouter.tls import VERIFY_ERROR_ATTRIBUTE
from logrouter.wire import fluent_handshake as hs
from fixtures.forward_encode import encode_event_time, encode_packed_forward

NS = 1_000_000_000
PEER = IPv4Address("TCP", "10.1.2.3", 40000)


class UDPReactor(MemoryReactorClock):
    """MemoryReactorClock has no listenUDP; record the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.udp = []
        self.fail_udp = False

    def listenUDP(self, port, protocol, interface="", maxPacketSize=8192):
        if self.fail_udp:
            raise error.CannotListenError(interface, port, OSError(98, "Address already in use"))
        self.udp.append((port, protocol, interface))
        return FakePort(None)


def make_source(**overrides) -> tuple[FluentForwardSource, FakeRouter]:
    """A source on a ``UDPReactor`` (left at time 0) and a ``FakeRouter``."""
    overrides = {"listen": "tcp:0:interface=127.0.0.1", **overrides}
    source, router, _ = source_fakes.make_source(FluentForwardSource, "fwd", clock=UDPReactor(), **overrides)
    return source, router


def connect(source: FluentForwardSource, peer=PEER) -> tuple:
    """A client connection from ``peer``: its protocol and transport."""
    conn = Conn(source, address=peer)
    return conn.protocol, conn.transport


def take(transport: StringTransport) -> list:
    """Every msgpack message written to ``transport`` since the last call."""
    data = transport.value()
    transport.clear()
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    return list(unpacker)


SECURE = dict(shared_key="s3cret", self_hostname="router.test")
USERS = dict(SECURE, users=[{"username": "alice", "password": "pw"}])


def handshake_ping(transport, *, shared_key="s3cret", username="", password="", hostname="client.test"):
    """The HELO the server sent, and a PING answering it."""
    (helo_message,) = take(transport)
    helo = hs.decode_helo(helo_message)
    ping, salt = hs.client_ping(helo, hostname, shared_key, username=username, password=password)
    return helo, ping, salt


# -- handshake ---------------------------------------------------------------------------


def test_no_shared_key_no_greeting():
    source, _ = make_source()
    proto, transport = connect(source)
    assert transport.value() == b"" and proto.handshake is None


def test_helo_is_sent_first_with_fresh_salts():
    source, _ = make_source(**SECURE)
    _, first = connect(source)
    _, second = connect(source)
    (a,), (b,) = take(first), take(second)
    assert a[0] == "HELO" and set(a[1]) == {"nonce", "auth", "keepalive"}
    assert len(a[1]["nonce"]) == len(a[1]["auth"]) == 16 and a[1]["keepalive"] is True
    assert isinstance(a[1]["nonce"], bytes)  # bin, as in_forward sends
    assert a[1]["nonce"] != b[1]["nonce"]


def test_good_handshake_then_events_acked_only_when_durable():
    source, router = make_source(**USERS)
    proto, transport = connect(source)
    helo, ping, salt = handshake_ping(transport, username="alice", password="pw")
    proto.dataReceived(ping)
    (pong,) = take(transport)
    assert hs.check_pong(pong, helo, salt, "client.test", "s3cret") == "router.test"
    proto.dataReceived(msgpack.packb(["app.a", T0, {"k": "v"}, {"chunk": "c1"}]))
    assert [b.tag for b in router.batches] == ["app.a"] and router.keys == [b"c1"]
    assert transport.value() == b""  # not durable yet: no ack
    router.fire_pending()
    assert take(transport) == [{"ack": "c1"}]
    assert not transport.disconnecting and source.decode_errors == 0


def test_ping_pipelined_with_events_in_one_read():
    source, router = make_source(**SECURE)
    proto, transport = connect(source)
    helo, ping, salt = handshake_ping(transport)
    events = msgpack.packb(["app.a", T0, {"n": 1}]) + b"\xc0" + msgpack.packb(["app.b", T0, {"n": 2}])
    proto.dataReceived(ping + events)
    assert take(transport)[0][:2] == ["PONG", True]
    assert [b.tag for b in router.batches] == ["app.a", "app.b"]


def test_ping_byte_by_byte():
    source, router = make_source(**SECURE)
    proto, transport = connect(source)
    _, ping, _ = handshake_ping(transport)
    data = ping + msgpack.packb(["app.a", T0, {"n": 1}])
    for i in range(len(data)):
        proto.dataReceived(data[i : i + 1])
    assert take(transport)[0][:2] == ["PONG", True]
    assert [b.tag for b in router.batches] == ["app.a"]


@pytest.mark.parametrize(
    "settings, client, reason",
    [
        (SECURE, dict(shared_key="wrong"), "shared_key mismatch (client hostname 'client.test')"),
        (USERS, dict(username="alice", password="nope"), "username/password mismatch (client hostname 'client.test', username 'alice')"),
        (USERS, dict(username="eve", password="pw"), "username/password mismatch (unknown user, client hostname 'client.test', username 'eve')"),
    ],
)
def test_failed_handshake_pong_log_close_count(settings, client, reason, log_lines):
    source, router = make_source(**settings)
    proto, transport = connect(source)
    _, ping, _ = handshake_ping(transport, **client)
    proto.dataReceived(ping + msgpack.packb(["app.a", T0, {"k": "v"}]))
    wire_reason = reason.split(" (")[0]
    assert take(transport) == [["PONG", False, wire_reason, "", ""]]
    assert transport.disconnecting  # loseConnection: closed once the PONG is written
    assert router.batches == []
    assert source.decode_errors == 1 and source.auth_failures == 1
    assert f"fluent_forward 10.1.2.3:40000: handshake failed: {reason}; closing connection" in log_lines
    # nothing more is read on that connection
    proto.dataReceived(msgpack.packb(["app.a", T0, {"k": "v"}]))
    assert router.batches == [] and transport.value() == b""


@pytest.mark.parametrize(
    "early",
    [
        msgpack.packb(["app.early", T0, {"k": "v"}, {"chunk": "c1"}]),
        encode_packed_forward("app.early", [(T0 * NS, {"k": "v"})], {"chunk": "c1"}),
        b"\xc0",  # a nil heartbeat is no PING either
        b'["app.early", 1700000000, {"k": "v"}]',  # JSON
    ],
)
def test_events_before_the_handshake_are_refused(early, log_lines):
    source, router = make_source(**SECURE)
    proto, transport = connect(source)
    take(transport)  # HELO
    proto.dataReceived(early)
    assert take(transport) == [["PONG", False, "invalid ping message", "", ""]]
    assert transport.disconnecting and router.batches == []
    assert source.decode_errors == 1
    assert any(line.startswith("fluent_forward 10.1.2.3:40000: handshake failed: invalid ping message (") for line in log_lines)


def test_a_ping_dribbled_in_is_closed_by_the_frame_deadline(log_lines):
    source, router = make_source(**SECURE, frame_timeout_secs=10)
    proto, transport = connect(source)
    _, ping, _ = handshake_ping(transport)
    clock = source.reactor
    for byte in ping[:40]:
        if transport.disconnecting:
            break
        proto.dataReceived(bytes([byte]))  # each byte resets the idle timer, not the frame's clock
        clock.advance(1)
    assert transport.disconnecting and transport.value() == b""  # no PONG: the PING never completed
    assert any(
        line.startswith("fluent_forward 10.1.2.3:40000: ") and "slower than frame_timeout_secs (10s)" in line
        for line in log_lines
    ), log_lines
    proto.connectionLost(None)
    assert source.closed["slow_frame"] == 1 and source.auth_failures == 0


def test_a_ping_and_a_message_in_one_read(log_lines):
    source, router = make_source(**SECURE)
    proto, transport = connect(source)
    _, ping, _ = handshake_ping(transport)
    proto.dataReceived(ping + msgpack.packb(["app.a", T0, {"k": "v"}, {"chunk": "c1"}]))
    assert take(transport)[0][:2] == ["PONG", True]
    router.fire_pending()
    assert take(transport) == [{"ack": "c1"}]
    assert proto.client_hostname == "client.test"


def test_session_stays_msgpack_after_the_handshake(log_lines):
    source, router = make_source(**SECURE)
    proto, transport = connect(source)
    _, ping, _ = handshake_ping(transport)
    proto.dataReceived(ping)
    take(transport)
    proto.dataReceived(b'["app.json", 1700000000, {"k": "v"}]')
    assert router.batches == [] and transport.disconnecting  # '[' is a msgpack int, not an array


def test_silent_client_times_out_during_handshake():
    source, _ = make_source(**SECURE, idle_timeout_secs=5)
    proto, transport = connect(source)
    source.reactor.advance(5)
    assert transport.disconnecting


# -- transport-phase options -------------------------------------------------------------


def test_size_is_a_hint_counted_and_warned_once(log_lines):
    source, router = make_source()
    proto, transport = connect(source)
    events = [(T0 * NS, {"n": i}) for i in range(3)]
    proto.dataReceived(encode_packed_forward("app.a", events, {"size": 5, "chunk": "c1"}))
    proto.dataReceived(encode_packed_forward("app.a", events, {"size": "3"}))
    proto.dataReceived(encode_packed_forward("app.a", events, {"size": 3}))
    assert [len(b.events) for b in router.batches] == [3, 3, 3]  # nothing dropped
    router.fire_pending()
    assert take(transport) == [{"ack": "c1"}]
    assert source.size_mismatches == 2
    warnings = [line for line in log_lines if "option size=" in line]
    assert warnings == [
        "fluent_forward 10.1.2.3:40000: option size=5 but the message holds 3 entries (tag app.a); "
        "size is a hint, every event is kept (further mismatches on this connection are only counted)"
    ]


def test_size_counts_invalid_entries_too(log_lines):
    source, router = make_source()
    proto, _ = connect(source)
    proto.dataReceived(msgpack.packb(["app.a", [[T0, {"ok": 1}], [T0, "not a map"]], {"size": 2}]))
    assert source.size_mismatches == 0 and source.invalid_events == 1
    assert len(router.batches[0].events) == 1


def test_fluent_signal_and_fluent_bit_metadata_times_are_accepted():
    source, router = make_source()
    proto, transport = connect(source)
    entries = [[[encode_event_time(T0 * NS + 5), {"otel": "x"}], {"log": "with metadata"}], [T0, {"log": "plain"}]]
    proto.dataReceived(msgpack.packb(["app.fb", entries, {"chunk": "fb1", "size": 2, "fluent_signal": 0}]))
    router.fire_pending()
    assert take(transport) == [{"ack": "fb1"}]
    assert router.batches[0].events == [(T0 * NS + 5, {"log": "with metadata"}), (T0 * NS, {"log": "plain"})]
    assert source.size_mismatches == 0


def test_gzip_multi_member_and_zstd_through_the_source():
    source, router = make_source()
    proto, transport = connect(source)
    packer = msgpack.Packer()
    first = b"".join(packer.pack([T0, {"n": i}]) for i in range(3))
    second = b"".join(packer.pack([T0, {"n": i}]) for i in range(3, 5))
    blob = gzip.compress(first, mtime=0) + gzip.compress(second, mtime=0)  # two gzip members
    message = ["app.gz", blob, {"compressed": "gzip", "size": 5, "chunk": "g1"}]
    proto.dataReceived(msgpack.packb(message, use_bin_type=True))  # bin blob, as Fluent Bit sends
    zblob = zstandard.ZstdCompressor().compress(first) + zstandard.ZstdCompressor().compress(second)
    proto.dataReceived(b"\x93\xa6app.zs\xdb" + struct.pack(">I", len(zblob)) + zblob + msgpack.packb({"compressed": "zstd", "chunk": "z1"}))
    router.fire_pending()
    assert take(transport) == [{"ack": "g1"}, {"ack": "z1"}]
    assert [[r["n"] for _, r in b.events] for b in router.batches] == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    assert source.size_mismatches == 0


def test_decompression_bomb_closes_only_that_connection(log_lines):
    source, router = make_source(max_decompressed_bytes=1000)
    proto, transport = connect(source)
    blob = gzip.compress(msgpack.packb([T0, {"pad": "x" * 5000}]))
    proto.dataReceived(msgpack.packb(["app.bomb", blob, {"compressed": "gzip"}], use_bin_type=True))
    assert transport.disconnecting and router.batches == [] and source.decode_errors == 1
    assert any("max_decompressed_bytes (1000)" in line for line in log_lines)


# -- UDP heartbeat -----------------------------------------------------------------------


class DatagramTransport:
    def __init__(self) -> None:
        self.sent = []

    def write(self, data, addr):
        self.sent.append((data, addr))


def test_heartbeat_datagrams_answered_with_one_zero_byte():
    source, _ = make_source()
    heartbeat = HeartbeatProtocol(source)
    heartbeat.transport = DatagramTransport()
    for datagram in (b"\x00", b"", b"x" * 128, b"y" * 2000):
        heartbeat.datagramReceived(datagram, ("127.0.0.1", 5000))
    assert heartbeat.transport.sent == [(b"\x00", ("127.0.0.1", 5000))] * 4
    assert source.heartbeats == 4


def test_heartbeat_ignores_unreachable_senders():
    class Refusing:
        def write(self, data, addr):
            raise OSError(111, "Connection refused")

    source, _ = make_source()
    heartbeat = HeartbeatProtocol(source)
    heartbeat.transport = Refusing()
    heartbeat.datagramReceived(b"\x00", ("127.0.0.1", 5000))  # no exception


@pytest.mark.parametrize(
    "address, expected",
    [
        (IPv4Address("TCP", "127.0.0.1", 41000), [(41000, "127.0.0.1")]),
        (IPv4Address("TCP", "0.0.0.0", 24224), [(24224, "0.0.0.0")]),
        (IPv6Address("TCP", "::1", 41001), [(41001, "::1")]),
        (UNIXAddress("/tmp/forward.sock"), []),
    ],
)
def test_udp_heartbeat_listens_on_the_tcp_port(address, expected):
    source, _ = make_source()
    source.port_opened(FakePort(address))
    assert [(port, interface) for port, _, interface in source.reactor.udp] == expected


def test_udp_heartbeat_can_be_turned_off():
    source, _ = make_source(udp_heartbeat=False)
    source.port_opened(FakePort(IPv4Address("TCP", "127.0.0.1", 41000)))
    assert source.reactor.udp == [] and source.udp_port is None


def test_udp_port_taken_fails_the_start_and_closes_the_tcp_port():
    source, _ = make_source()
    source.reactor.fail_udp = True
    tcp = FakePort(IPv4Address("TCP", "127.0.0.1", 41000))
    with pytest.raises(error.CannotListenError):
        source.port_opened(tcp)
    assert tcp.stopped


def test_stop_closes_the_udp_port():
    source, _ = make_source()
    source.port_opened(FakePort(IPv4Address("TCP", "127.0.0.1", 41000)))
    udp = source.udp_port
    source.port = FakePort(IPv4Address("TCP", "127.0.0.1", 41000))
    source.stop()
    assert udp.stopped and source.udp_port is None


# -- TLS failures ------------------------------------------------------------------------


def tls_failure(*reasons: str) -> Failure:
    try:
        raise SSL.Error([("SSL routines", "", reason) for reason in reasons])
    except SSL.Error:
        return Failure()


def test_tls_handshake_failure_is_logged_with_peer_and_reason(log_lines):
    source, _ = make_source()
    proto, transport = connect(source)
    proto.connectionLost(tls_failure("peer did not return a certificate"))
    assert source.tls_errors == 1
    assert "fluent_forward 10.1.2.3:40000: TLS handshake failed: client certificate required but none was sent; connection closed" in log_lines


def test_rejected_client_certificate_names_the_verify_error(log_lines):
    source, _ = make_source()
    proto, transport = connect(source)
    setattr(transport, VERIFY_ERROR_ATTRIBUTE, "unable to get local issuer certificate (certificate O=x/CN=rogue)")
    proto.connectionLost(tls_failure("certificate verify failed"))
    assert (
        "fluent_forward 10.1.2.3:40000: TLS handshake failed: client certificate rejected: "
        "unable to get local issuer certificate (certificate O=x/CN=rogue); connection closed"
    ) in log_lines


def test_other_tls_errors_and_plain_closes(log_lines):
    source, _ = make_source()
    proto, _ = connect(source)
    proto.handshakeCompleted()
    proto.connectionLost(tls_failure("decryption failed or bad record mac"))
    assert "fluent_forward 10.1.2.3:40000: TLS connection failed: decryption failed or bad record mac; connection closed" in log_lines
    proto, _ = connect(source)
    proto.connectionLost(Failure(error.ConnectionDone()))
    assert source.tls_errors == 1 and len([line for line in log_lines if "TLS" in line]) == 1


# -- out-of-range times and undecodable input (issue #9: 5, 10) --------------------------


@pytest.mark.parametrize("bad_time", [1e308, -1e308, 2**64 - 1, -(2**63), 9_223_372_037], ids=str)
def test_out_of_range_time_is_an_invalid_event_and_the_chunk_is_acked(bad_time, log_lines):
    source, router = make_source()
    proto, transport = connect(source)
    entries = [[T0, {"n": 1}], [bad_time, {"n": 2}], [T0 + 1, {"n": 3}]]
    proto.dataReceived(msgpack.packb(["app.t", entries, {"chunk": "t1"}]))
    assert [r["n"] for _, r in router.batches[0].events] == [1, 3]
    assert source.invalid_events == 1 and source.decode_errors == 0
    router.fire_pending()
    assert take(transport) == [{"ack": "t1"}] and not transport.disconnecting
    assert "fluent_forward 10.1.2.3:40000: skipped 1 invalid event(s) in tag app.t" in log_lines


def test_undecodable_msgpack_is_logged_with_what_was_wrong(log_lines):
    source, _ = make_source()
    proto, transport = connect(source)
    proto.dataReceived(b"\x93\xa3app\xc1garbage")
    assert (
        "fluent_forward 10.1.2.3:40000: invalid msgpack: FormatError (unexpected byte 0xc1 at offset 5); "
        "closing connection"
    ) in log_lines

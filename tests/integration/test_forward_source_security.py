"""End to end: the real daemon's fluent_forward source with the v1 handshake, mutual TLS
and the UDP heartbeat, driven by Python clients on loopback.

The clients speak what real peers send: out_forward's hex salt and str32 PackedForward,
Fluent Bit's raw binary salt inside a msgpack str and its Forward mode with
``[EventTime, metadata]`` times, gzip in several members and zstd. Refused clients
(wrong key, wrong password, events before the handshake, no/rogue/expired client
certificate) must see the connection closed and leave a log line naming peer and reason.
"""

from __future__ import annotations

import gzip
import socket
import ssl
import struct

import msgpack
import zstandard

from daemon import Daemon
from logrouter.lake.dataset import lake_dataset
from logrouter.wire import fluent_handshake as hs
from fixtures.forward_encode import encode_event_time

T0 = 1_700_000_000
NS = 1_000_000_000
PEER = r"127\.0\.0\.1:\d+"


class Client:
    """A forward client over one socket: reads whole msgpack replies, does the handshake."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)

    def read(self):
        """The next msgpack reply; AssertionError on EOF (socket timeout bounds the wait)."""
        for _ in range(10_000):
            try:
                return next(self.unpacker)
            except StopIteration:
                pass
            data = self.sock.recv(65536)
            if not data:
                raise AssertionError("connection closed by the server")
            self.unpacker.feed(data)
        raise AssertionError("no complete reply")

    def closed_by_server(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True

    def handshake(self, shared_key: str, hostname: str = "client.test", **user) -> list:
        helo = hs.decode_helo(self.read())
        ping, salt = hs.client_ping(helo, hostname, shared_key, **user)
        self.sock.sendall(ping)
        pong = self.read()
        if pong[1]:
            assert hs.check_pong(pong, helo, salt, hostname, shared_key) == "router.test"
        return pong

    def send_and_ack(self, data: bytes, chunk: str) -> None:
        self.sock.sendall(data)
        assert self.read() == {"ack": chunk}

    def close(self) -> None:
        self.sock.close()


def connect(port: int) -> Client:
    return Client(socket.create_connection(("127.0.0.1", port), timeout=15))


def packed(tag: str, blob: bytes, options: dict) -> bytes:
    """out_forward's layout: the blob in a str32."""
    return b"\x93" + msgpack.packb(tag) + b"\xdb" + struct.pack(">I", len(blob)) + blob + msgpack.packb(options)


def entries(start: int, count: int) -> bytes:
    return b"".join(msgpack.packb([encode_event_time((T0 + i) * NS), {"seq": i}]) for i in range(start, start + count))


def rows_by_tag(path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in lake_dataset(str(path)).to_table().to_pylist():
        out.setdefault(row["tag"], []).append(row)
    return out


HANDSHAKE_CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.secure]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"
shared_key = "s3cret"
self_hostname = "router.test"
users = [{ username = "alice", password = "pw" }]

[sinks.lake]
type = "parquet"
inputs = ["secure"]
path = "lake"
roll_secs = 3600
"""


def test_handshake_end_to_end(tmp_path):
    with Daemon(tmp_path, HANDSHAKE_CONFIG) as daemon:
        daemon.start()
        port = daemon.port("secure")

        # out_forward style: hex salt, str32 PackedForward; gzip in two members, then zstd.
        client = connect(port)
        assert client.handshake("s3cret", username="alice", password="pw")[:3] == ["PONG", True, ""]
        blob = gzip.compress(entries(0, 60), mtime=0) + gzip.compress(entries(60, 40), mtime=0)
        client.send_and_ack(packed("app.gzip", blob, {"size": 100, "compressed": "gzip", "chunk": "g1\n"}), "g1\n")
        zblob = zstandard.ZstdCompressor().compress(entries(0, 50))
        client.send_and_ack(packed("app.zstd", zblob, {"size": 50, "compressed": "zstd", "chunk": "z1"}), "z1")
        client.close()

        # Fluent Bit style: 16 raw salt bytes in a str, Forward mode, [EventTime, metadata] times.
        client = connect(port)
        helo = hs.decode_helo(client.read())
        salt = bytes(range(0xF0, 0x100))  # not UTF-8
        digest = hs.shared_key_digest(salt, "fluent-bit", helo.nonce, "s3cret")
        user = hs.password_digest(helo.auth, "alice", "pw")
        client.sock.sendall(
            b"\x96\xa4PING\xaafluent-bit\xb0" + salt + b"\xd9\x80" + digest.encode() + b"\xa5alice\xd9\x80" + user.encode()
        )
        assert client.read()[:2] == ["PONG", True]
        records = [[[encode_event_time(T0 * NS + i), {"trace": "x"}], {"log": f"fb {i}"}] for i in range(5)]
        options = {"chunk": "0123456789abcdef0123456789abcdef", "size": 5, "fluent_signal": 0}
        client.send_and_ack(msgpack.packb(["app.fb", records, options]), options["chunk"])
        # a size that does not match is kept and warned about once
        client.send_and_ack(msgpack.packb(["app.fb", records[:2], {"size": 9, "chunk": "s1"}]), "s1")
        client.close()
        daemon.wait_for(rf"fluent_forward {PEER}: option size=9 but the message holds 2 entries \(tag app\.fb\)")

        # Refusals: each gets in_forward's failure PONG, then the connection is closed.
        client = connect(port)
        assert client.handshake("wrong", hostname="evil.test") == ["PONG", False, "shared_key mismatch", "", ""]
        assert client.closed_by_server()
        daemon.wait_for(rf"fluent_forward {PEER}: handshake failed: shared_key mismatch \(client hostname 'evil\.test'\); closing connection")

        client = connect(port)
        assert client.handshake("s3cret", username="alice", password="guess") == ["PONG", False, "username/password mismatch", "", ""]
        assert client.closed_by_server()
        daemon.wait_for(rf"fluent_forward {PEER}: handshake failed: username/password mismatch \(client hostname 'client\.test', username 'alice'\)")

        client = connect(port)
        client.read()  # HELO
        client.sock.sendall(msgpack.packb(["app.early", T0, {"too": "early"}, {"chunk": "e1"}]))
        assert client.read() == ["PONG", False, "invalid ping message", "", ""]
        assert client.closed_by_server()
        daemon.wait_for(rf"fluent_forward {PEER}: handshake failed: invalid ping message \(.*\); closing connection")

        # UDP heartbeat on the same port, answered with one zero byte.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.settimeout(15)
            for datagram in (b"\x00", b"x" * 128):
                udp.sendto(datagram, ("127.0.0.1", port))
                assert udp.recvfrom(16) == (b"\x00", ("127.0.0.1", port))

        values = daemon.metrics()
        assert values['logrouter_source_decode_errors_total{source="secure",type="fluent_forward"}'] == 3
        daemon.stop_gracefully()

    rows = rows_by_tag(tmp_path / "lake")
    assert sorted(rows) == ["app.fb", "app.gzip", "app.zstd"]
    assert sorted(r["seq"] for r in rows["app.gzip"]) == list(range(100))
    assert sorted(r["seq"] for r in rows["app.zstd"]) == list(range(50))
    assert sorted(r["log"] for r in rows["app.fb"]) == sorted([f"fb {i}" for i in range(5)] + ["fb 0", "fb 1"])


def mtls_config(pki) -> str:
    return f"""
[spool]
path = "spool"

[sources.mtls]
type = "fluent_forward"
listen = '{pki.ssl_endpoint()}'
verify_client = true
ca_file = '{pki.ca}'

[sinks.lake]
type = "parquet"
inputs = ["mtls"]
path = "lake"
roll_secs = 3600
"""


def tls_connect(pki, port: int, cert=None, key=None) -> Client:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    raw = socket.create_connection(("127.0.0.1", port), timeout=15)
    return Client(context.wrap_socket(raw, server_hostname="localhost"))


def refused(client: Client) -> bool:
    """Whether the server ends the session: with TLS 1.3 the client learns it on its first read."""
    try:
        client.sock.sendall(msgpack.packb(["app.refused", T0, {"k": "v"}, {"chunk": "r1"}]))
        return client.sock.recv(100) == b""
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return True


def test_mutual_tls_refuses_missing_rogue_and_expired_client_certificates(tmp_path, pki):
    with Daemon(tmp_path, mtls_config(pki)) as daemon:
        daemon.start()
        port = daemon.port("mtls")

        client = tls_connect(pki, port, pki.client_cert, pki.client_key)
        client.send_and_ack(msgpack.packb(["app.mtls", T0, {"who": "test-client"}, {"chunk": "m1"}]), "m1")
        client.close()

        try:
            client = tls_connect(pki, port)
        except (ssl.SSLError, ConnectionResetError):
            pass  # TLS 1.2 fails the handshake itself
        else:
            assert refused(client)
        daemon.wait_for(rf"fluent_forward {PEER}: TLS handshake failed: client certificate required but none was sent; connection closed")

        for cert, key, reason in (
            (pki.rogue_client_cert, pki.rogue_client_key, r"unable to get local issuer certificate \(certificate O=logrouter tests/CN=rogue-client\)"),
            (pki.expired_client_cert, pki.expired_client_key, r"certificate has expired \(certificate O=logrouter tests/CN=expired-client\)"),
        ):
            try:
                client = tls_connect(pki, port, cert, key)
            except (ssl.SSLError, ConnectionResetError):
                pass
            else:
                assert refused(client)
            daemon.wait_for(rf"fluent_forward {PEER}: TLS handshake failed: client certificate rejected: {reason}; connection closed")

        daemon.stop_gracefully()

    rows = rows_by_tag(tmp_path / "lake")
    assert list(rows) == ["app.mtls"] and rows["app.mtls"][0]["who"] == "test-client"

"""Unit tests of the ``fluent_forward`` sink: MemoryReactor + task.Clock, StringTransport.

No sockets and no sleeps: connections are completed by hand, time moves with
``reactor.advance``. Covered: the cursor moves only past acked records (acks in any
order, filtered records, split records), the in-flight window, ack timeouts and broken
connections resend the same chunk ids, failover to a standby and back, weights, the
failure/backoff/replay path, heartbeats (tcp, udp), the shared-key handshake as a
client, gzip, acks off, the state file, and draining on stop.

``Harness`` builds a ``FluentForwardSink`` with every option at its default unless
given, a state file in a temporary directory (saved synchronously), and records what
the sink reports (progress calls, rewinds). ``FakeServer`` plays the server end of one
connection the sink opened: it decodes what the sink wrote with our in_forward decoder,
acks chosen chunks, and can run the handshake with ``ServerHandshake``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from twisted.internet import defer, error, ssl
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure

from fixtures.pki import make_pki
from logrouter.batch import Batch
from logrouter.sinks.fluent_forward import FluentForwardSink
from logrouter.sinks.forward_client import ClientFactory
from logrouter.sinks.forward_heartbeats import TcpHeartbeatProbe
from logrouter.tls import client_tls_options
from logrouter.sinks.state import SinkState
from logrouter.wire.fluent_client import chunk_id, pack_entries
from logrouter.wire.fluent_forward import EventMessage, ForwardDecoder, encode_ack
from logrouter.wire.fluent_handshake import Security, ServerHandshake, encode_helo, encode_pong

T0 = 1_700_000_000 * 10**9


class FakeUDPPort:
    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol
        self.sent: list[tuple[bytes, tuple[str, int]]] = []
        self.listening = True

    def write(self, data: bytes, address: tuple[str, int]) -> None:
        self.sent.append((data, address))

    def stopListening(self) -> None:
        self.listening = False


class Reactor(MemoryReactorClock):
    """MemoryReactorClock with a UDP port that records datagrams."""

    def __init__(self) -> None:
        super().__init__()
        self.udp_ports: list[FakeUDPPort] = []

    def listenUDP(self, port: int, protocol: Any, interface: str = "", maxPacketSize: int = 8192) -> FakeUDPPort:
        fake = FakeUDPPort(protocol)
        protocol.transport = fake
        self.udp_ports.append(fake)
        return fake


class FakeServer:
    """The server end of one connection the sink opened (a StringTransport)."""

    def __init__(self, reactor: Reactor, client: Any, host: str, port: int, security: Security | None = None) -> None:
        self.reactor = reactor
        self.client = client
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", host, port))
        self.decoder: ForwardDecoder | None = ForwardDecoder(allow_json=False)
        self.handshake = ServerHandshake(security) if security is not None else None
        self.messages: list[EventMessage] = []
        self.client.makeConnection(self.transport)

    def tls_done(self) -> None:
        self.client.handshakeCompleted()

    def greet(self) -> None:
        """Send HELO (the server speaks first when it has a shared key)."""
        assert self.handshake is not None
        self.client.dataReceived(self.handshake.helo())

    def answer_ping(self) -> Any:
        """Read the client's PING, answer with PONG; the verdict."""
        assert self.handshake is not None
        data = self.transport.value()
        self.transport.clear()
        result = self.handshake.feed(data)
        assert result is not None, data
        self.client.dataReceived(result.pong)
        return result

    def read(self) -> list[EventMessage]:
        """Messages the client wrote since the last read."""
        data = self.transport.value()
        self.transport.clear()
        new = self.decoder.feed(data) if data else []
        self.messages += new
        return new

    def ack(self, *messages: EventMessage) -> None:
        self.client.dataReceived(b"".join(encode_ack(m.chunk) for m in messages))

    def close(self, reason: Any = None) -> None:
        self.client.connectionLost(Failure(reason or error.ConnectionDone()))

    @property
    def aborted(self) -> bool:
        return self.transport.disconnecting or getattr(self.transport, "disconnected", False)


def defaults(**overrides: Any) -> dict[str, Any]:
    options = {k: o.default for k, o in FluentForwardSink.OPTIONS.items() if not o.required}
    options.update(
        servers=[{"host": "127.0.0.1", "port": 24224}],
        heartbeat_type="none",
        retry_initial_secs=1.0,
        retry_max_secs=8.0,
    )
    options.update(overrides)
    return options


class Harness:
    def __init__(self, tmp_path: Any, name: str = "out", start: bool = True, **overrides: Any) -> None:
        self.reactor = Reactor()
        self.tmp_path = tmp_path
        self.refused: list[tuple] = []
        self.sink = FluentForwardSink(name, defaults(**overrides), self._error, self.reactor)
        self.sink.run_blocking = lambda f, *a: defer.maybeDeferred(f, *a)
        self.sink.state = SinkState(str(tmp_path / "sinks" / f"{name}.json"))
        self.progress = 0
        self.rewinds = 0
        self.sink.on_progress = self._progress
        self.sink.on_rewind = self._rewind
        self.position = 0
        self.seen_connections = 0
        self.started_cursor: int | None = None
        if start:
            self.start()

    def _error(self, *args: Any) -> None:
        self.refused.append(args)

    def _progress(self) -> None:
        self.progress += 1

    def _rewind(self) -> None:
        self.rewinds += 1
        self.position = self.sink.cursor
        self.sink.advance(self.sink.cursor)

    def start(self) -> int:
        results: list[int] = []
        self.sink.start().addCallback(results.append)
        assert results, "start did not fire synchronously"
        self.started_cursor = results[0]
        self.position = results[0]
        return results[0]

    def feed(self, tag: str, events: list[tuple[int, dict]], size: int = 100, batches: int = 1) -> tuple[int, int]:
        """One spool record of ``size`` bytes yielding ``batches`` batches; (position, end)."""
        position = self.position
        for _ in range(batches):
            self.sink.write(Batch(tag, list(events), "src"), position, size)
        self.position = position + size
        self.sink.advance(self.position)
        return position, self.position

    def skip(self, size: int = 100) -> tuple[int, int]:
        """A record that yields nothing for this sink (filtered out)."""
        position = self.position
        self.position += size
        self.sink.advance(self.position)
        return position, self.position

    def connections(self) -> list[tuple[str, int, Any]]:
        """(host, port, factory) of every forward connection attempt (not heartbeats), in order."""
        return [(h, p, f) for h, p, f, _ in self.attempts() if isinstance(f, ClientFactory)]

    def probes(self) -> list[tuple[str, int, Any]]:
        return [(h, p, f) for h, p, f, _ in self.attempts() if isinstance(f, TcpHeartbeatProbe)]

    def attempts(self) -> list[tuple[str, int, Any, bool]]:
        """``(host, port, factory, tls)`` of every connection attempt: a TLS one is TLS over
        ``connectTCP`` (``logrouter.tls.connect``), its factory the one inside."""
        found = []
        for host, port, factory, *_ in self.reactor.tcpClients:
            wrapped = isinstance(factory, TLSMemoryBIOFactory)
            found.append((host, port, factory.wrappedFactory if wrapped else factory, wrapped))
        return found

    def accept(self, index: int = -1, security: Security | None = None) -> FakeServer:
        """Complete connection attempt ``index``: a FakeServer for its server end."""
        host, port, factory = self.connections()[index]
        client = factory.buildProtocol(IPv4Address("TCP", host, port))
        return FakeServer(self.reactor, client, host, port, security)

    def refuse(self, index: int = -1, reason: Exception | None = None) -> None:
        host, port, factory = self.connections()[index]
        factory.clientConnectionFailed(None, Failure(reason or error.ConnectionRefusedError()))

    def events(self, n: int, start: int = 0) -> list[tuple[int, dict]]:
        return [(T0 + start + i, {"n": start + i, "msg": f"event {start + i}"}) for i in range(n)]


# -- tests ---------------------------------------------------------------------------------


def ids(messages: list[EventMessage]) -> list[bytes]:
    return [m.chunk for m in messages]


def test_cursor_moves_only_after_acks_in_spool_order(tmp_path):
    h = Harness(tmp_path)
    assert h.started_cursor == 0
    _, end1 = h.feed("app.a", h.events(2))
    _, end2 = h.feed("app.b", h.events(3, 2))
    _, end3 = h.feed("app.a", h.events(1, 5))
    assert h.sink.cursor == 0 and h.sink.queued_bytes > 0
    server = h.accept()
    sent = server.read()
    assert [m.tag for m in sent] == ["app.a", "app.b", "app.a"]
    assert [len(m.events) for m in sent] == [2, 3, 1]
    assert sent[0].events == [tuple(e) for e in h.events(2)]
    assert all(m.options["size"] == len(m.events) and m.options["compressed"] == "text" for m in sent)
    # Acks may come in any order; the cursor follows the first unacked record.
    server.ack(sent[2])
    assert h.sink.cursor == 0
    server.ack(sent[0])
    assert h.sink.cursor == end1
    progress = h.progress
    server.ack(sent[1])
    assert h.sink.cursor == end3 and h.progress > progress
    assert h.sink.queued_bytes == 0 and h.sink.inflight_bytes == 0
    assert h.sink.chunks_acked == 3 and h.sink.events_out == 6
    assert end2 < end3


def test_chunk_ids_derive_from_spool_position_and_state(tmp_path):
    h = Harness(tmp_path)
    spool_id = h.sink.spool_id
    assert len(spool_id) == 32
    saved = h.sink.state.load()
    assert saved == {"cursor": 0, "spool_id": spool_id.decode()}  # saved before any id is used
    position, _ = h.feed("t", h.events(1))
    h.feed("t", h.events(1), batches=2)  # one record, two batches: indexes 0 and 1
    server = h.accept()
    sent = server.read()
    entries = pack_entries(h.events(1), 1 << 20)[0][1]
    assert ids(sent) == [
        chunk_id(spool_id, "out", position, 0, "t", entries),
        chunk_id(spool_id, "out", 100, 0, "t", entries),
        chunk_id(spool_id, "out", 100, 1, "t", entries),
    ]
    # A restart on the same state gives the same ids; another sink name gives others.
    again = Harness(tmp_path)
    assert again.sink.spool_id == spool_id
    other = Harness(tmp_path, name="other")
    assert other.sink.spool_id != spool_id


def test_filtered_records_and_split_records(tmp_path):
    h = Harness(tmp_path, max_chunk_bytes=300)
    h.skip()
    assert h.sink.cursor == 100  # nothing to send for it: done at once
    position, end = h.feed("big", h.events(30))
    h.skip()
    server = h.accept()
    sent = server.read()
    assert len(sent) >= 3 and sum(len(m.events) for m in sent) == 30
    assert len(set(ids(sent))) == len(sent)
    server.ack(*sent[:-1])
    assert h.sink.cursor == position  # the record is done only when all its chunks are
    server.ack(sent[-1])
    assert h.sink.cursor == end + 100


def test_in_flight_window(tmp_path):
    h = Harness(tmp_path, max_in_flight_bytes=1)
    for i in range(3):
        h.feed("t", h.events(1, i))
    server = h.accept()
    first = server.read()
    assert len(first) == 1  # the window holds one chunk (always at least one)
    server.ack(*first)
    second = server.read()
    assert len(second) == 1 and second[0].events[0][1]["n"] == 1
    server.ack(*second)
    server.ack(*server.read())
    assert h.sink.cursor == 300


def test_transport_backpressure_pauses_sending(tmp_path):
    h = Harness(tmp_path)
    h.feed("t", h.events(1))
    server = h.accept()
    server.ack(*server.read())
    server.client.pauseProducing()  # the transport's buffer is full
    h.feed("t", h.events(1))
    assert server.read() == [] and len(h.sink.queue) == 1
    server.client.resumeProducing()
    assert len(server.read()) == 1


def test_ack_timeout_resends_the_same_chunk_to_the_standby(tmp_path):
    h = Harness(
        tmp_path,
        ack_response_timeout_secs=10,
        servers=[{"host": "10.0.0.1", "port": 24224}, {"host": "10.0.0.2", "port": 24224, "standby": True}],
    )
    h.feed("t", h.events(2))
    assert [c[:2] for c in h.connections()] == [("10.0.0.1", 24224)]  # the standby is not used
    primary = h.accept()
    sent = primary.read()
    h.reactor.advance(9)
    assert not primary.aborted
    h.reactor.advance(1.5)
    assert primary.aborted and h.sink.ack_timeouts == 1
    primary.close()
    assert h.sink.servers[0].down and "no ack within 10s" in h.sink.servers[0].down_reason
    assert [c[:2] for c in h.connections()][-1] == ("10.0.0.2", 24224)
    standby = h.accept()
    resent = standby.read()
    assert ids(resent) == ids(sent) and resent[0].events == sent[0].events
    assert h.sink.chunks_resent == 1
    standby.ack(*resent)
    assert h.sink.cursor == 100 and not h.sink.failing


def test_broken_connection_resends_unacked_in_order(tmp_path):
    h = Harness(tmp_path, servers=[{"host": "a", "port": 1}, {"host": "b", "port": 2}])
    for i in range(4):
        h.feed("t", h.events(1, i))
    first_a, first_b = h.accept(0), h.accept(1)
    got_a, got_b = first_a.read(), first_b.read()
    assert len(got_a) + len(got_b) == 4
    first_a.ack(*got_a)
    first_b.close(error.ConnectionLost())
    assert h.sink.servers[1].down
    again = first_a.read()  # b's chunks go to a, same ids
    assert ids(again) == ids(got_b)
    first_a.ack(*again)
    assert h.sink.cursor == 400


def test_idle_close_by_the_server_is_not_a_failure(tmp_path):
    h = Harness(tmp_path)
    h.feed("t", h.events(1))
    server = h.accept()
    server.ack(*server.read())
    server.close()  # in_forward's idle timeout
    assert not h.sink.servers[0].down
    h.feed("t", h.events(1, 1))
    assert len(h.connections()) == 2  # reconnects for the next chunk
    second = h.accept()
    second.ack(*second.read())
    assert h.sink.cursor == 200


def test_close_with_unacked_chunks_marks_down_and_fails_without_another_server(tmp_path):
    h = Harness(tmp_path)
    h.feed("t", h.events(1))
    server = h.accept()
    sent = server.read()
    server.close()
    assert h.sink.failing and h.sink.failures == 1
    assert h.sink.queued_bytes == 0 and not h.sink.queue and not h.sink.records
    # Backoff on the injected clock, then a rewind: the router feeds the record again.
    h.reactor.advance(0.9)
    assert h.rewinds == 0
    h.reactor.advance(0.2)
    assert h.rewinds == 1 and not h.sink.failing and h.sink.cursor == 0
    h.feed("t", h.events(1))
    retry = h.accept()
    resent = retry.read()
    assert ids(resent) == ids(sent)  # same position, same id: a deduplicating receiver stores it once
    retry.ack(*resent)
    assert h.sink.cursor == 100


def test_backoff_doubles_while_no_server_answers(tmp_path):
    h = Harness(tmp_path, retry_initial_secs=1.0, retry_max_secs=4.0)
    h.feed("t", h.events(1))
    h.refuse()
    assert h.sink.failing and h.sink.failures == 1
    waits = []
    for _ in range(4):
        before = h.reactor.seconds()
        while h.rewinds == len(waits):
            h.reactor.advance(0.25)
            assert h.reactor.seconds() - before <= 10
        waits.append(h.reactor.seconds() - before)
        h.feed("t", h.events(1))
        h.refuse()
    assert waits == [1.0, 2.0, 4.0, 4.0]
    h.reactor.advance(4)
    h.feed("t", h.events(1))
    server = h.accept()
    server.ack(*server.read())
    assert h.sink.cursor == h.position and h.sink._retry_delay == 0  # success resets the backoff


def test_failover_to_standby_and_back(tmp_path):
    h = Harness(
        tmp_path,
        heartbeat_type="tcp",
        heartbeat_interval_secs=1,
        heartbeat_misses=2,
        recover_wait_secs=5,
        servers=[{"host": "primary", "port": 1}, {"host": "standby", "port": 2, "standby": True}],
    )
    primary, standby = h.sink.servers
    h.feed("t", h.events(1))
    h.refuse(0)  # the primary is down
    assert primary.down and not h.sink.failing
    on_standby = h.accept()
    assert on_standby.transport.getPeer().host == "standby"
    on_standby.ack(*on_standby.read())
    assert h.sink.cursor == 100
    # While the primary is down, new chunks keep going to the standby.
    h.feed("t", h.events(1, 1))
    pending = on_standby.read()
    assert len(pending) == 1
    # Heartbeats: the primary answers again, but only counts after recover_wait_secs.
    def answer_probes(*hosts: str) -> None:
        for probe_host, _, probe in h.probes():
            if probe_host in hosts and not probe.done:
                proto = probe.buildProtocol(None)
                proto.makeConnection(StringTransport())

    for _ in range(4):
        h.reactor.advance(1)
        answer_probes("primary", "standby")
        assert primary.down  # answers, but within recover_wait_secs of going down
    h.reactor.advance(1)
    answer_probes("primary", "standby")
    assert not primary.down and not standby.down
    # New traffic goes back to the primary; the standby keeps its unacked chunk until acked.
    h.feed("t", h.events(1, 2))
    back = h.accept()
    assert back.transport.getPeer().host == "primary"
    got = back.read()
    assert [m.events[0][1]["n"] for m in got] == [2]
    assert not on_standby.aborted
    on_standby.ack(*pending)
    assert on_standby.transport.disconnecting  # idle and no longer in use: closed
    on_standby.close()
    assert not standby.down  # a deliberate close is not a failure
    back.ack(*got)
    assert h.sink.cursor == 300


def test_heartbeat_misses_mark_a_server_down(tmp_path):
    h = Harness(tmp_path, heartbeat_type="tcp", heartbeat_interval_secs=1, heartbeat_misses=3)
    server = h.sink.servers[0]
    for _ in range(2):
        probe = h.probes()[-1][2]
        probe.clientConnectionFailed(None, Failure(error.ConnectionRefusedError()))
        h.reactor.advance(1)
    assert not server.down and server.missed == 2
    h.reactor.advance(1)  # the third probe is never answered: given up when the next is due
    assert server.down and server.down_reason == "3 heartbeats missed"
    assert h.probes()[-2][2].done


def test_udp_heartbeats(tmp_path):
    h = Harness(
        tmp_path, heartbeat_type="udp", heartbeat_interval_secs=1, heartbeat_misses=2, recover_wait_secs=0,
        servers=[{"host": "127.0.0.1", "port": 24224}],
    )
    port = h.reactor.udp_ports[0]
    server = h.sink.servers[0]
    assert port.sent == [(b"\x00", ("127.0.0.1", 24224))]
    port.protocol.datagramReceived(b"\x00", ("127.0.0.1", 24224))
    h.reactor.advance(1)
    h.reactor.advance(1)
    assert not server.down and server.missed == 1
    h.reactor.advance(1)
    assert server.down
    port.protocol.datagramReceived(b"\x00", ("127.0.0.1", 9999))  # another port: not this server
    assert server.down
    port.protocol.datagramReceived(b"\x00", ("127.0.0.1", 24224))
    assert not server.down
    stopped = []
    h.sink.stop().addCallback(stopped.append)
    assert stopped and not port.listening


def test_weights_split_chunks_exactly(tmp_path):
    h = Harness(tmp_path, servers=[{"host": "a", "port": 1, "weight": 1}, {"host": "b", "port": 2, "weight": 3}])
    h.feed("t", h.events(1))
    a, b = h.accept(0), h.accept(1)
    a.ack(*a.read())
    b.ack(*b.read())
    for i in range(16):
        h.feed("t", h.events(1, i))
    got_a, got_b = a.read(), b.read()
    assert (len(got_a), len(got_b)) == (4, 12)
    assert h.sink.servers[0].chunks_sent + h.sink.servers[1].chunks_sent == 17


def test_handshake_success_with_user(tmp_path):
    security = Security("s3cret", "receiver.test", {"alice": "pw"})
    h = Harness(tmp_path, shared_key="s3cret", self_hostname="sender.test", username="alice", password="pw")
    h.feed("t", h.events(1))
    server = h.accept(security=security)
    assert server.read() == []  # nothing before the handshake
    server.greet()
    result = server.answer_ping()
    assert result.ok and result.client_hostname == "sender.test" and result.username == "alice"
    sent = server.read()
    assert len(sent) == 1
    server.ack(*sent)
    assert h.sink.cursor == 100


@pytest.mark.parametrize(
    "sink_key, server_host, match",
    [
        ("wrong", "receiver.test", "handshake failed: authentication failed \\(shared_key mismatch\\)"),
        ("s3cret", "sender.test", "same hostname between input and output"),
    ],
)
def test_handshake_failures_mark_the_server_down(tmp_path, sink_key, server_host, match):
    h = Harness(tmp_path, shared_key=sink_key, self_hostname="sender.test")
    h.feed("t", h.events(1))
    server = h.accept(security=Security("s3cret", server_host))
    server.greet()
    server.answer_ping()
    assert server.aborted and server.read() == []
    server.close()
    assert re.search(match, h.sink.servers[0].down_reason), h.sink.servers[0].down_reason
    assert h.sink.handshake_failures == 1 and h.sink.failing


def test_server_digest_is_checked(tmp_path):
    h = Harness(tmp_path, shared_key="k", self_hostname="sender.test")
    h.feed("t", h.events(1))
    server = h.accept()
    server.client.dataReceived(encode_helo(b"n" * 16, b""))
    server.client.dataReceived(encode_pong(True, "", "receiver.test", "0" * 128))
    assert server.aborted and "shared_key mismatch" in server.client.failed_reason


def test_handshake_timeout_when_the_server_has_no_shared_key(tmp_path):
    h = Harness(tmp_path, shared_key="k", connect_timeout_secs=5)
    h.feed("t", h.events(1))
    server = h.accept()
    h.reactor.advance(5)
    assert server.aborted and "no HELO/PONG" in server.client.failed_reason


def test_helo_without_shared_key_and_garbage_replies(tmp_path):
    h = Harness(tmp_path, servers=[{"host": "a", "port": 1}, {"host": "b", "port": 2}])
    h.feed("t", h.events(1))
    a, b = h.accept(0), h.accept(1)
    a.client.dataReceived(ServerHandshake(Security("k", "x")).helo())
    assert a.aborted and "requires the shared-key handshake (set shared_key)" in a.client.failed_reason
    b.client.dataReceived(b"\xc1")
    assert b.aborted and "bad reply from server" in b.client.failed_reason


def test_tls_waits_for_the_tls_handshake(tmp_path):
    pki = make_pki(tmp_path / "pki")
    h = Harness(tmp_path, tls=True, ca_file=str(pki.ca), client_cert=str(pki.client_cert), client_key=str(pki.client_key))
    h.feed("t", h.events(1))
    assert [tls for *_, tls in h.attempts()] == [True]
    server = h.accept()
    assert server.read() == []  # nothing is written before the TLS handshake completed
    server.tls_done()
    sent = server.read()
    server.ack(*sent)
    assert h.sink.cursor == 100


def test_gzip_payload_decodes(tmp_path):
    h = Harness(tmp_path, compress="gzip")
    events = [(T0 + i, {"msg": "repeated text " * 5, "i": i}) for i in range(100)]
    h.feed("gz", events)
    server = h.accept()
    (message,) = server.read()
    assert message.options["compressed"] == "gzip"
    assert message.events == events
    assert h.sink.queued_bytes < 2000  # the compressed bytes are what is held


def test_without_acks_the_cursor_moves_on_write(tmp_path):
    h = Harness(tmp_path, require_ack_response=False)
    h.feed("t", h.events(2))
    assert h.sink.cursor == 0  # not connected yet
    server = h.accept()
    (message,) = server.read()
    assert message.chunk is None and "chunk" not in message.options
    assert h.sink.cursor == 100 and h.sink.queued_bytes == 0


def test_cursor_is_saved_about_once_a_second_and_on_stop(tmp_path):
    h = Harness(tmp_path)
    h.feed("t", h.events(1))
    server = h.accept()
    server.ack(*server.read())
    assert h.sink.state.load()["cursor"] == 0
    h.reactor.advance(1)
    assert h.sink.state.load()["cursor"] == 100
    h.feed("t", h.events(1))
    server.ack(*server.read())
    h.reactor.advance(0.25)
    assert h.sink.state.load()["cursor"] == 100  # not again within the second
    stopped = []
    h.sink.stop().addCallback(stopped.append)
    assert stopped and h.sink.state.load()["cursor"] == 200
    restarted = Harness(tmp_path)
    assert restarted.started_cursor == 200


def test_stop_waits_for_acks_then_gives_up_after_the_drain_timeout(tmp_path):
    h = Harness(tmp_path, drain_timeout_secs=5)
    h.feed("t", h.events(1))
    h.feed("t", h.events(1))
    server = h.accept()
    sent = server.read()
    stopped = []
    h.sink.stop().addCallback(stopped.append)
    assert not stopped
    server.ack(sent[0])
    assert not stopped
    h.reactor.advance(5)
    assert stopped and h.sink.state.load()["cursor"] == 100
    assert server.transport.disconnecting


def test_stop_after_all_acked_is_immediate(tmp_path):
    h = Harness(tmp_path)
    h.feed("t", h.events(1))
    server = h.accept()
    stopped = []
    d = h.sink.stop()
    d.addCallback(stopped.append)
    server.ack(*server.read())
    assert stopped and h.sink.state.load()["cursor"] == 100
    assert not h.reactor.getDelayedCalls()  # no timer left behind


def test_unknown_acks_are_ignored(tmp_path):
    h = Harness(tmp_path)
    h.feed("t", h.events(1))
    server = h.accept()
    sent = server.read()
    server.client.dataReceived(encode_ack(b"never-sent"))
    assert h.sink.unknown_acks == 1 and not server.aborted
    server.ack(*sent)
    server.ack(*sent)  # a duplicate ack
    assert h.sink.unknown_acks == 2 and h.sink.cursor == 100


def test_without_acks_a_broken_connection_loses_what_was_written(tmp_path):
    h = Harness(tmp_path, require_ack_response=False)
    h.feed("t", h.events(1))
    server = h.accept()
    assert len(server.read()) == 1 and h.sink.cursor == 100
    server.close(error.ConnectionLost())  # at-most-once: nothing is resent
    assert h.sink.chunks_resent == 0 and h.sink.cursor == 100


def test_nothing_handed_over_while_failing_moves_the_cursor(tmp_path):
    h = Harness(tmp_path)
    h.feed("t", h.events(1))
    h.refuse()
    assert h.sink.failing
    # A stale hand-over (e.g. a spool read that finished meanwhile) must not count as done.
    h.sink.write(Batch("t", h.events(1), "src"), 100, 100)
    h.sink.advance(200)
    assert h.sink.cursor == 0 and h.sink.queued_bytes == 0 and not h.sink.queue


def test_heartbeat_down_drops_the_connection_and_resends_elsewhere(tmp_path):
    h = Harness(
        tmp_path, heartbeat_type="udp", heartbeat_interval_secs=1, heartbeat_misses=1,
        servers=[{"host": "10.0.0.1", "port": 1}, {"host": "10.0.0.2", "port": 2}],
    )
    port = h.reactor.udp_ports[0]
    h.feed("t", h.events(1))
    h.feed("t", h.events(1, 1))
    a, b = h.accept(0), h.accept(1)
    got_a, got_b = a.read(), b.read()
    port.protocol.datagramReceived(b"\x00", ("10.0.0.2", 2))  # only b answers
    h.reactor.advance(1)
    assert h.sink.servers[0].down and a.aborted and not b.aborted
    a.close()
    assert ids(b.read()) == ids(got_a)


def test_verify_hostname_off_and_system_roots(tmp_path):
    pki = make_pki(tmp_path / "pki")
    options = defaults(tls=True, ca_file=str(pki.ca), verify_hostname=False)
    assert isinstance(client_tls_options("10.1.2.3", options), ssl.CertificateOptions)
    assert not isinstance(client_tls_options("localhost", defaults(tls=True)), ssl.CertificateOptions)


def test_stop_while_failing_does_not_wait(tmp_path):
    h = Harness(tmp_path)
    h.feed("t", h.events(1))
    h.refuse()
    stopped = []
    h.sink.stop().addCallback(stopped.append)
    assert stopped and not h.reactor.getDelayedCalls()


def test_acks_before_a_bad_reply_still_count(tmp_path):
    h = Harness(tmp_path, servers=[{"host": "a", "port": 1}, {"host": "b", "port": 2, "standby": True}])
    h.feed("t", h.events(1))
    h.feed("t", h.events(1, 1))
    server = h.accept()
    first, second = server.read()
    server.client.dataReceived(encode_ack(first.chunk) + b"\x92\xa3bad\x01")  # an ack, then nonsense
    assert server.aborted and "unexpected reply" in server.client.failed_reason
    assert h.sink.cursor == 100  # the acked record is done
    server.close()
    standby = h.accept()
    assert ids(standby.read()) == [second.chunk]  # only the unacked one is resent


def test_without_heartbeats_a_down_server_is_tried_again_after_recover_wait(tmp_path):
    h = Harness(
        tmp_path, heartbeat_type="none", recover_wait_secs=10,
        servers=[{"host": "primary", "port": 1}, {"host": "standby", "port": 2, "standby": True}],
    )
    h.feed("t", h.events(1))
    h.refuse(0)
    standby = h.accept()
    standby.ack(*standby.read())
    h.reactor.advance(9)
    h.feed("t", h.events(1, 1))
    assert [c[0] for c in h.connections()] == ["primary", "standby"]  # still on the standby
    standby.ack(*standby.read())
    h.reactor.advance(1)
    h.feed("t", h.events(1, 2))
    assert h.connections()[-1][0] == "primary"  # tried again; the chunk waits for it
    primary = h.accept()
    primary.ack(*primary.read())
    assert h.sink.cursor == 300


def test_acks_before_undecodable_bytes_still_count(tmp_path):
    h = Harness(tmp_path, servers=[{"host": "a", "port": 1}, {"host": "b", "port": 2, "standby": True}])
    h.feed("t", h.events(1))
    h.feed("t", h.events(1, 1))
    server = h.accept()
    first, second = server.read()
    server.client.dataReceived(encode_ack(first.chunk) + b"\xc1")  # an ack, then bytes no msgpack has
    assert server.aborted and "bad reply from server" in server.client.failed_reason
    assert h.sink.cursor == 100
    server.close()
    standby = h.accept()
    assert ids(standby.read()) == [second.chunk]


def test_a_deeply_nested_reply_is_reported_not_crashed_on(tmp_path):
    h = Harness(tmp_path)
    h.feed("t", h.events(1))
    server = h.accept()
    server.read()
    server.client.dataReceived(b"\x91" * 500 + b"\xc0")  # [[[…nil…]]], 500 deep
    assert server.aborted and "unexpected reply from server" in server.client.failed_reason

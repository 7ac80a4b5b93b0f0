"""The log_courier source's glue: StringTransport, task.Clock and a router whose ``ingest``
returns Deferreds fired by hand, so the handshake, ordered ACKNs and keepalives are
checked to the byte and to the tick."""

from __future__ import annotations

from typing import Any

from twisted.internet import task

import source_fakes
from source_fakes import T0, FakeRouter
from logrouter.sources.log_courier import SERVER_ID, LogCourierSource
from logrouter.wire import log_courier as lc

NOW_NS = T0 * 1_000_000_000
N1, N2, N3 = (bytes([i]) * 16 for i in (1, 2, 3))


class Conn(source_fakes.Conn):
    """The shared client connection, from 192.0.2.9; its replies are read as Log Courier
    messages (ACKN, VERS, PONG)."""

    def __init__(self, source: LogCourierSource) -> None:
        super().__init__(source, host="192.0.2.9")

    def replies(self) -> list[Any]:  # type: ignore[override]
        return lc.AcknDecoder().feed(super().replies())


def make_source(**overrides: Any) -> tuple[LogCourierSource, FakeRouter, task.Clock]:
    return source_fakes.make_source(LogCourierSource, "courier", **overrides)


def events(n: int, start: int = 0) -> list[dict]:
    return [{"message": f"line {i}", "@timestamp": "2024-01-02T03:04:05.5Z"} for i in range(start, start + n)]


def test_helo_gets_vers_with_evnt_then_payloads_are_acked_once_durable():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(lc.encode_helo(False, (2, 12, 0), b"LCOR"))
    (vers,) = conn.replies()
    assert isinstance(vers, lc.Vers) and vers.supports_evnt and vers.client_id == SERVER_ID.decode()
    assert conn.protocol.client_id == "LCOR"
    conn.send(lc.encode_evnt(N1, events(3)) + lc.encode_jdat(N2, events(2, 3)))
    assert len(router.calls) == 2 and conn.replies() == []
    batch, key = router.batches[0], router.keys[0]
    assert key == N1 and batch.tag == "log_courier" and batch.source == "courier"
    assert [r["message"] for _, r in batch.events] == ["line 0", "line 1", "line 2"]
    assert batch.events[0][0] == 1704164645_500_000_000  # from @timestamp
    router.fire(1)  # the second payload is durable first: its ACKN waits for the first's
    assert conn.replies() == []
    router.fire(0)
    assert conn.replies() == [lc.Ackn(N1, 3), lc.Ackn(N2, 2)]


def test_a_client_from_before_the_handshake_sends_jdat_first():
    source, router, _ = make_source()
    conn = Conn(source)
    data = lc.encode_jdat(N1, events(1))
    for i in range(len(data)):  # byte by byte through the handshake hook
        conn.send(data[i : i + 1])
    assert len(router.calls) == 1 and conn.protocol.client_id == ""
    router.fire(0)
    assert conn.replies() == [lc.Ackn(N1, 1)]


def test_a_first_message_that_is_neither_helo_nor_data_closes_the_connection():
    source, router, _ = make_source()
    conn = Conn(source)
    conn.send(lc.encode_ping())
    assert conn.transport.disconnecting and source.decode_errors == 1 and not router.calls


def test_ping_pong_unknown_types_and_a_late_helo():
    source, _, _ = make_source()
    conn = Conn(source)
    conn.send(lc.encode_helo())
    conn.replies()
    conn.send(lc.encode_ping() + b"ZZZZ\x00\x00\x00\x02hi" + lc.encode_helo() + lc.encode_unknown())
    assert conn.replies() == [lc.Pong(), lc.Unknown(), lc.Unknown()]  # the client's ???? is not echoed
    assert source.unknown_messages == 3 and not conn.transport.disconnecting


def test_waiting_payloads_get_their_count_repeated_every_keepalive():
    source, router, clock = make_source(keepalive_secs=5)
    conn = Conn(source)
    conn.send(lc.encode_helo())
    conn.replies()
    conn.send(lc.encode_jdat(N1, events(2)))
    clock.advance(5)
    assert conn.replies() == [lc.Ackn(N1, 0)]  # Log Carver's partial ACKN: still working
    clock.advance(5)
    assert conn.replies() == [lc.Ackn(N1, 0)]
    router.fire(0)
    assert conn.replies() == [lc.Ackn(N1, 2)]
    clock.advance(60)
    assert conn.replies() == []  # nothing owed, nothing written


def test_a_payload_split_by_tag_gets_one_ack_after_every_part_and_stable_keys():
    source, router, _ = make_source(tag="app.${service:-none}")
    conn = Conn(source)
    records = [{"message": "a", "service": "web"}, {"message": "b", "service": "db"}, {"message": "c"}]
    conn.send(lc.encode_jdat(N3, records))
    keys = router.keys
    assert [b.tag for b in router.batches] == ["app.web", "app.db", "app.none"]
    assert keys == [N3 + b"\0app.web", N3 + b"\0app.db", N3 + b"\0app.none"]
    router.fire(0)
    router.fire(2)
    assert conn.replies() == []
    router.fire(1)
    assert conn.replies() == [lc.Ackn(N3, 3)]


def test_events_that_are_not_objects_are_kept_and_counted():
    source, router, _ = make_source()
    conn = Conn(source)
    conn.send(lc.encode_jdat(N1, [b"not json", {"message": "ok"}]))
    batch = router.batches[0]
    assert [r["message"] for _, r in batch.events] == ["not json", "ok"]
    assert source.invalid_events == 1


def test_bad_zlib_closes_only_that_connection():
    source, router, _ = make_source()
    good, bad = Conn(source), Conn(source)
    bad.send(b"JDAT\x00\x00\x00\x14" + N1 + b"\x00\x01\x02\x03")
    assert bad.transport.disconnecting and source.decode_errors == 1
    good.send(lc.encode_jdat(N2, events(1)))
    assert len(router.calls) == 1 and not good.transport.disconnecting


def test_paused_in_the_middle_of_a_payload_the_shipper_gets_ackn_0():
    source, router, clock = make_source(keepalive_secs=5)
    conn = Conn(source)
    conn.send(lc.encode_helo())
    conn.replies()
    data = lc.encode_evnt(N1, events(100))
    conn.send(data[:40])  # the nonce and part of the stream
    source.pause_reading()  # the spool is full
    clock.advance(5)
    assert conn.replies() == [lc.Ackn(N1, 0)]
    clock.advance(5)
    assert conn.replies() == [lc.Ackn(N1, 0)]
    source.resume_reading()
    conn.send(data[40:])
    router.fire(0)
    assert conn.replies() == [lc.Ackn(N1, 100)]
    clock.advance(30)
    assert conn.replies() == []


def test_held_back_at_a_payload_boundary_it_reads_on_to_the_next_nonce_and_keeps_it_alive():
    """The real shipper has up to 10 payloads in flight: when the spool fills just after a
    whole payload, the next ones wait in the socket, and an ACKN of the payload already
    acknowledged does not re-arm its timeout. The connection reads on to the next nonce."""
    source, router, clock = make_source(keepalive_secs=5)
    conn = Conn(source)
    conn.send(lc.encode_helo())
    conn.replies()
    conn.send(lc.encode_evnt(N1, events(2)))
    source.pause_reading()  # the spool is full, at a payload boundary
    assert conn.transport.producerState == "producing"  # reading on, to the next nonce
    router.fire(0)
    assert conn.replies() == [lc.Ackn(N1, 2)]
    second = lc.encode_evnt(N2, events(100))
    conn.send(second[:30])  # the header and the nonce have come
    assert conn.transport.producerState == "paused"
    clock.advance(5)
    assert conn.replies() == [lc.Ackn(N2, 0)]
    clock.advance(5)
    assert conn.replies() == [lc.Ackn(N2, 0)]
    source.resume_reading()
    assert conn.transport.producerState == "producing"
    conn.send(second[30:])
    router.fire(1)
    assert conn.replies() == [lc.Ackn(N2, 100)]
    clock.advance(30)
    assert conn.replies() == []


def test_a_peek_that_completes_a_payload_stores_it_and_stops_at_the_next_nonce():
    source, router, clock = make_source(keepalive_secs=5)
    conn = Conn(source)
    conn.send(lc.encode_helo())
    conn.replies()
    conn.send(lc.encode_jdat(N1, events(1)))
    source.pause_reading()
    conn.send(lc.encode_jdat(N2, events(1)))  # a whole payload: stored, still at a boundary
    assert len(router.calls) == 2 and conn.transport.producerState == "producing"
    conn.send(lc.encode_jdat(N3, events(1))[:24])
    assert conn.transport.producerState == "paused"
    router.fire_all()
    assert conn.replies() == [lc.Ackn(N1, 1), lc.Ackn(N2, 1)]
    clock.advance(5)
    assert conn.replies() == [lc.Ackn(N3, 0)]


def test_no_peek_before_the_greeting_nor_for_a_stop():
    source, router, _ = make_source()
    source.pause_reading()
    conn = Conn(source)  # accepted while the spool is full: the HELO waits
    assert conn.transport.producerState == "paused"
    source.resume_reading()
    conn.send(lc.encode_helo())
    conn.send(lc.encode_jdat(N1, events(1)))
    source.pause_reading()
    assert conn.transport.producerState == "producing"
    conn.protocol.hold_reading("closing")  # a stop or a close wins over the peek
    assert conn.transport.producerState == "paused"


def test_a_helo_dribbled_in_is_closed_by_the_frame_deadline():
    source, _, clock = make_source(frame_timeout_secs=10)
    conn = Conn(source)
    helo = lc.encode_helo()
    for i in range(12):
        conn.send(helo[i : i + 1])
        clock.advance(1)
    assert conn.transport.disconnecting and conn.protocol.close_reason == "slow_frame"

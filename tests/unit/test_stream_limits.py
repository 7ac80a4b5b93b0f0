"""Connection limits of every stream source: the per-address cap and the frame deadline.

- ``max_connections_per_peer``: one IP address cannot take every connection slot.
- ``frame_timeout_secs`` / ``frame_min_bytes_per_sec`` (Apache mod_reqtimeout's
  body=…,MinRate=… model): a connection holding part of a frame must complete it within
  the timeout plus 1 s per ``frame_min_bytes_per_sec`` bytes received, so one byte a
  second (which resets any idle timer) is closed; time reading is held by us does not count.

StringTransport and task.Clock, with the line source of ``stream_harness``.
"""

from __future__ import annotations

from twisted.internet.address import IPv6Address, UNIXAddress

from source_fakes import Conn, log_lines  # noqa: F401  (log_lines is a fixture)
from stream_harness import make_source

from logrouter.sources.stream import STREAM_OPTIONS

# -- per-peer cap ------------------------------------------------------------------------


def test_one_address_cannot_take_every_connection(log_lines):
    source, _, _ = make_source(max_connections=10, max_connections_per_peer=3)
    flood = [Conn(source, host="198.51.100.9", port=p) for p in range(1, 6)]
    assert [c.refused for c in flood] == [False, False, False, True, True]
    others = [Conn(source, host="192.0.2.7", port=p) for p in range(1, 4)]
    assert not any(c.refused for c in others)  # other clients still get in
    assert source.refused == {"max_connections": 0, "max_connections_per_peer": 2}
    assert len(source.connections) == 6 and source.connections_total == 6
    assert log_lines.count(
        "lines 198.51.100.9:4: connection refused: max_connections_per_peer (3) reached"
    ) == 1
    # A refused connection ending frees nothing; a closed admitted one frees its slot.
    flood[3].lose()
    assert Conn(source, host="198.51.100.9", port=9).refused
    flood[0].lose()
    assert not Conn(source, host="198.51.100.9", port=10).refused
    assert source.closed["peer"] == 1  # refusals are not counted as closes


def test_the_global_cap_still_applies_and_is_counted(log_lines):
    source, _, _ = make_source(max_connections=2, max_connections_per_peer=5)
    conns = [Conn(source, host=f"192.0.2.{i}") for i in range(3)]
    assert [c.refused for c in conns] == [False, False, True]
    assert source.refused == {"max_connections": 1, "max_connections_per_peer": 0}
    assert "lines 192.0.2.2:40000: connection refused: max_connections (2) reached" in log_lines


def test_an_ipv4_client_of_a_dual_stack_listener_is_the_same_peer():
    source, _, _ = make_source(max_connections_per_peer=1)
    assert not Conn(source, host="192.0.2.7").refused
    assert Conn(source, address=IPv6Address("TCP", "::ffff:192.0.2.7", 1)).refused
    assert not Conn(source, address=IPv6Address("TCP", "2001:db8::1", 1)).refused
    assert source.per_peer == {"192.0.2.7": 1, "2001:db8::1": 1}


def test_zero_means_no_per_peer_cap_and_unix_peers_have_none():
    source, _, _ = make_source(max_connections_per_peer=0)
    assert not any(Conn(source, port=p).refused for p in range(20))
    source, _, _ = make_source(max_connections_per_peer=1)
    assert not any(Conn(source, address=UNIXAddress(None)).refused for _ in range(3))


def test_default_per_peer_cap_leaves_most_slots_to_others():
    assert STREAM_OPTIONS["max_connections_per_peer"].default * 4 <= STREAM_OPTIONS["max_connections"].default


# -- frame deadline ------------------------------------------------------------------------


def test_one_byte_a_second_is_closed(log_lines):
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(b"ok\n")
    router.fire_all()
    conn.replies()
    for _ in range(60):
        if conn.closed:
            break
        conn.send(b"x")  # resets the idle timer each time
        clock.advance(1)
    # 30 s + 1 s per 500 bytes: closed at the first check after 30.06 s.
    assert conn.closed and 30 <= len(conn.protocol.decoder.buffer) <= 31
    assert source.closed == {**source.closed, "slow_frame": 0}  # counted once the transport is gone
    conn.lose()
    assert source.closed["slow_frame"] == 1
    assert any(
        line.startswith("lines 192.0.2.7:40000: 31 bytes of a frame in 31s, slower than frame_timeout_secs (30s)")
        for line in log_lines
    ), log_lines


def test_a_big_frame_at_a_decent_rate_is_not_closed():
    source, router, clock = make_source()
    conn = Conn(source)
    for _ in range(200):  # 200 s at 600 bytes/s: slow, but above the minimum rate
        conn.send(b"y" * 600)
        clock.advance(1)
    conn.send(b"\n")
    assert not conn.closed and len(router.calls) == 1


def test_a_frame_boundary_is_governed_by_the_idle_timeout_only():
    source, router, clock = make_source(idle_timeout_secs=300)
    conn = Conn(source)
    conn.send(b"whole\n")
    clock.advance(299)
    assert not conn.closed
    router.fire_all()
    clock.advance(1)
    assert conn.closed and conn.protocol.close_reason == "idle_timeout"


def test_each_completed_frame_restarts_the_clock():
    source, router, clock = make_source(frame_timeout_secs=10)
    conn = Conn(source)
    conn.send(b"a")
    for _ in range(10):  # every read completes a frame and starts the next: never slow
        clock.advance(8)
        conn.send(b"\na")
    assert not conn.closed and len(router.calls) == 10
    clock.advance(10.01)
    assert conn.transport.producerState == "paused"  # this last frame took 10 s for 1 byte


def test_time_held_by_us_does_not_count():
    source, router, clock = make_source(frame_timeout_secs=10)
    conn = Conn(source)
    conn.send(b"half")
    clock.advance(5)
    source.pause_reading()  # the spool is full: the client cannot send
    clock.advance(100)
    source.resume_reading()
    clock.advance(4.9)
    assert not conn.closed
    clock.advance(0.2)
    assert conn.closed


def test_frame_timeout_zero_turns_it_off():
    source, router, clock = make_source(frame_timeout_secs=0, idle_timeout_secs=0)
    conn = Conn(source)
    for _ in range(100):
        conn.send(b"x")
        clock.advance(1)
    assert not conn.closed and clock.getDelayedCalls() == []


def test_a_decoder_without_pending_bytes_is_never_timed():
    source, router, clock = make_source(idle_timeout_secs=0)
    conn = Conn(source)
    conn.protocol.decoder = type("Opaque", (), {"feed": lambda self, data: []})()
    conn.send(b"x")
    assert clock.getDelayedCalls() == []


def test_timers_are_gone_once_the_connection_is():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(b"part")
    conn.lose()
    assert clock.getDelayedCalls() == []

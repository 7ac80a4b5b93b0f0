"""A graceful stop reads what connections already delivered before it closes them.

Unit tests of ``StreamSource.stop`` with StringTransport and task.Clock (the line source
of ``stream_harness``): reading goes on until a connection has been quiet at a frame
boundary for ``stop_quiet_secs``, or gave ``stop_drain_bytes``, or ``stop_drain_secs``
passed; then reading is held, stored batches get their replies, and the connection closes.
The real-daemon check with a real client is in ``test_e2e_stop_drain.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

from twisted.internet.address import UNIXAddress

from source_fakes import Conn, log_lines  # noqa: F401  (log_lines is a fixture)
from stream_harness import make_source


def stop(source) -> list:
    stopped: list = []
    source.stop().addCallback(stopped.append)
    return stopped


def test_bytes_delivered_after_the_stop_began_are_stored_and_acked(log_lines):
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(b"one\n")
    stopped = stop(source)
    assert source.port.stopped
    # Reading goes on: what the kernel took from the client before the stop is not lost.
    assert conn.transport.producerState == "producing"
    conn.send(b"two\nthr")
    clock.advance(0.3)
    conn.send(b"ee\n")
    assert router.lines() == ["one", "two", "three"]
    clock.advance(0.4)  # 0.4 s quiet: not yet
    assert conn.transport.producerState == "producing"
    clock.advance(0.1)  # quiet for stop_quiet_secs: reading stops, replies are awaited
    assert conn.transport.producerState == "paused"
    assert not stopped and not conn.closed
    conn.send(b"late\n")  # whatever Twisted still hands over is not taken any more
    assert router.lines() == ["one", "two", "three"]
    router.fire_all()
    assert conn.replies() == b"ok one\nok two\nok three\n"
    assert conn.closed and stopped == [None]
    assert "lines 192.0.2.7:40000: source stopping: read 10 more bytes; closing connection" in log_lines
    conn.lose()
    assert source.closed["stopping"] == 1 and source.connections == set()
    assert clock.getDelayedCalls() == []


def test_a_connection_mid_frame_waits_for_the_rest_of_it():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(b"par")
    stop(source)
    clock.advance(2)  # quiet, but half a line is buffered: the client is not done
    assert conn.transport.producerState == "producing"
    conn.send(b"tial\n")
    assert router.lines() == ["partial"]
    clock.advance(0.5)
    assert conn.transport.producerState == "paused"


def test_an_unfinished_frame_is_dropped_at_the_deadline_with_a_log_line(log_lines):
    source, router, clock = make_source()
    conn = Conn(source)
    stopped = stop(source)
    conn.send(b"never finished")
    clock.advance(2.9)
    assert not conn.closed
    clock.advance(0.1)  # stop_drain_secs (3)
    assert conn.closed and stopped == [None] and router.calls == []
    assert (
        "lines 192.0.2.7:40000: source stopping: read 14 more bytes, stop_drain_secs (3s) passed, "
        "14 bytes of an incomplete frame dropped; closing connection"
    ) in log_lines


def test_a_client_that_keeps_sending_is_cut_off_by_the_byte_budget(log_lines):
    source, router, clock = make_source(stop_drain_bytes=10)
    conn = Conn(source)
    stopped = stop(source)
    conn.send(b"12345\n")
    conn.send(b"67890\n")  # 12 bytes: the budget is spent
    assert conn.transport.producerState == "paused"
    conn.send(b"more\n")
    router.fire_all()
    assert router.lines() == ["12345", "67890"] and conn.closed and stopped == [None]
    assert any("stop_drain_bytes (10) read" in line for line in log_lines)


def test_a_client_that_keeps_sending_is_cut_off_by_the_deadline():
    source, router, clock = make_source()
    conn = Conn(source)
    stopped = stop(source)
    for _ in range(20):  # a line every 0.25 s: never quiet
        conn.send(b"x\n")
        clock.advance(0.25)
    assert conn.transport.producerState == "paused" and len(router.calls) == 12  # 3 s of it
    router.fire_all()
    assert conn.closed and stopped == [None]


def test_the_deadline_is_a_tenth_of_the_routers_shutdown_timeout():
    source, router, clock = make_source(stop_drain_secs=10)
    router.config = SimpleNamespace(router={"shutdown_timeout_secs": 5})
    conn = Conn(source)
    stop(source)
    conn.send(b"half")
    clock.advance(0.49)
    assert not conn.closed
    clock.advance(0.01)
    assert conn.closed


def test_stop_drain_secs_zero_closes_at_once():
    source, router, clock = make_source(stop_drain_secs=0)
    conn = Conn(source)
    conn.send(b"one\n")
    stopped = stop(source)
    assert conn.transport.producerState == "paused" and not conn.closed
    router.fire_all()
    assert conn.replies() == b"ok one\n" and conn.closed and stopped == [None]


def test_every_connection_drains_on_its_own(log_lines):
    source, router, clock = make_source()
    quiet, busy = Conn(source, port=1), Conn(source, port=2)
    stopped = stop(source)
    clock.advance(0.25)
    busy.send(b"b\n")
    clock.advance(0.25)
    assert quiet.closed and not busy.closed
    clock.advance(0.5)
    router.fire_all()
    assert busy.closed and stopped == [None]


def test_a_peer_that_closes_during_the_drain_ends_it():
    source, router, clock = make_source()
    conn = Conn(source)
    stopped = stop(source)
    conn.send(b"last\n")
    conn.lose()
    assert stopped == [None] and router.lines() == ["last"]
    assert source.closed["peer"] == 1 and clock.getDelayedCalls() == []


def test_a_connection_held_by_backpressure_stays_held_and_ends_when_quiet():
    source, router, clock = make_source()
    conn = Conn(source)
    source.pause_reading()
    stopped = stop(source)
    clock.advance(0.5)
    assert conn.transport.producerState == "paused" and conn.closed and stopped == [None]
    source.resume_reading()  # the router's backpressure lifting does not resume a closing connection
    assert conn.transport.producerState == "paused"


def test_a_frame_being_worked_on_keeps_the_drain_open():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.protocol.hold_reading("decoding")  # e.g. a big message decoded in a thread
    stop(source)
    clock.advance(1)
    assert not conn.closed
    conn.protocol.release_reading("decoding")
    assert conn.transport.producerState == "producing"
    conn.send(b"decoded\n")
    clock.advance(0.5)
    assert conn.transport.producerState == "paused" and router.lines() == ["decoded"]
    router.fire_all()
    assert conn.closed


def test_stop_replies_then_closes_when_nothing_comes():
    source, router, clock = make_source()
    conn = Conn(source, address=UNIXAddress(None))
    conn.send(b"a\n")
    stopped = stop(source)
    clock.advance(0.5)
    assert not stopped and not conn.closed
    router.fire_all()
    assert conn.replies() == b"ok a\n" and conn.closed and stopped == [None]


def test_stop_without_connections_is_immediate():
    source, router, clock = make_source()
    assert stop(source) == [None] and clock.getDelayedCalls() == []

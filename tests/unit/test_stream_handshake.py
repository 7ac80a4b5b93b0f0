"""The stream base's handshake hook, on the line protocol of ``stream_harness``.

The handshake here: the client sends ``HELLO <name>;`` and gets ``WELCOME;``; a first
line that starts with ``DATA`` is a legacy client without a handshake (its bytes go to
the codec unchanged); anything else fails with ``GO AWAY;`` written before the close."""

from __future__ import annotations

from typing import Any

from source_fakes import Conn, fake_context, log_lines  # noqa: F401  (log_lines is a fixture)
from stream_harness import LineProtocol, LineSource, make_source
from logrouter.sources.stream_handshake import HandshakeDone, HandshakeFailed


class GreetingProtocol(LineProtocol):
    name = ""

    def connection_ready(self) -> None:
        self.buffer = b""
        self.expect_handshake()

    def handshake_received(self, data: bytes) -> Any:
        self.buffer += data
        if self.buffer.startswith(b"DATA"):
            return HandshakeDone(self.buffer)  # no handshake: the same bytes go to the codec
        if len(self.buffer) < 6:
            return None
        if not self.buffer.startswith(b"HELLO "):
            return HandshakeFailed(f"no greeting: {self.buffer[:6]!r}", b"GO AWAY;")
        head, sep, rest = self.buffer.partition(b";")
        if not sep:
            return None
        self.name = head[6:].decode()
        return HandshakeDone(rest, b"WELCOME;")

    def handshake_pending_bytes(self) -> int:
        return len(self.buffer)


class GreetingSource(LineSource):
    protocol_class = GreetingProtocol


def greeting_source(**overrides: Any):
    source, router, clock = make_source(**overrides)
    greeting = GreetingSource("lines", source.options, fake_context(router, clock))
    greeting.port = source.port
    return greeting, router, clock


def test_bytes_go_to_the_handshake_then_to_the_codec():
    source, router, clock = greeting_source()
    conn = Conn(source)
    conn.send(b"HELLO al")
    assert conn.replies() == b"" and conn.protocol.handshaking
    conn.send(b"ice;one\ntw")
    assert conn.replies() == b"WELCOME;" and conn.protocol.name == "alice"
    assert router.lines() == ["one"]
    conn.send(b"o\n")
    router.fire_all()
    assert router.lines() == ["one", "two"] and conn.replies() == b"ok one\nok two\n"


def test_handshake_done_with_nothing_after_it():
    source, router, clock = greeting_source()
    conn = Conn(source)
    conn.send(b"HELLO bob;")
    assert conn.replies() == b"WELCOME;" and not conn.protocol.handshaking and router.calls == []
    conn.send(b"x\n")
    assert router.lines() == ["x"]


def test_a_client_without_a_handshake_has_its_bytes_decoded_unchanged():
    source, router, clock = greeting_source()
    conn = Conn(source)
    conn.send(b"DA")
    conn.send(b"TA 1\nDATA 2\n")
    assert router.lines() == ["DATA 1", "DATA 2"] and conn.replies() == b""


def test_a_failed_handshake_writes_its_reply_then_closes_as_bad_input(log_lines):
    source, router, clock = greeting_source()
    conn = Conn(source)
    conn.send(b"GET / HTTP/1.1\r\n")
    assert conn.replies() == b"GO AWAY;" and conn.closed
    assert source.decode_errors == 1 and router.calls == []
    assert "lines 192.0.2.7:40000: no greeting: b'GET / '; closing connection" in log_lines
    conn.lose()
    assert source.closed["decode_error"] == 1


def test_the_frame_deadline_covers_the_handshake(log_lines):
    source, router, clock = greeting_source()
    conn = Conn(source)
    conn.send(b"HELLO ")
    for _ in range(40):
        if conn.closed:
            break
        conn.send(b"x")  # a dribbled greeting: the idle timeout never fires
        clock.advance(1)
    assert conn.closed and conn.protocol.handshaking
    assert any(line.startswith("lines 192.0.2.7:40000: ") and "slower than frame_timeout_secs" in line for line in log_lines)
    conn.lose()
    assert source.closed["slow_frame"] == 1


def test_a_frame_begun_with_the_handshake_gets_a_fresh_clock():
    source, router, clock = greeting_source(frame_timeout_secs=10)
    conn = Conn(source)
    conn.send(b"HELLO ")
    clock.advance(9)
    conn.send(b"carol;half a li")  # the greeting completes; a line begins
    clock.advance(9)
    assert not conn.closed
    conn.send(b"ne\n")
    assert router.lines() == ["half a line"]


def test_a_peer_gone_mid_handshake_is_counted_mid_frame():
    source, router, clock = greeting_source()
    conn = Conn(source)
    conn.send(b"HELLO da")
    conn.lose()
    assert source.closed["peer_mid_frame"] == 1


def test_without_expect_handshake_bytes_go_straight_to_the_codec():
    source, router, clock = make_source()
    conn = Conn(source)
    assert not conn.protocol.handshaking
    conn.send(b"HELLO x;\n")
    assert router.lines() == ["HELLO x;"]

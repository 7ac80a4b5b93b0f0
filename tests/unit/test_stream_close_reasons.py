"""Every connection a stream source closes says why: a log line naming protocol, peer and
reason, and a count per reason (``logrouter_source_connections_closed_total``).

Also: a decode error does not throw away the frames decoded before it in the same read
(the codec attaches them as ``error.messages``); they are stored and answered before the
connection closes. StringTransport and task.Clock, with the line source of ``stream_harness``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from OpenSSL import SSL
from twisted.internet import error
from twisted.python.failure import Failure

from source_fakes import Conn, log_lines  # noqa: F401  (log_lines is a fixture)
from stream_harness import make_source

from logrouter import metrics
from logrouter.sources.stream import CLOSE_REASONS
from logrouter.wire.errors import DecodeError


def failure(exception: BaseException) -> Failure:
    try:
        raise exception
    except BaseException:
        return Failure()


# -- the peer closes -------------------------------------------------------------------------


def test_a_peer_closing_mid_frame_is_logged_and_counted(log_lines):
    source, router, _ = make_source()
    conn = Conn(source)
    conn.send(b"whole\ntrunc")
    conn.lose(failure(error.ConnectionDone()))
    assert router.lines() == ["whole"]
    assert "lines 192.0.2.7:40000: closed by the peer mid-frame; 5 bytes of an incomplete frame unprocessed" in log_lines
    assert source.closed["peer_mid_frame"] == 1 and source.closed["peer"] == 0


def test_a_peer_closing_at_a_frame_boundary_is_the_normal_end(log_lines):
    source, _, _ = make_source()
    conn = Conn(source)
    conn.send(b"whole\n")
    conn.lose(failure(error.ConnectionDone()))
    assert source.closed["peer"] == 1 and not any("192.0.2.7" in line for line in log_lines)


# -- decode errors -------------------------------------------------------------------------


def test_frames_before_a_bad_one_are_stored_and_answered_before_the_close(log_lines):
    source, router, _ = make_source()
    conn = Conn(source)
    conn.send(b"one\ntwo\nBAD\nthree\n")
    assert router.lines() == ["one", "two"]  # well-formed input from the client
    assert conn.transport.producerState == "paused" and not conn.closed
    conn.send(b"four\n")
    assert router.lines() == ["one", "two"]  # nothing after the bad frame is taken
    router.fire_all()
    assert conn.replies() == b"ok one\nok two\n"  # acked, so the client does not resend them
    assert conn.closed and source.decode_errors == 1
    assert "lines 192.0.2.7:40000: bad line; closing connection" in log_lines
    conn.lose()
    assert source.closed["decode_error"] == 1


def test_a_bad_frame_alone_closes_at_once():
    source, router, _ = make_source()
    conn = Conn(source)
    conn.send(b"BAD\n")
    assert conn.closed and router.calls == []


def test_a_codec_error_without_messages_still_works():
    source, router, _ = make_source()
    conn = Conn(source)

    def feed(data):
        raise DecodeError("plain")

    conn.protocol.decoder.feed = feed
    conn.send(b"x")
    assert conn.closed and source.decode_errors == 1


# -- closes of our own -----------------------------------------------------------------------


def test_idle_timeout(log_lines):
    source, _, clock = make_source(idle_timeout_secs=5)
    conn = Conn(source)
    clock.advance(5)
    assert conn.closed and "lines 192.0.2.7:40000: idle for 5s, closing" in log_lines
    conn.lose()
    assert source.closed["idle_timeout"] == 1


def test_a_failed_store_aborts(log_lines):
    source, router, _ = make_source()
    conn = Conn(source)
    conn.send(b"one\n")
    router.calls[0].deferred.errback(OSError("disk full"))
    assert conn.refused  # abortConnection
    assert any(line.startswith("lines 192.0.2.7:40000: batch could not be stored") for line in log_lines)
    conn.lose()
    assert source.closed["store_failed"] == 1


def test_tls_failure(log_lines):
    source, _, _ = make_source()
    conn = Conn(source)
    conn.lose(failure(SSL.Error([("SSL routines", "", "peer did not return a certificate")])))
    assert source.tls_errors == 1 and source.closed["tls_error"] == 1
    assert any(line.startswith("lines 192.0.2.7:40000: TLS handshake failed:") for line in log_lines)


def test_a_protocol_module_closing_on_its_own_is_other():
    source, _, _ = make_source()
    conn = Conn(source)
    conn.protocol.closing = True
    conn.transport.abortConnection()
    conn.lose()
    assert source.closed["other"] == 1


@pytest.mark.parametrize("how", ["idle", "slow", "bad", "stop", "store", "tls", "mid_frame"])
def test_every_close_names_protocol_peer_and_reason(how, log_lines):
    source, router, clock = make_source(idle_timeout_secs=5, frame_timeout_secs=2)
    conn = Conn(source, host="203.0.113.5", port=7)
    if how == "idle":
        clock.advance(5)
    elif how == "slow":
        conn.send(b"x")
        clock.advance(3)
    elif how == "bad":
        conn.send(b"BAD\n")
    elif how == "stop":
        source.stop()
        clock.advance(1)
    elif how == "store":
        conn.send(b"a\n")
        router.calls[0].deferred.errback(OSError("disk full"))
    elif how == "tls":
        conn.lose(failure(SSL.Error([("SSL routines", "", "decryption failed or bad record mac")])))
    elif how == "mid_frame":
        conn.send(b"x")
        conn.lose()
    if how not in ("tls", "mid_frame"):
        conn.lose()
    lines = [line for line in log_lines if line.startswith("lines 203.0.113.5:7: ")]
    assert len(lines) == 1, log_lines
    assert sum(source.closed.values()) == 1 and source.connections == set()


# -- metrics ---------------------------------------------------------------------------------


def stub_router(*sources):
    """What ``metrics.render`` asks of a router: its own samples, and components with ``samples()``."""
    for i, source in enumerate(sources):
        source.name = f"in{i}"
    return SimpleNamespace(
        samples=lambda: iter(()),
        feed_samples=lambda: iter(()),
        sources={source.name: source for source in sources},
        errors=SimpleNamespace(samples=lambda: iter(())),
        sinks={},
    )


def test_refusals_and_closes_are_in_the_prometheus_output():
    source, _, clock = make_source(max_connections_per_peer=1)
    first = Conn(source)
    assert Conn(source).refused
    first.send(b"x")
    clock.advance(31)
    first.lose()
    text = metrics.render(stub_router(source, make_source()[0]))
    assert 'logrouter_source_connections_refused_total{source="in0",type="lines",reason="max_connections_per_peer"} 1' in text
    assert 'logrouter_source_connections_refused_total{source="in0",type="lines",reason="max_connections"} 0' in text
    assert 'logrouter_source_connections_closed_total{source="in0",type="lines",reason="slow_frame"} 1' in text
    for reason in CLOSE_REASONS:  # every reason is exported from the start, so rate() works
        assert f'logrouter_source_connections_closed_total{{source="in0",type="lines",reason="{reason}"}}' in text
    # One TYPE line per metric, its samples right below it.
    lines = text.splitlines()
    start = lines.index("# TYPE logrouter_source_connections_closed_total counter")
    block = lines[start + 1 : start + 1 + 2 * len(CLOSE_REASONS)]
    assert all(line.startswith("logrouter_source_connections_closed_total{") for line in block)
    assert text.count("# TYPE logrouter_source_connections_closed_total") == 1

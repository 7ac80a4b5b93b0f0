"""The lumberjack source's glue: StringTransport, task.Clock and a router whose ``ingest``
returns Deferreds fired by hand, so acks, partial acks and ACK-0 keepalives are checked
to the byte and to the tick."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from twisted.internet import task

import source_fakes
from fixtures.pki import make_pki
from source_fakes import T0, FakeRouter, log_lines  # noqa: F401  (log_lines is a fixture)
from logrouter.config.load import ConfigError, load_string
from logrouter.sources import lumberjack as source_module
from logrouter.sources.lumberjack import LumberjackSource, TagTemplate, timestamp_ns
from logrouter.wire import lumberjack as lj

NOW_NS = T0 * 1_000_000_000


class Conn(source_fakes.Conn):
    """The shared client connection; it reads lumberjack acks."""

    def acks(self) -> list[tuple[int, int]]:
        """(version, seq) of every ack written since the last call."""
        return [(a.version, a.seq) for a in lj.AckDecoder().feed(self.replies())]


def make_source(**overrides: Any) -> tuple[LumberjackSource, FakeRouter, task.Clock]:
    return source_fakes.make_source(LumberjackSource, "beats", **overrides)


def window(records: list[dict], **kw: Any) -> bytes:
    return lj.encode_window_frames(records, **kw)


def docs(n: int, start: int = 0) -> list[dict]:
    return [{"message": f"m{i}", "i": i} for i in range(start, start + n)]


# -- acks after durability -----------------------------------------------------------------


def test_window_is_stored_then_acked_with_its_highest_seq():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(window(docs(3)))
    assert len(router.calls) == 1 and conn.acks() == []
    batch = router.batches[0]
    assert batch.tag == "beats" and batch.source == "beats"
    assert batch.events == [(NOW_NS, d) for d in docs(3)]
    router.fire(0)
    assert conn.acks() == [(2, 3)]
    assert clock.getDelayedCalls() and all(c.getTime() == T0 + 300 for c in clock.getDelayedCalls())  # idle timeout only


def test_partial_acks_while_a_window_is_stored_in_steps():
    source, router, clock = make_source()
    conn = Conn(source)
    frames = [lj.encode_json(i + 1, d) for i, d in enumerate(docs(6))]
    conn.send(lj.encode_window(6) + frames[0] + frames[1])
    conn.send(frames[2] + frames[3][:7])
    conn.send(frames[3][7:] + frames[4] + frames[5])
    assert [len(b.events) for b in router.batches] == [2, 1, 3]
    router.fire(1)  # a later step durable first: nothing may be acked before step 0
    assert conn.acks() == []
    router.fire(0)
    assert conn.acks() == [(2, 3)]  # steps 0 and 1 together: one ack, the highest seq
    router.fire(2)
    assert conn.acks() == [(2, 6)]


def test_pipelined_windows_are_acked_in_order_one_ack_each():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(window(docs(2)) + window(docs(3, 2)))  # Beats pipelining: window 2 before window 1's ack
    assert [len(b.events) for b in router.batches] == [2, 3]
    router.fire(1)
    assert conn.acks() == []
    router.fire(0)
    assert conn.acks() == [(2, 2), (2, 3)]


def test_sequence_numbers_that_keep_counting_are_acked_as_sent():
    # pylogbeat waits for the ack to equal its last seq, which keeps counting across windows.
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(window(docs(2), first_seq=1))
    router.fire(0)
    conn.send(window(docs(2), first_seq=3))
    router.fire(1)
    assert conn.acks() == [(2, 2), (2, 4)]


def test_empty_window_is_answered_with_ack_0_in_order():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(window(docs(1)) + lj.encode_window(0))
    assert conn.acks() == []  # the empty window's ack must wait for window 1's
    router.fire(0)
    assert conn.acks() == [(2, 1), (2, 0)]
    conn.send(lj.encode_window(0) + lj.encode_compressed(b""))
    assert conn.acks() == [(2, 0)]
    assert len(router.calls) == 1


def test_v1_connection_acks_and_keepalives_with_version_1():
    source, router, clock = make_source()
    conn = Conn(source)
    pairs = [{"line": "one", "file": "/var/log/a"}, {"line": "two", "file": "/var/log/a"}]
    conn.send(lj.encode_window_frames(pairs, version=1, compress_level=None))
    (batch,) = router.batches
    assert [r for _, r in batch.events] == pairs
    clock.advance(5)
    assert conn.acks() == [(1, 0)]  # the Node v1 client rejects any other version byte
    router.fire(0)
    assert conn.acks() == [(1, 2)]


def test_invalid_events_are_counted_logged_and_covered_by_the_ack(log_lines):
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(lj.encode_window(3) + lj.encode_json(1, {"a": 1}) + lj.encode_json(2, b"nope") + lj.encode_json(3, b"[1]"))
    (batch,) = router.batches
    assert [r for _, r in batch.events] == [{"a": 1}]
    assert source.invalid_events == 2
    assert any("lumberjack 192.0.2.7:40000: skipped 2 invalid event(s) in window 1 (event seq 2" in l for l in log_lines)
    router.fire(0)
    assert conn.acks() == [(2, 3)]
    # A window of nothing but invalid events is acked at once.
    conn.send(lj.encode_window(1) + lj.encode_json(1, b"0"))
    assert conn.acks() == [(2, 1)] and len(router.calls) == 1


def test_windows_with_nothing_stored_wait_behind_earlier_ones():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(window(docs(1)) + lj.encode_window(1) + lj.encode_json(1, b"bad"))
    assert conn.acks() == []
    router.fire(0)
    assert conn.acks() == [(2, 1), (2, 1)]


# -- keepalive -----------------------------------------------------------------------------


def test_ack_0_every_keepalive_interval_while_stored_events_wait():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(window(docs(2)))
    clock.advance(4.9)
    assert conn.acks() == []
    clock.advance(0.1)
    assert conn.acks() == [(2, 0)]
    clock.advance(5)
    assert conn.acks() == [(2, 0)]
    router.fire(0)
    assert conn.acks() == [(2, 2)]
    clock.advance(60)
    assert conn.acks() == []  # nothing pending: no keepalive
    assert conn.protocol.acks.keepalive_call is None


def test_keepalive_counts_from_the_last_ack_written():
    source, router, clock = make_source()
    conn = Conn(source)
    frames = [lj.encode_json(i + 1, d) for i, d in enumerate(docs(2))]
    conn.send(lj.encode_window(2) + frames[0])
    clock.advance(3)
    conn.send(frames[1])
    router.fire(0)
    assert conn.acks() == [(2, 1)]  # a partial ack at t=3
    clock.advance(4.9)  # t=7.9: step 2 still waits, but an ack went out 4.9 s ago
    assert conn.acks() == []
    clock.advance(0.1)  # t=8
    assert conn.acks() == [(2, 0)]
    router.fire(1)
    assert conn.acks() == [(2, 2)]


def test_keepalive_after_a_long_quiet_spell_waits_a_full_interval():
    source, router, clock = make_source(keepalive_secs=2.5)
    conn = Conn(source)
    clock.advance(100)
    conn.send(window(docs(1)))
    clock.advance(2.4)
    assert conn.acks() == []
    clock.advance(0.1)
    assert conn.acks() == [(2, 0)]
    assert conn.protocol.acks.keepalives_sent == 1


def test_keepalive_off():
    source, router, clock = make_source(keepalive_secs=0)
    conn = Conn(source)
    conn.send(window(docs(1)))
    clock.advance(60)
    assert conn.acks() == []
    router.fire(0)
    assert conn.acks() == [(2, 1)]


def test_no_keepalive_while_waiting_for_the_client():
    # An incomplete window whose received events are all acked: the client is the one
    # sending, the server owes nothing (and the Node v1 client would take ACK 0 as a reset).
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(lj.encode_window(10) + lj.encode_json(1, {}))
    router.fire(0)
    assert conn.acks() == [(2, 1)]
    clock.advance(30)
    assert conn.acks() == []


def test_waiting_for_acks_is_not_idleness():
    source, router, clock = make_source(idle_timeout_secs=10)
    conn = Conn(source)
    conn.send(window(docs(1)))
    clock.pump([1] * 25)  # storage is slow: the client waits, silent, past two idle periods
    assert not conn.transport.disconnecting
    router.fire(0)  # t=25: the ack goes out and the client's turn begins
    clock.advance(9.9)
    assert not conn.transport.disconnecting
    clock.advance(0.1)
    assert conn.transport.disconnecting  # silent for idle_timeout_secs with nothing owed


# -- closing -------------------------------------------------------------------------------


def test_bad_input_closes_the_connection_with_a_line_naming_the_peer(log_lines):
    source, router, clock = make_source(max_window_size=100)
    conn = Conn(source)
    other = Conn(source, port=40001)
    conn.send(lj.encode_window(101))
    assert conn.transport.disconnecting and not other.transport.disconnecting
    assert source.decode_errors == 1
    assert any(
        "lumberjack 192.0.2.7:40000: window size 101 exceeds max_window_size 100; closing connection" in l
        for l in log_lines
    )
    other.send(window(docs(1)))
    router.fire(0)
    assert other.acks() == [(2, 1)]


def test_stored_batches_after_a_close_send_nothing():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(window(docs(1)))
    conn.protocol.connectionLost(None)
    assert conn.protocol.acks.keepalive_call is None
    router.fire(0)
    clock.advance(30)
    assert conn.transport.value() == b""
    assert clock.getDelayedCalls() == []


def test_a_batch_that_cannot_be_stored_aborts_the_connection(log_lines):
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(window(docs(1)) + window(docs(1)))
    router.calls[0].deferred.errback(OSError("disk full"))
    assert conn.transport.disconnected  # abortConnection: the client re-sends what was not acked
    assert any("batch could not be stored; closing the connection" in l and "disk full" in l for l in log_lines)
    router.fire(1)
    clock.advance(30)
    assert conn.transport.value() == b""


def test_graceful_stop_lets_stored_windows_get_their_acks():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(window(docs(2)))
    stopped: list = []
    source.stop().addCallback(stopped.append)
    conn.send(window(docs(1, 2)))  # sent before the stop reached the client: still read and stored
    clock.advance(source.options["stop_quiet_secs"])  # quiet: reading stops, the acks are awaited
    assert not stopped and conn.transport.producerState == "paused"
    router.fire_all()
    assert stopped == [None]
    assert conn.acks() == [(2, 2), (2, 1)]
    assert conn.transport.disconnecting


def test_frames_before_bad_input_are_stored_and_acked_before_the_close(log_lines):
    # The read that brought the bad frame also brought good ones: the decoder hands them
    # over with its error, and they are stored and acknowledged before the close, so
    # Beats does not send them again.
    source, router, clock = make_source()
    conn = Conn(source)
    frames = [lj.encode_json(i + 1, d) for i, d in enumerate(docs(3))]
    conn.send(lj.encode_window(3) + frames[0] + frames[1][:5])
    conn.send(frames[1][5:] + frames[2] + b"2Z\x00\x00\x00\x00")
    assert [b.events for b in router.batches] == [[(NOW_NS, d) for d in docs(1)], [(NOW_NS, d) for d in docs(2, 1)]]
    assert source.decode_errors == 1 and not conn.transport.disconnecting
    router.fire_all()
    assert conn.acks() == [(2, 1), (2, 3)]
    assert conn.transport.disconnecting
    assert any("lumberjack 192.0.2.7:40000: unknown frame type 0x5a ('Z'); closing connection" in l for l in log_lines)


def test_a_bad_compressed_frame_stores_none_of_its_events():
    source, router, clock = make_source()
    conn = Conn(source)
    bad = lj.encode_compressed(lj.encode_json(2, {"in": "c"}) + b"2J\x00")
    conn.send(lj.encode_window(2) + lj.encode_json(1, {"before": "c"}) + bad)
    assert [b.events for b in router.batches] == [[(NOW_NS, {"before": "c"})]]
    router.fire_all()
    assert conn.acks() == [(2, 1)]  # Beats resends event 2 on its next connection
    assert conn.transport.disconnecting


def test_event_limits_close_the_connection_with_a_line_naming_them(log_lines):
    source, router, clock = make_source(max_event_bytes=100, max_data_fields=3)
    conn = Conn(source)
    conn.send(lj.encode_window(1, version=1) + b"1D" + struct.pack(">II", 1, 4))
    assert conn.transport.disconnecting and source.decode_errors == 1
    assert any("data frame with 4 fields exceeds max_data_fields 3; closing connection" in l for l in log_lines)
    conn = Conn(source, port=40001)
    conn.send(window([{"x": "y" * 100}]))
    assert conn.transport.disconnecting and source.decode_errors == 2
    assert any("40001: JSON frame of 108 bytes exceeds max_event_bytes 100; closing connection" in l for l in log_lines)
    assert router.calls == []


# -- records, times, tags ------------------------------------------------------------------


def test_event_time_from_timestamp_else_now():
    source, router, clock = make_source()
    conn = Conn(source)
    records = [
        {"@timestamp": "2024-01-02T03:04:05.678Z", "n": 0},
        {"@timestamp": "2024-01-02T03:04:05Z", "n": 1},
        {"@timestamp": "2024-01-02T04:04:05.123456789+01:00", "n": 2},
        {"@timestamp": "yesterday", "n": 3},
        {"@timestamp": 1704164645, "n": 4},
        {"n": 5},
        {"@timestamp": "2024-01-02T03:04:05.123456789Z", "n": 6},
    ]
    conn.send(window(records))
    (batch,) = router.batches
    base = 1704164645 * 1_000_000_000
    assert [t for t, _ in batch.events] == [
        base + 678_000_000,
        base,
        base + 123_456_000,  # via datetime: microseconds
        NOW_NS,
        NOW_NS,
        NOW_NS,
        base + 123_456_789,
    ]
    assert [r for _, r in batch.events] == records  # fields intact, @timestamp kept


def test_timestamp_parsing():
    base = 1704164645 * 1_000_000_000
    assert timestamp_ns("2024-01-02T03:04:05.678Z") == base + 678_000_000
    assert timestamp_ns("2024-01-02t03:04:05.6z") == base + 600_000_000
    assert timestamp_ns("2024-01-02T03:04:05.1234567891Z") == base + 123_456_789
    assert timestamp_ns("2024-01-02T03:04:05-00:30") == base + 1800 * 1_000_000_000
    assert timestamp_ns("2024-01-02T03:04:05") == base  # no offset: UTC
    assert timestamp_ns("1970-01-01T00:00:00Z") == 0
    for bad in ("", "Z", "2024-13-02T03:04:05Z", "2024-01-02T03:04:05.Z", "2024-01-02T03:04:05.1a2Z", "2024-01-02T03:04:05+0100Z", "x" * 30):
        assert timestamp_ns(bad) is None, bad


def test_tag_template_from_event_fields():
    source, router, clock = make_source(tag="beats.${@metadata.beat:-unknown}.${host.name}")
    conn = Conn(source)
    records = [
        {"@metadata": {"beat": "filebeat"}, "host": {"name": "web1"}, "i": 0},
        {"@metadata": {"beat": "metricbeat"}, "host": {"name": "web1"}, "i": 1},
        {"@metadata": {"beat": "filebeat"}, "host": {"name": "web1"}, "i": 2},
        {"host": {"name": "db"}, "i": 3},
    ]
    conn.send(window(records))
    assert {b.tag: [r["i"] for _, r in b.events] for b in router.batches} == {
        "beats.filebeat.web1": [0, 2],
        "beats.metricbeat.web1": [1],
        "beats.unknown.db": [3],
    }
    # One window in three batches: the ack waits for all of them.
    router.fire(0)
    router.fire(2)
    assert conn.acks() == []
    router.fire(1)
    assert conn.acks() == [(2, 4)]


def test_tag_template_rendering():
    t = TagTemplate("a.${x}.${y.z:-d}.$plain.${n}.${b}")
    assert t.render({"x": "X", "y": {"z": "Z"}, "n": 5, "b": True}) == "a.X.Z.$plain.5.true"
    assert t.render({}) == "a..d.$plain.."
    assert t.render({"x": {"nested": 1}, "y": {"z": None}}) == "a..d.$plain.."
    assert TagTemplate("${log.level}").render({"log.level": "warn", "log": {"level": "info"}}) == "warn"
    assert TagTemplate("${log.level}").render({"log": {"level": "info"}}) == "info"
    assert TagTemplate("static").static == "static"
    for bad in ("${}", "${a..b}", "x.${a", "${.a}"):
        with pytest.raises(ValueError):
            TagTemplate(bad)


def test_metadata_kept_or_dropped():
    record = {"@metadata": {"beat": "filebeat"}, "message": "hi"}
    source, router, clock = make_source()
    Conn(source).send(window([dict(record)]))
    assert router.batches[0].events[0][1] == record
    source, router, clock = make_source(keep_metadata=False, tag="b.${@metadata.beat}")
    Conn(source).send(window([dict(record)]))
    batch = router.batches[0]
    assert batch.tag == "b.filebeat" and batch.events[0][1] == {"message": "hi"}


# -- configuration -------------------------------------------------------------------------

SINK = '\n[sinks.s]\ntype = "parquet"\ninputs = ["beats"]\npath = "lake"\n'


def config_errors(body: str) -> list[str]:
    try:
        load_string('[sources.beats]\ntype = "lumberjack"\n' + body + SINK)
    except ConfigError as e:
        return e.errors
    return []


def test_config_defaults_and_checks(tmp_path):
    config = load_string('[sources.beats]\ntype = "lumberjack"\n' + SINK)
    options = config.sources["beats"].options
    assert options["listen"] == "tcp:5044" and options["keepalive_secs"] == 5
    assert options["max_window_size"] == 10_000 and options["tag"] == "beats"
    assert options["max_event_bytes"] == 16 << 20 and options["max_data_fields"] == 1024
    assert config_errors("max_data_fields = 0") == ["sources.beats.max_data_fields: must be greater than 0, got 0"]
    assert options["ssl_client_authentication"] == "none" and options["keep_metadata"] is True
    assert config_errors('tag = "x.${a"') == ["sources.beats.tag: unterminated '${' in tag 'x.${a'"]
    assert config_errors("max_window_size = 0") == ["sources.beats.max_window_size: must be greater than 0, got 0"]
    assert config_errors('ssl_client_authentication = "maybe"')[0].startswith(
        "sources.beats.ssl_client_authentication: must be one of 'none', 'optional', 'required'"
    )
    missing = tmp_path / "missing.pem"
    assert config_errors(f'ca_file = "{missing}"') == [f"sources.beats.ca_file: cannot read '{missing}': No such file or directory"]
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("hello")
    assert "holds no PEM certificate" in config_errors(f'ca_file = "{not_pem}"')[0]


def test_config_client_authentication_needs_an_ssl_listener_and_a_ca(tmp_path):
    pki = make_pki(tmp_path)
    listen = pki.ssl_endpoint()
    assert config_errors(f'ssl_client_authentication = "optional"\nca_file = "{pki.ca}"\nlisten = "tcp:0"') == [
        "sources.beats.ssl_client_authentication: 'optional' needs an ssl: listen endpoint, got 'tcp:0'"
    ]
    assert config_errors(f'ssl_client_authentication = "required"\nlisten = "{listen}"') == [
        "sources.beats.ca_file: required when ssl_client_authentication is 'required'"
    ]
    assert config_errors(f'ca_file = "{pki.ca}"\nlisten = "{listen}"') == [
        "sources.beats.ca_file: only used with ssl_client_authentication 'optional' or 'required'; set it or remove ca_file"
    ]
    for mode in ("optional", "required"):
        assert config_errors(f'ssl_client_authentication = "{mode}"\nca_file = "{pki.ca}"\nlisten = "{listen}"') == []


def test_source_registered_and_module_documented():
    from logrouter import registry

    registry.load_builtin()
    assert registry.SOURCES["lumberjack"] is LumberjackSource
    assert source_module.__doc__ and "keepalive_secs" in source_module.__doc__


def test_ack_0_while_backpressure_holds_a_v2_window_half_read():
    # The router paused reading (spool full): the client is mid-window and waits for an
    # ack we cannot give yet. ACK 0 keeps Beats from timing out and resending.
    source, router, clock = make_source()
    conn = Conn(source)
    frames = [lj.encode_json(i + 1, d) for i, d in enumerate(docs(3))]
    conn.send(lj.encode_window(3) + frames[0])
    router.fire(0)
    assert conn.acks() == [(2, 1)]
    source.pause_reading()
    for _ in range(3):
        clock.advance(5)
        assert conn.acks() == [(2, 0)]
    clock.advance(400)  # paused on our side: the idle timeout does not close the connection
    assert conn.transport.connected
    conn.acks()
    source.resume_reading()
    conn.send(frames[1] + frames[2])
    router.fire(1)
    assert conn.acks() == [(2, 3)]
    clock.advance(60)
    assert conn.acks() == []


def test_no_ack_0_while_paused_between_windows():
    source, router, clock = make_source()
    conn = Conn(source)
    conn.send(window(docs(2)))
    router.fire(0)
    assert conn.acks() == [(2, 2)]
    source.pause_reading()
    clock.advance(30)
    assert conn.acks() == []

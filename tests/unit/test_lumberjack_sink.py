"""The lumberjack sink on ``task.Clock`` and ``StringTransport``: what goes on the wire (read
back with our own decoder), which acks move the cursor, timeouts, protocol errors, failover
and resends through the router's rewind, draining on stop, and config validation."""

from __future__ import annotations

import base64
import json
import math
import zlib
from typing import Any

import pytest
from twisted.internet import defer, error, task
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python.failure import Failure

from fixtures.pki import make_pki
from logrouter.tls import client_tls_options
from logrouter.batch import Batch
from logrouter.config.load import ConfigError, load_string
from logrouter.sinks.lumberjack import LumberjackSink, parse_host
from logrouter.sinks.lumberjack_json import event_json, rfc3339
from logrouter.sinks.state import SinkState
from logrouter.wire import lumberjack as lj

T0 = 1_700_000_000  # 2023-11-14T22:13:20Z
NS = 1_000_000_000


# -- a fake network ------------------------------------------------------------------------


class Attempt:
    """One connection attempt of the sink; the test decides how it ends."""

    def __init__(self, host: str, port: int, factory: Any) -> None:
        self.host, self.port, self.factory = host, port, factory
        self.d: defer.Deferred = defer.Deferred()
        self.client: Any = None
        self.transport: StringTransport | None = None

    def accept(self) -> "Attempt":
        self.client = self.factory.buildProtocol(IPv4Address("TCP", "192.0.2.1", self.port))
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "192.0.2.1", self.port))
        self.client.makeConnection(self.transport)
        self.d.callback(self.client)
        return self

    def refuse(self) -> None:
        self.d.errback(error.ConnectionRefusedError("refused"))

    def sent(self) -> bytes:
        assert self.transport is not None
        data = self.transport.value()
        self.transport.clear()
        return data

    def windows(self) -> list[list[tuple[int, dict]]]:
        """The windows written since the last call: per window its (seq, event) pairs."""
        return parse_windows(self.sent())

    def ack(self, value: int) -> None:
        self.client.dataReceived(lj.encode_ack(value))

    def lose(self) -> None:
        self.client.connectionLost(Failure(error.ConnectionDone("closed by the server")))

    @property
    def aborted(self) -> bool:
        return bool(self.transport is not None and self.transport.disconnecting)


class Network:
    def __init__(self) -> None:
        self.attempts: list[Attempt] = []

    def __call__(self, host: str, port: int) -> Any:
        network = self

        class Endpoint:
            def connect(self, factory: Any) -> defer.Deferred:
                attempt = Attempt(host, port, factory)
                network.attempts.append(attempt)
                return attempt.d

        return Endpoint()

    @property
    def last(self) -> Attempt:
        return self.attempts[-1]


def parse_windows(data: bytes) -> list[list[tuple[int, dict]]]:
    """Split a client stream into windows by hand (W, then one C or N plain J frames),
    checking the sequence numbers the decoder does not expose."""
    windows = []
    pos = 0
    while pos < len(data):
        assert data[pos : pos + 2] == b"2W", data[pos : pos + 8]
        count = int.from_bytes(data[pos + 2 : pos + 6], "big")
        pos += 6
        if data[pos : pos + 2] == b"2C":
            size = int.from_bytes(data[pos + 2 : pos + 6], "big")
            inner = zlib.decompress(data[pos + 6 : pos + 6 + size])
            pos += 6 + size
            frames, used = _j_frames(inner, 0, count)
            assert used == len(inner)
        else:
            frames, pos = _j_frames(data, pos, count)
        windows.append(frames)
    return windows


def _j_frames(data: bytes, pos: int, count: int) -> tuple[list[tuple[int, dict]], int]:
    frames = []
    for _ in range(count):
        assert data[pos : pos + 2] == b"2J"
        seq = int.from_bytes(data[pos + 2 : pos + 6], "big")
        size = int.from_bytes(data[pos + 6 : pos + 10], "big")
        frames.append((seq, json.loads(data[pos + 10 : pos + 10 + size])))
        pos += 10 + size
    return frames, pos


# -- a fake router -------------------------------------------------------------------------


class Harness:
    """The sink with the router's side of the contract: records fed in order, replayed
    from the cursor on rewind."""

    def __init__(self, tmp_path: Any = None, **overrides: Any) -> None:
        options = {k: o.default for k, o in LumberjackSink.OPTIONS.items() if not o.required}
        options.update(hosts=["a:5044"], retry_initial_secs=1.0, retry_max_secs=8.0)
        options.update(overrides)
        self.clock = task.Clock()
        self.clock.advance(T0)
        self.network = Network()
        self.sink = LumberjackSink("out", options, errors=lambda *a: None, reactor=self.clock)
        self.sink.run_blocking = lambda f, *a, **k: defer.maybeDeferred(f, *a, **k)
        self.sink.endpoint_for = self.network
        if tmp_path is not None:
            self.sink.state = SinkState(str(tmp_path / "sinks" / "out.json"))
        self.progress: list[int] = []
        self.rewinds = 0
        self.sink.on_progress = lambda: self.progress.append(self.sink.cursor)
        self.sink.on_rewind = self.rewind
        self.records: list[tuple[int, int, list[Batch]]] = []
        self.end = 0
        self.next_id = 0
        assert self.sink.start().result == self.sink.cursor
        self.sink.advance(self.sink.cursor)

    def record(self, *counts: int, tag: str = "app.web", size: int = 100) -> int:
        """Append a spool record of batches with ``counts`` events each, feed it, return its end."""
        batches = []
        for count in counts:
            events = []
            for _ in range(count):
                events.append(((T0 + self.next_id) * NS + 250_000_000, {"id": self.next_id, "msg": f"event {self.next_id}"}))
                self.next_id += 1
            batches.append(Batch(tag, events, "src"))
        position, self.end = self.end, self.end + size
        self.records.append((position, self.end, batches))
        self._feed(position, self.end, batches)
        return self.end

    def _feed(self, position: int, end: int, batches: list[Batch]) -> None:
        for batch in batches:
            self.sink.write(batch, position, end - position)
        self.sink.advance(end)

    def rewind(self) -> None:
        self.rewinds += 1
        self.sink.advance(self.sink.cursor)
        for position, end, batches in self.records:
            if position >= self.sink.cursor:
                self._feed(position, end, batches)

    def connect(self) -> Attempt:
        """Let the sink connect (it does so on the next reactor turn) and accept."""
        self.clock.advance(0)
        return self.network.last.accept()


def ids(window: list[tuple[int, dict]]) -> list[int]:
    return [event["id"] for _, event in window]


@pytest.fixture
def log_lines():
    lines: list[str] = []

    def observe(event: dict) -> None:
        lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


# -- framing -------------------------------------------------------------------------------


def test_window_is_w_then_one_compressed_frame_that_our_decoder_reads():
    h = Harness()
    h.record(3)
    h.record(2, tag="app.db")
    assert h.network.attempts == []  # connecting waits for the next reactor turn
    conn = h.connect()
    assert (conn.host, conn.port) == ("a", 5044)
    data = conn.sent()
    assert data[:6] == lj.encode_window(5) and data[6:8] == b"2C"  # W 5, then one C frame
    decoded = lj.LumberjackDecoder().feed(data)
    assert decoded[0] == lj.Window(version=2, size=5, window=1)
    events = decoded[1]
    assert events.complete and events.ack_seq == 5 and events.invalid == 0
    assert [r["id"] for r in events.records] == [0, 1, 2, 3, 4]
    assert events.records[0] == {
        "@timestamp": "2023-11-14T22:13:20.250Z",
        "@metadata": {"tag": "app.web"},
        "id": 0,
        "msg": "event 0",
    }
    assert events.records[3]["@metadata"] == {"tag": "app.db"}
    assert [seq for seq, _ in parse_windows(data)[0]] == [1, 2, 3, 4, 5]


def test_compression_level_0_sends_plain_json_frames():
    h = Harness(compression_level=0)
    h.record(3)
    data = h.connect().sent()
    assert data[6:8] == b"2J"
    (window,) = parse_windows(data)
    assert [seq for seq, _ in window] == [1, 2, 3]
    assert [r["id"] for r in lj.LumberjackDecoder().feed(data)[1].records] == [0, 1, 2]


def test_windows_split_at_window_size_and_sequence_numbers_restart():
    h = Harness(window_size=3, pipelining=1)
    h.record(7)
    conn = h.connect()
    windows = conn.windows()
    assert [[seq for seq, _ in w] for w in windows] == [[1, 2, 3]]
    conn.ack(3)
    (window,) = conn.windows()
    assert [seq for seq, _ in window] == [1, 2, 3] and ids(window) == [3, 4, 5]
    conn.ack(3)
    (window,) = conn.windows()
    assert [seq for seq, _ in window] == [1] and ids(window) == [6]
    conn.ack(1)
    assert h.sink.cursor == h.end and h.sink.queued_bytes == 0


def test_pipelining_bounds_the_windows_in_flight():
    h = Harness(window_size=2, pipelining=2)
    h.record(7)
    conn = h.connect()
    assert [ids(w) for w in conn.windows()] == [[0, 1], [2, 3]]
    conn.ack(1)  # partial: no room yet
    assert conn.windows() == []
    conn.ack(2)
    assert [ids(w) for w in conn.windows()] == [[4, 5]]
    conn.ack(2)  # the second window
    assert [ids(w) for w in conn.windows()] == [[6]]
    conn.ack(2)
    conn.ack(1)
    assert h.sink.cursor == h.end


def test_windows_are_written_in_order_when_encoded_out_of_order():
    h = Harness(window_size=100, pipelining=3)
    pending: list[tuple[defer.Deferred, Any, tuple]] = []

    def run_blocking(f: Any, *args: Any) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        pending.append((d, f, args))
        return d

    h.sink.run_blocking = run_blocking
    h.record(300)
    conn = h.connect()
    assert len(pending) == 3 and conn.sent() == b""
    for index in (2, 1):  # the later windows finish first: nothing may be written yet
        d, f, args = pending[index]
        d.callback(f(*args))
    assert conn.sent() == b""
    d, f, args = pending[0]
    d.callback(f(*args))
    assert [ids(w)[0] for w in conn.windows()] == [0, 100, 200]


# -- acks and the cursor -------------------------------------------------------------------


def test_cursor_moves_only_past_records_whose_events_are_all_acked():
    h = Harness()
    first = h.record(3, size=100)
    second = h.record(2, size=50)
    conn = h.connect()
    assert h.sink.queued_bytes == 150
    conn.sent()
    assert h.sink.cursor == 0
    conn.ack(0)  # keepalive: no progress
    assert h.sink.cursor == 0 and h.progress == []
    conn.ack(2)  # partial: the first record still has an unacked event
    assert h.sink.cursor == 0
    conn.ack(3)
    assert h.sink.cursor == first and h.sink.queued_bytes == 50 and h.progress == [first]
    conn.ack(5)
    assert h.sink.cursor == second and h.sink.queued_bytes == 0 and h.progress[-1] == second
    assert (h.sink.partial_acks, h.sink.events_acked, h.sink.keepalives) == (2, 5, 1)


def test_record_with_nothing_for_this_sink_moves_the_cursor_and_is_reported_by_the_ticker():
    h = Harness()
    h.sink.advance(100)  # a spool record whose batches all went elsewhere
    assert h.sink.cursor == 100 and h.progress == []
    h.clock.advance(1)
    assert h.progress == [100]
    assert h.network.attempts == []  # nothing to send, no connection


def test_record_behind_unacked_events_waits_for_them():
    h = Harness()
    h.record(2)
    h.sink.advance(h.end + 10)  # nothing for this sink, but behind unacked events
    conn = h.connect()
    conn.sent()
    assert h.sink.cursor == 0
    conn.ack(2)
    assert h.sink.cursor == h.end + 10


# -- timeouts, protocol errors, failover -----------------------------------------------------


def test_keepalive_acks_rearm_the_timeout_and_silence_reconnects_and_resends(log_lines):
    h = Harness(timeout_secs=30)
    h.record(4)
    conn = h.connect()
    first = conn.windows()
    for _ in range(3):
        h.clock.advance(29)
        conn.ack(0)  # "still working"
    h.clock.advance(29)
    conn.ack(1)  # a partial ack re-arms it too
    h.clock.advance(29.9)
    assert not conn.aborted and not h.sink.failing
    h.clock.advance(0.1)
    assert conn.aborted and h.sink.failing and h.sink.failures == 1
    assert any("no ACK from a:5044 within timeout_secs (30s); 1 window(s) not acknowledged" in l for l in log_lines)
    h.clock.advance(1)  # retry_initial_secs: reset, rewind
    assert h.rewinds == 1
    again = h.connect()
    assert again is not conn
    assert again.windows() == first  # the same events, the same numbering
    again.ack(4)
    assert h.sink.cursor == h.end and not h.sink.failing


def test_ack_larger_than_the_window_is_a_protocol_error(log_lines):
    h = Harness()
    h.record(3)
    conn = h.connect()
    conn.sent()
    conn.ack(4)
    assert conn.aborted and h.sink.failing and h.sink.cursor == 0
    assert any("protocol error from a:5044: ACK 4 for a window of 3 event(s)" in l for l in log_lines)
    h.clock.advance(1)
    again = h.connect()
    assert [ids(w) for w in again.windows()] == [[0, 1, 2]]


def test_ack_without_a_window_and_other_frames_are_protocol_errors(log_lines):
    h = Harness()
    h.record(1)
    conn = h.connect()
    conn.sent()
    conn.ack(1)
    conn.ack(0)  # a keepalive between windows is fine
    assert not h.sink.failing
    conn.ack(1)
    assert h.sink.failing and conn.aborted
    assert any("ACK 1 with no window in flight" in l for l in log_lines)

    for garbage, reason in ((b"2W\x00\x00\x00\x01", "expected an ACK frame"), (b"1A\x00\x00\x00\x01", "a v1 ACK")):
        h2 = Harness()
        h2.record(1)
        conn = h2.connect()
        conn.client.dataReceived(garbage)
        assert h2.sink.failing and conn.aborted
        assert any(reason in l for l in log_lines)


def test_lost_connection_resends_from_the_cursor_to_the_next_host(log_lines):
    h = Harness(hosts=["a:1", "[::1]:2"], window_size=10)
    h.record(3)
    h.record(3)
    conn = h.connect()
    conn.sent()
    conn.ack(4)  # the first record is done, the second half-acked
    assert h.sink.cursor == 100
    conn.lose()
    assert h.sink.failing
    assert any("connection to a:1 lost with 1 window(s) not acknowledged" in l for l in log_lines)
    h.clock.advance(1)
    again = h.connect()
    assert (again.host, again.port) == ("::1", 2)
    # Resent from the cursor: the whole second record (events 3 and 4 again: at least once).
    assert [ids(w) for w in again.windows()] == [[3, 4, 5]]
    again.ack(3)
    assert h.sink.cursor == h.end


def test_refused_connections_fail_over_round_robin_with_backoff():
    h = Harness(hosts=["a:1", "b:2"], retry_initial_secs=1.0, retry_max_secs=8.0)
    h.record(2)
    h.clock.advance(0)
    h.network.last.refuse()
    assert h.sink.failing and h.sink.queued_bytes == 0
    h.clock.advance(1)
    h.clock.advance(0)
    assert [(a.host, a.port) for a in h.network.attempts] == [("a", 1), ("b", 2)]
    h.network.last.refuse()
    h.clock.advance(1.9)
    assert len(h.network.attempts) == 2  # the backoff doubled
    h.clock.advance(0.1)
    h.clock.advance(0)
    assert (h.network.last.host, h.network.last.port) == ("a", 1)
    conn = h.network.last.accept()
    assert [ids(w) for w in conn.windows()] == [[0, 1]]
    conn.ack(2)
    assert h.sink.cursor == h.end and h.sink._retry_delay == 0  # success resets the backoff


def test_connect_timeout_gives_up_on_the_attempt(log_lines):
    h = Harness(hosts=["a:1", "b:2"], connect_timeout_secs=5)
    h.record(1)
    h.clock.advance(0)
    attempt = h.network.last
    h.clock.advance(5)
    assert h.sink.failing and attempt.d.called  # cancelled
    assert any("cannot connect to a:1: no connection within connect_timeout_secs (5s)" in l for l in log_lines)
    h.clock.advance(1)
    assert (h.connect().host) == "b"


def test_server_closing_an_idle_connection_is_no_failure():
    h = Harness()
    h.record(1)
    conn = h.connect()
    conn.sent()
    conn.ack(1)
    conn.lose()  # e.g. Logstash's client_inactivity_timeout
    assert not h.sink.failing and h.sink.failures == 0
    h.record(1)
    again = h.connect()
    assert [ids(w) for w in again.windows()] == [[1]]


def test_writes_while_failing_are_dropped_and_replayed():
    h = Harness()
    h.record(1)
    conn = h.connect()
    conn.lose()
    h.record(2)  # the router would not feed a failing sink; a late catch-up read might
    assert h.sink.queued_bytes == 0 and h.sink.appended == 0
    h.clock.advance(1)
    assert [ids(w) for w in h.connect().windows()] == [[0, 1, 2]]


# -- stopping and state ----------------------------------------------------------------------


def test_stop_drains_then_saves_the_cursor(tmp_path):
    h = Harness(tmp_path)
    h.record(3)
    conn = h.connect()
    conn.sent()
    stopped = h.sink.stop()
    assert not stopped.called
    conn.ack(3)
    assert stopped.called and conn.transport.disconnecting
    assert SinkState(str(tmp_path / "sinks" / "out.json")).load() == {"cursor": h.end}
    again = Harness(tmp_path)
    assert again.sink.cursor == h.end


def test_stop_gives_up_after_drain_timeout_and_keeps_the_cursor(tmp_path, log_lines):
    h = Harness(tmp_path, drain_timeout_secs=3)
    h.record(1)
    first = h.end
    conn = h.connect()
    conn.ack(1)
    h.record(2)
    conn.sent()
    stopped = h.sink.stop()
    h.clock.advance(2.9)
    assert not stopped.called
    h.clock.advance(0.1)
    assert stopped.called
    assert SinkState(str(tmp_path / "sinks" / "out.json")).load() == {"cursor": first}
    assert any("stopping with 2 event(s) not acknowledged after 3s" in l for l in log_lines)


def test_failure_while_stopping_does_not_retry(tmp_path):
    h = Harness(tmp_path)
    h.record(1)
    conn = h.connect()
    stopped = h.sink.stop()
    conn.lose()
    assert stopped.called and h.rewinds == 0
    h.clock.advance(100)
    assert h.rewinds == 0 and len(h.network.attempts) == 1


def test_cursor_is_saved_at_most_about_once_a_second():
    saves: list[dict] = []

    class State:
        def load(self) -> None:
            return None

        def save(self, state: dict) -> None:
            saves.append(state)

    h = Harness(window_size=1, pipelining=1)
    h.sink.state = State()
    for _ in range(5):
        h.record(1)
    conn = h.connect()
    for _ in range(5):
        conn.ack(1)
    assert h.sink.cursor == h.end and saves == []
    h.clock.advance(1)
    assert saves == [{"cursor": h.end}]
    h.clock.advance(5)
    assert len(saves) == 1  # nothing moved


# -- events as JSON ----------------------------------------------------------------------------


def test_event_json_values_and_fields():
    path = ("@metadata", "tag")
    record = {"b": b"\xff\x00", "nan": math.nan, "inf": -math.inf, "bad": b"a\xffb".decode("utf-8", "surrogateescape"), "ü": "ö"}
    data = json.loads(event_json(record, T0 * NS + 123_456_789, "t.x", path))
    assert data == {
        "@timestamp": "2023-11-14T22:13:20.123456Z",
        "@metadata": {"tag": "t.x"},
        "b": base64.b64encode(b"\xff\x00").decode(),
        "nan": "NaN",
        "inf": "-Infinity",
        "bad": "a\\xffb",
        "ü": "ö",
    }
    # A record that has @timestamp and @metadata keeps them; the tag is merged into a copy.
    own = {"@timestamp": "2020-01-01T00:00:00Z", "@metadata": {"beat": "filebeat"}, "n": 1}
    data = json.loads(event_json(own, T0 * NS, "t", path))
    assert data == {"@timestamp": "2020-01-01T00:00:00Z", "@metadata": {"beat": "filebeat", "tag": "t"}, "n": 1}
    assert own["@metadata"] == {"beat": "filebeat"}  # the shared record is untouched
    assert json.loads(event_json({}, T0 * NS, "t", ())) == {"@timestamp": "2023-11-14T22:13:20.000Z"}
    assert json.loads(event_json({"a": 1}, T0 * NS, "t", ("tag",))) == {"@timestamp": "2023-11-14T22:13:20.000Z", "tag": "t", "a": 1}


def test_rfc3339():
    assert rfc3339(T0 * NS) == "2023-11-14T22:13:20.000Z"
    assert rfc3339(T0 * NS + 5_000_000) == "2023-11-14T22:13:20.005Z"
    assert rfc3339(T0 * NS + 5_000_999) == "2023-11-14T22:13:20.005000Z"  # below µs is cut
    assert rfc3339(-1) == "1969-12-31T23:59:59.999999Z"
    assert rfc3339(10**30) is None


def test_tag_field_off():
    h = Harness(tag_field="")
    h.record(1)
    (window,) = h.connect().windows()
    assert window[0][1] == {"@timestamp": "2023-11-14T22:13:20.250Z", "id": 0, "msg": "event 0"}


# -- config ----------------------------------------------------------------------------------


def config(**sink: Any) -> str:
    body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in sink.items())
    return f'[sources.f]\ntype = "fluent_forward"\n[sinks.out]\ntype = "lumberjack"\ninputs = ["f"]\n{body}'


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_string(text)
    return e.value.errors


def test_parse_host():
    assert parse_host("logstash") == ("logstash", 5044)
    assert parse_host("10.0.0.1:5000") == ("10.0.0.1", 5000)
    assert parse_host("[::1]:6000") == ("::1", 6000)
    assert parse_host("[fe80::1]") == ("fe80::1", 5044)
    for bad in ("", "a:", ":1", "a:0", "a:65536", "::1", "[::1", "[::1]x", "a b:1"):
        with pytest.raises(ValueError):
            parse_host(bad)


def test_config_defaults_and_errors_name_their_keys(tmp_path):
    options = load_string(config(hosts=["a"])).sinks["out"].options
    assert (options["window_size"], options["compression_level"], options["timeout_secs"], options["pipelining"]) == (2048, 3, 30, 2)
    assert options["tag_field"] == "@metadata.tag" and options["tls"] is False
    assert errors_of(config()) == ["sinks.out.hosts: required key is missing"]
    assert errors_of(config(hosts=[])) == ['sinks.out.hosts: must list at least one server, e.g. ["logstash:5044"]']
    assert errors_of(config(hosts=["a:1", "a:x", 7, "a:1"], window_size=0, compression_level=-1, pipelining=0, tag_field="a..b")) == [
        "sinks.out.hosts[1]: port must be a number from 1 to 65535, got 'x' in 'a:x'",
        "sinks.out.hosts[2]: must be 'host:port', got 7",
        "sinks.out.hosts[3]: 'a:1' is already listed as [0]",
        "sinks.out.window_size: must be greater than 0, got 0",
        "sinks.out.compression_level: must be from 0 (off) to 9, got -1",
        "sinks.out.pipelining: must be from 1 to 64, got 0",
        "sinks.out.tag_field: must be a field name or a dotted path like '@metadata.tag' (or \"\" for none), got 'a..b'",
    ]
    pki = make_pki(tmp_path / "pki")
    assert errors_of(config(hosts=["a"], ca_file=str(pki.ca))) == [
        "sinks.out.ca_file: only used with tls = true; set tls = true or remove ca_file"
    ]
    assert errors_of(config(hosts=["a"], tls=True, client_cert=str(pki.client_cert))) == [
        "sinks.out: client_cert, client_key: give both (client certificate) or neither"
    ]
    (problem,) = errors_of(config(hosts=["a"], tls=True, client_cert=str(pki.client_cert), client_key=str(pki.server_key)))
    assert problem.startswith("sinks.out.client_cert: cannot be loaded with client_key:")
    assert errors_of(config(hosts=["a"], tls=True, ca_file=str(tmp_path / "nope.pem")))[0].startswith("sinks.out.ca_file: cannot read")
    load_string(config(hosts=["a"], tls=True, ca_file=str(pki.ca), client_cert=str(pki.client_cert), client_key=str(pki.client_key)))


def test_tls_connection_creators(tmp_path):
    from twisted.internet import ssl

    pki = make_pki(tmp_path / "pki")
    options = {k: o.default for k, o in LumberjackSink.OPTIONS.items() if not o.required}
    options.update(tls=True, ca_file=str(pki.ca), client_cert=str(pki.client_cert), client_key=str(pki.client_key))
    creator = client_tls_options("localhost", options)
    assert hasattr(creator, "clientConnectionForTLS")  # name checked (optionsForClientTLS)
    options["verify_hostname"] = False
    creator = client_tls_options("localhost", options)
    assert isinstance(creator, ssl.CertificateOptions) and creator.verify  # chain still checked


def test_acks_before_undecodable_bytes_still_count(log_lines):
    h = Harness()
    h.record(3)
    conn = h.connect()
    conn.sent()
    conn.client.dataReceived(lj.encode_ack(3) + b"2X")  # an ack, then an unknown frame type
    assert conn.aborted and h.sink.failing
    assert h.sink.cursor == h.end  # the acked window is done: not sent again
    assert any("protocol error from a:5044" in l for l in log_lines)

"""The logjam sink publishing on a real ZeroMQ PUB socket on loopback, read back by a SUB
socket and our own decoder: frames and metadata, templates, compression, numbering,
heartbeats, invalid names, the cursor and its state file, thread encoding order, config
validation and samples. The sink runs on ``task.Clock`` with a synchronous
``run_blocking``; the only waits are ZeroMQ polls, each bounded."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
import zmq
from twisted.internet import defer, task

from logrouter.batch import Batch
from logrouter.config.load import ConfigError, load_string
from logrouter.sinks import logjam as sink_module
from logrouter.sinks.logjam import INLINE_EVENTS, LogjamSink, default_announce
from logrouter.sinks.state import SinkState
from logrouter.wire import logjam as wire

T0 = 1_700_000_000
NS = 1_000_000_000
POLL_MS = 100
MAX_PROBES = 100  # slow-joiner probes: at most 100 heartbeats × 100 ms


def sync(f: Any, *a: Any, **k: Any) -> defer.Deferred:
    return defer.maybeDeferred(f, *a, **k)


class Harness:
    """A started sink on a Clock, a SUB socket subscribed to it, and a fake router's feeding."""

    def __init__(self, tmp_path: Any = None, run_blocking: Any = sync, **overrides: Any) -> None:
        options = {k: o.default for k, o in LogjamSink.OPTIONS.items() if not o.required}
        options.update(bind="tcp://127.0.0.1:*", device_number=7, linger_secs=0.5)
        options.update(overrides)
        self.clock = task.Clock()
        self.clock.advance(T0)
        self.errors: list[tuple[str, str, dict, str]] = []
        self.sink = LogjamSink("out", options, errors=lambda *a: self.errors.append(a), reactor=self.clock)
        self.sink.run_blocking = run_blocking
        if tmp_path is not None:
            self.sink.state = SinkState(str(tmp_path / "sinks" / "out.json"))
        self.progress: list[int] = []
        self.sink.on_progress = lambda: self.progress.append(self.sink.cursor)
        self.context = zmq.Context()
        self.sub: zmq.Socket | None = None
        self.end = 0
        self.next_id = 0
        started = self.sink.start()
        assert started.called, "start must finish with a synchronous run_blocking"
        self.start_cursor = started.result
        self.sink.advance(self.start_cursor)

    def subscribe(self) -> int:
        """Connect a SUB socket and send heartbeats until one arrives (ZeroMQ's slow joiner:
        a SUB misses what is published before its subscription reaches the PUB). Returns
        the sequence number of the last heartbeat, all of whose successors will arrive."""
        self.sub = self.context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(self.sink.bound_endpoint)
        for probe in range(1, MAX_PROBES + 1):
            self.clock.advance(self.sink.options["heartbeat_secs"])
            assert self.sink.heartbeats_sent == probe
            if self.sub.poll(POLL_MS):
                break
        else:
            pytest.fail(f"no heartbeat reached the SUB socket after {MAX_PROBES} probes")
        # A probe that arrived late may have been overtaken by more probes: read up to the last.
        last = 0
        for _ in range(MAX_PROBES + 1):
            message = wire.decode_message(self.sub.recv_multipart())
            assert isinstance(message, wire.Heartbeat)
            last = message.meta.sequence
            if last == self.sink.sequence:
                return last
            assert self.sub.poll(5000), "a heartbeat after the subscription was lost"
        pytest.fail("heartbeats did not end at the sink's sequence")

    def receive(self, count: int) -> list[Any]:
        """The next ``count`` messages, decoded; then nothing more is waiting."""
        assert self.sub is not None
        out = []
        for _ in range(count):
            assert self.sub.poll(5000), f"only {len(out)} of {count} message(s) arrived"
            out.append(wire.decode_message(self.sub.recv_multipart()))
        assert not self.sub.poll(0), "more messages than expected"
        return out

    def raw(self) -> list[bytes]:
        assert self.sub is not None and self.sub.poll(5000)
        return self.sub.recv_multipart()

    def record(self, *batches: list[dict], tag: str = "app.web", size: int = 100, time_ns: int | None = None) -> int:
        """Feed one spool record holding one batch per list of records; returns its end."""
        position, self.end = self.end, self.end + size
        for records in batches:
            events = []
            for rec in records:
                events.append((time_ns if time_ns is not None else (T0 + self.next_id) * NS + 250_000_000, rec))
                self.next_id += 1
            self.sink.write(Batch(tag, events, "src"), position, size)
        self.sink.advance(self.end)
        return self.end

    def close(self) -> None:
        if self.sink.socket is not None:
            d = self.sink.stop()
            assert d.called
        if self.sub is not None:
            self.sub.close(linger=0)
        self.context.term()


@pytest.fixture
def harnesses():
    made: list[Harness] = []

    def make(*args: Any, **kwargs: Any) -> Harness:
        h = Harness(*args, **kwargs)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def meta_record(i: int, **meta: Any) -> dict:
    logjam = {"app": "shop", "env": "production", "topic": "logs.web", "device": 3, "sequence": 100 + i}
    logjam.update(meta)
    return {"action": "Orders#show", "code": 200, "n": i, **{f"logjam_{k}": v for k, v in logjam.items()}}


# -- messages --------------------------------------------------------------------------------


def test_metadata_round_trip_body_leaves_out_the_metadata(harnesses):
    h = harnesses()
    last = h.subscribe()
    records = [meta_record(0), meta_record(1, app="shop-api", env="staging", topic="javascript")]
    originals = json.loads(json.dumps(records))
    h.record(records)
    first, second = h.receive(2)
    assert isinstance(first, wire.LogjamMessage)
    assert (first.app, first.env, first.topic) == ("shop", "production", "logs.web")
    assert first.body == {"action": "Orders#show", "code": 200, "n": 0}
    assert (second.app, second.env, second.topic) == ("shop-api", "staging", "javascript")
    assert second.body == {"action": "Orders#show", "code": 200, "n": 1}
    assert records == originals  # never changed in place
    assert first.meta.device == 7 and first.meta.compression == wire.NONE
    assert [first.meta.sequence, second.meta.sequence] == [last + 1, last + 2]
    assert first.meta.created_ms == T0 * 1000 + 250 and second.meta.created_ms == (T0 + 1) * 1000 + 250
    assert h.sink.messages_sent == 2 and h.sink.invalid_events == 0 and h.errors == []


def test_records_without_metadata_use_the_templates(harnesses):
    h = harnesses(app="${service:-unknown}", env="${stage}", topic="logs.${kind:-app}")
    h.subscribe()
    h.record(
        [
            {"service": "billing", "stage": "prod", "kind": "db", "msg": "a"},
            {"stage": "test", "msg": "b"},
            {"service": "x", "stage": "prod", "logjam_app": "a", "logjam_env": "e", "msg": "c"},  # no topic: templates
            {"service": "y", "stage": "prod", "logjam_app": 1, "logjam_env": "e", "logjam_topic": "t", "msg": "d"},
        ]
    )
    messages = h.receive(4)
    assert [(m.app, m.env, m.topic) for m in messages] == [
        ("billing", "prod", "logs.db"),
        ("unknown", "test", "logs.app"),
        ("x", "prod", "logs.app"),
        ("y", "prod", "logs.app"),
    ]
    assert messages[0].body == {"service": "billing", "stage": "prod", "kind": "db", "msg": "a"}
    assert messages[2].body == {"service": "x", "stage": "prod", "msg": "c"}  # the fields are left out either way


def test_default_templates_and_no_metadata_prefix(harnesses):
    h = harnesses(metadata_prefix="")
    h.subscribe()
    h.record([meta_record(0)])
    (m,) = h.receive(1)
    assert (m.app, m.env, m.topic) == ("logrouter", "production", "logs")
    assert m.body["logjam_app"] == "shop"  # "" = no metadata fields: the record is the body


def test_values_json_has_no_form_for_are_spelled_as_in_the_lake(harnesses):
    h = harnesses()
    h.subscribe()
    h.record([{"raw": b"\x00\xff", "nan": float("nan"), "text": "grüße", "big": 2**70}])
    (m,) = h.receive(1)
    assert m.body == {"raw": "AP8=", "nan": "NaN", "text": "grüße", "big": 2**70}


@pytest.mark.parametrize("name", ["none", "zlib", "snappy", "lz4"])
def test_each_compression_decodes(harnesses, name):
    h = harnesses(compression=name)
    h.subscribe()
    h.record([meta_record(i) for i in range(3)])
    messages = h.receive(3)
    number = {v: k for k, v in wire.COMPRESSION_NAMES.items()}[name]
    assert [m.meta.compression for m in messages] == [number] * 3
    assert [m.body["n"] for m in messages] == [0, 1, 2]


def test_created_ms_of_times_before_the_epoch_is_0(harnesses):
    h = harnesses()
    h.subscribe()
    h.record([{"a": 1}], time_ns=-5 * NS)
    h.record([{"a": 2}], time_ns=1_999_999)
    assert [m.meta.created_ms for m in h.receive(2)] == [0, 1]


# -- numbering and heartbeats ----------------------------------------------------------------


def test_sequence_starts_at_1_and_counts_heartbeats(harnesses):
    h = harnesses()
    last = h.subscribe()  # the heartbeats sent until one arrived were numbered 1..last
    assert last == h.sink.heartbeats_sent
    h.record([{"a": 1}, {"a": 2}])
    h.clock.advance(5)  # a heartbeat between data messages
    h.record([{"a": 3}])
    messages = h.receive(4)
    assert [type(m).__name__ for m in messages] == ["LogjamMessage", "LogjamMessage", "Heartbeat", "LogjamMessage"]
    assert [m.meta.sequence for m in messages] == [last + 1, last + 2, last + 3, last + 4]
    assert h.sink.sequence == last + 4


def test_sequence_restarts_at_1_after_a_restart(harnesses, tmp_path):
    h = harnesses(tmp_path)
    h.subscribe()
    h.record([{"a": 1}])
    assert h.sink.stop().called
    again = harnesses(tmp_path)
    assert again.sink.sequence == 0
    last = again.subscribe()
    assert last == again.sink.heartbeats_sent  # numbered from 1 again


def test_sequence_wraps_past_0_to_1(harnesses):
    h = harnesses()
    h.sink.sequence = 2**64 - 1
    assert h.sink._next_sequence() == 1


def test_heartbeat_frames_and_default_announce(harnesses):
    h = harnesses(heartbeat_secs=2)
    h.subscribe()
    port = h.sink.bound_endpoint.rpartition(":")[2]
    assert h.sink.bound_endpoint == f"tcp://127.0.0.1:{port}"
    assert h.sink.announce == f"tcp://{socket.getfqdn()}:{port}"
    h.clock.advance(1.5)
    assert not h.sub.poll(POLL_MS)  # not due yet
    h.clock.advance(0.5)
    frames = h.raw()
    assert frames[0] == b"heartbeat" and frames[1] == h.sink.announce.encode() and frames[2] == b"{}"
    meta = wire.decode_meta(frames[3])
    assert (meta.device, meta.compression, meta.sequence) == (7, wire.NONE, h.sink.sequence)
    assert meta.created_ms == int(h.clock.seconds() * 1000)
    assert frames == wire.encode_heartbeat(h.sink.announce, 7, meta.sequence, meta.created_ms)


def test_announce_option_is_sent_as_given(harnesses):
    h = harnesses(announce="tcp://logs.example:9606")
    h.subscribe()
    h.clock.advance(5)
    (hb,) = h.receive(1)
    assert isinstance(hb, wire.Heartbeat) and hb.endpoint == "tcp://logs.example:9606"


def test_default_announce_shapes():
    assert default_announce("tcp://0.0.0.0:9606", "h.example") == "tcp://h.example:9606"
    assert default_announce("tcp://[::1]:9606", "h.example") == "tcp://h.example:9606"
    assert default_announce("tcp://127.0.0.1:9606", "hôte") == "tcp://127.0.0.1:9606"
    assert default_announce("ipc:///tmp/x", "h.example") == "ipc:///tmp/x"


# -- invalid events --------------------------------------------------------------------------


def test_invalid_app_env_or_topic_is_counted_and_the_rest_is_sent(harnesses):
    h = harnesses()
    last = h.subscribe()
    records = [
        meta_record(0),
        meta_record(1, env="prod-eu"),  # '-' in env
        meta_record(2, app=""),
        meta_record(3, env="prödüction"),  # outside 32..127
        meta_record(4, app="a\tb"),
        meta_record(5, topic="lögs"),  # topic not ASCII
        meta_record(6),
    ]
    h.record(records, tag="in.logjam")
    good = h.receive(2)
    assert [m.body["n"] for m in good] == [0, 6]
    assert [m.meta.sequence for m in good] == [last + 1, last + 2]  # invalid events use no number
    assert h.sink.invalid_events == 5 and h.sink.messages_sent == 2
    assert [(c, t, r["n"]) for c, t, r, _ in h.errors] == [("out", "in.logjam", n) for n in (1, 2, 3, 4, 5)]
    reasons = [reason for *_, reason in h.errors]
    assert "contains '-'" in reasons[0] and "app is empty" in reasons[1]
    assert "outside ASCII 32..127" in reasons[2] and "outside ASCII 32..127" in reasons[3]
    assert "topic 'lögs' is not ASCII" in reasons[4]
    assert h.sink.cursor == h.end  # the record is done: invalid events are not retried


def test_template_rendering_a_bad_env_goes_to_the_error_path(harnesses):
    h = harnesses(env="${stage:-prod}")
    h.subscribe()
    h.record([{"stage": "eu-west"}, {"stage": "eu"}])
    (m,) = h.receive(1)
    assert m.env == "eu" and h.sink.invalid_events == 1


# -- cursor, state, threads ------------------------------------------------------------------


def test_cursor_moves_past_records_once_published_and_is_saved(harnesses, tmp_path):
    h = harnesses(tmp_path)
    assert h.start_cursor == 0
    h.record([{"a": 1}], size=100)
    h.record([{"a": 2}, {"a": 3}], size=50)
    assert h.sink.cursor == 150 and h.sink.queued_bytes == 0
    assert h.progress == []  # not while the router hands over
    h.clock.advance(1)  # the ticker reports and saves
    assert h.progress == [150]
    state = json.loads((tmp_path / "sinks" / "out.json").read_text())
    assert state == {"cursor": 150}
    h.record([{"a": 4}], size=10)
    assert h.sink.stop().called  # saves on stop
    assert json.loads((tmp_path / "sinks" / "out.json").read_text()) == {"cursor": 160}
    again = harnesses(tmp_path)
    assert again.start_cursor == 160 and again.sink.cursor == 160


def test_records_with_nothing_for_the_sink_move_the_cursor(harnesses):
    h = harnesses()
    h.sink.advance(40)
    assert h.sink.cursor == 40


class ManualPool:
    """run_blocking that the test completes by hand, in any order."""

    def __init__(self) -> None:
        self.calls: list[tuple[defer.Deferred, Any, tuple]] = []

    def __call__(self, f: Any, *a: Any, **k: Any) -> defer.Deferred:
        if f is not sink_module.prepare:
            return sync(f, *a, **k)  # state file, context term
        d: defer.Deferred = defer.Deferred()
        self.calls.append((d, f, a))
        return d

    def finish(self, i: int) -> None:
        d, f, a = self.calls[i]
        d.callback(f(*a))


def test_big_records_are_encoded_via_run_blocking_and_published_in_order(harnesses):
    pool = ManualPool()
    h = harnesses(run_blocking=pool, compression="lz4")
    last = h.subscribe()
    big1 = [{"r": 1, "i": i} for i in range(INLINE_EVENTS)]
    small = [{"r": 2, "i": 0}]
    big2 = [{"r": 3, "i": i} for i in range(INLINE_EVENTS + 5)]
    h.record(big1, size=1000)
    h.record(small, size=10)  # encoded at once, but waits for the record before it
    h.record(big2, size=2000)
    assert len(pool.calls) == 2
    assert h.sink.cursor == 0 and h.sink.queued_bytes == 3010
    assert not h.sub.poll(POLL_MS)
    pool.finish(1)  # the later big record is ready first: still nothing goes out
    assert h.sink.messages_sent == 0 and h.sink.cursor == 0
    pool.finish(0)
    assert h.sink.cursor == h.end and h.sink.queued_bytes == 0
    assert h.progress == [h.end]  # reported at once: not inside the router's handing over
    messages = h.receive(2 * INLINE_EVENTS + 6)
    assert [(m.body["r"], m.body["i"]) for m in messages] == (
        [(1, i) for i in range(INLINE_EVENTS)] + [(2, 0)] + [(3, i) for i in range(INLINE_EVENTS + 5)]
    )
    assert [m.meta.sequence for m in messages] == list(range(last + 1, last + 1 + len(messages)))


def test_a_heartbeat_while_a_record_is_encoded_takes_the_next_number(harnesses):
    pool = ManualPool()
    h = harnesses(run_blocking=pool)
    last = h.subscribe()
    h.record([{"i": i} for i in range(INLINE_EVENTS)])
    h.clock.advance(5)
    pool.finish(0)
    messages = h.receive(INLINE_EVENTS + 1)
    assert isinstance(messages[0], wire.Heartbeat) and messages[0].meta.sequence == last + 1
    assert [m.meta.sequence for m in messages[1:]] == list(range(last + 2, last + 2 + INLINE_EVENTS))


def test_stop_publishes_records_still_being_encoded(harnesses, tmp_path):
    pool = ManualPool()
    h = harnesses(tmp_path, run_blocking=pool)
    h.subscribe()
    h.record([{"i": i} for i in range(INLINE_EVENTS)], size=500)
    d = h.sink.stop()
    assert not d.called
    pool.finish(0)
    assert d.called and h.sink.socket is None
    assert json.loads((tmp_path / "sinks" / "out.json").read_text()) == {"cursor": 500}
    assert len(h.receive(INLINE_EVENTS)) == INLINE_EVENTS  # flushed before the context ended


def test_a_full_queue_counts_a_dropped_message_and_uses_its_number(harnesses):
    h = harnesses()

    class Full:
        def send_multipart(self, frames: Any, flags: int = 0) -> None:
            raise zmq.Again()

    real, h.sink.socket = h.sink.socket, Full()
    try:
        h.record([{"a": 1}, {"a": 2}])
    finally:
        h.sink.socket = real
    assert h.sink.dropped_messages == 2 and h.sink.messages_sent == 0 and h.sink.sequence == 2
    assert h.sink.cursor == h.end


def test_a_socket_error_fails_the_sink_and_replays_from_the_cursor(harnesses):
    h = harnesses()
    h.record([{"a": 1}], size=10)

    class Broken:
        def send_multipart(self, frames: Any, flags: int = 0) -> None:
            raise zmq.ZMQError(zmq.ENOTSOCK)

    rewinds: list[int] = []
    h.sink.on_rewind = lambda: rewinds.append(h.sink.cursor)
    real, h.sink.socket = h.sink.socket, Broken()
    h.record([{"a": 2}], size=10)
    assert h.sink.failing and h.sink.failures == 1 and h.sink.cursor == 10 and h.sink.queued_bytes == 0
    h.sink.socket = real
    h.clock.advance(1)  # retry_initial_secs
    assert not h.sink.failing and rewinds == [10]


def test_bind_failure_names_the_endpoint(harnesses):
    h = harnesses()
    port = h.sink.bound_endpoint.rpartition(":")[2]
    options = {k: o.default for k, o in LogjamSink.OPTIONS.items() if not o.required}
    options.update(bind=f"tcp://127.0.0.1:{port}", device_number=1)
    other = LogjamSink("dup", options, errors=None, reactor=task.Clock())
    other.run_blocking = sync
    d = other.start()
    failure = d.result
    d.addErrback(lambda _: None)
    assert isinstance(failure.value, sink_module.LogjamSinkError)
    assert f"cannot bind tcp://127.0.0.1:{port}" in str(failure.value)
    assert other.socket is None and other.context is None


def test_samples(harnesses):
    h = harnesses()
    last = h.subscribe()
    h.record([meta_record(0), meta_record(1, env="a-b")], size=30)
    h.receive(1)
    samples = {name: value for name, _, _, value in h.sink.samples()}
    assert samples["logrouter_sink_events_in_total"] == 2
    assert samples["logrouter_sink_messages_sent_total"] == 1
    assert samples["logrouter_sink_heartbeats_sent_total"] == last
    assert samples["logrouter_sink_invalid_events_total"] == 1
    assert samples["logrouter_sink_dropped_messages_total"] == 0
    assert samples["logrouter_sink_logjam_sequence"] == last + 1
    assert samples["logrouter_sink_cursor_bytes"] == 30
    kinds = {name: kind for name, kind, _, _ in h.sink.samples()}
    assert kinds["logrouter_sink_logjam_sequence"] == "gauge"
    assert {labels["type"] for _, _, labels, _ in h.sink.samples()} == {"logjam"}


# -- config ----------------------------------------------------------------------------------


def config(**sink: Any) -> str:
    body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in sink.items())
    return f'[sources.f]\ntype = "fluent_forward"\n[sinks.out]\ntype = "logjam"\ninputs = ["f"]\n{body}'


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_string(text)
    return e.value.errors


def test_config_defaults_and_errors_name_their_keys():
    options = load_string(config(bind="tcp://*:9606", device_number=3)).sinks["out"].options
    assert (options["compression"], options["heartbeat_secs"], options["announce"], options["metadata_prefix"]) == ("none", 5, "", "logjam_")
    assert (options["app"], options["env"], options["topic"]) == ("logrouter", "production", "logs")
    assert (options["send_hwm"], options["linger_secs"]) == (10000, 1.0)
    assert errors_of(config()) == ["sinks.out.bind: required key is missing", "sinks.out.device_number: required key is missing"]
    problems = errors_of(
        config(
            bind="tcp://host",
            device_number=2**32,
            compression="gzip",
            heartbeat_secs=0,
            announce="tcp://*:1",
            app="${",
            env="prod-eu",
            topic="lögs",
            send_hwm=0,
            linger_secs=-1,
        )
    )
    assert problems[0].startswith("sinks.out.bind: bad ZeroMQ endpoint 'tcp://host'")
    assert problems[1:3] == [
        "sinks.out.device_number: must be from 0 to 4294967295, got 4294967296",
        "sinks.out.compression: must be one of 'none', 'zlib', 'snappy', 'lz4', got 'gzip'",
    ]
    assert problems[3] == "sinks.out.heartbeat_secs: must be greater than 0, got 0"
    assert problems[4].startswith("sinks.out.announce: bad ZeroMQ endpoint 'tcp://*:1'")
    assert problems[5].startswith("sinks.out.app: unterminated '${'")
    assert problems[6] == "sinks.out.env: env 'prod-eu' contains '-' (the app-env name is split at its last '-')"
    assert problems[7] == "sinks.out.topic: must be ASCII, got 'lögs'"
    assert problems[8:] == ["sinks.out.send_hwm: must be greater than 0, got 0", "sinks.out.linger_secs: must be 0 or more, got -1"]
    assert errors_of(config(bind="tcp://*:9606", device_number=1, app="")) == ["sinks.out.app: app is empty"]
    load_string(config(bind="ipc:///tmp/logjam.sock", device_number=0, compression="lz4", env="${stage}", announce="tcp://h:9606"))

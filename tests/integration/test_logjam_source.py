"""The logjam source with real ZeroMQ peers (pyzmq) on loopback, a fake router and a clock.

The source's receiver thread is real; what it hands to the reactor goes through
``ThreadClock.callFromThread`` into a queue that the test drains (``run_until``), so the
reactor side runs on the test's thread with an injected clock, deterministically.
"""

from __future__ import annotations

import json
import queue
import time
import zlib
from typing import Any, Callable

import pytest
import zmq
from twisted.internet import task

from logrouter.failures import UnstorableBatch
from logrouter.sources.logjam import LogjamSource
from logrouter.wire import logjam as wire
from source_fakes import T0, FakeRouter, fake_context, log_lines  # noqa: F401 - log_lines is a fixture

pytestmark = pytest.mark.timeout(60)

CTX = zmq.Context.instance()


class ThreadClock(task.Clock):
    """A ``task.Clock`` that also takes ``callFromThread``: the calls wait in a queue until
    the test runs them on its own thread."""

    def __init__(self) -> None:
        super().__init__()
        self.from_threads: "queue.Queue[tuple[Callable, tuple, dict]]" = queue.Queue()

    def callFromThread(self, f: Callable, *args: Any, **kwargs: Any) -> None:
        self.from_threads.put((f, args, kwargs))

    def run_pending(self, wait: float = 0.0) -> bool:
        try:
            f, args, kwargs = self.from_threads.get(timeout=wait) if wait else self.from_threads.get_nowait()
        except queue.Empty:
            return False
        f(*args, **kwargs)
        return True

    def run_until(self, predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            self.run_pending(0.05)


def result_of(clock: ThreadClock, d: Any, what: str = "the Deferred") -> Any:
    out: list = []
    d.addBoth(out.append)
    clock.run_until(lambda: bool(out), what)
    if hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0]


def make(clock: ThreadClock | None = None, router: Any = None, **overrides: Any) -> tuple[LogjamSource, FakeRouter, ThreadClock]:
    options = {key: option.default for key, option in LogjamSource.OPTIONS.items()}
    options.update(overrides)
    clock = clock or ThreadClock()
    if not clock.seconds():
        clock.advance(T0)
    router = router or FakeRouter()
    return LogjamSource("lj", options, fake_context(router, clock)), router, clock


@pytest.fixture
def sockets():
    opened: list[zmq.Socket] = []

    def open_socket(kind: int) -> zmq.Socket:
        s = CTX.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        opened.append(s)
        return s

    yield open_socket
    for s in opened:
        s.close(0)


@pytest.fixture
def started():
    running: list[tuple[LogjamSource, ThreadClock]] = []

    def start(source: LogjamSource, clock: ThreadClock) -> list[str]:
        bound = result_of(clock, source.start(), "the start")
        running.append((source, clock))
        return bound

    yield start
    for source, clock in running:
        if source.receiver is not None:
            source.receiver.stop()
            clock.run_until(lambda: source.receiver._stopped.called, "the receiver thread to end")


def meta(seq: int, device: int = 3, compression: int = wire.NONE, created_ms: int = 1_700_000_000_000) -> wire.Meta:
    return wire.Meta(compression, device, created_ms, seq)


def publisher(sockets) -> tuple[zmq.Socket, str]:
    pub = sockets(zmq.PUB)
    pub.bind("tcp://127.0.0.1:*")
    return pub, pub.getsockopt_string(zmq.LAST_ENDPOINT)


def join(pub: zmq.Socket, source: LogjamSource, clock: ThreadClock, device: int = 99) -> None:
    """Beat the slow-joiner problem: publish heartbeats of a throw-away device until the
    source has heard one, then forget that device."""
    seq = 0

    def heard() -> bool:
        nonlocal seq
        seq += 1
        pub.send_multipart(wire.encode_heartbeat("tcp://probe:1", device, seq, 0))
        clock.run_pending(0.02)
        return source.heartbeats > 0

    clock.run_until(heard, "the SUB socket to join")
    for endpoint in {s.endpoint for s in source.specs}:
        source.tracker.forget(endpoint, device)
    source.heartbeats = 0


def events(router: FakeRouter) -> list[tuple[str, int, dict]]:
    return [(b.tag, t, r) for b in router.batches for t, r in b.events]


# -- SUB: consuming a device -----------------------------------------------------------------


def test_sub_messages_every_compression_become_events(sockets, started) -> None:
    pub, endpoint = publisher(sockets)
    source, router, clock = make(connect=[endpoint])
    started(source, clock)
    join(pub, source, clock)
    for seq, compression in enumerate((wire.NONE, wire.ZLIB_COMPRESSION, wire.SNAPPY, wire.LZ4), start=1):
        body = {"action": f"a#{compression}", "started_ms": 1_700_000_001_000 + seq}
        pub.send_multipart(wire.encode_message("shop-app", "prod", "logs.web", body, meta(seq, compression=compression)))
    clock.run_until(lambda: len(events(router)) == 4, "4 events")
    got = events(router)
    assert [r["action"] for _, _, r in got] == ["a#0", "a#1", "a#2", "a#3"]
    assert {tag for tag, _, _ in got} == {"logjam.shop-app.prod"}
    assert [t for _, t, _ in got] == [(1_700_000_001_000 + s) * 1_000_000 for s in (1, 2, 3, 4)]
    first = got[0][2]
    assert {k: v for k, v in first.items() if k.startswith("logjam_")} == {
        "logjam_app": "shop-app", "logjam_env": "prod", "logjam_topic": "logs.web", "logjam_device": 3, "logjam_sequence": 1
    }
    assert all(b.source == "lj" for b in router.batches)
    assert all(b.json_values for b in router.batches)  # JSON bodies and text metadata: the spool's fast encoder
    assert source.messages == 4


def test_event_time_from_started_at_then_created_ms(sockets, started) -> None:
    pub, endpoint = publisher(sockets)
    source, router, clock = make(connect=[endpoint], tag="${app}/${topic}", metadata_prefix="")
    started(source, clock)
    join(pub, source, clock)
    pub.send_multipart(wire.encode_message("a", "e", "logs", {"started_at": "2024-01-02T03:04:05.5+01:00"}, meta(1)))
    pub.send_multipart(wire.encode_message("a", "e", "events", {"x": 1}, meta(2, created_ms=1_700_000_000_123)))
    pub.send_multipart(wire.encode_message("a", "e", "events", {"started_ms": "soon"}, meta(3, created_ms=0)))
    clock.run_until(lambda: len(events(router)) == 3, "3 events")
    by_topic = {tag: [(t, r) for tg, t, r in events(router) if tg == tag] for tag in ("a/logs", "a/events")}
    assert by_topic["a/logs"][0][0] == 1704161045_500_000_000
    assert by_topic["a/events"][0][0] == 1_700_000_000_123_000_000
    assert by_topic["a/events"][1][0] == int(clock.seconds() * 1e9)  # nothing usable: arrival
    assert not any(k.startswith("logjam_") for k in by_topic["a/logs"][0][1])


def test_gaps_duplicates_and_restarts_are_counted_per_device(sockets, started) -> None:
    pub, endpoint = publisher(sockets)
    source, router, clock = make(connect=[endpoint])
    started(source, clock)
    join(pub, source, clock)
    body = {"n": 0}
    for seq in (1, 2, 5, 6, 6, 5, 7):  # 3-4 lost; 6 and 5 again are duplicates
        pub.send_multipart(wire.encode_message("a", "e", "logs", {**body, "n": seq}, meta(seq)))
    pub.send_multipart(wire.encode_heartbeat("tcp://dev:9606", 3, 8, 0))  # a heartbeat uses a number
    pub.send_multipart(wire.encode_message("a", "e", "logs", {"n": 9}, meta(9)))
    for seq in (1, 2):  # the device restarted
        pub.send_multipart(wire.encode_message("a", "e", "logs", {"n": 100 + seq}, meta(seq)))
    clock.run_until(lambda: source.messages == 10, "10 messages")
    assert [r["n"] for _, _, r in events(router)] == [1, 2, 5, 6, 7, 9, 101, 102]
    samples = {(n, l.get("device")): v for n, _, l, v in source.samples() if "device" in l}
    device = f"{endpoint}#3"
    assert samples[("logrouter_logjam_lost_messages_total", device)] == 2
    assert samples[("logrouter_logjam_duplicates_total", device)] == 2
    assert samples[("logrouter_logjam_restarts_total", device)] == 1
    assert source.duplicates_dropped == 2
    assert source.tracker.stream(endpoint, 3).announced == "tcp://dev:9606"


def test_bad_messages_are_dropped_per_reason_and_the_socket_goes_on(sockets, started, log_lines) -> None:
    pub, endpoint = publisher(sockets)
    source, router, clock = make(connect=[endpoint], max_body_bytes=1000, max_decompressed_bytes=2000)
    started(source, clock)
    join(pub, source, clock)
    good = wire.encode_message("a", "e", "logs", {"ok": 1}, meta(1))
    bad_meta = good[:3] + [b"\x00" * 24]
    bomb = wire.encode_message("a", "e", "logs", zlib.compress(b"{" + b" " * 50_000 + b"}"), meta(2, compression=wire.ZLIB_COMPRESSION))
    bomb[2] = zlib.compress(b'{"x":"' + b"y" * 50_000 + b'"}')
    pub.send_multipart(good[:3])  # 3 frames
    pub.send_multipart(bad_meta)
    pub.send_multipart(good[:2] + [b"{}", wire.encode_meta(wire.Meta(9, 3, 0, 2))])  # compression 9
    pub.send_multipart(good[:2] + [b"x" * 1001, good[3]])  # over max_body_bytes
    pub.send_multipart(bomb)
    pub.send_multipart(good[:2] + [b"[1]", good[3]])  # not an object
    for _ in range(3):
        pub.send_multipart([b"no_dash", b"logs", b"{}", good[3]])
    pub.send_multipart(good)
    clock.run_until(lambda: len(events(router)) == 1, "the good message")
    lines = log_lines
    reasons = {l["reason"]: v for n, _, l, v in source.samples() if n == "logrouter_logjam_dropped_messages_total"}
    assert reasons == {"frames": 1, "meta": 1, "compression": 1, "too_big": 1, "bomb": 1, "body": 1, "stream": 3}
    stream_lines = [line for line in lines if "(stream)" in line]
    assert len(stream_lines) == 1, "repeats within the interval are not logged one by one"


def test_liveness_reconnects_a_silent_endpoint(sockets, started, log_lines) -> None:
    pub, endpoint = publisher(sockets)
    source, router, clock = make(connect=[endpoint], silence_secs=30)
    started(source, clock)
    join(pub, source, clock)
    pub.send_multipart(wire.encode_heartbeat("tcp://dev:9606", 3, 1, 0))
    clock.run_until(lambda: source.heartbeats == 1, "a heartbeat")
    clock.advance(25)
    assert source.reconnects == 0
    clock.advance(10)
    assert source.reconnects == 1
    assert any("reconnecting" in line and "tcp://dev:9606" in line for line in log_lines)
    # The reconnected socket still receives.
    seq = 2

    def heard() -> bool:
        nonlocal seq
        pub.send_multipart(wire.encode_message("a", "e", "logs", {"n": seq}, meta(seq)))
        seq += 1
        clock.run_pending(0.02)
        return bool(router.batches)

    clock.run_until(heard, "a message after the reconnect")


def test_paused_source_reads_nothing_and_resumes(sockets, started) -> None:
    pull_source, router, clock = make(listen_pull="tcp://127.0.0.1:*")
    (endpoint,) = started(pull_source, clock)
    push = sockets(zmq.PUSH)
    push.connect(endpoint)
    pull_source.pause_reading()
    for seq in range(1, 6):
        push.send_multipart(wire.encode_message("a", "e", "logs", {"n": seq}, meta(seq, device=0)))
    assert not clock.run_pending(0.3)
    assert router.batches == []
    pull_source.resume_reading()
    clock.run_until(lambda: len(events(router)) == 5, "5 events after resume")


# -- ROUTER and PULL: the device side --------------------------------------------------------


def dealer(sockets, endpoint: str) -> zmq.Socket:
    d = sockets(zmq.DEALER)
    d.connect(endpoint)
    return d


def reply(d: zmq.Socket, clock: ThreadClock) -> list[bytes]:
    out: list = []

    def got() -> bool:
        if d.poll(20):
            out.append(d.recv_multipart())
        return bool(out)

    clock.run_until(got, "a reply")
    return out[0]


def test_router_replies_202_only_once_durable(sockets, started) -> None:
    source, router, clock = make(listen_router="tcp://127.0.0.1:*")
    (endpoint,) = started(source, clock)
    d = dealer(sockets, endpoint)
    d.send_multipart([b"", *wire.encode_message("shop", "prod", "logs", {"n": 1}, meta(1, device=0))])
    clock.run_until(lambda: len(router.calls) == 1, "the message stored")
    assert not d.poll(200), "no reply before the batch is durable"
    router.fire(0)
    assert reply(d, clock) == [b"shop-prod", b"202 Accepted"]
    assert source.replies_accepted == 1


def test_router_ping_bad_request_async_and_unstorable(sockets, started) -> None:
    source, router, clock = make(listen_router="tcp://127.0.0.1:*", fqdn="lr.example")
    (endpoint,) = started(source, clock)
    d = dealer(sockets, endpoint)
    good = wire.encode_message("shop", "prod", "logs", {"n": 1}, meta(1, device=0))
    d.send_multipart([b"", b"ping", b"shop-prod", b"{}", good[3]])
    assert reply(d, clock) == [b"ping", b"200 OK", b"lr.example"]
    d.send_multipart([b"", b"ping", b"shop-prod", b"{}", b"short"])
    assert reply(d, clock) == [b"ping", b"400 Bad Request"]
    d.send_multipart([b"", b"shop-prod", b"logs", b"{", good[3]])
    assert reply(d, clock) == [b"shop-prod", b"400 Bad Request"]
    d.send_multipart(good)  # no empty frame: no reply owed
    clock.run_until(lambda: len(router.calls) == 1, "the async message stored")
    router.fire(0)
    assert not d.poll(200)
    d.send_multipart([b"", *good])
    clock.run_until(lambda: len(router.calls) == 2, "the request stored")
    router.calls[1].deferred.errback(UnstorableBatch("too big"))
    assert reply(d, clock) == [b"shop-prod", b"400 Bad Request"]
    assert source.pings == 1 and source.replies_bad_request == 3 and source.replies_accepted == 0


def test_pull_takes_four_frame_and_legacy_three_frame_messages(sockets, started) -> None:
    source, router, clock = make(listen_pull="tcp://127.0.0.1:*")
    (endpoint,) = started(source, clock)
    push = sockets(zmq.PUSH)
    push.connect(endpoint)
    push.send_multipart(wire.encode_message("a", "e", "logs", {"n": 1}, meta(1, device=0, compression=wire.LZ4)))
    push.send_multipart([b"a-e", b"logs", json.dumps({"n": 2}).encode()])
    clock.run_until(lambda: len(events(router)) == 2, "2 events")
    got = events(router)
    assert [r["n"] for _, _, r in got] == [1, 2]
    assert got[1][1] == int(clock.seconds() * 1000) * 1_000_000


def test_stop_lets_stored_messages_get_their_replies(sockets, started) -> None:
    source, router, clock = make(listen_router="tcp://127.0.0.1:*", stop_quiet_secs=0.1)
    (endpoint,) = started(source, clock)
    d = dealer(sockets, endpoint)
    d.send_multipart([b"", *wire.encode_message("a", "e", "logs", {"n": 1}, meta(1, device=0))])
    clock.run_until(lambda: len(router.calls) == 1, "the message stored")
    stopped = source.stop()
    done: list = []
    stopped.addBoth(done.append)
    clock.advance(0.2)
    assert not done, "a stored message still waits for its reply"
    router.fire(0)
    clock.run_until(lambda: bool(done), "the stop")
    assert d.poll(2000) and d.recv_multipart() == [b"a-e", b"202 Accepted"]


def test_a_bind_that_fails_fails_the_start_with_the_endpoint(sockets) -> None:
    taken = sockets(zmq.PULL)
    taken.bind("tcp://127.0.0.1:*")
    endpoint = taken.getsockopt_string(zmq.LAST_ENDPOINT)
    source, _, clock = make(listen_pull=endpoint)
    with pytest.raises(RuntimeError, match=f"cannot open pull socket on {endpoint}"):
        result_of(clock, source.start())


# -- config ----------------------------------------------------------------------------------


def _errors(text: str) -> list[str]:
    from logrouter.config.load import ConfigError, load_string

    try:
        load_string(text)
    except ConfigError as e:
        return e.errors
    return []


def test_config_errors_name_the_key() -> None:
    sink = '\n[sinks.lake]\ntype = "parquet"\ninputs = ["lj"]\npath = "x"\n'
    assert _errors('[sources.lj]\ntype = "logjam"\n' + sink) == [
        "sources.lj: connect, listen_router, listen_pull: set at least one (nothing to receive from)"
    ]
    errors = _errors('[sources.lj]\ntype = "logjam"\nconnect = ["tcp://a:1", "tcp://*:2"]\nlisten_pull = "tcp://x"\n' + sink)
    assert any(e.startswith("sources.lj.connect[1]: bad ZeroMQ endpoint 'tcp://*:2'") for e in errors), errors
    assert any(e.startswith("sources.lj.listen_pull: bad ZeroMQ endpoint 'tcp://x'") for e in errors), errors
    errors = _errors('[sources.lj]\ntype = "logjam"\nconnect = ["tcp://a:1"]\ntag = "${app"\n' + sink)
    assert any(e.startswith("sources.lj.tag:") for e in errors), errors


def test_a_forced_gap_while_paused_is_counted_exactly(sockets, started) -> None:
    """Stop reading, overrun both high-water marks: what ZeroMQ dropped shows up as lost
    messages, and delivered + lost is exactly what was published."""
    pub, endpoint = publisher(sockets)
    pub.setsockopt(zmq.SNDHWM, 50)
    source, router, clock = make(connect=[endpoint], receive_hwm=50)
    started(source, clock)
    join(pub, source, clock)
    source.pause_reading()
    clock.run_pending(0.1)  # a chunk read before the pause still arrives
    published = 20_000
    padding = "x" * 1000
    for seq in range(1, published + 1):
        pub.send_multipart(wire.encode_message("a", "e", "logs", {"n": seq, "p": padding}, meta(seq)))
    source.resume_reading()
    seq = published

    def tail_arrived() -> bool:
        # what was published right after the resume may be dropped too: go on until one lands
        nonlocal seq
        seq += 1
        pub.send_multipart(wire.encode_message("a", "e", "logs", {"n": seq}, meta(seq)))
        clock.run_pending(0.05)
        return any(r["n"] > published for _, _, r in events(router))

    clock.run_until(tail_arrived, "a message after the resume", timeout=30)
    stream = source.tracker.stream(endpoint, 3)
    delivered = len(events(router))
    assert stream.lost > 0, "the high-water marks were not overrun"
    assert delivered + stream.lost == stream.last == max(r["n"] for _, _, r in events(router))
    assert stream.duplicates == 0


def test_subscriptions_filter_by_app_env_prefix_and_keep_heartbeats(sockets, started) -> None:
    pub, endpoint = publisher(sockets)
    source, router, clock = make(connect=[endpoint], subscriptions=["shop-"])
    assert source.specs[0].subscriptions == (b"shop-", b"heartbeat")
    started(source, clock)
    join(pub, source, clock)
    pub.send_multipart(wire.encode_message("other", "prod", "logs", {"n": 1}, meta(1)))
    pub.send_multipart(wire.encode_message("shop", "prod", "logs", {"n": 2}, meta(2)))
    clock.run_until(lambda: len(events(router)) == 1, "the subscribed message")
    assert [r["n"] for _, _, r in events(router)] == [2]
    assert not clock.run_pending(0.2)


def test_silence_while_paused_is_not_the_devices(sockets, started) -> None:
    pub, endpoint = publisher(sockets)
    source, router, clock = make(connect=[endpoint], silence_secs=30)
    started(source, clock)
    join(pub, source, clock)
    pub.send_multipart(wire.encode_heartbeat("tcp://dev:9606", 3, 1, 0))
    clock.run_until(lambda: source.heartbeats == 1, "a heartbeat")
    source.pause_reading()
    clock.advance(60)
    source.resume_reading()
    clock.advance(10)
    assert source.reconnects == 0

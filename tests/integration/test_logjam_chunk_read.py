"""The logjam receiver's work per chunk, not per message: a chunk's bodies read in one
native call (``LogjamReader.read_many``, ``LogjamSource.read_bodies`` as the receiver's
``finish``), frames received without ``getsockopt`` per frame (``receive_message``), a
chunk's ``finish`` run in the receiver thread, checked stream names kept."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest
import zmq
from helpers import spin
from twisted.internet import defer, task

import source_fakes
from logrouter.native import NATIVE, describe
from logrouter.sources import logjam_native
from logrouter.sources.logjam import LogjamSource, Ping, Request
from logrouter.sources.logjam_native import LogjamBatches, ScannedMessage
from logrouter.sources.zmq_receiver import PULL, ROUTER, SUB, Received, SocketSpec, ZmqReceiver, receive_message
from logrouter.wire import logjam as wire
from logrouter.wire.errors import detached

NOW = 1_764_000_000_123_456_789
GOOD = b'{"started_ms":1764000000000,"a":{"b":[1,2]},"s":"x"}'


def frames_of(body: bytes, n: int, stream: bytes = b"shop-prod") -> list[bytes]:
    meta = wire.encode_meta(wire.Meta(wire.NONE, 2, 0 if n % 2 else 1_764_000_000_000, n))
    return [stream, b"logs", body, meta]


# -- the native read of many bodies ---------------------------------------------------------


needs_native = pytest.mark.skipif(NATIVE is None, reason=f"native decoding off: {describe()}")


@needs_native
def test_read_many_is_read_of_each_body() -> None:
    reader = NATIVE.LogjamReader("logjam_", ["started_ms", "started_at"])
    bodies = [GOOD, b'{"x":NaN}', b"{}", b'{"started_at":"2026-11-26T10:00:00Z","k":[{}]}', b"[1]"]
    infos = [("app", "env", "logs", n, 2**64 - 1 - n, NOW + n) for n in range(len(bodies))]
    many = reader.read_many(bodies, infos)
    assert many == [reader.read(body, *info) for body, info in zip(bodies, infos)]
    assert [piece is None for piece in many] == [False, True, False, False, True]
    assert reader.read_many([], []) == []
    with pytest.raises(ValueError):
        reader.read_many([GOOD], [])


@needs_native
def test_a_join_past_a_mib_is_the_scan_of_its_bodies() -> None:
    """A join that large releases the GIL; a smaller one holds it: the same pieces either way."""
    reader = NATIVE.LogjamReader("logjam_", ["started_ms"])
    body = b'{"started_ms":1764000000000,"pad":"' + b"x" * 4000 + b'","o":{"p":[1]}}'
    for count in (3, 400):  # about 12 KB and 1.6 MB
        bodies = [body] * count
        infos = [("a", "b", "logs", 1, n, NOW) for n in range(count)]
        joined = NATIVE.join_logjam(reader.read_many(bodies, infos))
        entries, buckets, texts = NATIVE.scan_logjam(bodies, infos, "logjam_", ["started_ms"])
        assert joined == (entries, buckets, texts)


# -- the source's read of a chunk -------------------------------------------------------------


class CountingNative:
    """The extension, its ``LogjamReader``'s calls counted (or ``read_many`` failing)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail

    def __getattr__(self, name: str) -> Any:
        return getattr(NATIVE, name)

    def LogjamReader(self, prefix: str, time_fields: list[str]) -> Any:  # noqa: N802 - the extension's name
        native, calls, fail = NATIVE.LogjamReader(prefix, time_fields), self.calls, self.fail

        class Reader:
            def read(self, body: bytes, *info: Any) -> Any:
                calls.append(("read", 1))
                return native.read(body, *info)

            def read_many(self, bodies: list[bytes], infos: list[Any]) -> Any:
                calls.append(("read_many", len(bodies)))
                if fail:
                    raise RuntimeError("logrouter_native panicked (a bug)")
                return native.read_many(bodies, infos)

        return Reader()


def make_source(monkeypatch, fail: bool = False) -> tuple[LogjamSource, CountingNative]:
    native = CountingNative(fail)
    monkeypatch.setattr(logjam_native, "NATIVE", native)
    clock = task.Clock()
    clock.advance(source_fakes.T0)
    options = {key: option.default for key, option in LogjamSource.OPTIONS.items()}
    options.update(listen_router="tcp://127.0.0.1:*", connect=["tcp://127.0.0.1:1"])
    source = LogjamSource("jam", options, source_fakes.fake_context(source_fakes.FakeRouter(), clock))
    return source, native


def chunk_of(source: LogjamSource) -> list[Received]:
    heartbeat = wire.encode_heartbeat("tcp://device:9606", 2, 1, 0)
    return [
        Received(0, None, source.decode_frames(SUB, frames_of(GOOD, 1)), 0),
        Received(1, b"id", source.decode_frames(ROUTER, [b"", *frames_of(b"[1,2]", 2)]), 0),
        Received(0, None, source.decode_frames(SUB, heartbeat), 0),
        Received(1, b"id", source.decode_frames(ROUTER, [b"", b"ping", b"", b"", heartbeat[3]]), 0),
        Received(0, None, detached(RuntimeError("a bug in decoding")), 0),
        Received(0, None, source.decode_frames(SUB, frames_of(b'{"x":NaN}', 3)), 0),
        Received(0, None, source.decode_frames(SUB, frames_of(GOOD, 4, b"shop")), 0),
        Received(0, None, source.decode_frames(SUB, frames_of(GOOD, 6)), 0),
    ]


def assert_read(chunk: list[Received], first: type) -> None:
    kinds = [type(getattr(item.decoded, "decoded", item.decoded)) for item in chunk]
    assert kinds == [first, wire.LogjamDecodeError, wire.Heartbeat, Ping, RuntimeError, wire.LogjamMessage,
                     wire.LogjamDecodeError, first]
    assert (chunk[1].decoded.decoded.kind, chunk[6].decoded.decoded.kind) == ("body", "stream")
    assert chunk[1].decoded.reply_first == b"shop-prod" and chunk[1].decoded.decoded.__traceback__ is None
    assert math.isnan(chunk[5].decoded.decoded.body["x"])  # declined by the extension, decoded in Python


@needs_native
def test_the_receiver_reads_a_chunks_bodies_in_one_native_call(monkeypatch) -> None:
    source, native = make_source(monkeypatch)
    chunk = chunk_of(source)
    assert [type(item.decoded.decoded) for item in chunk if type(item.decoded) is Request].count(wire.UndecodedMessage) == 4
    assert native.calls == []  # decode_frames leaves the bodies to the chunk's read
    assert source.read_bodies(chunk) is chunk
    assert native.calls == [("read_many", 4)]
    assert_read(chunk, ScannedMessage)
    scanned = chunk[0].decoded.decoded
    assert scanned.info == ("shop", "prod", "logs", 2, 1, int(source_fakes.T0 * 10**9))  # no created_ms: the arrival
    assert chunk[7].decoded.decoded.info[5] == 1_764_000_000_000 * 10**6  # the meta's created_ms
    assert source.read_bodies([]) == [] and native.calls == [("read_many", 4)]
    # one message alone (decode): read, holding the GIL
    assert type(source.decode(SUB, frames_of(GOOD, 8)).decoded) is ScannedMessage
    assert native.calls == [("read_many", 4), ("read", 1)]


@needs_native
def test_a_failing_native_read_leaves_the_chunk_to_python(monkeypatch) -> None:
    source, native = make_source(monkeypatch, fail=True)
    chunk = source.read_bodies(chunk_of(source))
    assert native.calls == [("read_many", 4)]
    assert_read(chunk, wire.LogjamMessage)


def test_without_the_extension_decode_frames_decodes_the_bodies(monkeypatch) -> None:
    monkeypatch.setattr(logjam_native, "NATIVE", None)
    clock = task.Clock()
    options = {key: option.default for key, option in LogjamSource.OPTIONS.items()}
    options.update(listen_router="tcp://127.0.0.1:*")
    source = LogjamSource("jam", options, source_fakes.fake_context(source_fakes.FakeRouter(), clock))
    chunk = chunk_of(source)
    assert_read(source.read_bodies(chunk), wire.LogjamMessage)


@needs_native
def test_read_raises_what_read_many_gives_in_place() -> None:
    batches = LogjamBatches("logjam_", ["started_ms"])
    meta = wire.Meta(wire.NONE, 1, 0, 5)
    with pytest.raises(wire.LogjamDecodeError):
        batches.read(wire.UndecodedMessage("a", "b", "logs", b"[1]", meta), NOW)
    found = batches.read_many([wire.UndecodedMessage("a", "b", "logs", b, meta) for b in (b"[1]", GOOD)], NOW)
    assert [type(f) for f in found] == [wire.LogjamDecodeError, ScannedMessage]


# -- names ----------------------------------------------------------------------------------------


def test_names_are_checked_once_and_bad_ones_every_time() -> None:
    for _ in range(2):
        for stream in (b"shop", b"sh\x01op-prod", b"shop-pr\xffod"):
            with pytest.raises(wire.LogjamDecodeError):
                wire.decode_message(frames_of(GOOD, 1, stream))
        with pytest.raises(wire.LogjamDecodeError, match="topic"):
            wire.decode_message([b"shop-prod", b"l\xffogs", GOOD, frames_of(GOOD, 1)[3]])
    for n in range(5000):  # more names than are kept
        message = wire.decode_message(frames_of(b"{}", 1, b"app-%d-env%d" % (n, n % 7)))
        assert (message.app, message.env, message.topic) == (f"app-{n}", f"env{n % 7}", "logs")
    message = wire.decode_message([bytearray(b"a-b-c"), memoryview(b"logs"), b"{}", frames_of(GOOD, 1)[3]])
    assert (message.app, message.env, message.topic) == ("a-b", "c", "logs")


# -- the receiver thread ----------------------------------------------------------------------------


class CountingSocket(zmq.Socket):
    """A socket that counts ``getsockopt`` calls (``recv_multipart`` makes one a frame)."""

    gets: list[int] = []

    def get(self, option: int) -> Any:
        CountingSocket.gets.append(int(option))
        return super().get(option)

    getsockopt = get


class CountingContext(zmq.Context):
    _socket_class = CountingSocket


def test_receive_message_takes_whole_messages_without_getsockopt() -> None:
    context = CountingContext()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    try:
        pull.bind("inproc://counted")
        push.connect("inproc://counted")
        messages = [[b"one"], [b"a", b"", b"c", b"d" * 5000], [b""] * 6]
        for frames in messages:
            push.send_multipart(frames)
        CountingSocket.gets.clear()
        got = []
        while len(got) < len(messages):
            assert pull.poll(10_000), "the messages did not arrive"
            frames = receive_message(pull)
            while frames is not None:
                got.append(frames)
                frames = receive_message(pull)
        assert got == messages
        assert receive_message(pull) is None
        assert int(zmq.RCVMORE) not in CountingSocket.gets
    finally:
        pull.close(0)
        push.close(0)
        context.term()


@pytest.mark.parametrize("fails", [False, True])
def test_finish_runs_on_each_chunk_in_the_receiver_thread(threaded_reactor, fails) -> None:
    context = CountingContext()
    threads: list[str] = []
    chunks: list[list[Received]] = []
    arrived: defer.Deferred = defer.Deferred()
    messages = [[b"m%d" % n, b"x" * n] for n in range(40)]

    def finish(chunk: list[Received]) -> list[Received]:
        threads.append(threading.current_thread().name)
        if fails:
            raise ZeroDivisionError("a bug in finish")
        return [item._replace(decoded=("finished", item.decoded)) for item in chunk]

    def deliver(chunk: list[Received]) -> None:
        chunks.append(chunk)
        receiver.done()
        if sum(map(len, chunks)) == len(messages) and not arrived.called:
            arrived.callback(None)

    receiver = ZmqReceiver(threaded_reactor, [SocketSpec(PULL, "tcp://127.0.0.1:*")], lambda kind, frames: frames,
                           deliver, name="test-finish", context=context, finish=finish, max_chunk_messages=16)
    push = context.socket(zmq.PUSH)
    try:
        [endpoint] = spin(threaded_reactor, receiver.start())
        CountingSocket.gets.clear()
        push.connect(endpoint)
        for frames in messages:
            push.send_multipart(frames)
        spin(threaded_reactor, arrived)
    finally:
        push.close(0)
        spin(threaded_reactor, receiver.stop())
        context.term()
    assert set(threads) == {"logrouter-zmq-test-finish"} and len(threads) == len(chunks)
    assert all(len(chunk) <= 16 for chunk in chunks)
    items = [item for chunk in chunks for item in chunk]
    assert [item.size for item in items] == [len(b"".join(frames)) for frames in messages]
    if fails:
        assert all(type(item.decoded) is ZeroDivisionError and item.decoded.__traceback__ is None for item in items)
    else:
        assert [item.decoded for item in items] == [("finished", frames) for frames in messages]
    assert int(zmq.RCVMORE) not in CountingSocket.gets


class HeldReactor:
    """``callFromThread`` only records the call; ``run`` makes the recorded calls (the
    reactor's turn, when the test says)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple, dict]] = []
        self.lock = threading.Lock()

    def callFromThread(self, f: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N802 - the reactor's name
        with self.lock:
            self.calls.append((f, args, kwargs))

    def run(self) -> int:
        with self.lock:
            calls, self.calls = self.calls, []
        for f, args, kwargs in calls:
            f(*args, **kwargs)
        return len(calls)

    def until(self, condition: Any, what: str) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, f"{what}: not in time"
            time.sleep(0.005)


def test_chunks_handed_over_before_the_reactor_ran_are_one_call(caplog) -> None:
    """A busy reactor gets one call for the chunks waiting for it, in order; its done()
    lets the thread, stopped at ``in_flight`` chunks, read on; a deliver that fails costs
    its chunk only."""
    reactor = HeldReactor()
    delivered: list[list[Received]] = []

    def deliver(chunk: list[Received]) -> None:
        delivered.append(chunk)
        receiver.done()
        if len(delivered) == 2:
            raise ZeroDivisionError("a bug in deliver")

    receiver = ZmqReceiver(reactor, [SocketSpec(PULL, "tcp://127.0.0.1:*")], lambda kind, frames: frames,
                           deliver, name="test-held", max_chunk_messages=1, in_flight=2)
    started: list[Any] = []
    receiver.start().addBoth(started.append)
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    try:
        reactor.until(lambda: reactor.run() or started, "the start")
        push.connect(started[0][0])
        for n in range(5):
            push.send_multipart([b"m%d" % n])
        reactor.until(lambda: receiver.handed == 2, "two chunks handed over")
        assert [f for f, _, _ in reactor.calls] == [receiver._deliver_handed]  # one call for both
        reactor.run()  # (the thread may read on meanwhile: what it hands over then, this call delivers too)
        assert [chunk[0].decoded for chunk in delivered[:2]] == [[b"m0"], [b"m1"]]
        reactor.until(lambda: reactor.run() >= 0 and len(delivered) == 5, "the thread reading on after done()")
        assert [chunk[0].decoded for chunk in delivered] == [[b"m%d" % n] for n in range(5)]
    finally:
        stopped: list[Any] = []
        receiver.stop().addBoth(stopped.append)
        reactor.until(lambda: reactor.run() or stopped, "the stop")
        push.close(0)
        context.term()

"""The pravega source's segment-store side: StringTransport, task.Clock and a router whose
``ingest`` returns Deferreds fired by hand, so AppendSetup numbers, DataAppended order
(never before durability) and the error replies are checked to the byte."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from twisted.internet import defer

import source_fakes
from source_fakes import FakeRouter
from logrouter.pravega.streams import StreamRegistry
from logrouter.failures import UnstorableBatch
from logrouter.sources.pravega import PravegaSource
from logrouter.wire import pravega as wire

W1 = uuid.UUID(int=1)
W2 = uuid.UUID(int=2)
SEG0 = "sc/st/0.#epoch.0"
SEG1 = "sc/st/1.#epoch.0"


class WriterRouter(FakeRouter):
    """A FakeRouter that also keeps writers' last stored event numbers, as the router does
    once a writer's batch is durable."""

    def __init__(self) -> None:
        super().__init__()
        self.writers: dict[tuple[str, bytes], int] = {}

    def ingest(self, batch: Any, key: Any = None, *, writer: Any = None) -> defer.Deferred:
        if writer is not None:
            stored = self.writers.get((batch.source, writer[0]))
            if stored is not None and writer[1] <= stored:
                return defer.succeed(None)
        d = super().ingest(batch, key, writer=writer)
        if writer is not None:
            def stored_now(result: Any) -> Any:
                previous = self.writers.get((batch.source, writer[0]), writer[1])
                self.writers[(batch.source, writer[0])] = max(previous, writer[1])
                return result
            d.addCallback(stored_now)
        return d

    def last_event_number(self, source: str, writer: bytes) -> int | None:
        return self.writers.get((source, writer))


class Conn(source_fakes.Conn):
    def replies(self) -> list[Any]:  # type: ignore[override]
        return wire.PravegaClientDecoder().feed(super().replies())


@pytest.fixture
def make(tmp_path):
    def make_source(router: Any = None, **overrides: Any):
        errors: list = []
        source, router, clock = source_fakes.make_source(PravegaSource, "pv", router=router or WriterRouter(), **overrides)
        source.context = source.context.__class__(**{**source.context.__dict__, "errors": lambda *a: errors.append(a)})
        source.streams = StreamRegistry(str(tmp_path / "streams.json"))
        source.streams.create_scope("sc")
        source.streams.create_stream("sc", "st", 2)
        return source, router, clock, errors

    return make_source


def block(writer: uuid.UUID, payloads: list[bytes], last: int, request_id: int) -> bytes:
    data = b"".join(wire.encode_event(p) for p in payloads)
    return wire.encode_append_block_end(writer, len(data), data, len(payloads), last, request_id)


def setup(conn: Conn, writer: uuid.UUID = W1, segment: str = SEG0, request_id: int = 1, token: str = "") -> list[Any]:
    conn.send(wire.encode_hello(15, 5) + wire.encode_setup_append(request_id, writer, segment, token))
    return conn.replies()


def test_hello_setup_and_acks_only_after_durability(make) -> None:
    source, router, _, _ = make()
    conn = Conn(source)
    hello, setup_reply = setup(conn)
    assert hello == wire.Hello(17, 5)
    assert setup_reply == wire.AppendSetup(1, SEG0, W1, wire.NO_EVENT_NUMBER)
    conn.send(block(W1, [b'{"n": 1}', b'{"n": 2}'], 2, 2) + block(W1, [b'{"n": 3}'], 3, 3))
    assert len(router.calls) == 2 and conn.replies() == []
    first, second = router.calls
    assert first.writer == (f"{SEG0}|{W1}".encode(), 2) and second.writer[1] == 3
    assert [r for _, r in first.batch.events] == [{"n": 1}, {"n": 2}]
    assert first.batch.tag == "sc.st" and first.batch.source == "pv"
    router.fire(1)
    assert conn.replies() == [], "the second block is durable first: its ack waits for the first"
    router.fire(0)
    acks = conn.replies()
    assert acks == [wire.DataAppended(W1, 3, wire.NO_EVENT_NUMBER, 3, acks[0].current_segment_write_offset)]


def test_a_writer_reconnecting_is_told_what_is_stored_and_resends_nothing_twice(make) -> None:
    source, router, _, _ = make()
    conn = Conn(source)
    setup(conn)
    conn.send(block(W1, [b"{}"] * 3, 3, 2))
    conn.send(block(W1, [b"{}"] * 2, 5, 3))
    router.fire(0)
    conn.replies()
    conn.lose()  # cut while the second block is still being stored
    again = Conn(source)
    assert setup(again, request_id=9) == [wire.Hello(17, 5)], "AppendSetup waits for the writer's block in flight"
    router.fire(1)
    (setup_reply,) = again.replies()
    assert setup_reply == wire.AppendSetup(9, SEG0, W1, 5)
    again.send(block(W1, [b"{}"] * 2, 5, 10))  # a stale resend is acked, not stored
    assert len(router.calls) == 2
    (ack,) = again.replies()
    assert (ack.event_number, ack.previous_event_number, ack.request_id) == (5, 5, 10)


def test_several_writers_and_segments_on_one_connection(make) -> None:
    source, router, _, _ = make()
    conn = Conn(source)
    setup(conn, W1, SEG0, 1)
    conn.send(wire.encode_setup_append(2, W2, SEG1, ""))
    assert conn.replies() == [wire.AppendSetup(2, SEG1, W2, wire.NO_EVENT_NUMBER)]
    conn.send(block(W2, [b'"x"'], 1, 3) + block(W1, [b"[1]"], 1, 4))
    router.fire_all()
    acks = conn.replies()
    assert [(a.writer_id, a.event_number, a.request_id) for a in acks] == [(W2, 1, 3), (W1, 1, 4)]
    assert [r for _, r in router.calls[0].batch.events] == [{"value": "x"}]
    assert router.calls[0].writer[0] == f"{SEG1}|{W2}".encode()


def test_payload_modes_and_bad_payloads_go_to_the_error_path(make) -> None:
    source, router, _, errors = make()
    conn = Conn(source)
    setup(conn)
    conn.send(block(W1, [b'{"a": 1}', b"not json", b'{"b": 2}'], 3, 2))
    router.fire_all()
    assert [r for _, r in router.calls[0].batch.events] == [{"a": 1}, {"b": 2}]
    assert router.calls[0].batch.json_values
    assert len(conn.replies()) == 1, "the block is acknowledged all the same"
    assert errors and errors[0][0] == "pv" and errors[0][2] == {"payload": b"not json"} and "not JSON" in errors[0][3]
    assert source.invalid_events == 1
    for mode, payload, record in (("string", "grüße".encode(), {"message": "grüße"}), ("bytes", b"\x00\xff", {"data": b"\x00\xff"})):
        source2, router2, _, errors2 = make(payload=mode)
        conn2 = Conn(source2)
        setup(conn2)
        conn2.send(block(W1, [payload], 1, 2))
        assert [r for _, r in router2.calls[0].batch.events] == [record]
        assert router2.calls[0].batch.json_values  # JSON values or bytes: the spool's fast encoder
    source3, router3, _, errors3 = make(payload="string")
    conn3 = Conn(source3)
    setup(conn3)
    conn3.send(block(W1, [b"\xff"], 1, 2))
    assert router3.calls[0].batch.events == [] and "UTF-8" in errors3[0][3]


def test_event_time_from_time_fields(make) -> None:
    source, router, clock, _ = make(time_fields=["ts"])
    conn = Conn(source)
    setup(conn)
    conn.send(block(W1, [json.dumps({"ts": 1_700_000_000_123}).encode(), b"{}"], 2, 2))
    times = [t for t, _ in router.calls[0].batch.events]
    assert times == [1_700_000_000_123_000_000, int(clock.seconds() * 1e9)]


def test_unknown_segment_wrong_token_and_versions(make) -> None:
    source, _, _, _ = make(delegation_token="secret")
    conn = Conn(source)
    conn.send(wire.encode_setup_append(1, W1, "sc/other/0.#epoch.0", "secret"))
    assert conn.replies() == [wire.NoSuchSegment(1, "sc/other/0.#epoch.0", "", -1)]
    assert not conn.closed
    conn.send(wire.encode_setup_append(2, W1, SEG0, "wrong"))
    (failed,) = conn.replies()
    assert isinstance(failed, wire.AuthTokenCheckFailed) and failed.request_id == 2
    assert conn.closed
    old = Conn(source)
    old.send(wire.encode_hello(4, 1))
    assert old.replies() == [wire.Hello(17, 5)] and old.closed


def test_appends_before_setup_close_the_connection_keepalive_is_echoed(make) -> None:
    source, router, _, _ = make()
    conn = Conn(source)
    conn.send(wire.encode_keep_alive())
    assert conn.replies() == [wire.KeepAlive()]
    conn.send(block(W1, [b"{}"], 1, 1))
    assert conn.closed and router.calls == []


def test_conditional_append_is_unsupported(make) -> None:
    source, _, _, _ = make()
    conn = Conn(source)
    setup(conn)
    conn.send(wire.encode_conditional_append(W1, 1, 0, b"{}", 7))
    (reply,) = conn.replies()
    assert isinstance(reply, wire.OperationUnsupported) and reply.request_id == 7


def test_an_unstorable_block_closes_the_connection_without_an_ack(make) -> None:
    source, router, _, _ = make()
    conn = Conn(source)
    setup(conn)
    conn.send(block(W1, [b"{}"], 1, 2))
    router.calls[0].deferred.errback(UnstorableBatch("too big"))
    assert conn.replies() == [] and conn.refused

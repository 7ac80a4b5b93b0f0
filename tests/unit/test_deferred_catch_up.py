"""Deferred batches: a sink that reads events in its own thread catches up on records.

The router hands a worker-thread sink (``parquet``, ``file``) the records it reads back
from the spool undecoded (``Batch.deferred``): the sink's queue then holds them at their
spool size, and the sink's thread decodes each one as it writes it, keeping nothing.
A record routed to the sink through a filter is decoded in the reading thread as before
(filters read events on the reactor). A record that cannot be decoded costs only itself.
"""

from __future__ import annotations

import msgpack
import pytest
from twisted.internet import defer, task

from helpers import spin
from source_fakes import CursorSink, log_lines  # noqa: F401  (log_lines is a fixture)
from logrouter import registry
from logrouter.batch import Batch, Routing
from logrouter.config.load import load_string
from logrouter.lake.dataset import lake_dataset
from logrouter.router import Router
from logrouter.sinks.base import SINK_OPTIONS, SinkBase
from logrouter.sinks.parquet import _ROWS, _STOP, ParquetSink
from logrouter.sinks.state import SinkState
from logrouter.spool.log import SpoolLog
from logrouter.spool.record import RecentBatches, decode_batch, decode_deferred, encode_batch

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


def test_a_deferred_batch_decodes_each_time_it_is_read_and_keeps_nothing():
    calls = []

    def decode():
        calls.append(1)
        return [(T0, {"n": len(calls)})]

    batch = Batch.deferred("t", "src", decode)
    assert batch.is_deferred and calls == []
    assert batch.events == [(T0, {"n": 1})]
    assert batch.events == [(T0, {"n": 2})]  # decoded again: nothing was kept
    assert batch.is_deferred and (batch.tag, batch.source) == ("t", "src")
    held = batch.materialized()
    assert not held.is_deferred and held.events == [(T0, {"n": 3})] and len(calls) == 3
    assert (held.tag, held.source) == ("t", "src")
    plain = Batch("t", [(T0, {})])
    assert plain.materialized() is plain and not plain.is_deferred


def test_recent_batches_hand_out_a_deferred_batch_for_a_record_they_do_not_hold():
    kept = Batch("t", [(T0, {"kept": True})], "src")
    other = Batch("u", [(T0 + 1, {"b": b"\xff"}), (T0 + 2, {"x": [1, {"y": None}]})], "src2")
    recent = RecentBatches()
    recent.add(0, kept, 10)
    assert recent.decode(0, encode_batch(kept), deferred=True) is kept
    got = recent.decode(100, encode_batch(other, ("src2", b"k")), deferred=True)
    assert got.is_deferred and (got.tag, got.source) == ("u", "src2")
    assert [tuple(e) for e in got.events] == [tuple(e) for e in decode_batch(encode_batch(other))[0].events]
    assert not recent.decode(100, encode_batch(other)).is_deferred  # not asked for: decoded now


@pytest.mark.parametrize(
    "payload",
    [
        msgpack.packb([9, "s", "t", [], None]),  # an unknown version
        msgpack.packb([2, "s", "t", []]),  # not 5 fields
        msgpack.packb({"not": "a record"}),
        b"\x95\x02\xa1s",  # cut short
    ],
)
def test_a_record_whose_head_is_not_one_is_refused_at_once(payload):
    with pytest.raises(Exception):
        decode_deferred(payload)


# -- through the router: which batches come deferred ---------------------------------------


class DeferredSink(CursorSink, SinkBase):
    """Takes deferred batches, as the worker-thread sinks do; notes how each came."""

    OPTIONS = dict(SINK_OPTIONS)
    TYPE = "deferred_collect"
    DEFERRED_EVENTS = True
    got: list = []

    def write(self, batch, position, size):
        DeferredSink.got.append((batch.source, batch.is_deferred, [tuple(e) for e in batch.events]))


class EagerSink(DeferredSink):
    TYPE = "eager_collect"
    DEFERRED_EVENTS = False
    got: list = []

    def write(self, batch, position, size):
        EagerSink.got.append((batch.source, batch.is_deferred, [tuple(e) for e in batch.events]))


@pytest.fixture
def collecting_sinks():
    registry.load_builtin()
    registry.sink("deferred_collect")(DeferredSink)
    registry.sink("eager_collect")(EagerSink)
    DeferredSink.got, EagerSink.got = [], []
    yield
    del registry.SINKS["deferred_collect"], registry.SINKS["eager_collect"]


def test_a_sink_catching_up_gets_straight_records_deferred_and_filtered_ones_decoded(
    tmp_path, threaded_reactor, collecting_sinks
):
    reactor = threaded_reactor
    straight = Batch("a.log", [(T0, {"from": "a"}), (T0 + 1, {"from": "a", "n": 2})], "a")
    filtered = Batch("b.log", [(T0 + 2, {"from": "b"})], "b")
    spool = SpoolLog(reactor, str(tmp_path / "spool"))
    spool.open()
    spin(reactor, defer.gatherResults([spool.append(encode_batch(b)) for b in (straight, filtered, straight)]))
    spin(reactor, spool.close())

    config = load_string(
        f'[spool]\npath = "{tmp_path}/spool"\n'
        '[sources.a]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[sources.b]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[filters.keep]\ntype = "grep"\ninputs = ["b"]\nfield = "from"\ninclude = "b"\n'
        '[sinks.lazy]\ntype = "deferred_collect"\ninputs = ["a", "keep"]\n'
        '[sinks.eager]\ntype = "eager_collect"\ninputs = ["a"]\n'
    )
    router = Router(config, reactor)
    try:
        spin(reactor, router.start())
        deadline = reactor.seconds() + 30
        while (len(DeferredSink.got) < 3 or len(EagerSink.got) < 2) and reactor.seconds() < deadline:
            spin(reactor, defer.Deferred().addTimeout(0.01, reactor).addErrback(lambda _: None))
    finally:
        spin(reactor, router.stop())
    a_events = [(T0, {"from": "a"}), (T0 + 1, {"from": "a", "n": 2})]
    assert DeferredSink.got == [("a", True, a_events), ("b", False, [(T0 + 2, {"from": "b"})]), ("a", True, a_events)]
    assert EagerSink.got == [("a", False, a_events), ("a", False, a_events)]


def test_a_catch_up_read_hands_on_an_undecodable_records_error_detached(tmp_path, threaded_reactor, collecting_sinks, log_lines):
    """A record the read thread cannot decode is reported and skipped; its error comes
    back without a traceback, which would hold the read thread's frame (the whole read,
    up to a few MiB of records) until the collector ran."""
    reactor = threaded_reactor
    good = encode_batch(Batch("a.log", [(T0, {"from": "a"})], "a"))
    bad = msgpack.packb([3, "a", "a.log", ["nope", 1], None])  # a packed format replay does not know
    spool = SpoolLog(reactor, str(tmp_path / "spool"))
    spool.open()
    spin(reactor, defer.gatherResults([spool.append(p) for p in (good, bad, good)]))
    spin(reactor, spool.close())
    config = load_string(
        f'[spool]\npath = "{tmp_path}/spool"\n'
        '[sources.a]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[sinks.eager]\ntype = "eager_collect"\ninputs = ["a"]\n'
    )
    router = Router(config, reactor)
    errors: list = []
    apply = router.catch_up.apply

    def spy(result, feed, epoch):
        errors.extend(batch for _, batch in result[0] if isinstance(batch, Exception))
        return apply(result, feed, epoch)

    router.catch_up.apply = spy
    try:
        spin(reactor, router.start())
        deadline = reactor.seconds() + 30
        while len(EagerSink.got) < 2 and reactor.seconds() < deadline:
            spin(reactor, defer.Deferred().addTimeout(0.01, reactor).addErrback(lambda _: None))
    finally:
        spin(reactor, router.stop())
    assert len(EagerSink.got) == 2
    assert len(errors) == 1 and "unknown packed events format 'nope'" in str(errors[0])
    assert errors[0].__traceback__ is None and errors[0].__context__ is None
    assert any("cannot be decoded" in line for line in log_lines)


# -- in the sink's thread ------------------------------------------------------------------


def parquet_sink(tmp_path) -> ParquetSink:
    config = {
        "path": str(tmp_path / "lake"), "writer_id": "w1", "roll_bytes": 1 << 30, "roll_secs": 10.0,
        "row_group_rows": 100, "roll_row_groups": 256, "compression": "zstd", "columns": {}, "max_queue_bytes": 1 << 20,
        "retry_initial_secs": 1.0, "retry_max_secs": 8.0,
    }
    sink = ParquetSink("lake", config, errors=lambda *a: None, reactor=task.Clock())
    sink.state = SinkState(str(tmp_path / "spool" / "sinks" / "lake.json"))
    return sink


def deferred_record(position: int, ids: range) -> tuple:
    payload = encode_batch(Batch("t", [(T0 + i, {"id": i}) for i in ids], "in"))
    return ((_ROWS, decode_deferred(payload), position, len(payload)), 0.0, position, 0)


def test_the_parquet_sink_decodes_deferred_records_and_skips_one_that_cannot_be_decoded(tmp_path, log_lines):
    sink = parquet_sink(tmp_path)
    assert sink._recover() == 0

    def broken():
        raise ValueError("unknown packed events format 'nope' in a spool record")

    bad = ((_ROWS, Batch.deferred("t", "in", broken), 100, 50), 0.0, 100, 0)
    items = [deferred_record(0, range(0, 5)), bad, deferred_record(200, range(5, 8)), ((_STOP,), 1.0, 300, 0)]
    result = sink._run(items)
    freed, cursor, refused, undecodable = result
    assert freed == sum(item[0][3] for item in items[:3]) and cursor == 300 and refused == []
    assert undecodable == [(100, "ValueError: unknown packed events format 'nope' in a spool record")]
    assert sink.events_in == 8
    ids = sorted(lake_dataset(str(tmp_path / "lake")).to_table(columns=["id"]).column("id").to_pylist())
    assert ids == list(range(8))  # the rest is written, the cursor passes the bad record
    sink._done(result)
    assert any("spool record at 100 cannot be decoded" in line and "sink lake skipped it" in line for line in log_lines)
    assert sink.cursor == 300 and not sink.failing


def test_the_file_sink_writes_a_deferred_record_like_a_decoded_one(tmp_path):
    from test_file_sink import ids, make_sink, stop
    from logrouter.sinks.file import _ROWS as FILE_ROWS

    sink = make_sink(tmp_path)
    sink._recover()
    payload = encode_batch(Batch("t", [(T0 + i, {"id": i}) for i in range(4)], "in"))
    deferred = decode_deferred(payload)
    freed, cursor, refused, undecodable = sink._run([((FILE_ROWS, deferred, 0, len(payload)), 0.0, 0, 0), stop(1.0, 100)])
    assert ids(tmp_path) == [0, 1, 2, 3] and freed == len(payload) and cursor == 100
    assert refused == [] and undecodable == [] and sink.events_in == 4
    assert deferred.is_deferred  # the sink kept nothing of it


def test_a_deferred_batch_that_cannot_be_decoded_never_escapes_a_node(log_lines):
    # A filter reading it raises, or a sink's write raises: the error path wants its
    # records, which cannot be decoded either; the node logs and goes on.
    from logrouter.routes import FilterNode, SinkNode

    def broken():
        raise ValueError("bad record")

    class Raising:
        def process(self, batch):
            return batch.replace(events=[e for e in batch.events])

        def write(self, batch, position, size):
            raise RuntimeError("no")

    reported = []

    class Errors:
        position = None

        def __call__(self, *args):
            reported.append(args)

    batch = Batch.deferred("t", "in", broken)
    FilterNode("f", Raising(), Errors()).push(batch, Routing(700, 718, 10, frozenset({"s"})))  # reach is empty: skipped
    node = FilterNode("f", Raising(), Errors())
    node.reach = frozenset({"s"})
    node.push(batch, Routing(700, 718, 10, frozenset({"s"})))
    SinkNode("s", Raising(), Errors()).push(batch, Routing(800, 818, 10, frozenset({"s"})))
    assert reported == []
    lines = [line for line in log_lines if "cannot be decoded" in line]
    assert len(lines) == 2 and "spool record at 700" in lines[0] and "spool record at 800" in lines[1]
    assert all("ValueError: bad record" in line for line in lines)

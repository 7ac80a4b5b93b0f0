"""A sink's queue counts what its batches hold in memory, not the size of their spool
records: a Beats window stored compressed is ~25 times smaller than the documents and
the native scan's entries it holds, and counted at its record's size a queue bounded by
``max_queue_bytes`` would hold that many times its bound (``Batch.charge``)."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import pytest
from twisted.internet import defer, task

import source_fakes
from logrouter import registry
from logrouter.batch import Batch
from logrouter.catch_up import CatchUp, read_records
from logrouter.config.load import load_string
from logrouter.feeds import LIVE, SinkFeed
from logrouter.router import Router
from logrouter.sinks.base import SINK_OPTIONS, SinkBase
from logrouter.sources.compressed_documents import LUMBERJACK_ZLIB
from logrouter.sources.lumberjack import LumberjackSource
from logrouter.spool.record import RecentBatches, encode_batch
from logrouter.spool.segment import Record
from logrouter.wire import lumberjack as lj

BOUND = 2 << 20


def filebeat(i: int) -> dict[str, Any]:
    return {
        "@timestamp": "2026-11-26T10:%02d:%02d.%03dZ" % (i // 60 % 60, i % 60, i % 1000),
        "@metadata": {"beat": "filebeat", "type": "_doc", "version": "8.11.0"},
        "message": '10.0.%d.%d - - [26/Nov/2026:10:00:00 +0000] "GET /api/v1/items/%06d HTTP/1.1" 200 %d "-" '
                   '"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36"' % (i % 256, i % 200, i, 512 + i % 1000),
        "log": {"offset": 1000 * i, "file": {"device_id": "64769", "inode": "1839212", "path": "/var/log/nginx/access.log"}},
        "input": {"type": "filestream"},
        "ecs": {"version": "8.0.0"},
        "host": {"hostname": "web-%02d" % (i % 17), "architecture": "x86_64",
                 "os": {"kernel": "6.1.0-13-amd64", "codename": "bookworm", "type": "linux", "platform": "debian"},
                 "ip": ["10.0.0.%d" % (i % 17), "fe80::5054:ff:fe12:3456"], "name": "web-%02d" % (i % 17)},
        "agent": {"ephemeral_id": "3f0a6c1e-2b8d-4f57-9c3e-2a1b0c9d8e7f", "id": "b1c2d3e4-f5a6-4b7c-8d9e-0f1a2b3c4d5e",
                  "name": "web-%02d" % (i % 17), "type": "filebeat", "version": "8.11.0"},
    }


class ListSink(SinkBase):
    """Keeps every batch it is handed (never done), counting what the router says."""

    TYPE = "list_queue"
    OPTIONS = dict(SINK_OPTIONS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: list[Batch] = []

    def start(self):
        return defer.succeed(0)

    def write(self, batch, position, size):
        self.held.append(batch)
        self.queued_bytes += size

    def advance(self, end):
        pass

    def stop(self):
        return defer.succeed(None)


def windows(count: int, events: int) -> list[tuple[Batch, int, int]]:
    """``count`` Filebeat windows through the lumberjack source, each as the router gets
    it once stored (``packed`` let go), with its record's size and the memory it holds
    (measured with ``tracemalloc``)."""
    source, router, _ = source_fakes.make_source(LumberjackSource, "beats", tag="beats.${@metadata.beat}")
    conn = source_fakes.Conn(source)
    out = []
    tracemalloc.start()
    try:
        for w in range(count):
            wire = lj.encode_window_frames([filebeat(w * events + i) for i in range(events)])
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            conn.send(wire)
            batch = router.calls[-1].batch
            assert batch.packed[0] == LUMBERJACK_ZLIB
            size = len(encode_batch(batch))
            batch.packed = None  # in the spool now (as logrouter.ingest does)
            router.fire_pending()
            gc.collect()
            out.append((batch, size, tracemalloc.get_traced_memory()[0] - before))
    finally:
        tracemalloc.stop()
    return out


@pytest.fixture
def router(tmp_path):
    registry.load_builtin()
    registry.sink("list_queue")(ListSink)
    config = load_string(
        f'[spool]\npath = "{tmp_path}/spool"\n'
        '[sources.beats]\ntype = "lumberjack"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        f'[sinks.q]\ntype = "list_queue"\ninputs = ["beats"]\nmax_queue_bytes = {BOUND}\nhold_sources_secs = 0\n'
    )
    router = Router(config, task.Clock(), run_blocking=lambda f, *args: defer.maybeDeferred(f, *args))
    router.spool.open()
    router.sources = {}
    feed = router.feeds["q"]
    feed.start(0)
    feed.go_live()
    yield router
    del registry.SINKS["list_queue"]


def test_a_sink_queue_of_compressed_beats_batches_stays_within_its_bound_of_memory(router):
    made = windows(40, 256)
    sink, feed = router.feeds["q"].sink, router.feeds["q"]
    memory = {}
    position = 0
    for batch, size, held in made:
        if feed.state is not LIVE:
            break  # the spool takes the rest: the sink reads it when it has room
        memory[id(batch)] = held
        router.route_stored(batch, position, position + size + 8, size)
        position += size + 8
    assert feed.state is not LIVE, "the sink never went past its bound"
    in_queue = sum(memory[id(b)] for b in sink.held)
    largest = max(held for _, _, held in made)
    # Within its bound, give or take the record that took it past it.
    assert in_queue <= BOUND + largest, (in_queue, len(sink.held), [s for _, s, _ in made[:3]])
    # ... and counted as what they hold: the charge is at least the memory measured.
    for batch, size, held in made:
        assert batch.charge(size) >= 0.9 * held > 10 * size


def test_a_compressed_record_read_back_for_a_catch_up_is_counted_as_what_it_holds():
    (batch, size, held), = windows(1, 256)
    source, fake, _ = source_fakes.make_source(LumberjackSource, "beats", tag="beats.${@metadata.beat}")
    source_fakes.Conn(source).send(lj.encode_window_frames([filebeat(i) for i in range(256)]))
    payload = encode_batch(fake.calls[0].batch)

    class Spool:
        def read(self, start, end, max_bytes):
            return [Record(0, len(payload) + 8, payload)], len(payload) + 8

    class Host:
        routed: list = []

        def catch_up_limit(self, feed):
            return len(payload) + 8

        def route(self, batch, routing):
            self.routed.append(routing.size)

        def read_done(self, feed):
            pass

    class Sink:
        options = {"max_queue_bytes": BOUND}
        queued_bytes = 0
        cursor = 0
        failing = False

        def advance(self, end):
            pass

    clock = task.Clock()
    feed = SinkFeed("q", Sink(), clock)
    feed.start(0)
    catch_up = CatchUp(Spool(), RecentBatches(), clock, None, Host())
    epoch = feed.begin_read(defer.Deferred())
    result = read_records(Spool().read, RecentBatches().decode, 0, len(payload) + 8, False, frozenset())
    catch_up.apply(result, feed, epoch)
    assert Host.routed == [result[0][0][1].held_bytes]
    assert Host.routed[0] >= 0.9 * held > 10 * len(payload)

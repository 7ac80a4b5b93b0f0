"""``dedupe`` in the real router over a real spool (issue 28, item 4): an event sent again
in its own message and a batch resent under a new chunk id are dropped live, and again
when the sinks replay the spool after a crash, whether the filter's memory was saved
before the originals were decided or not at all.

The sink is a lake with exactly-once commits whose commits the test makes; a crash is the
router left without a stop (the spool closed under it), then another router started on
the same spool, as a ``kill -9`` and a restart would leave them.
"""

from __future__ import annotations

import msgpack
import pytest
from twisted.internet import defer

from helpers import spin
from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.load import load_string
from logrouter.router import Router
from logrouter.sinks.base import SINK_OPTIONS, SinkBase

SECOND = 10**9
T0 = 1_700_000_000 * SECOND


class LedgerSink(SinkBase):
    """A lake with exactly-once commits: rows by spool position; ``commit(position)`` saves
    the cursor; a start drops what was written at or after the saved cursor (uncommitted)."""

    OPTIONS = {**SINK_OPTIONS}
    lake: dict[str, dict[int, list]] = {}

    def start(self) -> defer.Deferred:
        saved = self.state.load() if self.state else None
        self.cursor = saved["cursor"] if saved else 0
        rows = LedgerSink.lake.setdefault(self.name, {})
        for position in [p for p in rows if p >= self.cursor]:
            del rows[position]
        return defer.succeed(self.cursor)

    def write(self, batch: Batch, position: int, size: int) -> None:
        LedgerSink.lake[self.name].setdefault(position, []).extend(r["message"] for _, r in batch.events)

    def advance(self, end: int) -> None:
        self.on_progress()

    def commit(self, position: int) -> None:
        self.cursor = position
        self.state.save({"cursor": position})
        self.on_progress()

    def stop(self) -> defer.Deferred:
        return defer.succeed(None)


@pytest.fixture(autouse=True)
def ledger_sink():
    registry.load_builtin()
    registry.sink("test_ledger")(LedgerSink)
    LedgerSink.lake = {}
    yield
    del registry.SINKS["test_ledger"]


CONFIG = """
[spool]
path = "{root}/spool"

[sources.in]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[filters.unique]
type = "dedupe"
inputs = ["in"]
fields = ["message"]

[sinks.lake]
type = "test_ledger"
inputs = ["unique"]

[sinks.mirror]
type = "test_ledger"
inputs = ["unique"]
"""


def start_router(reactor, tmp_path) -> Router:
    """A router started, its sinks done replaying the spool."""
    router = Router(load_string(CONFIG.format(root=tmp_path)), reactor)
    spin(reactor, router.start())
    deadline = reactor.seconds() + 30
    while not all(feed.live for feed in router.feeds.values()) and reactor.seconds() < deadline:
        reactor.iterate(0.01)
    assert all(feed.live for feed in router.feeds.values()), "the sinks did not catch up"
    return router


def crash(reactor, router: Router) -> None:
    """What a ``kill -9`` leaves: the spool and the files saved so far, nothing of a stop."""
    for source in router.sources.values():
        spin(reactor, source.stop())
    spin(reactor, router.snapshots.idle())
    spin(reactor, router.spool.close())


def lake(name: str) -> list[str]:
    return [m for _, rows in sorted(LedgerSink.lake[name].items()) for m in rows]


def ingest(reactor, router: Router, messages: list[str], chunk: bytes, when: int = T0) -> int:
    """Store one record (a forward message with its chunk id); its spool position."""
    start = router.spool.end
    spin(reactor, router.ingest(Batch("t", [(when + i, {"message": m}) for i, m in enumerate(messages)], "in"), chunk))
    return start


@pytest.mark.parametrize("memory", ["saved", "lost"])
def test_duplicates_are_dropped_live_and_again_after_a_crash(tmp_path, threaded_reactor, memory):
    reactor = threaded_reactor
    router = start_router(reactor, tmp_path)
    ingest(reactor, router, ["boot"], b"c0")
    spin(reactor, router.snapshots.idle())  # the filters' memory as the first progress saved it
    ingest(reactor, router, ["disk full"], b"c1")  # a client's event...
    ingest(reactor, router, ["x", "y", "z"], b"c2")  # ...and a batch
    middle = ingest(reactor, router, ["later"], b"c3")
    ingest(reactor, router, ["disk full"], b"c4")  # the same event in its own message, same second
    ingest(reactor, router, ["x", "y", "z"], b"c5")  # the batch resent under a new chunk id
    expected = ["boot", "disk full", "x", "y", "z", "later"]
    assert lake("lake") == expected and lake("mirror") == expected
    # One sink committed up to the middle, the other nothing; then the process dies.
    router.sinks["lake"].commit(middle)
    crash(reactor, router)
    if memory == "lost":
        (tmp_path / "spool" / "filters.msgpack").unlink(missing_ok=True)

    again = start_router(reactor, tmp_path)  # replays: lake from the middle, mirror from 0
    # The memory saved after the first record, or none: the rest is read back from the spool.
    assert (again.filter_memory.starts["unique"] > 0) == (memory == "saved")
    assert lake("lake") == expected and lake("mirror") == expected
    ingest(reactor, again, ["disk full", "new"], b"c6")  # and live again, after the restart
    assert lake("lake") == [*expected, "new"] and lake("mirror") == [*expected, "new"]
    spin(reactor, again.stop())


def test_a_graceful_stop_saves_the_memory_and_the_next_start_needs_no_warm_up(tmp_path, threaded_reactor):
    reactor = threaded_reactor
    router = start_router(reactor, tmp_path)
    ingest(reactor, router, ["a"], b"c1")
    end = router.spool.end
    router.sinks["lake"].commit(end)
    router.sinks["mirror"].commit(end)
    spin(reactor, router.stop())
    saved = msgpack.unpackb((tmp_path / "spool" / "filters.msgpack").read_bytes(), raw=False)
    assert saved[0] == 1 and saved[1]["unique"][2] == end  # covers everything

    again = start_router(reactor, tmp_path)
    assert again.filter_memory.starts == {"unique": end}  # nothing to read back
    ingest(reactor, again, ["a"], b"c2", when=T0 + 1)  # within the window of the one before the stop
    assert lake("lake") == ["a"] and lake("mirror") == ["a"]
    spin(reactor, again.stop())

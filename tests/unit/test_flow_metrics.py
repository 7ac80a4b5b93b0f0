"""The numbers ``logrouter top`` shows, on ``/metrics``: per source the events and spool
bytes it stored, per filter the events in and out, per sink its lag in seconds and the
time of its last commit; and the supervisor's page takes the largest of an age or a time
over its workers instead of their sum.
"""

from __future__ import annotations

import pytest
from twisted.internet import defer, task

from helpers import spin
from logrouter import metrics, registry
from logrouter.batch import Batch
from logrouter.config.load import load_string
from logrouter.metrics import render_samples
from logrouter.router import Router
from logrouter.sinks.base import SINK_OPTIONS, SinkBase
from logrouter.spool.ages import StoreTimes
from logrouter.workers.metrics import merge

T0 = 1_700_000_000 * 10**9
START = 1_700_000_000.0


def values(router: Router) -> dict[str, float]:
    text = metrics.render(router)
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}


def test_each_source_counts_the_events_and_spool_bytes_it_stored(tmp_path):
    from twisted.internet import reactor

    config = load_string(
        f'[spool]\npath = "{tmp_path}/spool"\n'
        '[sources.fwd]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[sources.beats]\ntype = "lumberjack"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        f'[sinks.lake]\ntype = "parquet"\ninputs = ["fwd", "beats"]\npath = "{tmp_path}/lake"\n'
    )
    router = Router(config, reactor)
    router.spool.open()
    try:
        spin(reactor, router.ingest(Batch("t", [(T0, {"n": 1}), (T0, {"n": 2})], source="fwd")))
        after_first = router.spool.end
        spin(reactor, router.ingest(Batch("t", [(T0, {"n": 3})], source="fwd"), b"chunk"))
        spin(reactor, router.ingest(Batch("t", [(T0, {"n": 3})], source="fwd"), b"chunk"))  # a resend: not stored again
        spin(reactor, router.ingest(Batch("t", [(T0, {"n": 4})], source="lake.errors")))  # dead letters are no source
    finally:
        spin(reactor, router.spool.close())
    got = values(router)
    fwd, beats = '{source="fwd",type="fluent_forward"}', '{source="beats",type="lumberjack"}'
    assert got[f"logrouter_source_events_total{fwd}"] == 3
    # Spool bytes: the records as framed less the frame headers, i.e. what the source's batches took.
    assert after_first < got[f"logrouter_source_bytes_total{fwd}"] < router.spool.end
    assert got[f"logrouter_source_events_total{beats}"] == 0 and got[f"logrouter_source_bytes_total{beats}"] == 0
    assert not any("lake.errors" in key for key in got if key.startswith("logrouter_source_"))


class Committing(SinkBase):
    """Keeps what it is handed until the test commits it."""

    TYPE = "flow_commit"
    OPTIONS = dict(SINK_OPTIONS)

    def start(self):
        return defer.succeed(0)

    def write(self, batch, position, size):
        self.events_in += len(batch.events)

    def advance(self, end):
        self.handed = end

    def stop(self):
        return defer.succeed(None)

    def commit(self) -> None:
        self.cursor = self.handed
        self.on_progress()


@pytest.fixture
def router(tmp_path):
    registry.load_builtin()
    registry.sink("flow_commit")(Committing)
    clock = task.Clock()
    clock.advance(START)
    config = load_string(
        f'[spool]\npath = "{tmp_path}/spool"\n'
        '[sources.in]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'
        '[filters.keep]\ntype = "grep"\ninputs = ["in"]\nfield = "n"\ninclude = "^[0-4]$"\n'
        '[filters.by]\ntype = "route"\ninputs = ["keep"]\nroutes = { low = "n < 2", any = "n >= 0" }\n'
        '[sinks.lake]\ntype = "flow_commit"\ninputs = ["by.low", "by.any"]\n'
    )
    router = Router(config, clock, run_blocking=lambda f, *args: defer.maybeDeferred(f, *args))
    router.spool.open()
    feed = router.feeds["lake"]
    feed.start(0)
    feed.go_live()
    yield router, clock, feed.sink
    del registry.SINKS["flow_commit"]


def hand(router: Router, size: int, events: list[dict]) -> None:
    """One batch of ``size`` spool bytes from source ``in``, stored and routed live."""
    position = router.routed_end
    router.route_stored(Batch("t", [(T0, e) for e in events], "in"), position, position + size, size)


def test_each_filter_counts_events_in_and_out(router):
    router, _, _ = router
    hand(router, 100, [{"n": n} for n in range(10)])  # grep keeps 0..4; route: 0, 1 to low, all five to any
    got = values(router)
    assert got['logrouter_filter_events_in_total{filter="keep",type="grep"}'] == 10
    assert got['logrouter_filter_events_out_total{filter="keep",type="grep"}'] == 5
    assert got['logrouter_filter_events_in_total{filter="by",type="route"}'] == 5
    assert got['logrouter_filter_events_out_total{filter="by",type="route"}'] == 7  # one per output it goes to
    assert got['logrouter_sink_events_in_total{sink="lake",type="flow_commit"}'] == 7


def test_a_reload_keeps_counting_where_it_was(router):
    router, _, _ = router
    hand(router, 100, [{"n": 1}])
    router.routes = router.build_routes()  # as a reload rebuilds them
    hand(router, 100, [{"n": 2}])
    assert values(router)['logrouter_filter_events_in_total{filter="keep",type="grep"}'] == 2


def test_a_sinks_lag_in_seconds_is_the_age_of_the_oldest_event_it_has_not_committed(router):
    router, clock, sink = router
    lake = '{sink="lake",type="flow_commit"}'
    got = values(router)
    assert got[f"logrouter_sink_lag_seconds{lake}"] == 0 and got[f"logrouter_sink_last_commit_timestamp_seconds{lake}"] == 0
    hand(router, 100, [{"n": 1}])  # stored at START
    clock.advance(10)
    hand(router, 100, [{"n": 2}])  # stored at START + 10
    router.spool.written_end = router.routed_end  # as the spool's worker would have it
    clock.advance(5)
    got = values(router)
    assert got[f"logrouter_sink_lag_seconds{lake}"] == 15 and got[f"logrouter_sink_lag_bytes{lake}"] == 200
    sink.handed = 100
    sink.commit()  # the first batch is committed: the oldest left is the second
    got = values(router)
    assert got[f"logrouter_sink_lag_seconds{lake}"] == 5 and got[f"logrouter_sink_last_commit_timestamp_seconds{lake}"] == START + 15
    clock.advance(3)
    sink.handed = 200
    sink.commit()
    got = values(router)
    assert got[f"logrouter_sink_lag_seconds{lake}"] == 0 and got[f"logrouter_sink_last_commit_timestamp_seconds{lake}"] == START + 18


def test_store_times_are_coarse_never_young_and_forget_what_every_sink_passed():
    times = StoreTimes(100.0, bucket_secs=1.0)
    assert times.stored_at(0) == 100.0 and times.stored_at(5000) == 100.0  # from before the start: the start
    never = lambda: 0  # noqa: E731 - no sink passed anything
    times.stored(5000, 100.4, never)  # this process's first record starts a stretch at once
    times.stored(5100, 100.9, never)  # within a second: the same stretch
    times.stored(5200, 101.5, never)
    assert times.stored_at(4999) == 100.0 and times.stored_at(5000) == 100.4
    assert times.stored_at(5150) == 100.4 and times.stored_at(5200) == 101.5 and len(times) == 3
    times.stored(5300, 103.0, lambda: 5250)  # every sink is past 5250: the stretches before 5200 go
    assert len(times) == 2 and times.stored_at(5250) == 101.5 and times.stored_at(9999) == 103.0


def test_the_supervisor_shows_the_largest_age_and_latest_commit_over_its_workers():
    def page(lag: float, commit: float, events: int) -> str:
        labels = {"sink": "lake", "type": "parquet"}
        return render_samples(iter([
            ("logrouter_sink_lag_seconds", "gauge", labels, lag),
            ("logrouter_sink_last_commit_timestamp_seconds", "gauge", labels, commit),
            ("logrouter_sink_events_in_total", "counter", labels, events),
        ]))

    merged = merge({0: page(3.5, START + 20, 10), 1: page(12.0, START + 7, 5), 2: page(0, 0, 1)}).splitlines()
    assert 'logrouter_sink_lag_seconds{sink="lake",type="parquet"} 12' in merged
    assert f'logrouter_sink_last_commit_timestamp_seconds{{sink="lake",type="parquet"}} {int(START + 20)}' in merged
    assert 'logrouter_sink_events_in_total{sink="lake",type="parquet"} 16' in merged

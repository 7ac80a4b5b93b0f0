"""The daemon's collector settings (see logrouter.gc_tuning for why)."""

from __future__ import annotations

import gc

import pytest
from twisted.internet.task import Clock

from logrouter import gc_tuning


def test_tune_raises_the_thresholds_freezes_what_start_up_built_and_collects_on_a_clock() -> None:
    before = gc.get_threshold()
    clock = Clock()
    collector = gc_tuning.tune(clock)
    try:
        assert gc.get_threshold() == gc_tuning.THRESHOLDS
        assert gc.get_freeze_count() > 0
        assert clock.getDelayedCalls()
    finally:
        collector.stop()
        gc.unfreeze()
        gc.set_threshold(*before)
    assert not clock.getDelayedCalls()


def test_the_young_generations_every_period_and_everything_every_so_often() -> None:
    clock = Clock()
    generations: list[int] = []
    collector = gc_tuning.PeriodicCollector(clock, generations.append).start()
    clock.advance(gc_tuning.COLLECT_SECS - 0.001)
    assert generations == []  # not at start: tune() has just collected
    for _ in range(2 * gc_tuning.FULL_EVERY):
        clock.advance(gc_tuning.COLLECT_SECS)
    collector.stop()
    clock.advance(10 * gc_tuning.COLLECT_SECS)
    full = [i for i, g in enumerate(generations, 1) if g == 2]
    assert len(generations) == 2 * gc_tuning.FULL_EVERY
    assert full == [gc_tuning.FULL_EVERY, 2 * gc_tuning.FULL_EVERY]
    assert set(generations) == {1, 2}


class _Router:
    """Just what RouterService calls on a router, with start and stop fired by hand."""

    def __init__(self) -> None:
        from twisted.internet import defer

        self.starting = defer.Deferred()
        self.stopping = defer.Deferred()
        self.reload_hook = None

    def start(self):
        return self.starting

    def stop(self):
        return self.stopping


@pytest.fixture
def daemon(tmp_path):
    """A RouterService as twistd runs it (a config path), on a Clock, with a router whose
    start and stop the test fires; the process's collector settings restored after."""
    from logrouter.config.load import load_string
    from logrouter.service import RouterService

    before = gc.get_threshold()
    clock = Clock()
    clock.stop = lambda: None  # type: ignore[attr-defined]
    service = RouterService(load_string(f'[spool]\npath = "{tmp_path}"\n'), reactor=clock,
                            config_path=str(tmp_path / "logrouter.toml"))
    router = _Router()
    service.build_router = lambda: router  # type: ignore[method-assign]
    service._install_sighup = lambda: None  # type: ignore[method-assign]
    yield service, router, clock
    if service.collector is not None:
        service.collector.stop()
    gc.unfreeze()
    gc.set_threshold(*before)


def test_the_daemon_collects_until_its_drain_is_done(daemon) -> None:
    service, router, clock = daemon
    service.startService()
    router.starting.callback(None)
    assert service.collector is not None
    service.stopService()
    assert service.collector is not None  # the sinks are still draining
    router.stopping.callback(None)
    assert service.collector is None and not clock.getDelayedCalls()


def test_a_stop_during_the_start_starts_no_collector_and_no_compaction(daemon, monkeypatch) -> None:
    import logrouter.service

    service, router, clock = daemon
    started = []
    monkeypatch.setattr(logrouter.service, "start_compaction", lambda config, reactor: started.append(1) or object())
    service.startService()
    service.stopService()  # SIGTERM while the spool replays
    router.starting.callback(None)
    router.stopping.callback(None)
    assert service.collector is None and not clock.getDelayedCalls()
    assert started == []  # stopService had already passed it by

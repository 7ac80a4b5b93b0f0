"""The daemon's collector settings (see logrouter.gc_tuning for why)."""

from __future__ import annotations

import gc

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

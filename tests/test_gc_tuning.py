"""The daemon's collector settings (see logrouter.gc_tuning for why)."""

from __future__ import annotations

import gc

from logrouter import gc_tuning


def test_tune_raises_the_thresholds_and_freezes_what_start_up_built() -> None:
    before = gc.get_threshold()
    try:
        gc_tuning.tune()
        assert gc.get_threshold() == gc_tuning.THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)

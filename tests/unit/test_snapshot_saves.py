"""``Snapshots``: one save of the id window at a time, the stop's included (the window's
saves share one copy buffer, ``DigestRing.joined``)."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, task

from logrouter import dedupe
from logrouter.snapshots import Snapshots


class Memory:
    """The filters' memory, empty: nothing to capture, nothing held back."""

    ready = True
    starts: dict = {}

    def release(self, filters: Any, cursor: int) -> None:
        pass

    def covered(self, filters: Any) -> None:
        return None

    def capture(self, filters: Any) -> None:
        return None

    def changed(self, filters: Any) -> bool:
        return False

    def save(self, memory: Any) -> None:
        pass


class Threads:
    """``run_blocking`` whose jobs run when the test says; it fails a test that starts a
    job while another one is under way."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Any, tuple, defer.Deferred]] = []
        self.overlaps = 0

    def __call__(self, f: Any, *args: Any) -> defer.Deferred:
        self.overlaps += bool(self.jobs)
        d: defer.Deferred = defer.Deferred()
        self.jobs.append((f, args, d))
        return d

    def run_next(self) -> None:
        f, args, d = self.jobs.pop(0)
        d.callback(f(*args))


def test_a_save_started_by_the_end_of_another_is_waited_for_by_the_stops(tmp_path):
    window = dedupe.DedupeWindow(10)
    for n in range(3):
        window.add(("fwd", b"%d" % n), n)
    threads = Threads()
    snapshots = Snapshots(str(tmp_path / "dedupe.msgpack"), window, Memory(), object(), task.Clock(), threads)
    snapshots.loaded = True
    snapshots.save({}, 5)
    # The end of a save trims, and a trim may save again (the spool moved meanwhile).
    snapshots.on_saved = lambda: snapshots.save({}, 6) if snapshots.position < 6 else None
    stopped = snapshots.save_at_stop({}, 7, 7)
    threads.run_next()  # the first save ends; its trim starts the second
    assert len(threads.jobs) == 1 and not stopped.called
    threads.run_next()  # the second ends; only now the stop's own save starts
    threads.run_next()
    assert stopped.called and threads.overlaps == 0
    assert dedupe.load_snapshot(str(tmp_path / "dedupe.msgpack")).position == 7

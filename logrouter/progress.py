"""Progress lines for long work in the daemon: bytes done of the total, the rate, time left.

Work that can take minutes (the replay of the spool's ids at start-up, a sink catching up
from the spool) is watched by a ``ProgressLog``: every ``interval`` seconds on the
injected clock it reads ``(done, total)`` bytes from the work and logs one line,

    sink lake catching up from the spool: 1.2 GiB of 3.4 GiB (35%), 48.0 MiB/s, about 47 s left

and, if it logged any, a closing line when the work is done. Work shorter than one
interval logs nothing. The total may grow while the work runs (new events arrive while a
sink catches up): time left is reckoned from how fast the gap closes, not from the rate
alone, and a gap that does not close says so. ``read`` may be called from the reactor
only; work running in a thread publishes its numbers in attributes the reader reads.
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.logger import Logger

from logrouter.units import human_bytes, human_duration

#: how often a progress line is logged (seconds on the daemon's clock)
INTERVAL_SECS = 5.0

log = Logger(namespace="logrouter.progress")


def progress_line(what: str, done: int, total: int, rate: float, closing: float) -> str:
    """One line: ``done`` of ``total`` bytes, at ``rate`` bytes/s, the gap between them
    shrinking by ``closing`` bytes/s (less than ``rate`` when the total grows meanwhile)."""
    percent = 100.0 * done / total if total > 0 else 100.0
    line = f"{what}: {human_bytes(done)} of {human_bytes(total)} ({percent:.0f}%), {human_bytes(rate)}/s"
    left = total - done
    if left <= 0:
        return line
    if closing <= 0 and rate <= 0:
        return f"{line}, nothing done yet"
    if closing <= 0:
        return f"{line}, not closing in (new data arrives as fast as it is read)"
    return f"{line}, about {human_duration(left / closing)} left"


class ProgressLog:
    """Logs ``what``'s progress every ``interval`` seconds until ``finish()`` or until
    ``read()`` returns None (the work was abandoned: a stop, a removed sink).

    ``read() -> (done, total) | None``: bytes done so far and bytes to do in all, both
    counted from where the work began. ``emit(text)`` logs a line (tests pass a list's
    ``append``).
    """

    def __init__(
        self,
        clock: Any,
        what: str,
        read: Callable[[], tuple[int, int] | None],
        interval: float = INTERVAL_SECS,
        emit: Callable[[str], None] | None = None,
    ) -> None:
        self.clock = clock
        self.what = what
        self.read = read
        self.interval = interval
        self.emit = emit or (lambda text: log.info("{text}", text=text))
        self.started = clock.seconds()
        self.lines = 0
        # The gap to close at the start: the first total known (done counts from the
        # start, so it was 0 then); a thread may learn its total only after a while.
        self._start_total: int | None = None
        self._note_total(read())
        self._call: Any = clock.callLater(interval, self._tick)

    @property
    def active(self) -> bool:
        return self._call is not None

    def _note_total(self, sample: tuple[int, int] | None) -> None:
        if self._start_total is None and sample is not None and sample[1] > 0:
            self._start_total = sample[1]

    def _tick(self) -> None:
        self._call = None
        sample = self.read()
        if sample is None:
            return
        self._note_total(sample)
        done, total = sample
        elapsed = self.clock.seconds() - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        # How fast the gap closes: the rate, less what was added to the total meanwhile.
        closing = (self._start_total - (total - done)) / elapsed if self._start_total and elapsed > 0 else 0.0
        self.emit(progress_line(self.what, done, total, rate, closing))
        self.lines += 1
        self._call = self.clock.callLater(self.interval, self._tick)

    def finish(self, note: str = "done") -> None:
        """The work is over: stop, and close the lines with a summary if any was logged."""
        self.cancel()
        if self.lines:
            sample = self.read()
            done = sample[0] if sample is not None else 0
            self.emit(f"{self.what}: {note}, {human_bytes(done)} in {human_duration(self.clock.seconds() - self.started)}")
            self.lines = 0

    def cancel(self) -> None:
        """Stop without a closing line (the daemon is stopping)."""
        if self._call is not None:
            if self._call.active():
                self._call.cancel()
            self._call = None

"""The ``blackhole`` sink: counts what it is handed and throws it away (for benchmarks).

Its cursor moves as soon as a record is handed over (saved now and then, like the
``stdout`` sink's), so it never holds the spool back. With ``log_secs`` it logs its rate.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, task

from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.options import Option, non_negative
from logrouter.sinks.base import SINK_OPTIONS
from logrouter.sinks.stdout import CursorOnly


@registry.sink("blackhole")
class BlackholeSink(CursorOnly):
    COUNTERS = {
        "spool_bytes": "bytes of the records handed over, as a sink's queue counts them: spool bytes, or what a batch "
        "holds in memory where that is known and more (Beats, Log Courier)"
    }
    OPTIONS = {
        "log_secs": Option((int, float), 0, "log events and events/s this often (0 = never)", non_negative),
        **SINK_OPTIONS,
    }

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        super().__init__(name, options, errors, reactor)
        self.spool_bytes = 0
        self._logger: task.LoopingCall | None = None
        self._last = (0.0, 0)

    def start(self) -> defer.Deferred:
        d = super().start()
        interval = float(self.options["log_secs"])
        if interval > 0:
            self._logger = task.LoopingCall(self._log_rate)
            self._logger.clock = self.reactor
            self._last = (self.reactor.seconds(), 0)
            self._logger.start(interval, now=False)
        return d

    def write(self, batch: Batch, position: int, size: int) -> None:
        self.events_in += len(batch.events)
        self.spool_bytes += size

    def _log_rate(self) -> None:
        now = self.reactor.seconds()
        then, count = self._last
        rate = (self.events_in - count) / (now - then) if now > then else 0.0
        self._last = (now, self.events_in)
        self.log.info("blackhole {name}: {events} events, {rate:.0f} events/s", name=self.name, events=self.events_in, rate=rate)

    def stop(self) -> defer.Deferred:
        if self._logger is not None and self._logger.running:
            self._logger.stop()
        return super().stop()

"""What the router expects of a sink, and the retry/backoff every sink shares.

The router feeds a sink the spool's records in order: ``write(batch, position, size)``
for each batch a record yields for this sink (there may be none), then
``advance(end)`` once the record is fully handed over. The sink reports back through
two numbers and one callback:

* ``cursor``: every record before this spool position is done for good (committed
  into the lake, acked by the next hop); the spool keeps what lies after it, and a
  restart resumes from it.
* ``queued_bytes``: memory held for records handed over but not done (``size`` is
  ``Batch.charge``: what the batch holds, where known, else its spool bytes); above
  ``max_queue_bytes`` the router holds the sources that can push back until it drains
  (at most ``hold_sources_secs``), then stops feeding the sink live and lets it catch
  up from the spool later, so a slow sink costs disk, not memory.
* ``on_progress()``: called by the sink whenever those numbers moved.

When a sink fails (disk full, next hop down) it drops what it holds, waits with capped
exponential backoff on the injected clock, then asks to be fed again from its cursor
(``on_rewind()``), so the retry goes through the spool like any catch-up.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterator

from twisted.internet import defer
from twisted.logger import Logger

from logrouter.config.options import Option, non_negative, positive
from logrouter.sinks.state import SinkState

SINK_OPTIONS: dict[str, Option] = {
    "max_queue_bytes": Option(
        int, 32 << 20, "records handed to the sink and not yet done, counted as what their batches hold in memory where that "
        "is known (Beats and Log Courier events: their documents and the native scan's output, not the far smaller compressed "
        "record), else in spool bytes (decoded records take several times that); beyond it the sources are held "
        "(`hold_sources_secs`), then the sink reads from the spool",
        positive
    ),
    "hold_sources_secs": Option(
        (int, float), 5.0, "when the queue passes `max_queue_bytes`, how long the TCP sources feeding this sink may stop "
        "reading (their senders wait) for it to drain; past that it reads from the spool and they read again. 0: never hold the "
        "sources (the spool takes the backlog at once, and the sink decodes it again)", non_negative
    ),
    "retry_initial_secs": Option((int, float), 1.0, "first wait after a failure (no server available, disk full); it doubles up to `retry_max_secs`", positive),
    "retry_max_secs": Option((int, float), 60.0, "longest wait between retries", positive),
}


def _nothing() -> None:
    pass


class SinkBase:
    """Bookkeeping shared by sinks: progress numbers, callbacks and retry backoff."""

    OPTIONS = SINK_OPTIONS
    OPTIONS_FAMILY = "sinks.common"  # the docs' table of the options every sink shares
    # Counters a sink class keeps, as attribute -> help; each is exported as
    # logrouter_sink_<attribute>_total by samples(). Sink classes declare their own.
    COUNTERS: ClassVar[dict[str, str]] = {}
    log = Logger(namespace="logrouter.sink")

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        self.name = name
        self.options = options
        self.errors = errors
        self.reactor = reactor
        self.cursor = 0
        self.queued_bytes = 0
        self.state: SinkState | None = None
        self.on_progress: Callable[[], None] = _nothing
        self.on_rewind: Callable[[], None] = _nothing
        self.events_in = 0
        self.failures = 0
        self.failing = False
        self.epoch = 0  # bumped on failure: work queued before it is stale
        self._retry_delay = 0.0
        self._retry_call: Any = None

    # -- metrics ----------------------------------------------------------------------

    def labels(self) -> dict[str, str]:
        return {"sink": self.name, "type": self.TYPE}

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        """The sink's metric samples (``logrouter.metrics`` renders them): what it took in,
        where its cursor is, what it holds, its failures and the counters it declares.

        How far the router fed it (lag, live) is the router's to say.
        """
        labels = self.labels()
        yield "logrouter_sink_events_in_total", "counter", labels, self.events_in
        yield "logrouter_sink_cursor_bytes", "gauge", labels, self.cursor
        yield "logrouter_sink_queued_bytes", "gauge", labels, self.queued_bytes
        yield "logrouter_sink_failures_total", "counter", labels, self.failures
        for attribute in self.COUNTERS:
            yield f"logrouter_sink_{attribute}_total", "counter", labels, getattr(self, attribute)

    def fail(self, failure: Any) -> None:
        """The sink lost what it held: log, back off, then ask to be fed from ``cursor``."""
        self.failures += 1
        self.failing = True
        self.epoch += 1
        self.queued_bytes = 0
        initial = float(self.options["retry_initial_secs"])
        self._retry_delay = min(float(self.options["retry_max_secs"]), self._retry_delay * 2 or initial)
        self.log.error(
            "{type} sink {name} failed: {error}; retrying from spool position {cursor} in {delay:.1f}s",
            type=self.TYPE,
            name=self.name,
            error=failure.getErrorMessage() if hasattr(failure, "getErrorMessage") else failure,
            cursor=self.cursor,
            delay=self._retry_delay,
        )
        if self._retry_call is None or not self._retry_call.active():
            self._retry_call = self.reactor.callLater(self._retry_delay, self._retry)

    def _retry(self) -> None:
        self._retry_call = None
        epoch = self.epoch
        d = defer.maybeDeferred(self.reset)

        def ready(_: Any) -> None:
            if self.epoch != epoch:
                return  # the reset itself failed: fail() has scheduled the next retry
            self.failing = False
            self.on_rewind()

        d.addCallbacks(ready, self.fail)

    def reset(self) -> Any:
        """Drop whatever was done since the last commit, before being fed from ``cursor``."""
        return None

    def settled(self) -> bool:
        """Nothing handed over is still being worked on that may yet be reported to the
        error path: a graceful stop waits for it, so that the dead letters reach their
        sinks before those stop. True for a sink that reports in ``write`` itself."""
        return True

    def succeeded(self) -> None:
        """A unit of work went through: the next failure starts the backoff afresh."""
        self._retry_delay = 0.0

    def cancel_retry(self) -> None:
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        self._retry_call = None

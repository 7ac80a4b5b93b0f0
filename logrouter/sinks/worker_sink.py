"""The reactor half of sinks whose work runs in one worker thread (``parquet``, ``file``).

Such a sink queues items for its ``SerialWorker``: ``(kind, …)`` with the time, how far
the spool was handed over and the failure epoch. This base owns that queueing and what
comes back: ``_done`` frees the queued bytes, moves the cursor to what the worker
committed, reports refused records (``_report_refused``, the subclass's shape) and
records whose events could not be decoded;
``_failed`` hands a failure to ``SinkBase.fail``. ``reset`` (after a failure's backoff)
fails too while ``reset_problem()`` says what it left undone (files of a committed
record still unpublished), so the retry comes again. A subclass sets ``worker``,
``ticker``, ``fed_end``, ``_unpublished`` and ``_stopped`` in its constructor and runs the items in the worker thread.

Batches read back from the spool come deferred (``Batch.deferred``, ``DEFERRED_EVENTS``):
the worker thread decodes them (``events_of``), which also counts ``events_in``.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from logrouter.batch import Batch
from logrouter.sinks.base import SinkBase

TICK = "tick"  # seal what is due, move the cursor
STOP = "stop"  # seal and publish everything open
ROWS = "rows"
RESET = "reset"  # drop open files after a failure, before the spool is replayed


class WorkerSink(SinkBase):
    DEFERRED_EVENTS = True  # the router may hand over batches whose events are decoded here
    # The option that makes this sink's file names unique per writer; with several
    # worker processes each worker but the first gets "-w<index>" added to it.
    WRITER_OPTION = ""

    @classmethod
    def default_writer(cls, name: str) -> str:
        """What ``WRITER_OPTION`` means when it is left empty."""
        return name

    @classmethod
    def worker_options(cls, name: str, options: dict[str, Any], index: int) -> dict[str, Any]:
        if index == 0 or not cls.WRITER_OPTION:
            return options  # worker 0 goes on with the files of a single-process router
        own = options.get(cls.WRITER_OPTION) or cls.default_writer(name)
        return {**options, cls.WRITER_OPTION: f"{own}-w{index}"}

    worker: Any
    ticker: Any
    fed_end: int
    _unpublished: list
    _stopped: bool

    def advance(self, end: int) -> None:
        self.fed_end = end

    def settled(self) -> bool:
        return self.queued_bytes == 0  # the rows handed over went through the worker, refusals reported

    def _tick(self) -> None:
        if not self.worker.busy and not self.failing and not self._stopped:
            self._submit((TICK,))

    def stop(self) -> defer.Deferred:
        self._stopped = True
        if self.ticker.running:
            self.ticker.stop()
        self.cancel_retry()
        d = self.worker.idle() if self.failing else self._submit((STOP,))
        d.addCallback(lambda _: self.worker.stop())
        return d

    def reset(self) -> defer.Deferred:
        d = self._submit((RESET,))

        def check(_: object) -> None:
            # The reset runs while the sink is failing, so the worker's failure is not
            # reported; what it left undone (reset_problem) means it failed: retry later.
            problem = self.reset_problem()
            if problem:
                raise OSError(problem)

        return d.addCallback(check)

    def reset_problem(self) -> str:
        """What the last reset left undone (empty: the sink may be fed again)."""
        if self._unpublished:
            return f"{len(self._unpublished)} committed file(s) could not be published yet"
        return ""

    def _submit(self, item: tuple) -> defer.Deferred:
        return self.worker.submit((item, self.reactor.seconds(), self.fed_end, self.epoch))

    def events_of(self, batch: Batch, position: int, undecodable: list) -> list | None:
        """In the worker thread: the batch's events (a deferred batch decodes them now),
        or None, noted in ``undecodable``, if its spool record cannot be decoded."""
        try:
            events = batch.events
        except Exception as e:  # noqa: BLE001 - the record is skipped, as the router skips one
            undecodable.append((position, f"{type(e).__name__}: {e}"))
            return None
        self.events_in += len(events)  # only this thread counts them
        return events

    def _done(self, result: tuple[int, int, list, list]) -> None:
        freed, cursor, refused, undecodable = result
        self.queued_bytes = max(0, self.queued_bytes - freed)
        self.cursor = max(self.cursor, cursor)
        self._report_refused(refused)
        for position, error in undecodable:
            self.log.error("spool record at {position} cannot be decoded ({error}); sink {name} skipped it",
                           position=position, error=error, name=self.name)
        self.succeeded()
        self.on_progress()

    def _report_refused(self, refused: list) -> None:
        raise NotImplementedError

    def _failed(self, failure: Any) -> None:
        if self.failing:
            return  # a run queued before the failure was noticed
        self.queued_bytes = 0
        self.fail(failure)
        self.on_progress()

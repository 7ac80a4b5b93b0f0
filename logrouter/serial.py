"""A dedicated worker thread that runs one job at a time over everything queued.

Both the spool's group commit and the sinks' encoders follow the same pattern: items
arrive one by one on the reactor thread, and while the worker is busy they pile up, so
the next run handles all of them at once (one fsync, one Parquet write). This keeps
blocking work off the reactor and amortises it over as many items as the load brings.

Also the one way the rest of the code runs a single call in a thread (``defer_to_thread``),
whose failures, like a run's, are cleaned of their frames (``clean_failure``).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool


def clean_failure(result: Any) -> Any:
    """``result``; a Failure with its frames made strings (it still prints its traceback).

    A call that fails in a Twisted thread pool leaves a Failure whose traceback holds the
    failed frames (their locals: the batch, the payload) and the pool's own frame holding
    the Failure: a reference cycle, freed only when the cycle collector runs, every few
    seconds in the daemon (``logrouter.gc_tuning``)."""
    if isinstance(result, Failure):
        result.cleanFailure()
    return result


def defer_to_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> defer.Deferred:
    """``threads.deferToThread``, its failures cleaned (``clean_failure``)."""
    return threads.deferToThread(function, *args, **kwargs).addErrback(clean_failure)


class SerialWorker:
    """Run ``job(items)`` in one thread; every ``submit`` Deferred fires with that run's result.

    With ``on_result``/``on_failure`` the run's outcome goes to those, once per run, and
    the ``submit`` Deferreds only say the item was handled (they fire with ``None``).
    """

    def __init__(
        self,
        reactor: Any,
        job: Callable[[list[Any]], Any],
        name: str,
        on_result: Callable[[Any], None] | None = None,
        on_failure: Callable[[Failure], None] | None = None,
    ) -> None:
        self._reactor = reactor
        self._job = job
        self._on_result = on_result
        self._on_failure = on_failure
        self._pool = ThreadPool(1, 1, name=name)
        self._queued: list[Any] = []
        self._waiting: list[defer.Deferred] = []
        self._busy = False
        self._idle: list[defer.Deferred] = []

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def queued(self) -> int:
        return len(self._queued)

    def submit(self, item: Any) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self._queued.append(item)
        self._waiting.append(d)
        if not self._busy:
            self._run()
        return d

    def idle(self) -> defer.Deferred:
        """Fires once nothing is queued or running."""
        if not self._busy and not self._queued:
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        self._idle.append(d)
        return d

    def stop(self) -> defer.Deferred:
        """Wait for queued work, then end the thread."""
        d = self.idle()
        d.addCallback(lambda _: self._pool.stop() if self._pool.started else None)
        return d

    def _run(self) -> None:
        items, self._queued = self._queued, []
        waiting, self._waiting = self._waiting, []
        self._busy = True
        if not self._pool.started:
            self._pool.start()
        d = threads.deferToThreadPool(self._reactor, self._pool, self._job, items)
        d.addBoth(self._done, waiting)

    def _done(self, result: Any, waiting: list[defer.Deferred]) -> None:
        self._busy = False
        clean_failure(result)  # its frames hold the run's items
        if isinstance(result, Failure) and self._on_failure is not None:
            self._on_failure(result)
            result = None
        elif not isinstance(result, Failure) and self._on_result is not None:
            self._on_result(result)
            result = None
        for d in waiting:
            if isinstance(result, Failure):
                d.errback(result)
            else:
                d.callback(result)
        if self._queued:
            self._run()
        else:
            idle, self._idle = self._idle, []
            for d in idle:
                d.callback(None)

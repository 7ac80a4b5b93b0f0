"""Running a source's costly per-message work off the reactor thread, one item at a time.

A codec that hands out deferred work (the forward codec's ``DeferredMessage``, whose
``parts()`` inflate and unpack a big message part by part) has it run here:

- ``OffloadPool``: a small thread pool of the source's own. The reactor's default pool
  serves the spool and the sinks, which must never queue behind a 250 MiB message.
- ``IteratorRun``: pulls an iterator's items one at a time in that pool and hands each
  to the reactor thread before the next is built, so a message never exists whole in
  memory and the caller can hold production back (durability, backpressure) between
  items.

The work stays charged to its sender: the source holds that connection's reading while
its message is worked on, and other connections go on being read and served.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from twisted.internet import defer, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from logrouter.serial import clean_failure

_END = object()


def _next(items: Iterator[Any]) -> Any:
    return next(items, _END)


class OffloadPool:
    """Up to ``size`` worker threads, started on first use and ended by ``stop``."""

    def __init__(self, reactor: Any, size: int, name: str) -> None:
        self.reactor = reactor
        self.size = size
        self.name = name
        self._pool: ThreadPool | None = None
        self._trigger: Any = None
        self._running: set[defer.Deferred] = set()

    @property
    def running(self) -> int:
        """Calls handed to the threads and not finished (for metrics and tests)."""
        return len(self._running)

    def run(self, function: Callable[..., Any], *args: Any) -> defer.Deferred:
        """``function(*args)`` in a worker thread; the Deferred fires on the reactor thread."""
        if self._pool is None:
            self._pool = ThreadPool(0, self.size, name=self.name)
            self._pool.start()
            # A stop that times out must not leave threads keeping the process alive.
            self._trigger = self.reactor.addSystemEventTrigger("during", "shutdown", self._pool.stop)
        d = threads.deferToThreadPool(self.reactor, self._pool, function, *args)
        self._running.add(d)

        def finished(result: Any) -> Any:
            self._running.discard(d)
            return clean_failure(result)  # its frames hold the message being decoded

        return d.addBoth(finished)

    def stop(self) -> defer.Deferred:
        """End the threads once the calls running now are done (a thread cannot be interrupted)."""
        running = [self._watch(d) for d in self._running]

        def end(_: Any) -> None:
            pool, self._pool = self._pool, None
            if pool is not None:
                self.reactor.removeSystemEventTrigger(self._trigger)
                pool.stop()

        return defer.DeferredList(running).addCallback(end)

    @staticmethod
    def _watch(d: defer.Deferred) -> defer.Deferred:
        """A Deferred that fires when ``d`` does, without taking its result from its owner."""
        watcher: defer.Deferred = defer.Deferred()

        def fire(result: Any) -> Any:
            watcher.callback(None)
            return result

        d.addBoth(fire)
        return watcher


class IteratorRun:
    """Pulls ``items`` one by one in ``pool``; ``on_item`` gets each on the reactor thread.

    ``on_item`` may return a Deferred: the next item is only pulled once it fired (this is
    where the caller holds production back). ``start()`` returns a Deferred that fires
    with ``None`` after the last item, or fails with what the iterator raised.
    ``cancel()`` stops pulling; the item being built is thrown away when it arrives and
    the Deferred never fires.
    """

    def __init__(self, pool: OffloadPool, items: Iterator[Any], on_item: Callable[[Any], Any]) -> None:
        self.pool = pool
        self.items = items
        self.on_item = on_item
        self.cancelled = False
        self.done: defer.Deferred = defer.Deferred()

    def start(self) -> defer.Deferred:
        self._pull()
        return self.done

    def cancel(self) -> None:
        self.cancelled = True

    def _pull(self, _: Any = None) -> None:
        if not self.cancelled:
            self.pool.run(_next, self.items).addCallbacks(self._got, self._failed)

    def _got(self, item: Any) -> None:
        if self.cancelled:
            return
        if item is _END:
            self.done.callback(None)
            return
        try:
            wait = self.on_item(item)
        except Exception:
            self.cancelled = True
            self.done.errback(Failure())
            return
        if isinstance(wait, defer.Deferred):
            wait.addCallback(self._pull)
        else:
            self._pull()

    def _failed(self, failure: Failure) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.done.errback(failure)

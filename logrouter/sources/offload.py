"""Running a source's costly per-message work off the reactor thread, a step at a time,
taking turns between connections.

A codec that hands out deferred work (the forward codec's ``DeferredMessage``, whose
``steps()`` inflate and unpack a big message step by step and part by part) has it run
here:

- ``OffloadPool``: a small thread pool of the source's own. The reactor's default pool
  serves the spool and the sinks, which must never queue behind a 250 MiB message.
  Calls wait in one queue, first come first served, and at most ``size`` run at once.
- ``IteratorRun``: pulls an iterator's items one at a time in that pool and hands each
  to the reactor thread before the next is built, so a message never exists whole in
  memory and the caller can hold production back (durability, backpressure) between
  items. An iterator yields ``None`` between bounded steps of work that give no item.

Fairness follows from the two: a run has at most one call queued or running, and queues
its next one behind everyone else's, so runs take turns a step at a time. A message
waits at most one step of each other message for a thread, however long they are, and
one message never holds more than one thread. ``IteratorRun.cancel()`` withdraws a
queued call, so a stop waits for the steps running now only.

The work stays charged to its sender: the source holds that connection's reading while
its message is worked on, and other connections go on being read and served.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterator

from twisted.internet import defer, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from logrouter.serial import clean_failure

_END = object()

# Runs ``function(*args)`` somewhere; the Deferred fires with its result on the reactor thread.
Runner = Callable[..., defer.Deferred]


def _next(items: Iterator[Any]) -> Any:
    return next(items, _END)


class OffloadPool:
    """Up to ``size`` calls at once in worker threads, the rest queued in arrival order.

    The threads are started on first use and ended by ``stop``. ``runner`` replaces
    them (tests run calls when they choose to).
    """

    def __init__(self, reactor: Any, size: int, name: str, runner: Runner | None = None) -> None:
        self.reactor = reactor
        self.size = size
        self.name = name
        self._runner = runner
        self._pool: ThreadPool | None = None
        self._trigger: Any = None
        self._queue: collections.deque[tuple[Callable[..., Any], tuple[Any, ...], defer.Deferred]] = collections.deque()
        self._running: set[defer.Deferred] = set()
        self._stopping = False

    @property
    def running(self) -> int:
        """Calls handed to the threads and not finished (for metrics and tests)."""
        return len(self._running)

    @property
    def queued(self) -> int:
        """Calls waiting for a thread."""
        return len(self._queue)

    def run(self, function: Callable[..., Any], *args: Any) -> defer.Deferred:
        """``function(*args)`` in a worker thread once one is free; the Deferred fires on
        the reactor thread. Cancelling it withdraws a call still queued; one already
        running is finished and its result thrown away. While a stop waits, calls fail
        with ``CancelledError`` at once."""
        if self._stopping:
            return defer.fail(defer.CancelledError(f"{self.name} is stopping"))
        d: defer.Deferred = defer.Deferred(self._withdraw)
        self._queue.append((function, args, d))
        self._dispatch()
        return d

    def _withdraw(self, d: defer.Deferred) -> None:
        for index, (_, _, queued) in enumerate(self._queue):
            if queued is d:
                del self._queue[index]
                return

    def _dispatch(self) -> None:
        while self._queue and len(self._running) < self.size:
            function, args, d = self._queue.popleft()
            call = self._start(function, args)
            self._running.add(call)
            call.addBoth(self._finished, call, d)

    def _start(self, function: Callable[..., Any], args: tuple[Any, ...]) -> defer.Deferred:
        if self._runner is not None:
            return defer.maybeDeferred(self._runner, function, *args)
        if self._pool is None:
            self._pool = ThreadPool(0, self.size, name=self.name)
            self._pool.start()
            # A stop that times out must not leave threads keeping the process alive.
            self._trigger = self.reactor.addSystemEventTrigger("during", "shutdown", self._pool.stop)
        return threads.deferToThreadPool(self.reactor, self._pool, function, *args)

    def _finished(self, result: Any, call: defer.Deferred, d: defer.Deferred) -> None:
        self._running.discard(call)
        result = clean_failure(result)  # its frames hold the message being decoded
        if not d.called:  # else it was cancelled while running: the result is thrown away
            if isinstance(result, Failure):
                d.errback(result)
            else:
                d.callback(result)
        self._dispatch()

    def stop(self) -> defer.Deferred:
        """Withdraw queued calls and end the threads once the calls running now are done
        (a thread cannot be interrupted). Calls made meanwhile are refused; once it is
        done, a new call starts the threads again."""
        self._stopping = True
        while self._queue:
            self._queue[0][2].cancel()
        running = [self._watch(d) for d in self._running]

        def end(_: Any) -> None:
            self._stopping = False
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
    where the caller holds production back). A ``None`` item is a step boundary: it is
    not handed to ``on_item``, the next pull just queues behind other runs' calls.
    ``start()`` returns a Deferred that fires with ``None`` after the last item, or fails
    with what the iterator raised. ``cancel()`` stops pulling: a queued call is withdrawn,
    the item being built is thrown away when it arrives, and the Deferred never fires.
    """

    def __init__(self, pool: OffloadPool, items: Iterator[Any], on_item: Callable[[Any], Any]) -> None:
        self.pool = pool
        self.items = items
        self.on_item = on_item
        self.cancelled = False
        self.done: defer.Deferred = defer.Deferred()
        self._call: defer.Deferred | None = None

    def start(self) -> defer.Deferred:
        self._pull()
        return self.done

    def cancel(self) -> None:
        self.cancelled = True
        call, self._call = self._call, None
        if call is not None and not call.called:
            call.cancel()

    def _pull(self, _: Any = None) -> None:
        if not self.cancelled:
            call = self._call = self.pool.run(_next, self.items)
            call.addCallbacks(self._got, self._failed)

    def _got(self, item: Any) -> None:
        self._call = None
        if self.cancelled:
            return
        if item is None:
            self._pull()
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
        self._call = None
        if not self.cancelled:
            self.cancelled = True
            self.done.errback(failure)
        # else: the cancelled call's CancelledError, or a fault of a step nobody waits for

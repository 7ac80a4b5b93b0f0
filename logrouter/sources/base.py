"""The one contract every source keeps, and the context a source is built from.

The router, the service and the metrics call a source only through ``Source``:

* ``start()`` -> Deferred: listen / connect / subscribe; fires once it takes input.
* ``stop()`` -> Deferred: stop taking input, let what was stored get its replies; fires
  when done.
* ``pause_reading()`` / ``resume_reading()``: the router's backpressure. Every source
  pauses while the spool's backlog is over its bound; one whose ``PUSHES_BACK`` is true
  (not reading makes its senders wait instead of losing messages: every TCP source) also
  while a full sink's queue drains.
* ``samples()``: the metric samples it exposes, ``(name, type, labels, value)`` tuples
  (``logrouter.metrics`` renders them). Each source says what it counts; nothing outside
  the source reads its connections or counters.

Nothing in the contract assumes a TCP listener: a stream source reports its connections
in its samples, a ZeroMQ subscriber its sequence gaps, a request/reply server its
requests, each under its own metric names.

A source is built from a ``SourceContext`` (``build_source``): the router it hands
batches to (``ingest``), the reactor, a thread runner, the error path and a state
directory of its own. Every source takes ``(name, options, context)``.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Protocol, runtime_checkable

from twisted.internet import defer

from logrouter.errors import ErrorPath
from logrouter.serial import defer_to_thread

#: One metric sample: (metric name, "counter" or "gauge", labels, value).
Sample = tuple[str, str, dict[str, str], float]


@dataclass(frozen=True)
class SourceContext:
    """What a source may use of the process around it; the router builds one per router.

    ``worker`` and ``passed`` are set by a worker process (``logrouter.workers``): a
    stream source whose connections the supervisor accepts takes them from ``passed``
    instead of listening, and a source's side listener (the forward UDP heartbeat) runs
    in worker 0 only.

    ``router`` is what batches are handed to (``ingest(batch, key, writer=…)``,
    ``last_event_number(source, writer)``, ``config``). ``run_in_thread(f, *args)``
    runs blocking work off the reactor and returns a Deferred. ``errors`` is the error
    path for records that cannot be taken. ``state_dir`` is a directory for sources that
    keep state across restarts; ``state_path(name)`` gives each source its own place in it.
    """

    router: Any
    reactor: Any
    errors: ErrorPath
    state_dir: str
    run_in_thread: Callable[..., defer.Deferred] = field(default=defer_to_thread)
    # With [router] workers: this process's worker index, and where the connections the
    # supervisor accepted for shared sources come from (None in a single process).
    worker: int = 0
    passed: Any = None

    def state_path(self, source_name: str) -> str:
        """The state directory of one source (not created: a source that keeps state does that)."""
        return os.path.join(self.state_dir, source_name)


@runtime_checkable
class Source(Protocol):
    """What the router, the service and the metrics may call on any source."""

    name: str
    TYPE: ClassVar[str]

    def start(self) -> defer.Deferred: ...

    def stop(self) -> defer.Deferred: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def samples(self) -> Iterator[Sample]: ...


class SourceBase(abc.ABC):
    """A convenient base for sources that are not stream sources (ZeroMQ, request/reply).

    It keeps the context and the common labels; a subclass implements the contract's
    methods and yields its counters from ``samples()``, usually through ``counter_samples``
    for the names it declares in ``COUNTERS`` (attribute name -> help text); each becomes
    ``logrouter_source_<attribute>_total``.
    """

    TYPE: ClassVar[str] = "?"
    OPTIONS: ClassVar[dict[str, Any]] = {}
    COUNTERS: ClassVar[dict[str, str]] = {}
    # A ZeroMQ subscriber that stops reading loses what its publishers send meanwhile:
    # such a source is not held for a full sink (the spool absorbs instead).
    PUSHES_BACK: ClassVar[bool] = False

    def __init__(self, name: str, options: dict[str, Any], context: SourceContext) -> None:
        self.name = name
        self.options = options
        self.context = context
        self.router = context.router
        self.reactor = context.reactor
        for attribute in self.COUNTERS:
            setattr(self, attribute, 0)

    @abc.abstractmethod
    def start(self) -> defer.Deferred: ...

    @abc.abstractmethod
    def stop(self) -> defer.Deferred: ...

    @abc.abstractmethod
    def pause_reading(self) -> None: ...

    @abc.abstractmethod
    def resume_reading(self) -> None: ...

    def labels(self) -> dict[str, str]:
        return {"source": self.name, "type": self.TYPE}

    def samples(self) -> Iterator[Sample]:
        yield from counter_samples(self, self.labels())


def counter_samples(source: Any, labels: dict[str, str]) -> Iterator[Sample]:
    """``logrouter_source_<name>_total`` for each counter the source's class declares."""
    for attribute in type(source).COUNTERS:
        yield f"logrouter_source_{attribute}_total", "counter", labels, getattr(source, attribute)


def build_source(cls: type, name: str, options: dict[str, Any], context: SourceContext) -> Source:
    """Construct a source of ``cls`` (every source takes ``(name, options, context)``)."""
    source = cls(name, options, context)
    if not isinstance(source, Source):
        missing = [m for m in ("start", "stop", "pause_reading", "resume_reading", "samples") if not hasattr(source, m)]
        raise TypeError(f"source class {cls.__name__} does not keep the source contract: missing {', '.join(missing)}")
    return source

"""Where records that a filter or sink could not handle go: counted, logged, and routed.

A record that fails never takes its batch down with it; the component reports it here
and carries on with the rest. Every component has an ``errors`` output: when some sink
or filter takes ``<component>.errors`` as input, what that component reports becomes a
dead-letter event ``{"component", "reason", "event"}`` (the original record under
``event``, its tag kept) stored in the spool like any batch and routed to them, so
nothing that failed is only a log line. Dead letters of one spool record are stored as
one batch under the id ``(position, tag)``: a replay from the spool (a restart, a second
sink catching up through the same filter) reports the same failures again and the
router's id window stores them once. Errors reported outside the routing of a spool
record (a sink's asynchronous refusal) have no position and are stored at least once.

``UnstorableBatch`` is what the router refuses a batch with that the spool cannot hold:
sources import it from here, below them, to answer that sender only.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol

from twisted.logger import Logger

from logrouter.batch import Batch

#: a routed dead letter is logged at most this often per component (the rest are counted)
LOG_INTERVAL_SECS = 10.0


class UnstorableBatch(ValueError):
    """A batch the spool cannot hold (it cannot be encoded, or is too large): refused, never acked."""


class ErrorPath(Protocol):
    def __call__(self, component: str, tag: str, record: Any, reason: str) -> None: ...


class LoggedErrors:
    """The default error path: one log line per failed record and a counter per component."""

    log = Logger(namespace="logrouter.errors")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, component: str, tag: str, record: Any, reason: str) -> None:
        self.counts[component] = self.counts.get(component, 0) + 1
        self.log.warn(
            "{component}: record dropped to error path (tag={tag}): {reason}",
            component=component,
            tag=tag,
            reason=reason,
        )

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        """Records dropped to the error path, per filter or sink (``logrouter.metrics`` renders them)."""
        for name, count in self.counts.items():
            yield "logrouter_error_path_records_total", "counter", {"component": name}, count


class RoutedErrors(LoggedErrors):
    """The router's error path: ``LoggedErrors`` plus dead letters for the components
    whose ``errors`` output is taken (``routed``, set by the router's route builder).

    ``position`` is the spool position of the record being routed while a filter or a
    sink runs (set by the router's nodes), else None; ``pass_number`` is bumped by the
    router for each spool record it routes. Reports are gathered during a reactor turn
    and stored at its end, one batch per (component, tag, position), from the first pass
    over that record only (two sinks catching up through one filter in the same turn
    report its failures twice);
    ``pending`` says some are gathered, and ``on_flushed()`` is called once they were
    handed to the router (a stop waits for them to reach their sinks).
    """

    def __init__(self, router: Any, reactor: Any) -> None:
        super().__init__()
        self.router = router
        self.reactor = reactor
        self.routed: set[str] = set()
        self.position: int | None = None
        self.dead_letters = 0
        self.pass_number = 0
        self._pending: dict[tuple[str, str, int | None], tuple[int, list[tuple[int, dict[str, Any]]]]] = {}
        self._flush_call: Any = None
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}
        self.on_flushed: Any = lambda: None

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def __call__(self, component: str, tag: str, record: Any, reason: str) -> None:
        if component not in self.routed:
            super().__call__(component, tag, record, reason)
            return
        key = (component, tag, self.position)
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = (self.pass_number, [])
        elif pending[0] != self.pass_number and self.position is not None:
            return  # a second pass over the record reports what the first one did
        self.counts[component] = self.counts.get(component, 0) + 1
        self.dead_letters += 1
        now = self.reactor.seconds()
        event = {"component": component, "reason": reason, "event": record}
        pending[1].append((int(now * 1_000_000_000), event))
        if self._flush_call is None:
            self._flush_call = self.reactor.callLater(0, self.flush)
        self._log(component, tag, reason, now)

    def _log(self, component: str, tag: str, reason: str, now: float) -> None:
        # Routed dead letters are kept: one line now and then is enough to see them.
        last = self._logged_at.get(component)
        if last is not None and now - last < LOG_INTERVAL_SECS:
            self._unlogged[component] = self._unlogged.get(component, 0) + 1
            return
        more = self._unlogged.pop(component, 0)
        self._logged_at[component] = now
        self.log.warn(
            "{component}: record sent to {component}.errors (tag={tag}): {reason}{more}",
            component=component,
            tag=tag,
            reason=reason,
            more=f" (and {more} more since the last line)" if more else "",
        )

    def flush(self) -> None:
        """Store the dead letters gathered so far (at the end of the reactor turn)."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        pending, self._pending = self._pending, {}
        for (component, tag, position), (_, events) in pending.items():
            key = None if position is None else f"{position}|{tag}".encode("utf-8", "surrogateescape")
            d = self.router.ingest(Batch(tag, events, f"{component}.errors"), key)
            d.addErrback(
                lambda f, c=component: self.log.failure("dead letters of {component} could not be stored", f, component=c)
            )
        self.on_flushed()

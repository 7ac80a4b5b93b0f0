"""The lifecycle shared by the sinks that forward to a next hop: ``fluent_forward``,
``lumberjack`` and ``logjam``. A subclass keeps only its protocol (what goes on the wire,
which connections it keeps, what an ack means); this module owns the rest.

What the three sinks share, read from them:

1. **Start.** Open what must exist before anything is read (``_open``: the logjam sink
   binds its PUB socket; an error fails the start). Read the state file in a thread
   (``_load_state``; the fluent_forward sink also creates its spool id there), then on the
   reactor thread take the cursor (``_resume``), count it as saved, start the ticker and,
   when the protocol has them, the heartbeats (``_heartbeat_secs``), and log one line
   saying where the sink forwards from which spool position (``_log_started``).
2. **Fed.** ``write``/``advance`` as ``SinkBase`` says; ``accepting`` tells whether a
   hand-over counts (started, not failing, not stopped), and ``_hold`` is ``write`` for
   the sinks that send events rather than records. What is held is counted in
   ``queued_bytes``; the cursor passes a spool record once the next hop has all of it
   (acked, or handed to ZeroMQ where there are no acks).
3. **Ticks** (every ``STATE_SAVE_SECS``, or ``_tick_secs``): the protocol's timer work
   (``_on_tick``: the fluent_forward sink's ack timeouts; by default, telling the router
   of a cursor that moved without it, inside ``advance``), then saving the cursor in a
   thread, at most about once a second (``CursorSaver``).
4. **Failure** (``_broken``): a lost connection, a protocol error, a timeout, a socket
   error. The connections are thrown away (``_drop_connections``), everything held is
   dropped (``_drop``), and ``SinkBase.fail`` backs off and then asks the router to
   replay from the cursor; ``reset`` drops again before the replay. While stopping
   there is no retry: what was not acked stays in the spool for the next start. (The
   fluent_forward sink fails only when no server is left, through ``_fail_and_drop``;
   a retry it schedules while stopping is cancelled when the stop ends.)
5. **Stop.** No more retries; ``_stop_begins`` (the fluent_forward sink stops probing);
   wait until nothing handed over is outstanding (``_drained``), the sink failed, or
   ``drain_timeout_secs`` passed (``_drain_timeout``; ``None``: no limit, as for the
   logjam sink's records still being encoded); then stop the timers, save the cursor
   (forced) and close the output (``_close_output``: connections closed gracefully, a
   ZeroMQ context terminated once the state is saved).

What stays in the subclasses, because the protocols differ: how connections are made
(one per configured server with weighted failover and heartbeat probes; one host at a
time, the next after each failure; a bound socket), what is in flight (chunks acked by
id in any order; windows acked in order, partially; nothing), and how the cursor is
tracked against those acks.

Every timer runs on the injected reactor and every blocking call goes through
``run_blocking``, so tests drive a sink with ``task.Clock`` and a synchronous runner.
"""

from __future__ import annotations

from typing import Any, ClassVar

from twisted.internet import defer, task
from twisted.python.failure import Failure

from logrouter.batch import Batch
from logrouter.serial import defer_to_thread
from logrouter.sinks.base import SinkBase
from logrouter.sinks.state import CursorSaver

STATE_SAVE_SECS = 1.0


def host_label(host: str, port: int) -> str:
    """``host:port`` as logs name a next hop (``[v6]:port`` for an IPv6 address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ForwardingSink(SinkBase):
    """A sink whose records are done once a next hop has them (see the module docstring)."""

    # The exception a failure's reason is wrapped in (logged by SinkBase.fail).
    ERROR: ClassVar[type[Exception]] = Exception
    # Whether the first heartbeat goes out at start or one interval later.
    HEARTBEAT_AT_START: ClassVar[bool] = False
    # How the drain timeout's warning says what happens to what was not acked.
    RESENT: ClassVar[str] = "sent again"

    # Blocking or CPU-heavy calls (the state file's fsync, encoding big batches, ...) run
    # through this; tests replace it with a direct call.
    run_blocking = staticmethod(defer_to_thread)

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        super().__init__(name, options, errors, reactor)
        self.started = False
        self.stopping = False
        self.stopped = False  # drained and closed: nothing is sent any more
        self._drain_waiters: list[defer.Deferred] = []
        self._notified_cursor = -1  # the cursor last reported through on_progress
        self.saver = CursorSaver(self, STATE_SAVE_SECS, self._state_extra)
        self.ticker = task.LoopingCall(self._tick)
        self.ticker.clock = reactor
        self.heartbeats = task.LoopingCall(self._heartbeat)
        self.heartbeats.clock = reactor

    @property
    def accepting(self) -> bool:
        """Whether what the router hands over now counts (else the replay brings it again)."""
        return not self.failing and self.started and not self.stopped

    def _hold(self, batch: Batch, size: int) -> int:
        """``write`` for a sink that sends events rather than records (lumberjack, logjam):
        the batch's events wait in ``unsent`` (with ``unsent_events`` and the record's
        ``_bytes_since_mark``, which the subclass keeps). The number of events held."""
        if not self.accepting:
            return 0  # the replay from the cursor brings it again
        events = batch.events
        if events:
            self.events_in += len(events)
            self.unsent.append((batch.tag, events))
            self.unsent_events += len(events)
            self.queued_bytes += size
            self._bytes_since_mark += size
        return len(events)

    # -- start ---------------------------------------------------------------------------

    def start(self) -> defer.Deferred:
        try:
            self._open()
        except Exception as e:
            return defer.fail(e)
        d = self.run_blocking(self._load_state)

        def started(loaded: Any) -> int:
            cursor = self._resume(loaded)
            self.cursor = self._notified_cursor = cursor
            self.saver.loaded(cursor)
            self.started = True
            self.ticker.start(self._tick_secs(), now=False)
            interval = self._heartbeat_secs()
            if interval is not None:
                self.heartbeats.start(interval, now=self.HEARTBEAT_AT_START)
            self._log_started(cursor)
            return cursor

        return d.addCallbacks(started, self._start_failed)

    def _open(self) -> None:
        """Before the state is read, on the reactor thread; raising fails the start."""

    def _load_state(self) -> Any:
        """Blocking (in a thread): what ``_resume`` needs; here, the saved cursor."""
        state = self.state.load() if self.state is not None else None
        return int(state["cursor"]) if state else 0

    def _resume(self, loaded: Any) -> int:
        """On the reactor thread, with what ``_load_state`` returned: the cursor to resume from."""
        return int(loaded)

    def _start_failed(self, failure: Failure) -> Failure:
        """Undo ``_open`` when the start fails."""
        return failure

    def _state_extra(self) -> dict[str, Any] | None:
        """Keys saved next to the cursor; ``None`` while there is nothing worth saving."""
        return {} if self.started else None

    def _log_started(self, cursor: int) -> None:
        raise NotImplementedError

    # -- timers --------------------------------------------------------------------------

    def _tick_secs(self) -> float:
        return STATE_SAVE_SECS

    def _tick(self) -> None:
        self._on_tick()
        self._save()

    def _on_tick(self) -> None:
        """The protocol's timer work; by default, report a cursor that moved silently."""
        if self.cursor != self._notified_cursor and not self.failing:
            self._notify()

    def _notify(self) -> None:
        self._notified_cursor = self.cursor
        self.on_progress()

    def _save(self, force: bool = False) -> defer.Deferred:
        return self.saver.save(force)

    def _heartbeat_secs(self) -> float | None:
        """The heartbeat interval, or ``None`` for a sink (or a config) without heartbeats."""
        return None

    def _heartbeat(self) -> None:
        pass

    # -- failure -------------------------------------------------------------------------

    def _broken(self, reason: str) -> None:
        """The output failed: drop it and everything held; back off; replay from the cursor."""
        if self.failing:
            return
        if self.stopping:
            # No retry while stopping: what is not acknowledged stays in the spool.
            self.failures += 1
            self.failing = True
            self.epoch += 1
            self._drop_connections()
            self.log.error("{type} sink {name} failed while stopping: {error}", type=self.TYPE, name=self.name, error=reason)
            self._drop()
            self._check_drained()
            return
        self._fail_and_drop(Failure(self.ERROR(reason)))

    def _fail_and_drop(self, failure: Failure) -> None:
        self.fail(failure)  # bumps the epoch first: what connections still report is ignored
        self._drop_connections()
        self._drop()
        self._check_drained()
        self.on_progress()

    def _drop_connections(self) -> None:
        """Throw the connections away after a failure."""

    def _drop(self) -> None:
        """Forget everything handed over; the replay from the cursor brings it again."""
        raise NotImplementedError

    def reset(self) -> None:
        """After a failure's backoff: start clean; the router replays from the cursor."""
        self._drop()

    # -- stop ----------------------------------------------------------------------------

    def stop(self) -> defer.Deferred:
        self.stopping = True
        self.cancel_retry()
        self._stop_begins()
        d: defer.Deferred = defer.Deferred()
        self._drain_waiters.append(d)
        self._check_drained()
        timer = None
        if not d.called:
            timeout = self._drain_timeout()
            if timeout is not None:
                self._log_draining(timeout)
                timer = self.reactor.callLater(timeout, self._drain_timed_out, d, timeout)

        def drained(_: Any) -> defer.Deferred:
            if timer is not None and timer.active():
                timer.cancel()
            self.stopped = True
            self.cancel_retry()  # a failure while draining must not schedule work after the stop
            if self.ticker.running:
                self.ticker.stop()
            if self.heartbeats.running:
                self.heartbeats.stop()
            return self._close_output(self._save(force=True))

        return d.addCallback(drained)

    def _stop_begins(self) -> None:
        pass

    def _drain_timeout(self) -> float | None:
        return float(self.options["drain_timeout_secs"])

    def _drained(self) -> bool:
        """Nothing handed over is still waiting for the next hop."""
        raise NotImplementedError

    def _undrained(self) -> str:
        """What is still outstanding, for the log: ``3 chunk(s) not acked``."""
        raise NotImplementedError

    def _log_draining(self, timeout: float) -> None:
        pass

    def _check_drained(self) -> None:
        if self._drain_waiters and (self.failing or not self.started or self._drained()):
            waiters, self._drain_waiters = self._drain_waiters, []
            for d in waiters:
                d.callback(None)

    def _drain_timed_out(self, d: defer.Deferred, timeout: float) -> None:
        if d.called:
            return
        self.log.warn(
            "{type} sink {name}: stopping with {undrained} after {secs:g}s; "
            "they stay in the spool and are {resent} on the next start",
            type=self.TYPE,
            name=self.name,
            undrained=self._undrained(),
            secs=timeout,
            resent=self.RESENT,
        )
        if d in self._drain_waiters:
            self._drain_waiters.remove(d)
        d.callback(None)

    def _close_output(self, saved: defer.Deferred) -> defer.Deferred:
        """The stop's last step, once the cursor's save is under way; returns when done."""
        return saved

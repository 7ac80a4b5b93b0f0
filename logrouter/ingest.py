"""Taking a source's batch in: recognise a resend, store the batch in the spool, ack it once
it is durable.

``Ingest.ingest`` runs on the reactor thread. A batch whose idempotency key (a batch id
or a writer's event number, ``logrouter.dedupe``) is already stored, or being stored, is
acked without being stored again. Any other batch is encoded as one spool record
(``logrouter.spool.record``; a batch that cannot be encoded, or is too big for a record,
is refused with ``UnstorableBatch``: its sender only) and appended to the spool, whose
writer thread writes and fsyncs it (group commit); the Deferred handed back fires on the
reactor once the record is durable (at once with ``durability = "none"``), after
``on_stored(batch, position, end, size)`` routed it. The source acks then.

A write the disk refuses stores nothing and acks nothing: the spool is marked failing,
the sources pause (``on_pressure``: ``logrouter.backpressure``) and try again after a
pause that doubles up to ``SPOOL_RETRY_SECS[1]``. The clock is injected: tests drive the
retry with ``task.Clock`` and a spool whose appends they fire.
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer
from twisted.python.failure import Failure
from twisted.logger import Logger

from logrouter import dedupe
from logrouter.batch import Batch
from logrouter.failures import UnstorableBatch
from logrouter.spool.record import encode_batch
from logrouter.spool.segment import MAX_PAYLOAD

SPOOL_RETRY_SECS = (1.0, 30.0)  # first and longest pause after the spool's disk refused a write


def _all(deferreds: list[defer.Deferred]) -> defer.Deferred:
    """Fires once every one of ``deferreds`` has, with None, or with the first failure."""
    if len(deferreds) == 1:
        return deferreds[0]
    if not deferreds:
        return defer.succeed(None)
    d = defer.DeferredList(deferreds, fireOnOneErrback=True, consumeErrors=True)
    d.addCallbacks(lambda _: None, lambda f: f.value.subFailure)
    return d


class Ingest:
    """Dedupe, spool append and ack for every batch a source hands the router.

    ``spool``: ``append(payload, durability) -> Deferred((position, end))``, ``durability``.
    ``on_stored(batch, position, end, size)``: the batch is durable; route it.
    ``on_pressure()``: the spool's state changed; tell the sources whether to read.
    ``on_settled()``: an append's outcome is known (a stop or drain waiting may go on).
    """

    log = Logger(namespace="logrouter.router")

    def __init__(
        self,
        spool: Any,
        window: dedupe.DedupeWindow,
        flow: Any,
        clock: Any,
        durability: dict[str, str],
        on_stored: Callable[[Batch, int, int, int], None],
        on_pressure: Callable[[], None] = lambda: None,
        on_settled: Callable[[], None] = lambda: None,
    ) -> None:
        self.spool = spool
        self.window = window
        self.flow = flow
        self.clock = clock
        self.durability = durability  # per source: its own `durability`, "" for the spool's
        self.on_stored = on_stored
        self.on_pressure = on_pressure
        self.on_settled = on_settled
        self.batches_in = 0
        self.events_in = 0
        self.duplicates = 0
        self.duplicate_events = 0  # Beats events recognised by their keys and left out
        self.unstorable_batches = 0
        self.failing = False  # the last spool write failed; sources wait and try again
        self.write_failures = 0
        self._retry_delay = 0.0
        self._retry_call: Any = None
        self._storing: set[defer.Deferred] = set()  # fire once each batch in the spool's queue is routed

    def ingest(
        self,
        batch: Batch,
        key: bytes | None = None,
        *,
        writer: tuple[bytes, int] | None = None,
        events: list[dedupe.EventKey | None] | None = None,
    ) -> defer.Deferred:
        """Store ``batch``; the Deferred fires once it is durable (then it is routed).

        Idempotency: ``key`` is the client's id for this batch (a forward ``chunk``, a Log
        Courier nonce): a batch whose id is already stored, or being stored, is acked
        without being stored again. ``writer`` is ``(writer id, number of the batch's last
        event)`` for senders that number their events (Pravega): a batch not numbered
        above what its writer already stored is acked without being stored again.
        ``events`` is one key per event of the batch (Beats events,
        ``logrouter.sources.event_keys``; None for an event without one): the events
        already stored are left out, and so are those another batch is storing, whose
        durability the Deferred then waits for too.
        """
        if events is not None:
            return self._ingest_events(batch, events)
        dedupe_key: tuple | None = None
        if writer is not None:
            dedupe_key = (batch.source, writer[0], writer[1])
        elif key is not None:
            dedupe_key = (batch.source, key)
        if dedupe_key is None:
            return self._store(batch, None, None)
        again = self.window.lookup(dedupe_key)
        if again is not None:
            self.duplicates += 1
            return again
        return self._store(batch, dedupe_key, dedupe.KeyClaim(self.window, dedupe_key))

    def _ingest_events(self, batch: Batch, keys: list[dedupe.EventKey | None]) -> defer.Deferred:
        claim = self.window.events.claim(batch.source, keys)
        if claim.dropped:
            self.duplicate_events += claim.dropped
            if not claim.keep:
                self.duplicates += 1
                return _all(claim.waiting)
            events = batch.events
            batch = Batch(batch.tag, [events[i] for i in claim.keep], batch.source, json_values=batch.json_values)
        return _all([self._store(batch, claim.record_key(), claim), *claim.waiting])

    def _store(self, batch: Batch, dedupe_key: tuple | None, claim: Any) -> defer.Deferred:
        """Append ``batch`` with its idempotency key; ``claim`` (``begin()``,
        ``finish(position)``, ``abandon(failure)``) hears whether it was stored."""
        try:
            payload = encode_batch(batch, dedupe_key)
            if len(payload) > MAX_PAYLOAD and batch.packed is not None:
                batch.packed = None  # what arrived is bigger than the records encoded: try those
                payload = encode_batch(batch, dedupe_key)
        except Exception as e:  # noqa: BLE001 - e.g. a record nested deeper than msgpack packs
            return self._unstorable(UnstorableBatch(f"batch cannot be stored: {type(e).__name__}: {e}"), claim)
        batch.packed = None  # in the payload now; the rest of the way reads the events
        if len(payload) > MAX_PAYLOAD:
            # A bigger record could not be read back: refuse it (this sender only) rather
            # than ack what the spool would later set aside as damage.
            return self._unstorable(
                UnstorableBatch(f"batch of {len(payload)} bytes exceeds the spool's record limit ({MAX_PAYLOAD})"), claim
            )
        if claim is not None:
            claim.begin()
        self.batches_in += 1
        self.events_in += len(batch.events)
        self.flow.stored(batch.source, len(batch.events), len(payload))
        durability = self.durability.get(batch.source) or self.spool.durability
        d = self.spool.append(payload, durability)
        d.addCallbacks(self._written, self._failed, (batch, len(payload), claim))
        routed: defer.Deferred = defer.Deferred()
        self._storing.add(routed)
        d.addBoth(self._settled, routed)
        if claim is not None:
            d.addErrback(self._not_stored, claim)
        self.on_pressure()
        if durability == "none":
            d.addErrback(lambda f: self.log.failure("spool write failed", f))
            return defer.succeed(None)
        return d

    def _unstorable(self, error: UnstorableBatch, claim: Any) -> defer.Deferred:
        self.unstorable_batches += 1
        failure = Failure(error)
        if claim is not None:
            claim.abandon(failure)  # what waits for these events is refused too
        return defer.fail(failure)

    @property
    def busy(self) -> bool:
        """Some append's outcome is not known yet."""
        return bool(self._storing)

    def idle(self) -> defer.Deferred:
        """Fires once every append under way is stored and routed, or refused."""
        return defer.DeferredList(list(self._storing), consumeErrors=True)

    def stop(self) -> None:
        """No retry after a refused write: the router stops."""
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()

    def _written(self, written: tuple[int, int], batch: Batch, size: int, claim: Any) -> None:
        position, end = written
        if self._retry_delay and not self.failing:
            self._retry_delay = 0.0
            self.log.info("spool writes succeed again")
        if claim is not None:
            claim.finish(position)
        self.on_stored(batch, position, end, size)

    def _settled(self, result: Any, routed: defer.Deferred) -> Any:
        # An append's outcome (routed, or refused) is known: a stop or drain waiting on it goes on.
        self._storing.discard(routed)
        routed.callback(None)
        self.on_settled()
        return result

    def _not_stored(self, failure: Any, claim: Any) -> Any:
        claim.abandon(failure)
        return failure

    def _failed(self, failure: Any) -> Any:
        """The disk refused a write: nothing of the batch is stored, so it is not acked.

        Sources stop reading for a while (doubling up to a limit) rather than have every
        client resend into a full disk; then they try again, by themselves, so the router
        recovers as soon as space is back. The failed batch's sender sees its connection
        closed without an ack and resends.
        """
        self.write_failures += 1
        if not self.failing:
            self.failing = True
            first, longest = SPOOL_RETRY_SECS
            self._retry_delay = min(longest, self._retry_delay * 2 or first)
            self.log.error(
                "spool write failed ({error}); nothing of the batch was stored or acked. Sources "
                "pause and try again in {delay:.0f}s",
                error=failure.getErrorMessage(),
                delay=self._retry_delay,
            )
            self._retry_call = self.clock.callLater(self._retry_delay, self._retry)
            self.on_pressure()
        return failure

    def _retry(self) -> None:
        self._retry_call = None
        self.failing = False
        self.on_pressure()

"""Ordered partial acks of one stream connection, with keepalives while the client waits.

A protocol whose client sends numbered groups of events and waits for acks (Lumberjack
windows, Log Courier payloads) hands the router each part of such a group as it is decoded.
Each part is a *step*: the events of one read, stored as one or more batches, and the ack
value that covers them (Lumberjack: the highest ``seq`` so far in the window; Log Courier:
the count of the payload's events processed so far). ``OrderedAcks`` keeps those steps in
arrival order and

- writes a step's ack only once every batch of the step is durable and every step before
  it has been acknowledged: acks leave strictly in arrival order, across keys too;
- writes one ack per run of consecutive durable steps of the same key (window, nonce),
  with the value of the run's last step (the highest contiguous progress);
- does not write again an ack that repeats the progress already acknowledged for its key
  (a value of 0 is always written: it answers an empty window);
- while something waits (a step not yet acknowledged, or whatever ``also_waiting`` says),
  writes the protocol's keepalive after every ``keepalive_secs`` in which nothing was
  written (Lumberjack: ``A`` 0; Log Courier: the current partial ``ACKN`` of the oldest
  payload still pending, possibly with count 0).

``OrderedAcks`` has no Twisted protocol of its own: time comes from the injected clock
(an ``IReactorTime``), bytes go out through the injected ``write``, and the protocol says
how an ack and a keepalive are encoded. One instance per connection; ``close`` when the
connection is lost or aborted. ``AckingConnection`` and ``AckingSource`` are the mixins
that wire it into a stream protocol and its source, so a protocol only says how its acks
and keepalives look.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Hashable


class Step:
    """One group of events waiting for its ack: ``batches`` of it are not durable yet."""

    __slots__ = ("key", "value", "batches")

    def __init__(self, key: Hashable, value: int, batches: int) -> None:
        self.key = key
        self.value = value
        self.batches = batches

    def __repr__(self) -> str:
        return f"Step(key={self.key!r}, value={self.value!r}, batches={self.batches})"


class OrderedAcks:
    """The ordered partial-ack queue and keepalive timer of one connection.

    ``encode_ack(key, value)`` gives the bytes of the ack of ``value`` for ``key``;
    ``encode_keepalive(key, value)`` those of a keepalive, given the oldest pending step's
    key and the value already acknowledged for that key (0 if none), or ``(None, 0)`` when
    no step is pending (waiting because of ``also_waiting``). Without ``encode_keepalive``,
    or with ``keepalive_secs`` 0, no keepalive is written. An encoder may return ``b""``
    to write nothing.
    """

    def __init__(
        self,
        clock: Any,
        write: Callable[[bytes], None],
        encode_ack: Callable[[Any, int], bytes],
        keepalive_secs: float = 0,
        encode_keepalive: Callable[[Any, int], bytes] | None = None,
        also_waiting: Callable[[], bool] | None = None,
    ) -> None:
        self.clock = clock
        self.write = write
        self.encode_ack = encode_ack
        self.keepalive_secs = keepalive_secs
        self.encode_keepalive = encode_keepalive
        self.also_waiting = also_waiting
        self.steps: collections.deque[Step] = collections.deque()  # not yet acknowledged, in arrival order
        self.steps_per_key: dict[Any, int] = {}
        self.acked: dict[Any, int] = {}  # value acknowledged so far, for keys with steps pending
        self.last_ack: tuple[Any, int] | None = None  # (key, value) of the last ack written
        self.idle_since = 0.0  # when something was last written, or waiting began
        self.keepalive_call: Any = None
        self.keepalives_sent = 0
        self.acks_sent = 0
        self.closed = False

    # -- steps ----------------------------------------------------------------------------

    def add(self, key: Any, value: int, batches: int = 0) -> Step:
        """A new step of ``key`` covering progress ``value``, stored as ``batches`` batches.

        Call ``durable(step)`` once per batch as it becomes durable. A step of 0 batches
        (nothing to store: an empty window, only invalid events) is ready at once and is
        acknowledged as soon as the steps before it are.
        """
        step = Step(key, value, batches)
        if self.closed:
            return step
        if not self.steps:
            self.idle_since = max(self.idle_since, self.clock.seconds())
        self.steps.append(step)
        self.steps_per_key[key] = self.steps_per_key.get(key, 0) + 1
        self._start_keepalive()
        if batches <= 0:
            self.flush()
        return step

    def durable(self, step: Step) -> None:
        """One batch of ``step`` is durable; once all are, the acks it unblocks are written."""
        step.batches -= 1
        if step.batches <= 0:
            self.flush()

    def on_durable(self, step: Step) -> Callable[[], None]:
        """``durable(step)`` as a callback (``StreamProtocol.submit``'s ``on_durable``)."""
        return lambda: self.durable(step)

    def flush(self) -> None:
        """Write the acks of every leading step that is durable: one per run of the same key."""
        if self.closed:
            return
        steps = self.steps
        frames = []
        while steps and steps[0].batches <= 0:
            step = steps.popleft()
            key = step.key
            left = self.steps_per_key[key] - 1
            if left:
                self.steps_per_key[key] = left
            else:
                del self.steps_per_key[key]
            if steps and steps[0].batches <= 0 and steps[0].key == key:
                continue  # the run goes on: only its last value is acknowledged
            frame = self._ack(key, step.value)
            if frame:
                frames.append(frame)
            if left:
                self.acked[key] = step.value
            else:
                self.acked.pop(key, None)
        if frames:
            self.acks_sent += len(frames)
            self.idle_since = self.clock.seconds()
            self.write(b"".join(frames))
        if not self.waiting():
            self._stop_keepalive()

    def _ack(self, key: Any, value: int) -> bytes:
        if value and (self.last_ack == (key, value) or self.acked.get(key) == value):
            return b""  # this exact progress was acknowledged already
        self.last_ack = (key, value)
        return self.encode_ack(key, value)

    # -- what waits ---------------------------------------------------------------------

    def pending(self) -> int:
        """Steps not acknowledged yet."""
        return len(self.steps)

    def waiting(self) -> bool:
        """The client waits for us: a step is not acknowledged, or ``also_waiting`` says so."""
        if self.closed:
            return False
        return bool(self.steps) or (self.also_waiting is not None and self.also_waiting())

    def oldest(self) -> tuple[Any, int] | None:
        """The oldest pending step's key and the value acknowledged so far for it (0 if none)."""
        if not self.steps:
            return None
        key = self.steps[0].key
        return key, self.acked.get(key, 0)

    def wait_began(self) -> None:
        """Something ``also_waiting`` covers began (e.g. reading paused mid-window): the
        keepalive interval counts from now."""
        if self.closed:
            return
        if not self.steps:
            self.idle_since = self.clock.seconds()
        self._start_keepalive()

    # -- keepalive ------------------------------------------------------------------------

    def _start_keepalive(self) -> None:
        interval = self.keepalive_secs
        if self.keepalive_call is None and interval > 0 and self.encode_keepalive is not None and not self.closed:
            delay = max(0.0, self.idle_since + interval - self.clock.seconds())
            self.keepalive_call = self.clock.callLater(delay, self._keepalive)

    def _stop_keepalive(self) -> None:
        if self.keepalive_call is not None:
            if self.keepalive_call.active():
                self.keepalive_call.cancel()
            self.keepalive_call = None

    def _keepalive(self) -> None:
        self.keepalive_call = None
        if not self.waiting():
            return
        now = self.clock.seconds()
        if now - self.idle_since >= self.keepalive_secs:
            assert self.encode_keepalive is not None
            key, value = self.oldest() or (None, 0)
            frame = self.encode_keepalive(key, value)
            self.idle_since = now
            if frame:
                self.keepalives_sent += 1
                self.write(frame)
        self._start_keepalive()

    def close(self) -> None:
        """The connection is gone or going: cancel the timer, write nothing more."""
        self.closed = True
        self._stop_keepalive()
        self.steps.clear()
        self.steps_per_key.clear()
        self.acked.clear()


class AckingConnection:
    """The glue every stream protocol with ordered partial acks needs; mix it in before
    ``StreamProtocol`` and define ``encode_ack(key, value)``, ``encode_keepalive(key,
    acked)`` and ``stalled_by_us()`` (reading paused while the client waits in the middle
    of a group, so keepalives go on).

    It builds ``self.acks`` (keepalive interval: the source's ``keepalive_secs`` option),
    restarts the idle timer whenever acks are written (the client's turn begins then),
    keeps a connection that waits for our acks from counting as idle, and closes the
    queue whenever the connection ends or aborts.
    """

    acks: OrderedAcks

    def __init__(self, source: Any) -> None:
        super().__init__(source)  # type: ignore[call-arg]
        self.acks = OrderedAcks(
            source.reactor,
            self.write_acks,
            self.encode_ack,
            source.options.get("keepalive_secs", 0),  # a protocol without keepalives has no such option
            self.encode_keepalive,
            also_waiting=self.stalled_by_us,
        )

    def encode_ack(self, key: Any, value: int) -> bytes:
        raise NotImplementedError

    def encode_keepalive(self, key: Any, acked: int) -> bytes:
        raise NotImplementedError

    def stalled_by_us(self) -> bool:
        return False

    def write_acks(self, data: bytes) -> None:
        self.send(data)  # type: ignore[attr-defined]
        self.resetTimeout()  # type: ignore[attr-defined]

    def timeoutConnection(self) -> None:
        if self.acks.waiting() and not self.closing:  # type: ignore[attr-defined]
            # The client is silent because it waits for our acks: not idle.
            self.setTimeout(self.source.options["idle_timeout_secs"])  # type: ignore[attr-defined]
            return
        super().timeoutConnection()  # type: ignore[misc]

    def store_failed(self, failure: Any) -> None:
        self.acks.close()
        super().store_failed(failure)  # type: ignore[misc]

    def close_now(self) -> None:
        self.acks.close()
        super().close_now()  # type: ignore[misc]

    def connectionLost(self, reason: Any = None) -> None:
        self.acks.close()
        super().connectionLost(reason)  # type: ignore[misc]


class AckingSource:
    """Mix in before ``StreamSource`` for ``AckingConnection`` protocols: when the router
    pauses reading, connections left waiting in the middle of a group start counting
    their keepalive interval from now."""

    def pause_reading(self) -> None:
        super().pause_reading()  # type: ignore[misc]
        for connection in self.connections:  # type: ignore[attr-defined]
            if connection.stalled_by_us():
                connection.acks.wait_began()

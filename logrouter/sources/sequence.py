"""Loss accounting for sources that cannot push back: per-stream sequence tracking.

A ZeroMQ PUB/SUB source (logjam) cannot slow its sender, so what it misses is detected
from the sender's sequence numbers and counted (DESIGN invariant 4). ``SequenceTracker``
owns that bookkeeping and nothing else: no sockets, no decoding. It is keyed by
``(endpoint, device number)``: ``endpoint`` is whatever the source connected to (its
configured ``tcp://…`` string), the device number comes from the meta frame.

Rules (docs/protocols/logjam.md §5, the C importer's ``device-tracker.c``, with our additions):

* Sequence numbers are u64; a logjam device numbers **every** message it publishes
  (heartbeats too) from 1 after start-up. So heartbeats must go through the tracker as
  well (``heartbeat``), or they would look like one lost message each.
* Serial arithmetic modulo 2**64: a step forward of ``d`` (0 < d < 2**63) loses ``d - 1``
  messages. A step that crosses the top (MAX -> 0, or MAX -> 1 for a counter that skips 0)
  is a wrap: not a loss, not a restart; 0 is never counted as lost.
* ZeroMQ delivers in order on one connection, so nothing is reordered within a stream: a
  step back is either a duplicate (the same device heard twice, e.g. through two
  endpoints) or a restart of the device. The doc gives no incarnation field (heartbeats
  carry only the device's endpoint), so:

  - back to 1 (and the last seen was not 1) -> restart;
  - back by ``duplicate_window`` or more -> restart (the C importer treats every step back
    as a restart/wrap);
  - back by less, including the same number again -> duplicate (drop it, counted) -- except
    that a duplicate directly continuing the previous duplicate (``seq == previous + 1``)
    means the device restarted and is counting up again: restart. A misjudged restart
    therefore costs at most one dropped message, not a run of them.

  On a restart the new incarnation's messages before the one seen (``seq - 1``) are
  counted as lost: they were published and we never stored them. The tail of the old
  incarnation after the last number seen is unknowable and not counted. A restart that
  already counted past the last number seen cannot be told from a gap.
* Device number 0 means "producer numbering, no gap checks" (the importer ignores it): such
  keys are counted as received and kept alive, never judged.
* The first message of a key is just stored (we were not there before it).
* Silence: the importer gives each device 6 credits, refilled by any message and taken one
  every 5 s, and reconnects at 0: about 30 s without data or heartbeat. ``silent()`` lists
  the keys quiet for ``silence_secs`` (default 30) so the source can reconnect, to the
  ``announced`` endpoint of the device's last heartbeat if it wants.
* Memory is bounded: at most ``max_keys`` streams are tracked, least recently heard first
  out (their counters leave the samples with them).

Each gap, restart, wrap and eviction is reported as a ``SequenceEvent`` to ``on_event``
(if given); a restart is also logged once, here. Gaps are not logged here (one line per gap
could flood): the source decides. Time comes from the injected clock (``IReactorTime``).
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple, Optional

from twisted.logger import Logger

from logrouter.sources.base import Sample

SEQUENCE_BITS = 64
SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
SEQUENCE_MAX = SEQUENCE_MASK
_HALF = 1 << (SEQUENCE_BITS - 1)

#: C importer: 6 credits, one taken every 5 one-second ticks (docs/protocols/logjam.md §5).
DEFAULT_SILENCE_SECS = 30.0
DEFAULT_MAX_KEYS = 4096
DEFAULT_DUPLICATE_WINDOW = 1024

LOST = "logrouter_logjam_lost_messages_total"
DUPLICATES = "logrouter_logjam_duplicates_total"
RESTARTS = "logrouter_logjam_restarts_total"
EVICTIONS = "logrouter_logjam_sequence_streams_evicted_total"


class Verdict(str, enum.Enum):
    """What the caller does with the message: store it (``NEW``) or drop it (``DUPLICATE``)."""

    NEW = "new"
    DUPLICATE = "duplicate"


class SequenceEvent(NamedTuple):
    """Something worth a log line or a debug hook: ``kind`` is ``gap``, ``restart``, ``wrap``
    or ``evicted``. ``previous`` is the last sequence seen before (None for ``evicted``'s
    unknown), ``count`` the messages lost (gap, restart) or 0."""

    kind: str
    endpoint: str
    device: int
    sequence: Optional[int]
    previous: Optional[int]
    count: int


class SilentStream(NamedTuple):
    endpoint: str
    device: int
    silent_secs: float
    announced: Optional[str]


@dataclass
class StreamCounters:
    """The state and counters of one ``(endpoint, device)`` stream."""

    last: Optional[int] = None
    received: int = 0
    lost: int = 0
    duplicates: int = 0
    restarts: int = 0
    wraps: int = 0
    last_seen: float = 0.0
    announced: Optional[str] = None
    #: sequence of the previous message if it was judged a duplicate, else None
    duplicate_run: Optional[int] = None


class SequenceTracker:
    """Per ``(endpoint, device)`` sequence bookkeeping; see the module docstring."""

    log = Logger(namespace="logrouter.source.sequence")

    def __init__(
        self,
        clock: Any,
        silence_secs: float = DEFAULT_SILENCE_SECS,
        on_event: Optional[Callable[[SequenceEvent], None]] = None,
        max_keys: int = DEFAULT_MAX_KEYS,
        duplicate_window: int = DEFAULT_DUPLICATE_WINDOW,
    ) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        if duplicate_window < 1:
            raise ValueError("duplicate_window must be at least 1")
        if silence_secs <= 0:
            raise ValueError("silence_secs must be positive")
        self.clock = clock
        self.silence_secs = float(silence_secs)
        self.on_event = on_event
        self.max_keys = max_keys
        self.duplicate_window = duplicate_window
        self.evicted = 0
        self._streams: "collections.OrderedDict[tuple[str, int], StreamCounters]" = collections.OrderedDict()

    # -- input ---------------------------------------------------------------------------

    def observe(self, endpoint: str, device: int, sequence: int, created_ms: Optional[int] = None) -> Verdict:
        """Judge one message of ``device`` heard on ``endpoint``; ``sequence`` is the meta's
        u64. ``created_ms`` is accepted for the caller's convenience and not used (it is
        the producer's clock, not monotonic per device)."""
        key = (endpoint, device)
        streams = self._streams
        stream = streams.get(key)
        if stream is None:
            stream = self._add(key)
        else:
            streams.move_to_end(key)
        stream.received += 1
        stream.last_seen = self.clock.seconds()
        last = stream.last
        if device == 0:
            return Verdict.NEW
        if last is not None:
            step = (sequence - last) & SEQUENCE_MASK
            if step == 1:  # the per-event fast path (MAX -> 0 included)
                stream.last = sequence
                stream.duplicate_run = None
                if sequence == 0:
                    self._wrap(stream, endpoint, device, sequence, last)
                return Verdict.NEW
            if 0 < step < _HALF:
                lost = step - 1
                if sequence < last:  # crossed the top: 0 is not a message of the counter
                    if sequence > 0:
                        lost -= 1
                    self._wrap(stream, endpoint, device, sequence, last)
                stream.last = sequence
                stream.duplicate_run = None
                if lost:
                    stream.lost += lost
                    self._emit("gap", endpoint, device, sequence, last, lost)
                return Verdict.NEW
            back = (last - sequence) & SEQUENCE_MASK
            run = stream.duplicate_run
            continues_run = run is not None and sequence == ((run + 1) & SEQUENCE_MASK)
            if (sequence == 1 and last != 1) or back >= self.duplicate_window or continues_run:
                self._restart(stream, endpoint, device, sequence, last)
                return Verdict.NEW
            stream.duplicates += 1
            stream.duplicate_run = sequence
            return Verdict.DUPLICATE
        stream.last = sequence
        return Verdict.NEW

    def heartbeat(
        self,
        endpoint: str,
        device: int,
        sequence: int,
        announced: Optional[str] = None,
        created_ms: Optional[int] = None,
    ) -> Verdict:
        """A device heartbeat: it uses a number of the device's counter (so it is judged like
        any message) and names the device's endpoint (``tcp://fqdn:port``), kept for
        reconnecting. The verdict matters little: a heartbeat is never stored."""
        verdict = self.observe(endpoint, device, sequence, created_ms)
        if announced:
            self._streams[(endpoint, device)].announced = announced
        return verdict

    def reconnecting(self, endpoint: str) -> None:
        """The source reconnects ``endpoint``: restart the silence timer of its streams so
        ``silent()`` gives the new connection ``silence_secs`` before naming them again."""
        now = self.clock.seconds()
        for (ep, _device), stream in self._streams.items():
            if ep == endpoint:
                stream.last_seen = now

    def forget(self, endpoint: str, device: Optional[int] = None) -> None:
        """Stop tracking ``endpoint``'s streams (all, or one device): a source removed from
        the config. Their counters leave the samples."""
        for key in [k for k in self._streams if k[0] == endpoint and (device is None or k[1] == device)]:
            del self._streams[key]

    # -- output --------------------------------------------------------------------------

    def silent(self, now: Optional[float] = None) -> list[SilentStream]:
        """Streams heard nothing from (data or heartbeat) for ``silence_secs`` or more, least
        recently heard first."""
        if now is None:
            now = self.clock.seconds()
        limit = self.silence_secs
        return [
            SilentStream(endpoint, device, now - stream.last_seen, stream.announced)
            for (endpoint, device), stream in self._streams.items()
            if now - stream.last_seen >= limit
        ]

    def silent_endpoints(self, now: Optional[float] = None) -> list[str]:
        """The endpoints every tracked stream of which is silent (what a source reconnects)."""
        if now is None:
            now = self.clock.seconds()
        quiet: dict[str, bool] = {}
        for (endpoint, _device), stream in self._streams.items():
            is_quiet = now - stream.last_seen >= self.silence_secs
            quiet[endpoint] = quiet.get(endpoint, True) and is_quiet
        return [endpoint for endpoint, q in quiet.items() if q]

    def stream(self, endpoint: str, device: int) -> Optional[StreamCounters]:
        """The live counters of one stream (None if not tracked); read, do not modify."""
        return self._streams.get((endpoint, device))

    def __len__(self) -> int:
        return len(self._streams)

    def samples(self, source_name: str) -> Iterator[Sample]:
        """Per tracked stream: lost, duplicates and restarts counters labelled
        ``{"source": source_name, "device": "<endpoint>#<device>"}``; plus how many streams
        were evicted by the key cap, labelled with the source only."""
        for (endpoint, device), stream in self._streams.items():
            labels = {"source": source_name, "device": f"{endpoint}#{device}"}
            yield LOST, "counter", labels, stream.lost
            yield DUPLICATES, "counter", labels, stream.duplicates
            yield RESTARTS, "counter", labels, stream.restarts
        yield EVICTIONS, "counter", {"source": source_name}, self.evicted

    # -- internals -----------------------------------------------------------------------

    def _add(self, key: tuple[str, int]) -> StreamCounters:
        streams = self._streams
        while len(streams) >= self.max_keys:
            (endpoint, device), old = streams.popitem(last=False)
            self.evicted += 1
            self._emit("evicted", endpoint, device, None, old.last, 0)
        stream = streams[key] = StreamCounters()
        return stream

    def _restart(self, stream: StreamCounters, endpoint: str, device: int, sequence: int, last: int) -> None:
        stream.restarts += 1
        stream.last = sequence
        stream.duplicate_run = None
        missed = max(sequence - 1, 0)
        stream.lost += missed
        self.log.info(
            "logjam device {device} at {endpoint} restarted: sequence {sequence} after {last}"
            " ({missed} messages of the new run missed)",
            device=device,
            endpoint=endpoint,
            sequence=sequence,
            last=last,
            missed=missed,
        )
        self._emit("restart", endpoint, device, sequence, last, missed)

    def _wrap(self, stream: StreamCounters, endpoint: str, device: int, sequence: int, last: int) -> None:
        stream.wraps += 1
        self._emit("wrap", endpoint, device, sequence, last, 0)

    def _emit(self, kind: str, endpoint: str, device: int, sequence: Optional[int], previous: Optional[int], count: int) -> None:
        if self.on_event is not None:
            self.on_event(SequenceEvent(kind, endpoint, device, sequence, previous, count))

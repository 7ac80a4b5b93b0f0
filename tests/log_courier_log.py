"""What a Log Courier 2.12.0 shipper's debug log says about a run: ``ShipperLog``.

The tests read the real shipper's own account (``log level: debug``) to know what it sent,
what it was acknowledged, when, and which events it sent a second time. The lines used,
all from its publisher's goroutine except the ACKN and connection lines:

- ``[E <server>] Sending payload <nonce> with N events``: a new payload is queued on the
  endpoint (logged before the transport is asked to send it);
- ``[E <server>] Resending payload <nonce> with M events``: a payload pulled back after a
  failure is sent again under its nonce, with only its M events not acknowledged yet
  (the shipper restarts its sequence: an ACKN of it counts from the first of those M);
- ``[T <local> < <server>] Received acknowledgement for nonce <nonce> with sequence S``;
- ``[T <local> - <server>] Connected``;
- ``[P <server>] Sending ping and starting pending timeout``: a PING (nothing pending);
- ``[P <server>] Forcing endpoint failure: <why>``.

**Events sent again under a new nonce.** When queueing a *new* payload fails because the
connection has just broken (``Forcing endpoint failure: invalid connection state`` right
after its ``Sending payload``, with no other send or ping in between), 2.12.0 sends its
events twice: the endpoint had already listed the payload as pending, so the failure
pulls it back for a resend under its nonce, while the publisher keeps the same events
(``nextSpool``) and later sends them as another new payload under a new nonce. That
happens from its main loop (``Holding N new events until an endpoint is ready``) and from
``tryQueueHeld`` (after an ACKN or a reconnect, no line of its own), and again for each
further failed attempt (a third copy, …). A failed *resend* keeps its nonce: no extra
copy. ``ShipperLog.sent_again`` is the number of extra event copies so made; no receiver
can tell them from new events, they are different payloads on the wire.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_STAMP = r"^\d{4}/\d\d/\d\d (\d\d):(\d\d):(\d\d\.\d+) "
_QUEUED = re.compile(_STAMP + r"\[E [^\]]+\] (Sending|Resending) payload ([0-9a-f]+) with (\d+) events$")
_ACK = re.compile(_STAMP + r".*Received acknowledgement for nonce ([0-9a-f]+) with sequence (\d+)$")
_CONNECTED = re.compile(_STAMP + r"\[T [^\]]+\] Connected$")
_PING = re.compile(_STAMP + r"\[P [^\]]+\] Sending ping and starting pending timeout$")
_FORCED = re.compile(_STAMP + r"\[P [^\]]+\] Forcing endpoint failure: (.*)$")
QUEUE_FAILED = "invalid connection state"


def _seconds(m: re.Match) -> float:
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))


@dataclass(frozen=True)
class Ack:
    at: float  # seconds since the first payload was queued
    nonce: str
    sequence: int
    size: int  # events in the send it answers (a resend counts its remainder only)


@dataclass
class _Payload:
    total: int  # events when first sent
    base: int = 0  # events acknowledged before its latest resend
    size: int = 0  # events in its latest send
    sequence: int = 0  # the highest ACKN sequence for its latest send


@dataclass
class ShipperLog:
    """Parse with ``ShipperLog.parse(text)``."""

    payloads: dict[str, _Payload] = field(default_factory=dict)
    acks: list[Ack] = field(default_factory=list)
    connections: int = 0
    failures: list[str] = field(default_factory=list)
    sent_again: int = 0

    @classmethod
    def parse(cls, text: str) -> "ShipperLog":
        log = cls()
        start: float | None = None
        last_queued: tuple[bool, int] | None = None  # (a new payload, its events)
        for line in text.splitlines():
            if m := _QUEUED.search(line):
                start = _seconds(m) if start is None else start
                new, nonce, events = m.group(4) == "Sending", m.group(5), int(m.group(6))
                payload = log.payloads.get(nonce)
                if payload is None:
                    payload = log.payloads[nonce] = _Payload(total=events)
                payload.base = payload.total - events
                payload.size, payload.sequence = events, 0
                last_queued = (new, events)
            elif m := _ACK.search(line):
                nonce, sequence = m.group(4), int(m.group(5))
                payload = log.payloads.get(nonce)
                size = payload.size if payload else 0
                if payload is not None:
                    payload.sequence = max(payload.sequence, min(sequence, size))
                log.acks.append(Ack(_seconds(m) - (start if start is not None else _seconds(m)), nonce, sequence, size))
            elif _CONNECTED.search(line):
                log.connections += 1
            elif _PING.search(line):
                last_queued = None
            elif m := _FORCED.search(line):
                why = m.group(4)
                log.failures.append(why)
                if why == QUEUE_FAILED and last_queued is not None and last_queued[0]:
                    log.sent_again += last_queued[1]
                last_queued = None
        return log

    @property
    def acknowledged(self) -> int:
        """Events acknowledged so far, over all payloads (resends counted once)."""
        return sum(p.base + p.sequence for p in self.payloads.values())

    def partial_steps(self) -> list[Ack]:
        """ACKNs that acknowledged part of a send, above 0 (Log Carver's split steps)."""
        return [a for a in self.acks if 0 < a.sequence < a.size]

    def zeros(self) -> list[Ack]:
        """ACKNs with sequence 0: a payload is alive, nothing of it done yet."""
        return [a for a in self.acks if a.sequence == 0]

    def repeats(self) -> list[Ack]:
        """ACKNs repeating, above 0, the sequence already acknowledged for their nonce."""
        seen: dict[str, int] = {}
        out = []
        for a in self.acks:
            if a.sequence and seen.get(a.nonce) == a.sequence:
                out.append(a)
            seen[a.nonce] = max(seen.get(a.nonce, 0), a.sequence)
        return out

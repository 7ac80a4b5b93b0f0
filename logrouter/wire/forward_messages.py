"""What a forward decoder hands out (``ForwardDecoder.feed``): ``EventMessage`` (a tag and
its events), ``Heartbeat`` (a msgpack ``nil``), and ``DeferredMessage`` (a framed message
whose events are built later, in parts, by ``forward_offload``). Pure, no Twisted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_PART_BYTES", "HEARTBEAT", "DeferredMessage", "EventMessage", "Heartbeat"]

DEFAULT_PART_BYTES = 8 * 1024 * 1024


@dataclass(slots=True)
class EventMessage:
    """One forward request: a tag and its valid events.

    ``chunk`` is the ``chunk`` option's bytes exactly as received (None when the client
    wants no ack); echo it unchanged. ``invalid`` counts events skipped for a bad time or a
    record that is not a map: like fluentd, the request is still acked. ``size_bytes`` is
    the message's size on the wire (characters in JSON mode), for metrics.

    ``packed`` is set for a (Compressed)PackedForward message decoded whole: the exact
    bytes of its entries (inflated) and the clock reading its time-0 entries got (None
    if none needed one). ``decode_entries(*packed)`` gives ``events`` and ``invalid``
    again, exactly, so the spool can store the bytes that arrived.
    """

    tag: str
    events: list[tuple[int, dict[str, Any]]]
    chunk: bytes | None
    options: dict[str, Any]
    invalid: int
    size_bytes: int
    packed: tuple[bytes, int | None] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A msgpack ``nil`` message: a TCP keepalive no-op (section 9)."""


HEARTBEAT = Heartbeat()


class DeferredMessage:
    """A framed message whose events cost too much to build inside ``feed``.

    ``parts()`` builds them: ``EventMessage`` objects in order, each with the message's
    tag, chunk and options and the events of about ``part_bytes`` of its entries, so only
    one part's events need to exist at a time. It is pure and may run on another thread
    (one thread at a time). Everything that makes the whole message bad (a compression
    bomb, corrupt or truncated compressed data, garbage or a cut in the entries) is found
    by a first pass that builds nothing, and raised as ``ForwardDecodeError`` before any
    part is yielded; only a fault that shows once values are built (a malformed msgpack
    Timestamp, an array used as a map key) can stop it after earlier parts. The parts of
    one message always come out the same, so a resend splits the same way. The first
    part's ``size_bytes`` is the message's wire size, later parts have 0. A message the
    bomb rule refuses (``forward_entries``) raises ``EntryBombError``, from the first pass
    when its entries are not even pairs, else once the parts have looked at its entries.

    ``steps()`` is ``parts()`` with ``None`` between bounded steps of work (an inflated
    piece or step of at most 1 MiB, a JSON parse, 65536 parsed entries, a part's packed
    entries joined and handed out): a scheduler
    takes turns between messages there, and a stop can leave a message there.
    """

    __slots__ = ("size_bytes", "tag", "_produce")

    def __init__(
        self, size_bytes: int, produce: Callable[[int], Iterator[EventMessage | None]], tag: str | None = None
    ) -> None:
        self.size_bytes = size_bytes
        #: The message's tag where framing it read it already (not for a JSON text, parsed later).
        self.tag = tag
        self._produce = produce

    def steps(self, part_bytes: int = DEFAULT_PART_BYTES) -> Iterator[EventMessage | None]:
        return self._produce(part_bytes)

    def parts(self, part_bytes: int = DEFAULT_PART_BYTES) -> Iterator[EventMessage]:
        return (part for part in self._produce(part_bytes) if part is not None)

    def decode(self) -> EventMessage:
        """The whole message at once, as ``feed`` returns it without ``offload_bytes``."""
        events: list[tuple[int, dict[str, Any]]] = []
        invalid = 0
        first = None
        for part in self.parts():
            first = first or part
            events += part.events
            invalid += part.invalid
        assert first is not None  # every producer yields at least one part
        return EventMessage(first.tag, events, first.chunk, first.options, invalid, self.size_bytes)

    def __repr__(self) -> str:
        return f"<DeferredMessage of {self.size_bytes} bytes>"

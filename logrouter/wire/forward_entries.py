"""The entries of a forward message: which ``[time, record]`` entries are events, and
how many invalid ones a message may make the decoder look at (pure, no Twisted).

- ``collect_events``: the per-event path shared by every carrier mode. An entry is an
  event when it is a pair whose record is a map and whose time fits int64 nanoseconds
  (``time_ns_of``); any other entry is invalid: counted and skipped, as in_forward does.
- The bomb rule (``EntryTally``): an invalid entry costs as much to look at as a valid
  one and leaves nothing to store, so a message made of them (a gzip blob of zeros is
  262 million one-byte entries per 245 KB) is refused instead of worked through. A
  message is refused once at least ``BOMB_MIN_INVALID`` of its entries looked at are
  invalid and they are more than ``BOMB_RATIO`` times the valid ones; it is judged
  after every invalid entry, in order. So a message costs at most ``BOMB_MIN_INVALID``
  plus ``BOMB_RATIO`` invalid entries per valid event, and one with a few invalid
  entries among valid ones is kept, minus those, as before.
- ``ForwardDecodeError``, the codec's error (``fluent_forward`` re-exports it), and its
  kind ``EntryBombError`` for a message refused by the rule.
- ``new_unpacker``: the msgpack unpacker every part of the codec reads entries with
  (EventTime comes out as ``EventNanos``, strings decode losslessly), and
  ``msgpack_problem``, which says what msgpack refused where.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from logrouter.wire.errors import DecodeError

__all__ = [
    "BOMB_MIN_INVALID",
    "BOMB_RATIO",
    "EVENT_TIME",
    "EVENT_TIME_EXT_CODE",
    "EntryBombError",
    "EntryTally",
    "EventNanos",
    "ForwardDecodeError",
    "MAX_TIME_NS",
    "MIN_TIME_NS",
    "MSGPACK_ERRORS",
    "NANOS_PER_SECOND",
    "byte_in",
    "collect_events",
    "ext_hook",
    "msgpack_problem",
    "new_unpacker",
    "str_keyed",
    "time_ns_of",
]

NANOS_PER_SECOND = 1_000_000_000
# The int64 nanosecond range, and the whole seconds that stay inside it once scaled.
MIN_TIME_NS = -(1 << 63)
MAX_TIME_NS = (1 << 63) - 1
_MAX_SECONDS = MAX_TIME_NS // NANOS_PER_SECOND  # 9223372036
_MIN_SECONDS = -_MAX_SECONDS  # -9223372036 s scales to just above MIN_TIME_NS

# Real senders (fluentd, Fluent Bit, the fluent-loggers) send no invalid entries at all;
# thousands of them, outnumbering the events many times over, are garbage or an attack.
BOMB_MIN_INVALID = 4096
BOMB_RATIO = 16


class ForwardDecodeError(DecodeError):
    """Input the forward decoder cannot decode.

    ``messages`` holds the messages decoded from the same ``feed`` call before the bad
    input; the caller may act on them or drop them (the client resends unacked chunks).
    """

    def __init__(self, reason: str, fatal: bool = True) -> None:
        super().__init__(reason, fatal)
        self.messages: list[Any] = []


class EntryBombError(ForwardDecodeError):
    """A message refused by the bomb rule, after ``valid`` + ``invalid`` entries looked at.

    The reason leaves the counts out: a message is refused with the same words whether it
    was decoded on the reactor or in parts (whose first pass may see the fault sooner).
    """

    def __init__(self, valid: int, invalid: int) -> None:
        super().__init__(
            f"message refused as a bomb: {BOMB_MIN_INVALID} or more of its entries are invalid, "
            f"over {BOMB_RATIO} per valid one"
        )
        self.valid = valid
        self.invalid = invalid


def is_bomb(valid: int, invalid: int) -> bool:
    """The bomb rule over the entries looked at so far."""
    return invalid >= BOMB_MIN_INVALID and invalid > BOMB_RATIO * valid


class EntryTally:
    """The entries of one message looked at so far, for a message decoded in several calls.

    ``bounded=False`` turns the rule off (the spool replays blobs it stored: they passed).
    """

    __slots__ = ("valid", "invalid", "bounded")

    def __init__(self, bounded: bool = True) -> None:
        self.valid = 0
        self.invalid = 0
        self.bounded = bounded


class EventNanos(int):
    """An EventTime already converted to nanoseconds by the unpacker's ext hook.

    Being a distinct type is what tells the event loop not to scale it as seconds. It
    only escapes the decoder inside records (an EventTime nested in a record value).
    """

    __slots__ = ()


def time_ns_of(value: Any) -> int | None:
    """The slow path for times that are not EventTime or in-range int seconds; None if invalid.

    Every time it returns fits int64 nanoseconds (see ``fluent_forward``'s docstring).
    """
    kind = type(value)
    if kind is int:
        return value * NANOS_PER_SECOND if _MIN_SECONDS <= value <= _MAX_SECONDS else None
    if kind is EventNanos:
        return int(value)  # u32 seconds and u32 nanoseconds: always in range
    if kind is float:
        # fluentd rejects floats; we accept them as seconds rather than drop the event.
        # The bound comes first: round() of an infinite product raises OverflowError.
        if not -9.3e9 < value < 9.3e9:  # also false for NaN
            return None
        time_ns = round(value * NANOS_PER_SECOND)
    elif kind is msgpack.Timestamp:  # ext -1 (fluentd's enable_msgpack_time_support)
        time_ns = value.to_unix_nano()
    elif kind is list and value and type(value[0]) is not list:
        return time_ns_of(value[0])  # Fluent Bit's [time, metadata] (section 5)
    else:
        return None
    return time_ns if MIN_TIME_NS <= time_ns <= MAX_TIME_NS else None


def str_keyed(record: dict[Any, Any]) -> dict[str, Any]:
    """A copy of ``record`` with str keys: bin keys decode as UTF-8 losslessly, others via str()."""
    return {
        key if type(key) is str
        else key.decode("utf-8", "surrogateescape") if type(key) is bytes
        else str(key): value
        for key, value in record.items()
    }


def collect_events(
    entries: Iterable[Any], now_ns: Callable[[], int], tally: EntryTally | None = None
) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """Valid ``(time_ns, record)`` events from ``[time, record]`` entries, and the invalid count.

    ``tally`` carries the counts of the message's earlier calls and gets this call's
    added; without it the entries are a whole message. Raises ``EntryBombError`` at the
    invalid entry that breaks the bomb rule, before looking at any further entry.

    This is the per-event path: keep it to type checks and one append (the rule is
    only looked at for an invalid entry).
    """
    if tally is None:
        tally = EntryTally()
    seen_valid, seen_invalid = tally.valid, tally.invalid
    # The invalid count of this call from which the rule may refuse (never, unbounded).
    judge_from = BOMB_MIN_INVALID - seen_invalid if tally.bounded else float("inf")
    events: list[tuple[int, dict[str, Any]]] = []
    append = events.append
    invalid = 0
    now = None
    # locals: this loop runs once per event
    min_seconds, max_seconds, scale = _MIN_SECONDS, _MAX_SECONDS, NANOS_PER_SECOND
    for entry in entries:
        try:
            time, record = entry
        except (TypeError, ValueError):
            record = None
        if type(record) is not dict:
            invalid += 1
            if invalid >= judge_from and is_bomb(seen_valid + len(events), seen_invalid + invalid):
                raise EntryBombError(seen_valid + len(events), seen_invalid + invalid)
            continue
        kind = type(time)
        if kind is EventNanos:
            time_ns = time + 0  # a plain int again
        elif kind is int and min_seconds <= time <= max_seconds:
            time_ns = time * scale
        else:
            time_ns = time_ns_of(time)
            if time_ns is None:
                invalid += 1
                if invalid >= judge_from and is_bomb(seen_valid + len(events), seen_invalid + invalid):
                    raise EntryBombError(seen_valid + len(events), seen_invalid + invalid)
                continue
        if not time_ns:  # time 0 means "now" (in_forward); one clock read per message
            if now is None:
                now = now_ns()
            time_ns = now
        for key in record:
            if type(key) is not str:
                record = str_keyed(record)
                break
        append((time_ns, record))
    tally.valid = seen_valid + len(events)
    tally.invalid = seen_invalid + invalid
    return events, invalid


# -- the unpacker ------------------------------------------------------------------------

EVENT_TIME_EXT_CODE = 0
EVENT_TIME = struct.Struct(">II")  # u32 seconds, u32 nanoseconds (section 6)
# msgpack refuses nesting deeper than this (its C unpacker's fixed stack).
_MSGPACK_MAX_DEPTH = 1024


def ext_hook(code: int, data: bytes) -> Any:
    # Converting here keeps the per-event loop to a type check (see collect_events).
    # Both fixext8 (d7 00) and ext8 (c7 08 00) arrive here with 8 bytes of data.
    if code == EVENT_TIME_EXT_CODE and len(data) == 8:
        seconds, nanos = EVENT_TIME.unpack(data)
        return EventNanos(seconds * NANOS_PER_SECOND + nanos)
    return msgpack.ExtType(code, data)


def new_unpacker(max_buffer_size: int) -> msgpack.Unpacker:
    # raw=False + surrogateescape: out_forward puts binary msgpack inside a str32 and Fluent
    # Bit sends raw salt bytes as str (section 2), so strings must decode losslessly.
    return msgpack.Unpacker(
        raw=False,
        unicode_errors="surrogateescape",
        max_buffer_size=max_buffer_size,
        strict_map_key=False,
        ext_hook=ext_hook,
    )


# msgpack's own errors for garbage: FormatError/StackError/limit errors are ValueErrors,
# TypeError comes from unhashable map keys (e.g. an array used as a key).
MSGPACK_ERRORS = (ValueError, TypeError, msgpack.UnpackException)


def msgpack_problem(exc: Exception, offset: int, byte_at: Callable[[int], int | None]) -> str:
    """What was wrong, never empty: msgpack raises FormatError and StackError without a message.

    ``offset`` is where the unpacker stopped (its ``tell()``), ``byte_at`` finds the byte
    there if it is still at hand.
    """
    if isinstance(exc, msgpack.FormatError):
        byte = byte_at(offset)
        found = f"byte 0x{byte:02x}" if byte is not None else "byte"
        return f"FormatError (unexpected {found} at offset {offset})"
    if isinstance(exc, msgpack.StackError):
        return f"StackError (nested more than {_MSGPACK_MAX_DEPTH} levels deep)"
    return str(exc) or type(exc).__name__


def byte_in(data: Any, start: int) -> Callable[[int], int | None]:
    """A ``byte_at`` for ``msgpack_problem``: ``data`` holds the stream's bytes from ``start``."""

    def byte_at(offset: int) -> int | None:
        index = offset - start
        return data[index] if 0 <= index < len(data) else None

    return byte_at

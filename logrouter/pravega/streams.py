"""Scopes and streams of logrouter's Pravega controller, persisted as one JSON file.

A stream here is a name, a fixed segment count and an epoch (always 0: logrouter never
seals, scales or truncates). Segment ``n`` of a stream with ``k`` segments owns the
routing-key range ``[n/k, (n+1)/k)`` of the key space ``[0, 1)``.

Durability: every change rewrites the file atomically (temporary file, fsync, rename,
fsync of the directory) before the call returns, so a stream the client was told exists
still exists after a ``kill -9``. A file that cannot be read or makes no sense stops
startup with a ``ValueError`` instead of being silently replaced: writers would lose
their streams.

Threads: gRPC worker threads create scopes and streams while the reactor thread looks
segments up. Changes are serialised by a lock and are copy-on-write: readers take the
current (immutable) state without locking, so the reactor never waits for an fsync.

Names follow the rule of the Pravega controller (``NameUtils.validateScopeName`` /
``validateStreamName``): an optional leading ``_`` then one or more ASCII letters,
digits, ``.`` or ``-``, at most 255 characters. logrouter also refuses ``.`` and ``..``
(and ``_.``/``_..``), which Pravega allows, because segment names may end up in paths.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

from logrouter.atomic_file import replace_file

FORMAT = 1
MAX_NAME_LENGTH = 255
MAX_SEGMENTS = 1024  # per stream; larger counts are refused (responses grow with it)
_MAX_INT32 = 2**31 - 1

_NAME = re.compile(r"_?[A-Za-z0-9.\-]+")
_SEGMENT = re.compile(r"(0|[1-9][0-9]*)(?:\.#epoch\.(0|[1-9][0-9]*))?")
_EPOCH_DELIMITER = ".#epoch."


class SegmentRange(NamedTuple):
    number: int
    min_key: float
    max_key: float


@dataclass(frozen=True)
class _Stream:
    segments: int
    epoch: int = 0


# scope -> stream -> _Stream; never mutated once published (copy-on-write)
_State = dict[str, dict[str, _Stream]]


def valid_name(name: object) -> bool:
    """Whether ``name`` is a scope or stream name the Pravega controller accepts (and
    not ``.``/``..``)."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        return False
    if _NAME.fullmatch(name) is None:
        return False
    return name.lstrip("_") not in (".", "..")


def segment_id(number: int, epoch: int = 0) -> int:
    """The 64-bit segment id of the gRPC API: epoch in the high half, number in the low."""
    return (epoch << 32) | (number & 0xFFFFFFFF)


def split_segment_id(value: int) -> tuple[int, int]:
    """``(number, epoch)`` of a gRPC segment id."""
    return value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF


def segment_name(scope: str, stream: str, number: int, epoch: int = 0) -> str:
    """The wire name of a segment, ``scope/stream/<number>.#epoch.<epoch>``."""
    return f"{scope}/{stream}/{number}{_EPOCH_DELIMITER}{epoch}"


def parse_segment_name(name: str) -> tuple[str, str, int, int]:
    """``(scope, stream, number, epoch)`` of ``scope/stream/<number>[.#epoch.<epoch>]``.

    Raises ``ValueError`` for anything else: other shapes (transaction segments, table
    segments, a missing scope), invalid scope or stream names, numbers with a sign or
    leading zeros (they would name the same segment twice) or beyond 32 bits.
    """
    if not isinstance(name, str):
        raise ValueError(f"segment name must be a string, not {type(name).__name__}")
    parts = name.split("/")
    if len(parts) != 3:
        raise ValueError(f"bad segment name {name!r}: expected scope/stream/number")
    scope, stream, tail = parts
    if not valid_name(scope):
        raise ValueError(f"bad segment name {name!r}: invalid scope name {scope!r}")
    if not valid_name(stream):
        raise ValueError(f"bad segment name {name!r}: invalid stream name {stream!r}")
    match = _SEGMENT.fullmatch(tail)
    if match is None:
        raise ValueError(f"bad segment name {name!r}: expected <number> or <number>.#epoch.<epoch> after the stream")
    number = int(match.group(1))
    epoch = int(match.group(2) or 0)
    if number > _MAX_INT32 or epoch > _MAX_INT32:
        raise ValueError(f"bad segment name {name!r}: segment number or epoch out of range")
    return scope, stream, number, epoch


def key_ranges(count: int) -> list[SegmentRange]:
    """``count`` contiguous ranges splitting ``[0, 1)`` evenly, the last ending at 1.0."""
    return [SegmentRange(n, n / count, (n + 1) / count) for n in range(count)]


class StreamRegistry:
    """The controller's scopes and streams, saved to ``path`` on every change."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self._write_lock = threading.Lock()
        self._state: _State = self._load()

    # -- reading (any thread, never blocks) ---------------------------------------

    def scope_exists(self, scope: str) -> bool:
        return scope in self._state

    def scopes(self) -> list[str]:
        return sorted(self._state)

    def streams(self, scope: str) -> list[str]:
        """The streams of ``scope``, sorted (empty for an unknown scope)."""
        return sorted(self._state.get(scope, {}))

    def stream_exists(self, scope: str, stream: str) -> bool:
        return stream in self._state.get(scope, {})

    def segment_count(self, scope: str, stream: str) -> int | None:
        found = self._state.get(scope, {}).get(stream)
        return None if found is None else found.segments

    def epoch(self, scope: str, stream: str) -> int | None:
        found = self._state.get(scope, {}).get(stream)
        return None if found is None else found.epoch

    def segments(self, scope: str, stream: str) -> list[SegmentRange]:
        """The stream's current segments with their key ranges; ``KeyError`` if unknown."""
        found = self._state.get(scope, {}).get(stream)
        if found is None:
            raise KeyError(f"no stream {scope}/{stream}")
        return key_ranges(found.segments)

    def has_segment(self, segment_name: str) -> bool:
        """Whether ``segment_name`` (wire form, epoch suffix optional) is a current
        segment of a known stream."""
        try:
            scope, stream, number, epoch = parse_segment_name(segment_name)
        except ValueError:
            return False
        return self.has_segment_id(scope, stream, segment_id(number, epoch))

    def has_segment_id(self, scope: str, stream: str, value: int) -> bool:
        """Whether the gRPC segment id ``value`` is a current segment of ``scope/stream``."""
        found = self._state.get(scope, {}).get(stream)
        if found is None or value < 0:
            return False
        number, epoch = split_segment_id(value)
        return epoch == found.epoch and number < found.segments

    # -- changes (serialised, durable before they return) ------------------------

    def create_scope(self, scope: str) -> bool:
        """Create ``scope``: ``True`` if created, ``False`` if it existed.
        ``ValueError`` for an invalid name."""
        if not valid_name(scope):
            raise ValueError(f"invalid scope name {scope!r}")
        with self._write_lock:
            if scope in self._state:
                return False
            new = dict(self._state)
            new[scope] = {}
            self._publish(new)
            return True

    def create_stream(self, scope: str, stream: str, segments: int) -> str:
        """Create ``scope/stream`` with ``segments`` fixed segments (epoch 0).

        Returns ``"created"``, ``"exists"`` (the existing stream is kept as it is, even
        with another segment count), ``"no_scope"`` (also for an invalid scope name:
        such a scope cannot exist) or ``"invalid"`` (invalid stream name). A segment
        count outside ``1..MAX_SEGMENTS`` raises ``ValueError``.
        """
        if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= MAX_SEGMENTS:
            raise ValueError(f"segment count must be 1..{MAX_SEGMENTS}, not {segments!r}")
        if not valid_name(scope):
            return "no_scope"
        if not valid_name(stream):
            return "invalid"
        with self._write_lock:
            streams = self._state.get(scope)
            if streams is None:
                return "no_scope"
            if stream in streams:
                return "exists"
            new = dict(self._state)
            new[scope] = {**streams, stream: _Stream(segments)}
            self._publish(new)
            return "created"

    def _publish(self, new: _State) -> None:
        # Called with the write lock held: durable first, visible second, so a reader
        # never sees a stream that a crash could take back.
        self._save(new)
        self._state = new

    # -- the file --------------------------------------------------------------

    def _save(self, state: _State) -> None:
        document = {
            "format": FORMAT,
            "scopes": {
                scope: {"streams": {name: {"segments": s.segments, "epoch": s.epoch} for name, s in sorted(streams.items())}}
                for scope, streams in sorted(state.items())
            },
        }
        replace_file(self.path, json.dumps(document, indent=1).encode() + b"\n")

    def _load(self) -> _State:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise ValueError(f"pravega stream registry {self.path} cannot be read: {e.strerror or e}") from None
        try:
            return _parse_document(json.loads(raw))
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(
                f"pravega stream registry {self.path} is damaged ({e}); fix or remove it (removing it forgets every stream)"
            ) from None


def _parse_document(document: Any) -> _State:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not a format {FORMAT} registry")
    scopes = document.get("scopes")
    if not isinstance(scopes, dict):
        raise ValueError("no scopes object")
    state: _State = {}
    for scope, body in scopes.items():
        if not valid_name(scope):
            raise ValueError(f"invalid scope name {scope!r}")
        streams = body.get("streams") if isinstance(body, dict) else None
        if not isinstance(streams, dict):
            raise ValueError(f"scope {scope!r} has no streams object")
        state[scope] = {}
        for name, stream in streams.items():
            if not valid_name(name):
                raise ValueError(f"invalid stream name {scope}/{name!r}")
            segments = stream.get("segments") if isinstance(stream, dict) else None
            epoch = stream.get("epoch", 0) if isinstance(stream, dict) else None
            if type(segments) is not int or not 1 <= segments <= MAX_SEGMENTS:
                raise ValueError(f"stream {scope}/{name} has a bad segment count {segments!r}")
            if type(epoch) is not int or not 0 <= epoch <= _MAX_INT32:
                raise ValueError(f"stream {scope}/{name} has a bad epoch {epoch!r}")
            state[scope][name] = _Stream(segments, epoch)
    return state

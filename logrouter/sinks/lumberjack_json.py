"""Events as a Lumberjack v2 client sends them: one JSON object per event, windows of ``J``
frames (``logrouter.sinks.lumberjack`` says what goes into each object and why).

Pure functions: ``encode_window`` runs on the reactor thread for small windows and in a
worker thread for big ones.
"""

from __future__ import annotations

import json
import struct
import time
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, Callable

from logrouter.batch import Event
from logrouter.lake.extra import jsonable
from logrouter.wire import lumberjack_frames as wire

_J_HEADER = struct.Struct(">BBII")
_V2 = wire.VERSION_BYTES[2]


def _refuse(value: Any) -> Any:
    raise TypeError(f"not a JSON type: {type(value).__name__}")


def _compact_dumps() -> Callable[[Any], str]:
    """Compact ``json.dumps`` (no ASCII escaping, no NaN) without its per-call setup."""
    fallback = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode
    try:
        encoder = c_make_encoder(None, _refuse, encode_basestring, None, ":", ",", False, False, False)
    except TypeError:  # no C accelerator
        return fallback

    def dumps(value: Any) -> str:
        return "".join(encoder(value, 0))

    return dumps


_dumps = _compact_dumps()
_SECONDS: dict[int, str] = {}


def rfc3339(time_ns: int) -> str | None:
    """``2024-01-02T03:04:05.678Z`` (or ``.678901Z`` when the time has microseconds)."""
    seconds, nanos = divmod(time_ns, 1_000_000_000)
    prefix = _SECONDS.get(seconds)
    if prefix is None:
        try:
            parts = time.gmtime(seconds)
        except (OverflowError, OSError, ValueError):
            return None
        if not 0 < parts.tm_year <= 9999:
            return None
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", parts)
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        _SECONDS[seconds] = prefix
    if nanos % 1_000_000 == 0:
        return "%s.%03dZ" % (prefix, nanos // 1_000_000)
    return "%s.%06dZ" % (prefix, nanos // 1000)


def _with_field(record: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of ``record`` with ``value`` at ``path`` (objects along the path copied, not changed)."""
    head = path[0]
    if len(path) == 1:
        return {**record, head: value}
    inner = record.get(head)
    return {**record, head: _with_field(inner if isinstance(inner, dict) else {}, path[1:], value)}


def _object_text(record: dict[str, Any]) -> str:
    try:
        text = _dumps(record)
        text.encode("utf-8")  # lone surrogates (invalid UTF-8 received) raise here
        return text
    except (TypeError, ValueError, RecursionError):
        return _dumps(jsonable(record))


def tag_prefix(tag: str, tag_path: tuple[str, ...]) -> str:
    """The JSON member (``"key":value,``) that carries ``tag`` at ``tag_path`` in a record without ``tag_path[0]``."""
    if not tag_path:
        return ""
    text = _object_text({"t": tag})[5:-1]
    for key in reversed(tag_path[1:]):
        text = "{" + _dumps(key) + ":" + text + "}"
    return _dumps(tag_path[0]) + ":" + text + ","


def event_json(record: dict[str, Any], time_ns: int, tag: str, tag_path: tuple[str, ...], prefix: str | None = None) -> bytes:
    """The ``J`` payload of one event (see the module docstring); ``prefix`` is ``tag_prefix(tag, tag_path)``."""
    extra = ""
    if tag_path:
        if tag_path[0] in record:
            record = _with_field(record, tag_path, tag)
        else:
            extra = tag_prefix(tag, tag_path) if prefix is None else prefix
    if "@timestamp" not in record:
        stamp = rfc3339(time_ns)
        if stamp is not None:
            extra = '"@timestamp":"' + stamp + '",' + extra
    text = _object_text(record)
    if extra:
        text = "{" + extra[:-1] + "}" if text == "{}" else "{" + extra + text[1:]
    return text.encode("utf-8")


def encode_window(groups: list[tuple[str, list[Event]]], count: int, level: int, tag_path: tuple[str, ...]) -> bytes:
    """One window as Beats sends it: ``W`` count, then the ``J`` frames 1..count (in a ``C`` frame when ``level``)."""
    frames: list[bytes] = []
    append = frames.append
    pack = _J_HEADER.pack
    seq = 0
    for tag, events in groups:
        prefix = tag_prefix(tag, tag_path)
        for time_ns, record in events:
            payload = event_json(record, time_ns, tag, tag_path, prefix)
            seq += 1
            append(pack(_V2, wire.JSON, seq, len(payload)))
            append(payload)
    assert seq == count, (seq, count)
    body = b"".join(frames)
    if level:
        body = wire.encode_compressed(body, level, 2)
    return wire.encode_window(count, 2) + body

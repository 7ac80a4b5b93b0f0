"""logjam request bodies made into the ``logjam`` source's batches without decoding them.

Where the native extension is installed, the source's receiver thread keeps each body
the extension's strict JSON reader takes undecoded (``keeps_body``, given to the codec
as ``keep_body``: ``logrouter_native.check_documents``, a JSON object Python reads the
same way; it runs without the GIL, beside the reactor), an ``UndecodedMessage``. A body
it does not take is decoded in Python there as before, so a bad one is still dropped,
counted and answered by itself, before the sequence tracker sees it.

On the reactor the source groups the messages by tag and size as before, and
``LogjamBatches.batch`` makes each stored batch of them: where every message is
undecoded, in one native pass over their bodies (``logrouter_native.scan_logjam``,
``native/src/logjam.rs``) which gives each event its time by the source's rules (the
first of ``time_fields`` holding one: a number is ms since the epoch, a string RFC
3339; else the meta's ``created_ms``, else the arrival time), adds the metadata fields
and transcodes the records into the entries blob the lake builds its columns from
(``DocumentEvents``; ``_extra`` takes the bodies' own text of their top-level objects
and arrays, as for Beats). Such a batch carries the bodies and, per message, what its
event takes besides (``logjam-bodies``: the spool stores what arrived, and a replay
reads it through the same scan, or ``decode_bodies`` without the extension).

``decode_bodies`` is the reference, the Python path: ``dict(body)`` plus the fields
``<prefix>app``, ``…env``, ``…topic``, ``…device``, ``…sequence`` (they replace body
fields of those names), the time from ``events.time_from_fields``. A batch the scan
declines (a time-field string with an offset or another ISO form, a body that holds a
metadata field's key itself, a time before 1970 or from 2106 on), or one holding a
message decoded in Python, is built so, and stored as records, as before.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Sequence

from logrouter.batch import Batch, Event
from logrouter.native import NATIVE
from logrouter.sources.events import time_from_fields
from logrouter.spool import formats
from logrouter.wire import json_text
from logrouter.wire.json_lazy import DocumentEvents
from logrouter.wire.logjam import METADATA_NAMES, LogjamMessage, UndecodedMessage

__all__ = ["LOGJAM_BODIES", "LogjamBatches", "decode_bodies", "events_of_bodies", "fallback_ns", "keeps_body", "scan_bodies"]

_MAX_NS = (1 << 63) - 1
#: What an event takes of its message besides the body: app, env, topic, device,
#: sequence, and the time (ns) it has when no time field gives one.
Meta = tuple[str, str, str, int, int, int]


def fallback_ns(created_ms: int, now_ns: int) -> int:
    """An event's time when no time field gives one: its meta's ``created_ms``, else ``now_ns``."""
    if created_ms and created_ms * 1_000_000 <= _MAX_NS:
        return created_ms * 1_000_000
    return now_ns


def _check(data: bytes) -> bool:
    try:
        return bool(NATIVE.check_documents([data]))
    except Exception:  # noqa: BLE001 - a bug in the extension: the Python path is the reference
        return False


#: The codec's ``keep_body``: whether the extension reads a body itself (None: it is not
#: installed, every body is decoded in Python).
keeps_body = _check if NATIVE is not None else None


def _metadata_keys(prefix: str) -> tuple[str, ...]:
    return tuple(prefix + name for name in METADATA_NAMES) if prefix else ()


def _record(body: dict[str, Any], meta: Sequence[Any], keys: tuple[str, ...], time_fields: tuple[str, ...]) -> Event:
    """One message's event from its decoded body (changed in place: the caller's own)."""
    time = time_from_fields(body, time_fields, meta[5])
    if keys:
        app_key, env_key, topic_key, device_key, sequence_key = keys
        body[app_key] = meta[0]
        body[env_key] = meta[1]
        body[topic_key] = meta[2]
        body[device_key] = meta[3]
        body[sequence_key] = meta[4]
    return time, body


def decode_bodies(bodies: list[bytes], metas: list[Sequence[Any]], prefix: str, time_fields: Sequence[str]) -> list[Event]:
    """The events of ``bodies`` (each a JSON object's text) and their ``metas``, decoded in
    Python: the reference."""
    keys = _metadata_keys(prefix)
    names = tuple(time_fields)
    events = []
    for body, meta in zip(bodies, metas):
        record = json_text.loads(body)
        if record.__class__ is not dict:
            raise ValueError(f"a stored logjam body is a {type(record).__name__}, not an object")
        events.append(_record(record, meta, keys, names))
    return events


def scan_bodies(
    bodies: list[bytes], metas: list[Sequence[Any]], prefix: str, time_fields: Sequence[str]
) -> DocumentEvents | None:
    """The events of ``bodies`` and ``metas`` read by the extension, or None: decode them
    in Python (``decode_bodies``)."""
    if NATIVE is None or not bodies:
        return None
    try:
        found = NATIVE.scan_logjam(bodies, [tuple(meta) for meta in metas], prefix, list(time_fields))
    except Exception:  # noqa: BLE001 - a bug in the extension (or a field of the wrong type): the Python path
        return None
    if found is None:
        return None
    entries, buckets, texts = found
    reference = partial(decode_bodies, bodies, metas, prefix, tuple(time_fields))
    return DocumentEvents(entries, tuple(buckets), reference, texts)


def events_of_bodies(bodies: list[bytes], metas: list[Sequence[Any]], prefix: str, time_fields: Sequence[str]) -> Sequence[Event]:
    """The events of a stored ``logjam-bodies`` batch: through the scan where the extension
    takes them (the lake builds its columns from them), else ``decode_bodies``'."""
    events = scan_bodies(bodies, metas, prefix, time_fields)
    return decode_bodies(bodies, metas, prefix, time_fields) if events is None else events


# The spool's stored format of a batch made by the native scan (``logrouter.spool.formats``):
# ``events_of_bodies`` must keep giving the same events for the same stored fields (so must
# ``decode_bodies``, ``time_from_fields`` and the scan): a change to that needs a new name.
LOGJAM_BODIES = formats.register("logjam-bodies", ("bodies", "metas", "prefix", "time_fields"), events_of_bodies).name


class LogjamBatches:
    """A source's batches of messages (``batch``), by its ``metadata_prefix`` and ``time_fields``."""

    def __init__(self, prefix: str, time_fields: Sequence[str]) -> None:
        self.prefix = prefix
        self.keys = _metadata_keys(prefix)
        self.time_fields = tuple(time_fields)

    def batch(self, tag: str, messages: Sequence[LogjamMessage | UndecodedMessage], now_ns: int, source: str) -> Batch:
        """The batch of ``messages`` (in order) received ``now_ns``."""
        metas = [
            (m.app, m.env, m.topic, m.meta.device, m.meta.sequence, fallback_ns(m.meta.created_ms, now_ns)) for m in messages
        ]
        if NATIVE is not None and all(m.__class__ is UndecodedMessage for m in messages):
            bodies = [m.body for m in messages]
            events = scan_bodies(bodies, metas, self.prefix, self.time_fields)
            if events is not None:
                packed = (LOGJAM_BODIES, bodies, metas, self.prefix, list(self.time_fields))
                return Batch(tag, events, source, packed=packed, json_values=True)
        keys, names = self.keys, self.time_fields
        events = [
            _record(dict(m.body) if m.__class__ is LogjamMessage else json_text.loads(m.body), meta, keys, names)
            for m, meta in zip(messages, metas)
        ]
        return Batch(tag, events, source, json_values=True)

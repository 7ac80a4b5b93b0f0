"""logjam request bodies made into the ``logjam`` source's batches without decoding them.

Where the native extension is installed, the source's receiver thread keeps each body
undecoded (the codec's ``undecoded``) and reads it with one native pass, the bodies of a
received chunk in one call, ``LogjamBatches.read_many`` (``logrouter_native.LogjamReader``,
``native/src/logjam.rs``, the GIL released once for them all): it checks the body is a JSON object Python reads the same way, gives
the event its time by the source's rules (the first of ``time_fields`` holding one: a
number is ms since the epoch, a string RFC 3339; else the meta's ``created_ms``, else
the arrival time), adds the metadata fields and transcodes the record into an entry
the lake builds its columns from, with the JSON text of its top-level objects and
arrays (``_extra`` takes it as it came, as for Beats): a ``ScannedMessage``. A body it
does not take is decoded in Python there (``wire.decode_body``), as before, so a bad
one is still dropped, counted and answered by itself, before the sequence tracker sees
it.

On the reactor the source groups the messages by tag and size as before, and
``LogjamBatches.batch`` makes each stored batch: where every message was scanned, by
joining their entries (``join_logjam``, a copy) into ``DocumentEvents``. Such a batch
carries the bodies and, per message, what its event takes besides (``logjam-bodies``):
the spool stores what arrived, and a replay reads it through the same scan
(``scan_logjam``, the whole batch at once), or ``decode_bodies`` without the extension.

``decode_bodies`` is the reference, the Python path: ``dict(body)`` plus the fields
``<prefix>app``, ``…env``, ``…topic``, ``…device``, ``…sequence`` (they replace body
fields of those names), the time from ``events.time_from_fields``. A message the scan
declines (a body outside ``jsondoc``'s subset, a time-field string with an offset or
another ISO form, a body that holds a metadata field's key itself, a time before 1970
or from 2106 on) is decoded in Python, and a batch holding one is built so, and stored
as records, as before.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple, Sequence

from logrouter.batch import Batch, Event
from logrouter.native import NATIVE
from logrouter.sources.events import time_from_fields
from logrouter.spool import formats
from logrouter.wire import json_text
from logrouter.wire.json_lazy import DocumentEvents
from logrouter.wire.errors import detached
from logrouter.wire.logjam import METADATA_NAMES, LogjamDecodeError, LogjamMessage, Meta, UndecodedMessage, decode_body

__all__ = [
    "LOGJAM_BODIES", "LogjamBatches", "ScannedMessage", "decode_bodies", "events_of_bodies", "fallback_ns", "scan_bodies",
]

_MAX_NS = (1 << 63) - 1
_MAX_MS = _MAX_NS // 1_000_000  # the largest created_ms whose ns fit
#: What an event takes of its message besides the body (``Info``): app, env, topic,
#: device, sequence, and the time (ns) it has when no time field gives one.
Info = tuple[str, str, str, int, int, int]


class ScannedMessage(NamedTuple):
    """A data message whose body the extension read (``LogjamBatches.read_many``): ``piece`` is
    its event's entry, and its top-level containers' text, as ``join_logjam`` takes them."""

    app: str
    env: str
    topic: str
    body: bytes
    meta: Meta
    info: Info
    piece: tuple[bytes, bytes, bytes]


def fallback_ns(created_ms: int, now_ns: int) -> int:
    """An event's time when no time field gives one: its meta's ``created_ms``, else ``now_ns``."""
    if created_ms and created_ms * 1_000_000 <= _MAX_NS:
        return created_ms * 1_000_000
    return now_ns


def _metadata_keys(prefix: str) -> tuple[str, ...]:
    return tuple(prefix + name for name in METADATA_NAMES) if prefix else ()


def _event(body: dict[str, Any], info: Sequence[Any], keys: tuple[str, ...], time_fields: tuple[str, ...]) -> Event:
    """One message's event from its decoded body (changed in place: the caller's own)."""
    time = time_from_fields(body, time_fields, info[5])
    if keys:
        app_key, env_key, topic_key, device_key, sequence_key = keys
        body[app_key] = info[0]
        body[env_key] = info[1]
        body[topic_key] = info[2]
        body[device_key] = info[3]
        body[sequence_key] = info[4]
    return time, body


def decode_bodies(bodies: list[bytes], infos: list[Sequence[Any]], prefix: str, time_fields: Sequence[str]) -> list[Event]:
    """The events of ``bodies`` (each a JSON object's text) and their messages' ``infos``,
    decoded in Python: the reference."""
    keys = _metadata_keys(prefix)
    names = tuple(time_fields)
    events = []
    for body, info in zip(bodies, infos):
        record = json_text.loads(body)
        if record.__class__ is not dict:
            raise ValueError(f"a stored logjam body is a {type(record).__name__}, not an object")
        events.append(_event(record, info, keys, names))
    return events


def scan_bodies(
    bodies: list[bytes], infos: list[Sequence[Any]], prefix: str, time_fields: Sequence[str]
) -> DocumentEvents | None:
    """The events of ``bodies`` and ``infos`` read by the extension in one pass, or None:
    decode them in Python (``decode_bodies``)."""
    if NATIVE is None or not bodies:
        return None
    try:
        found = NATIVE.scan_logjam(bodies, [tuple(info) for info in infos], prefix, list(time_fields))
    except Exception:  # noqa: BLE001 - a bug in the extension (or a field of the wrong type): the Python path
        return None
    if found is None:
        return None
    entries, buckets, texts = found
    return DocumentEvents(entries, tuple(buckets), partial(decode_bodies, bodies, infos, prefix, tuple(time_fields)), texts)


def events_of_bodies(bodies: list[bytes], infos: list[Sequence[Any]], prefix: str, time_fields: Sequence[str]) -> Sequence[Event]:
    """The events of a stored ``logjam-bodies`` batch: through the scan where the extension
    takes them (the lake builds its columns from them), else ``decode_bodies``'."""
    events = scan_bodies(bodies, infos, prefix, time_fields)
    return decode_bodies(bodies, infos, prefix, time_fields) if events is None else events


# The spool's stored format of a batch of scanned messages (``logrouter.spool.formats``):
# ``events_of_bodies`` must keep giving the same events for the same stored fields (so must
# ``decode_bodies``, ``time_from_fields`` and the scan): a change to that needs a new name.
LOGJAM_BODIES = formats.register("logjam-bodies", ("bodies", "metas", "prefix", "time_fields"), events_of_bodies).name


class LogjamBatches:
    """A source's messages read (``read``, in the receiver thread) and made into batches
    (``batch``, on the reactor), by its ``metadata_prefix`` and ``time_fields``."""

    def __init__(self, prefix: str, time_fields: Sequence[str]) -> None:
        self.prefix = prefix
        self.keys = _metadata_keys(prefix)
        self.time_fields = tuple(time_fields)
        self._reader = None if NATIVE is None else NATIVE.LogjamReader(prefix, list(time_fields))
        #: whether the codec leaves bodies undecoded for ``read``
        self.native = self._reader is not None

    def read(self, message: UndecodedMessage, now_ns: int) -> ScannedMessage | LogjamMessage:
        """``message`` (received ``now_ns``) read by the extension, else decoded in Python
        (``LogjamDecodeError`` for a body that is no JSON object)."""
        found = self.read_many([message], now_ns)[0]
        if isinstance(found, Exception):
            raise found
        return found

    def read_many(self, messages: Sequence[UndecodedMessage], now_ns: int) -> list[ScannedMessage | LogjamMessage | Exception]:
        """``read`` of each of ``messages`` (received ``now_ns``), in one native call for
        them all (the GIL released once, not once a message); a body that is no JSON
        object gives its ``LogjamDecodeError`` (detached) in its place."""
        infos = []
        for message in messages:
            meta = message.meta
            created_ms = meta.created_ms
            fallback = created_ms * 1_000_000 if created_ms and created_ms <= _MAX_MS else now_ns
            infos.append((message.app, message.env, message.topic, meta.device, meta.sequence, fallback))
        try:
            if len(messages) == 1:  # holding the GIL: one body costs less than its round trip
                pieces = [self._reader.read(messages[0].body, *infos[0])]  # type: ignore[union-attr]
            else:
                pieces = self._reader.read_many([m.body for m in messages], infos)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - a bug in the extension: the Python path is the reference
            pieces = [None] * len(messages)
        out: list[ScannedMessage | LogjamMessage | Exception] = []
        for message, info, piece in zip(messages, infos, pieces):
            if piece is not None:
                out.append(ScannedMessage(message.app, message.env, message.topic, message.body, message.meta, info, piece))
                continue
            try:
                out.append(decode_body(message))
            except LogjamDecodeError as e:
                out.append(detached(e))
        return out

    def batch(self, tag: str, messages: Sequence[LogjamMessage | ScannedMessage], now_ns: int, source: str) -> Batch:
        """The batch of ``messages`` (in order); ``now_ns`` is the arrival time of those
        decoded in Python (a scanned one has its own)."""
        if all(m.__class__ is ScannedMessage for m in messages):
            try:
                found = NATIVE.join_logjam([m.piece for m in messages])
            except Exception:  # noqa: BLE001 - a bug in the extension: the Python path is the reference
                found = None
            if found is not None:
                entries, buckets, texts = found
                bodies = [m.body for m in messages]
                infos = [m.info for m in messages]
                reference = partial(decode_bodies, bodies, infos, self.prefix, self.time_fields)
                events = DocumentEvents(entries, tuple(buckets), reference, texts)
                packed = (LOGJAM_BODIES, bodies, infos, self.prefix, list(self.time_fields))
                return Batch(tag, events, source, packed=packed, json_values=True)
        keys, names = self.keys, self.time_fields
        made = []
        for m in messages:
            if m.__class__ is ScannedMessage:
                made.append(_event(json_text.loads(m.body), m.info, keys, names))
            else:
                meta = m.meta
                info = (m.app, m.env, m.topic, meta.device, meta.sequence, fallback_ns(meta.created_ms, now_ns))
                made.append(_event(dict(m.body), info, keys, names))
        return Batch(tag, made, source, json_values=True)

"""Turning decoded JSON events into batches: event time, tag templates, grouping by tag.

Shared by the sources whose events are JSON objects with an ``@timestamp`` (Lumberjack /
Beats, Log Courier): the time comes from ``@timestamp`` (RFC 3339, fractions to
nanoseconds, no offset = UTC), else the arrival time; a time the lake cannot hold (outside
int64 nanoseconds, 1677-2262) is the arrival time too. The tag comes from a template
(``"beats.${@metadata.beat}"``, see ``TagTemplate``); one read's events become one batch
per tag.

Both run once per event, so a read of many events in the usual shape (every stamp
``YYYY-MM-DDTHH:MM:SS.fffZ``, one tag for all) is done column-wise: the stamps parsed by
Arrow in one call, the tag's field read with ``map`` (``_stamp_times``,
``TagTemplate.uniform``); anything else takes the per-event loop, which gives the same.
"""

from __future__ import annotations

import calendar
import datetime
import re
import threading
from collections.abc import Sequence
from functools import partial
from itertools import repeat
from operator import itemgetter
from typing import Any, Callable

from logrouter.batch import Batch
from logrouter.spool import formats
from logrouter.wire import json_text
from logrouter.wire.json_lazy import DocumentEvents, scan_documents

NANOS = 1_000_000_000


# -- event time --------------------------------------------------------------------------

_SECONDS_CACHE: dict[str, int | None] = {}
_SECONDS_CACHE_LIMIT = 4096
_FRACTION_SCALE = [10 ** (9 - n) for n in range(10)]


_MIN_NS = -(1 << 63)
_MAX_NS = (1 << 63) - 1
_MIN_SECONDS = -(_MIN_NS // -NANOS) + 1  # whole seconds whose nanoseconds, plus a fraction, fit
_MAX_SECONDS = _MAX_NS // NANOS - 1


def _whole_seconds(prefix: str) -> int | None:
    """``YYYY-MM-DDTHH:MM:SS`` (UTC) as seconds since the epoch, cached (events of one
    window mostly share a few seconds)."""
    try:
        return _SECONDS_CACHE[prefix]
    except KeyError:
        pass
    seconds = None
    if prefix[4] == "-" and prefix[7] == "-" and prefix[10] in "Tt " and prefix[13] == ":" and prefix[16] == ":":
        try:
            seconds = calendar.timegm(datetime.datetime.fromisoformat(prefix.replace("t", "T")).timetuple())
        except ValueError:
            seconds = None
        if seconds is not None and not _MIN_SECONDS <= seconds <= _MAX_SECONDS:
            seconds = None  # the lake's int64 nanoseconds cannot hold it
    if len(_SECONDS_CACHE) >= _SECONDS_CACHE_LIMIT:
        _SECONDS_CACHE.clear()
    _SECONDS_CACHE[prefix] = seconds
    return seconds




_COLUMN_MIN = 64  # below this many events Arrow's fixed cost per call outweighs the loop
_STAMP = itemgetter("@timestamp")
_STR_ONLY = {str}


def _stamp_times(records: list[dict[str, Any]]) -> list[int] | None:
    """Every record's ``@timestamp`` as ns, parsed at once, when each is a str in the
    usual shape (a valid date, within what ``_whole_seconds`` takes); else None.

    The shape is the inline fast path's, ``YYYY-MM-DD[T ]hh:mm:ss.f{1,9}Z``: of what
    Arrow's ISO 8601 parse takes, 22 to 30 characters ending in ``Z`` is that and
    nothing else (no offset, whose fraction the slow path cuts to microseconds; no
    other separator or shorter form). Both read the same UTC instant from it, and a
    date either refuses (February 30, hour 24, second 60) refuses the whole read here,
    which the loop then takes event by event.
    """
    if len(records) < _COLUMN_MIN:
        return None
    try:
        stamps = list(map(_STAMP, records))
    except KeyError:
        return None
    # The types first: Arrow would take bytes as strings, and inferring a type from a
    # deeply nested list recurses far deeper in C++ than decoding it did.
    if set(map(type, stamps)) != _STR_ONLY:
        return None
    # pyarrow only here: the config check imports this module in every process, the
    # supervisor of [router] workers too, which never parses an event (docs/operations/memory.md)
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        array = pa.array(stamps, pa.string())
    except (pa.ArrowException, UnicodeError):  # a lone surrogate (from a "\ud800" escape)
        return None
    lengths = pc.min_max(pc.utf8_length(array))
    if lengths["min"].as_py() < 22 or lengths["max"].as_py() > 30 or not pc.all(pc.ends_with(array, "Z")).as_py():
        return None
    try:
        nanos = array.cast(pa.timestamp("ns", "UTC")).cast(pa.int64())
    except (pa.ArrowInvalid, OverflowError):
        return None
    bounds = pc.min_max(nanos)
    if bounds["min"].as_py() < _MIN_SECONDS * NANOS or bounds["max"].as_py() >= (_MAX_SECONDS + 1) * NANOS:
        return None  # _whole_seconds refuses these seconds: the loop gives them the arrival time
    return nanos.to_pylist()


def _time_of(stamp: Any, now: int) -> int:
    """``@timestamp`` as ns since the epoch, or ``now`` when it is no RFC 3339 string or
    lies outside what the lake holds (int64 ns)."""
    if stamp.__class__ is str:
        t = timestamp_ns(stamp)
        if t is not None and _MIN_NS <= t <= _MAX_NS:
            return t
    return now


def time_from_fields(body: dict[str, Any], names: tuple[str, ...], fallback_ns: int) -> int:
    """The event time in ns from the first of ``names`` in ``body`` that holds one: a
    number is milliseconds since the epoch (logjam's ``started_ms``), a string RFC 3339
    (``started_at``); a time outside int64 ns does not count. Else ``fallback_ns``."""
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        t = None
        if value.__class__ is int or value.__class__ is float:
            try:
                t = int(value * 1_000_000)
            except (OverflowError, ValueError):  # inf, nan
                t = None
        elif value.__class__ is str:
            t = timestamp_ns(value)
        if t is not None and _MIN_NS <= t <= _MAX_NS:
            return t
    return fallback_ns


def timestamp_ns(text: str) -> int | None:
    """An RFC 3339 time (``2024-01-02T03:04:05.678Z``, any fraction up to nanoseconds,
    ``Z`` or ``±HH:MM``) as nanoseconds since the epoch; None when it does not parse.

    The common Beats form (UTC, ``Z``) takes a cached fast path; offsets go through
    ``datetime.fromisoformat`` (a time without an offset is taken as UTC).
    """
    if len(text) >= 20 and text[-1] in "Zz":
        seconds = _whole_seconds(text[:19])
        if seconds is None:
            return None
        fraction = text[19:-1]
        if not fraction:
            return seconds * NANOS
        digits = fraction[1:10]
        if fraction[0] == "." and digits.isascii() and digits.isdigit() and fraction[1:].isdigit():
            return seconds * NANOS + int(digits) * _FRACTION_SCALE[len(digits)]
        return None
    try:
        parsed = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    whole = calendar.timegm(parsed.utctimetuple())
    return whole * NANOS + parsed.microsecond * 1000


# -- tags --------------------------------------------------------------------------------

_FIELD = re.compile(r"\$\{([^{}]*)\}")


def _scalar_text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


class TagTemplate:
    """A ``tag`` option: literal text with ``${field}`` references to event fields.

    ``${@metadata.beat}`` walks nested objects (``record["@metadata"]["beat"]``); a
    top-level key that itself contains the dots is found first. ``${field:-text}`` gives
    ``text`` when the field is missing, null, an object or an array; without a default
    that part is empty. Scalars are used as text (``true``/``false`` for booleans). A
    ``$`` not followed by ``{`` is literal.
    """

    def __init__(self, template: str) -> None:
        self.template = template
        self.parts: list[str | tuple[str, tuple[str, ...], str]] = []
        pos = 0
        for m in _FIELD.finditer(template):
            if m.start() > pos:
                self.parts.append(template[pos : m.start()])
            name, _, default = m.group(1).partition(":-")
            name = name.strip()
            if not name or any(not key for key in name.split(".")):
                raise ValueError(f"bad field reference {m.group(0)!r} in tag {template!r}")
            self.parts.append((name, tuple(name.split(".")), default))
            pos = m.end()
        rest = template[pos:]
        if "${" in rest:
            raise ValueError(f"unterminated '${{' in tag {template!r}")
        if rest:
            self.parts.append(rest)
        self.static: str | None = template if all(isinstance(p, str) for p in self.parts) else None
        self.render = self._compile()
        fields = [p for p in self.parts if not isinstance(p, str)]
        # prefix${field}suffix: the shape ``uniform`` reads column-wise
        self._single: tuple[str, tuple[str, ...], str, str] | None = None
        if len(fields) == 1:
            i = self.parts.index(fields[0])
            self._single = (fields[0][0], fields[0][1], "".join(self.parts[:i]), "".join(self.parts[i + 1 :]))

    def uniform(self, records: list[dict[str, Any]]) -> str | None:
        """The tag of every record, when the template has one field and each record
        holds the same str there (read column-wise); None when that cannot be said so."""
        if self._single is None or not records:
            return None
        name, keys, prefix, suffix = self._single
        level: list[Any] = records
        if len(keys) > 1:
            if any(map(dict.__contains__, records, repeat(name))):
                return None  # a top-level key with the dots in it wins: the loop sorts that out
            for key in keys[:-1]:
                level = list(map(dict.get, level, repeat(key)))
                if set(map(type, level)) != {dict}:
                    return None
        try:
            values = list(map(itemgetter(keys[-1]), level))
        except KeyError:
            return None  # a record without the field: not one tag for all
        first = values[0]
        if first.__class__ is not str or values.count(first) != len(values):
            return None
        return prefix + first + suffix

    def _compile(self) -> Callable[[dict[str, Any]], str]:
        """A renderer specialised for this template (it runs once per event)."""
        if self.static is not None:
            static = self.static
            return lambda record: static
        pieces: list[Any] = [p if isinstance(p, str) else _field_getter(*p) for p in self.parts]
        if len(pieces) <= 3 and sum(not isinstance(p, str) for p in pieces) == 1:
            # The common shape, prefix.${field}.suffix: two concatenations.
            i = next(i for i, p in enumerate(pieces) if not isinstance(p, str))
            prefix, get, suffix = "".join(pieces[:i]), pieces[i], "".join(pieces[i + 1 :])
            return lambda record: prefix + get(record) + suffix

        def render(record: dict[str, Any]) -> str:
            return "".join([p if p.__class__ is str else p(record) for p in pieces])

        return render


def _field_getter(name: str, keys: tuple[str, ...], default: str) -> Callable[[dict[str, Any]], str]:
    if len(keys) == 1:

        def get_top(record: dict[str, Any]) -> str:
            value = record.get(name)
            if value.__class__ is str:
                return value
            text = _scalar_text(value)
            return default if text is None else text

        return get_top

    def get_path(record: dict[str, Any]) -> str:
        value = record.get(name)  # a top-level key with the dots in it wins
        if value is None:
            value = record
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
                if value is None:
                    break
        if value.__class__ is str:
            return value
        text = _scalar_text(value)
        return default if text is None else text

    return get_path


def check_tag(value: str) -> None:
    TagTemplate(value)



def timed_events(records: list[dict[str, Any]], now: int) -> list[tuple[int, dict[str, Any]]]:
    """The events of ``records``: each with its ``@timestamp``'s time, else ``now``."""
    times = _stamp_times(records)
    if times is not None:
        return list(zip(times, records))
    whole_seconds = _SECONDS_CACHE.get
    fraction_scale = _FRACTION_SCALE
    events = []
    append = events.append
    last: Any = None
    t = now
    for r in records:
        stamp = r.get("@timestamp")
        if stamp != last:  # consecutive events mostly share their stamp: parse once
            last = stamp
            t = -1
            # Inline fast path for UTC with a fraction: Beats' own 2024-01-02T03:04:05.678Z,
            # and Go's RFC3339Nano (up to nine digits, trailing zeros cut).
            if stamp.__class__ is str and 21 < len(stamp) < 31 and stamp[19] == "." and stamp[-1] == "Z":
                seconds = whole_seconds(stamp[:19])
                digits = stamp[20:-1]
                if seconds is not None and digits.isascii() and digits.isdigit():
                    t = seconds * NANOS + int(digits) * fraction_scale[len(digits)]
            if t < 0:
                t = _time_of(stamp, now)
        append((t, r))
    return events




def _loads_shallow(document: bytes) -> Any:
    """``json_text.loads`` in a thread of its own: JSON decoders count nesting against
    Python's recursion limit, so whether a deep document decodes depends on how deep the
    caller's stack already is. The source decoded it on the reactor; a replay may run
    deeper, and must not lose it."""
    result: list[Any] = []

    def decode() -> None:
        try:
            result.append(json_text.loads(document))
        except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread
            result.append(e)

    thread = threading.Thread(target=decode, name="logrouter-deep-json")
    thread.start()
    thread.join()
    outcome = result.pop()
    if isinstance(outcome, BaseException):
        try:
            raise outcome
        finally:
            outcome = None  # not kept in this frame, which the raised error's traceback holds
    return outcome


def events_of_documents(documents: list[bytes], now: int, drop_metadata: bool) -> Sequence[tuple[int, dict[str, Any]]]:
    """The events ``batch_builder`` made of ``documents`` (each a JSON object's text)
    read ``now`` (the packed form ``(JSON_DOCUMENTS, documents, now, drop_metadata)``):
    kept undecoded where the native extension takes them (``wire.json_lazy``: the lake
    builds its columns from them; the events, if read, are ``decode_documents``'),
    else ``decode_documents``'."""
    found = scan_documents(documents, now, drop_metadata, [])
    if found is not None:
        entries, buckets, _, texts, _ = found
        return DocumentEvents(entries, buckets, partial(decode_documents, documents, now, drop_metadata), texts)
    return decode_documents(documents, now, drop_metadata)


def decode_documents(documents: list[bytes], now: int, drop_metadata: bool) -> list[tuple[int, dict[str, Any]]]:
    """The events of ``documents`` read ``now``, decoded in Python: the reference."""
    records = []
    for document in documents:
        try:
            record = json_text.loads(document)
        except RecursionError:
            record = _loads_shallow(document)
        if record.__class__ is not dict:
            raise ValueError(f"a stored JSON document is a {type(record).__name__}, not an object")
        records.append(record)
    if drop_metadata:
        for r in records:
            r.pop("@metadata", None)
    return timed_events(records, now)


#: What decoded records hold in memory per byte of the JSON they were decoded from:
#: 5.5 for Filebeat 8 events (``tracemalloc`` over ``decode_documents`` of 2048 of them,
#: ``bench/native_decode.filebeat``), rounded up.
DECODED_BYTES_PER_JSON_BYTE = 6
_BYTES_OBJECT = 41  # a bytes object's header and the list slot that holds it


def held_bytes(events: Sequence[tuple[int, dict[str, Any]]], document_bytes: int) -> int:
    """What a batch of ``events`` made from documents of ``document_bytes`` holds in
    memory (``Batch.held_bytes``): the native read's entries and texts and the documents
    its reference decode keeps (``DocumentEvents``), else the decoded records."""
    if isinstance(events, DocumentEvents):
        texts = events.texts
        return (
            len(events.entries)
            + (0 if texts is None else len(texts[0]) + len(texts[1]))
            + document_bytes
            + len(events) * _BYTES_OBJECT
        )
    return document_bytes * DECODED_BYTES_PER_JSON_BYTE


def _held_documents(events: Sequence[tuple[int, dict[str, Any]]], documents: list[bytes], now: int, drop_metadata: bool) -> int:
    return held_bytes(events, sum(map(len, documents)))


# The spool's stored format of a batch built here from JSON documents (see
# ``logrouter.spool.formats``). ``events_of_documents`` must keep giving the same events
# for the same stored documents (so must ``decode_documents``, ``timed_events``,
# ``_stamp_times``, ``_time_of`` and ``json_text.loads``, which it calls, and the native
# scan, which gives the same): a change to that needs a new name.
JSON_DOCUMENTS = formats.register(
    "json-documents", ("documents", "now", "drop_metadata"), events_of_documents, _held_documents
).name


def batch_builder(
    tag_template: TagTemplate, drop_metadata: bool = False
) -> Callable[..., list[Batch]]:
    """``batches(records, now_ns, documents=None)``: the per-event work, specialised once
    for a source's options. ``documents``, when given, are the texts the records were
    decoded from, one each: a batch of all of them then carries them (``Batch.packed``)
    and the spool stores them instead of encoding the records again."""
    static_tag = tag_template.static
    render = tag_template.render
    uniform = tag_template.uniform

    def batches(records: list[dict[str, Any]], now: int, documents: list[bytes] | None = None) -> list[Batch]:
        if not records:
            return []
        tag = static_tag
        if tag is None and len(records) >= _COLUMN_MIN:
            tag = uniform(records)
        by_tag: dict[str, list[dict[str, Any]]]
        if tag is not None:
            by_tag = {tag: records}
        else:
            by_tag = {}
            for r in records:
                tag = render(r)
                group = by_tag.get(tag)
                if group is None:
                    by_tag[tag] = [r]
                else:
                    group.append(r)
        packed = None
        if documents is not None and len(by_tag) == 1 and len(documents) == len(records):
            packed = (JSON_DOCUMENTS, documents, now, drop_metadata)
        if drop_metadata:  # after the tags: a template may read @metadata
            for r in records:
                r.pop("@metadata", None)
        return [Batch(tag, timed_events(group, now), json_values=True, packed=packed) for tag, group in by_tag.items()]

    return batches

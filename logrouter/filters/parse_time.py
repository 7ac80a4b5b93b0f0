"""The ``parse_time`` filter: a field's text or number becomes the event time.

Formats are tried in the order given; the first that reads the value wins:

* ``rfc3339``: ``2023-11-14T22:13:20.123456789Z`` (``T``, ``t`` or a space between date
  and time; fractions up to nanoseconds; ``Z`` or ``±HH:MM``; without an offset the
  ``timezone`` option applies);
* ``epoch`` / ``epoch_ms`` / ``epoch_us`` / ``epoch_ns``: a number, or a string of
  digits with an optional fraction, of seconds / milli- / micro- / nanoseconds since
  1970-01-01 UTC (exact: no float rounding for strings and integers);
* anything holding ``%``: a ``strptime`` pattern (``%d/%b/%Y:%H:%M:%S %z`` for an access
  log); without ``%z`` in the text the ``timezone`` option applies. Results are cached
  per text (log lines share their second), so the per-event cost is a dict lookup.

``timezone`` is an IANA name read through ``zoneinfo`` (``Europe/Berlin``), ``UTC``, or a
fixed offset ``±HH:MM``. The record itself is unchanged unless ``remove_field`` is set
or the parse fails and is flagged; a failed record keeps its old event time, and so does a
record without the field.
"""

from __future__ import annotations

import datetime
import re
import zoneinfo
from typing import Any, Callable

from logrouter import paths, registry
from logrouter.batch import Batch, Event
from logrouter.config.options import Option, list_of
from logrouter.errors import ErrorPath
from logrouter.filters.common import FailurePolicy, failure_options, replaced

EPOCH_SCALES = {"epoch": 10**9, "epoch_s": 10**9, "epoch_ms": 10**6, "epoch_us": 10**3, "epoch_ns": 1}
NAMED = ("rfc3339", *EPOCH_SCALES)
CACHE_SIZE = 4096
_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()
_UTC_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_MICROSECOND = datetime.timedelta(microseconds=1)
_RFC3339 = re.compile(
    r"\s*(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?\s*(?:([Zz])|([+-])(\d\d):?(\d\d))?\s*"
)
_DECIMAL = re.compile(r"\s*([+-]?)(\d+)(?:\.(\d*))?\s*")
_OFFSET = re.compile(r"([+-])(\d\d):?(\d\d)")
MAX_NS = 2**63 - 1


class TimeFailure(Exception):
    pass


def zone(name: str) -> datetime.tzinfo:
    """``UTC``, ``±HH:MM`` or an IANA zone name; ``ValueError`` if unknown."""
    if name.upper() in ("UTC", "Z"):
        return datetime.timezone.utc
    m = _OFFSET.fullmatch(name)
    if m:
        sign, hours, minutes = m.groups()
        delta = datetime.timedelta(hours=int(hours), minutes=int(minutes))
        return datetime.timezone(-delta if sign == "-" else delta)
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name like 'Europe/Berlin', 'UTC' or '+02:00')") from None


def _check_zone(value: str) -> None:
    zone(value)


def _check_formats(value: list[Any]) -> None:
    list_of(str)(value)
    if not value:
        raise ValueError("must name at least one format")
    for i, fmt in enumerate(value):
        if fmt not in NAMED and "%" not in fmt:
            raise ValueError(f"item {i}: unknown format {fmt!r} (one of: {', '.join(NAMED)}, or a strptime pattern with %)")


def _ns_of(dt: datetime.datetime) -> int:
    return ((dt - _UTC_EPOCH) // _MICROSECOND) * 1000


def rfc3339_reader(tz: datetime.tzinfo) -> Callable[[Any], int]:
    utc = tz is datetime.timezone.utc
    match = _RFC3339.fullmatch
    # Times of one batch mostly share their second: the UTC form ("…Z") is looked up by
    # its first 19 characters, and only the fraction is read per event.
    seconds_of: dict[str, int] = {}

    def read(value: Any) -> int:
        if value.__class__ is not str:
            raise TimeFailure("not text")
        if len(value) >= 20 and value[-1] in "Zz":
            known = seconds_of.get(value[:19])
            if known is not None:
                fraction = value[19:-1]
                if not fraction:
                    return known * 1_000_000_000
                digits = fraction[1:]
                if fraction[0] in ".," and digits.isdigit() and digits.isascii():
                    return known * 1_000_000_000 + int(digits[:9].ljust(9, "0"))
        return slow(value)

    def slow(value: str) -> int:
        m = match(value)
        if m is None:
            raise TimeFailure("not an RFC 3339 time")
        year, month, day, hour, minute, second, fraction, z, sign, oh, om = m.groups()
        h, mi, s = int(hour), int(minute), int(second)
        if h > 23 or mi > 59 or s > 60:
            raise TimeFailure("time of day out of range")
        try:
            days = datetime.date(int(year), int(month), int(day)).toordinal() - _EPOCH_ORDINAL
        except ValueError as exc:
            raise TimeFailure(str(exc)) from None
        seconds = days * 86400 + h * 3600 + mi * 60 + min(s, 59)
        if z is None:
            if sign is not None:
                offset = int(oh) * 3600 + int(om) * 60
                seconds -= offset if sign == "+" else -offset
            elif not utc:
                local = datetime.datetime(int(year), int(month), int(day), h, mi, min(s, 59), tzinfo=tz)
                seconds -= int(local.utcoffset().total_seconds())
        nanos = int(fraction[:9].ljust(9, "0")) if fraction else 0
        if z is not None and m.start(1) == 0 and m.end(6) == 19:
            if len(seconds_of) >= CACHE_SIZE:
                seconds_of.clear()
            seconds_of[value[:19]] = seconds
        return seconds * 1_000_000_000 + nanos

    return read


def epoch_reader(scale: int) -> Callable[[Any], int]:
    digits = len(str(scale)) - 1

    def read(value: Any) -> int:
        kind = value.__class__
        if kind is int:
            return value * scale
        if kind is float:
            if value != value or value in (float("inf"), float("-inf")):
                raise TimeFailure("not a finite number")
            whole = int(value)
            return whole * scale + round((value - whole) * scale)
        if kind is str:
            m = _DECIMAL.fullmatch(value)
            if m is None:
                raise TimeFailure("not a number")
            sign, whole, fraction = m.groups()
            ns = int(whole) * scale + (int((fraction or "")[:digits].ljust(digits, "0")) if digits else 0)
            return -ns if sign == "-" else ns
        raise TimeFailure("not a number")

    return read


def strptime_reader(pattern: str, tz: datetime.tzinfo) -> Callable[[Any], int]:
    cache: dict[str, int] = {}
    strptime = datetime.datetime.strptime

    def read(value: Any) -> int:
        ns = cache.get(value)
        if ns is not None:
            return ns
        if value.__class__ is not str:
            raise TimeFailure("not text")
        try:
            dt = strptime(value, pattern)
        except ValueError as exc:
            raise TimeFailure(str(exc)) from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=tz)
        ns = _ns_of(dt)
        if len(cache) >= CACHE_SIZE:
            cache.clear()
        cache[value] = ns
        return ns

    return read


def reader(fmt: str, tz: datetime.tzinfo) -> Callable[[Any], int]:
    if fmt == "rfc3339":
        return rfc3339_reader(tz)
    if fmt in EPOCH_SCALES:
        return epoch_reader(EPOCH_SCALES[fmt])
    return strptime_reader(fmt, tz)


@registry.filter("parse_time")
class ParseTimeFilter:
    """Sets each event's time from a field, by the first format that reads it."""

    OPTIONS = {
        "field": Option(str, "time", "the field holding the time: " + paths.SYNTAX, paths.check),
        "formats": Option(
            list, ["rfc3339"], "tried in order: `rfc3339`, `epoch` (seconds), `epoch_ms`, `epoch_us`, `epoch_ns`, or a "
            "strptime pattern such as `%d/%b/%Y:%H:%M:%S %z`", _check_formats
        ),
        "timezone": Option(str, "UTC", "zone of times that carry no offset: an IANA name (`Europe/Berlin`), `UTC` or `±HH:MM`", _check_zone),
        "remove_field": Option(bool, False, "remove `field` from records whose time was read"),
        **failure_options("no format reads the field"),
    }

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath) -> None:
        self.name = name
        self.errors = errors
        _check_formats(options["formats"])
        tz = zone(options["timezone"])
        path = paths.parse(options["field"])
        self._key = path[0] if len(path) == 1 else None
        self._get = paths.getter(path)
        self._remove = paths.key_path(options["field"]) if options["remove_field"] else None
        self._readers = [reader(fmt, tz) for fmt in options["formats"]]
        self._formats = options["formats"]
        self.failures = FailurePolicy(name, options, errors)

    def _read(self, value: Any) -> int:
        reasons = []
        for fmt, read in zip(self._formats, self._readers):
            try:
                ns = read(value)
            except TimeFailure as exc:
                reasons.append(f"{fmt}: {exc}")
                continue
            except (ValueError, OverflowError, TypeError) as exc:
                reasons.append(f"{fmt}: {exc}")
                continue
            if not -MAX_NS <= ns <= MAX_NS:
                reasons.append(f"{fmt}: out of range")
                continue
            return ns
        raise TimeFailure(f"{value!r} matches no format ({'; '.join(reasons)})")

    def process(self, batch: Batch) -> Batch | None:
        key, get, remove = self._key, self._get, self._remove
        read = self._read
        single = self._readers[0] if len(self._readers) == 1 else read
        fail = self.failures.fail
        out: list[Event] = []
        append = out.append
        for event in batch.events:
            record = event[1]
            try:
                value = record.get(key) if key is not None else get(record)
                if value is None:
                    append(event)  # nothing to read: the event keeps its time
                    continue
                try:
                    ns = single(value)  # type: ignore[misc]
                    if not -MAX_NS <= ns <= MAX_NS:
                        raise TimeFailure("out of range")
                except Exception:
                    ns = read(value)  # every format in turn; raises with every reason
                if remove is not None:
                    record = paths.without(record, remove)
            except TimeFailure as exc:
                failed = fail(batch.tag, event, f"parse_time: {exc}")
                if failed is not None:
                    append(failed)
                continue
            except Exception as exc:
                failed = fail(batch.tag, event, f"parse_time: {type(exc).__name__}: {exc}")
                if failed is not None:
                    append(failed)
                continue
            append((ns, record))
        return replaced(batch, out)

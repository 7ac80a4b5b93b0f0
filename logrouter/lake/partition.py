"""Where an event lands in the lake: Hive-style partition directories.

Owns the partition layout ``tag=<tag>/dt=YYYY-MM-DD/hour=HH`` (UTC, from the event
time), the escaping of partition values, and splitting a batch's events by hour.

Escaping follows Hive (``FileUtils.escapePathName``) and Spark
(``ExternalCatalogUtils.escapePathName``) exactly: control characters and
``" # % ' * / : = ? \\ DEL { [ ] ^`` become ``%XX`` (uppercase hex); everything else,
including non-ASCII text, is kept as is. Spark and pyarrow (``partitioning="hive"``,
whose default ``segment_encoding="uri"`` percent-decodes) both read the original
value back. We escape no more than Hive does because Spark's decoder turns every
``%XX`` into one *character*, so percent-encoding a multi-byte UTF-8 character would
read back as mojibake in Spark.

Two values cannot round-trip and are documented here:

* the empty tag is written as ``__HIVE_DEFAULT_PARTITION__``, which both readers
  return as null;
* lone surrogates (from surrogateescape decoding of invalid UTF-8) cannot be in a
  path that readers decode as UTF-8; they become backslash escapes first (see
  ``extra.fix_text``), so the tag ``b"a\\xff".decode(errors="surrogateescape")``
  reads back as the text ``a\\xff``.

This module has no pyarrow import: the writer's per-batch path uses it on every call.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Sequence

from logrouter.lake.extra import fix_text

Event = tuple[int, dict[str, Any]]

HOUR_NS = 3_600_000_000_000

#: The partition columns, outermost first. A record field with one of these names
#: would clash with the partition column in Spark, so schema.py keeps them reserved.
PARTITION_COLUMNS = ("tag", "dt", "hour")

#: Hive's and Spark's spelling of a null/empty partition value.
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

#: The longest directory name most filesystems accept (bytes).
MAX_SEGMENT_BYTES = 255

# Hive's set: \x00-\x1f, DEL and  " # % ' * / : = ? \ { [ ] ^
_NEEDS_ESCAPE = re.compile(r"[\x00-\x1f\x7f\"#%'*/:=?\\{\[\]^]")
_ESCAPED = re.compile(r"%([0-9A-Fa-f]{2})")


class PartitionError(ValueError):
    """A tag that cannot name a partition directory (for example: too long)."""


def _percent(match: re.Match[str]) -> str:
    return "%%%02X" % ord(match.group())


@lru_cache(maxsize=4096)
def escape_value(value: str) -> str:
    """One partition value as it is spelled in a directory name (Hive escaping)."""
    if not value:
        return DEFAULT_PARTITION
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = fix_text(value)
    return _NEEDS_ESCAPE.sub(_percent, value)


def unescape_value(segment: str) -> str | None:
    """The inverse of ``escape_value`` (None for the default partition)."""
    if segment == DEFAULT_PARTITION:
        return None
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), segment)


@lru_cache(maxsize=4096)
def tag_segment(tag: str) -> str:
    """``tag=<escaped tag>``; raises PartitionError if no filesystem would take it."""
    segment = "tag=" + escape_value(tag)
    if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
        raise PartitionError(
            f"tag is too long for a partition directory "
            f"({len(segment.encode('utf-8'))} > {MAX_SEGMENT_BYTES} bytes escaped): {tag[:64]!r}…"
        )
    return segment


# Years a datetime can hold; event times outside them are clamped for the *directory*
# only (the row's time column keeps the real value).
_MIN_HOUR = int(datetime(1, 1, 2, tzinfo=timezone.utc).timestamp()) // 3600
_MAX_HOUR = int(datetime(9999, 12, 30, tzinfo=timezone.utc).timestamp()) // 3600


@lru_cache(maxsize=8192)
def hour_dirs(hour_bucket: int) -> tuple[str, str]:
    """``(dt, hour)`` strings, e.g. ``("2024-05-01", "07")``, of an hour bucket."""
    bucket = min(max(hour_bucket, _MIN_HOUR), _MAX_HOUR)
    moment = datetime.fromtimestamp(bucket * 3600, tz=timezone.utc)
    # not strftime("%Y"): glibc does not zero-pad years before 1000
    return "%04d-%02d-%02d" % (moment.year, moment.month, moment.day), "%02d" % moment.hour


def hour_bucket(time_ns: int) -> int:
    """Hours since the epoch (floor), the unit events are split by."""
    return int(time_ns // HOUR_NS)


def hour_bucket_of(dt: str, hour: str) -> int:
    """The hour bucket of ``hour_dirs``' strings (the inverse, within the clamped years)."""
    day = datetime.strptime(dt, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    return int(day.timestamp()) // 3600 + int(hour)


def partition_path(tag: str, bucket: int) -> str:
    """The relative directory ``tag=…/dt=…/hour=…`` of a tag and hour bucket."""
    dt, hour = hour_dirs(bucket)
    return f"{tag_segment(tag)}/dt={dt}/hour={hour}"


def split_by_hour(events: Sequence[Event]) -> list[tuple[int, Sequence[Event]]]:
    """The events grouped by hour bucket, in order of first appearance.

    Most batches fall into one hour, so check min and max first and hand the batch
    back untouched when they agree; only straddling batches pay for grouping.
    """
    if not events:
        return []
    split = getattr(events, "split_by_hour", None)
    if split is not None:  # forward entries still packed (wire.forward_lazy): split unread
        return split()
    times = [event[0] for event in events]
    low = hour_bucket(min(times))
    if low == hour_bucket(max(times)):
        return [(low, events)]
    groups: dict[int, list[Event]] = {}
    for event in events:
        bucket = int(event[0] // HOUR_NS)
        group = groups.get(bucket)
        if group is None:
            groups[bucket] = [event]
        else:
            group.append(event)
    return list(groups.items())

"""An Iceberg lake table's ``partition_by``, as the config spells it: parsed and checked.

``year``/``month``/``day``/``hour`` of ``time`` and ``identity``/``bucket[N]``/``truncate[W]``
of ``tag`` (a file holds one tag and one hour, so its partition value is known without
reading it). Without pyarrow or pyiceberg: the config check runs in every process, the
supervisor of ``[router] workers`` too; ``iceberg_table.py`` makes the table's spec from it.
"""

from __future__ import annotations

import re

from logrouter.config.options import Problems
from logrouter.lake.column_names import TIME

TAG = "tag"
DEFAULT_PARTITION_BY = ["day(time)", "identity(tag)"]

_TIME_TRANSFORMS = ("year", "month", "day", "hour")
_TAG_TRANSFORMS = ("identity", "bucket", "truncate")
_PARTITION = re.compile(r"\s*(\w+)\s*\(\s*(?:(\d+)\s*,\s*)?(\w+)\s*\)\s*")


def parse_partition(text: str) -> tuple[str, int | None, str]:
    """``"bucket(16, tag)"`` → ``("bucket", 16, "tag")``; ValueError saying what is wrong."""
    match = _PARTITION.fullmatch(text)
    if not match:
        raise ValueError(f"must look like day(time), identity(tag) or bucket(16, tag), got {text!r}")
    transform, number, source = match.group(1).lower(), match.group(2), match.group(3)
    if source == TIME:
        if transform not in _TIME_TRANSFORMS or number is not None:
            raise ValueError(f"time can be partitioned by {', '.join(f'{t}(time)' for t in _TIME_TRANSFORMS)}, got {text!r}")
    elif source == TAG:
        if transform not in _TAG_TRANSFORMS:
            raise ValueError(f"tag can be partitioned by identity(tag), bucket(N, tag) or truncate(N, tag), got {text!r}")
        if (number is None) != (transform == "identity") or (number is not None and int(number) <= 0):
            raise ValueError(f"{transform}(…) of tag takes {'no number' if transform == 'identity' else 'a positive number first'}, got {text!r}")
    else:
        raise ValueError(f"only time and tag can partition the table (a file holds one tag and one hour), got {text!r}")
    return transform, None if number is None else int(number), source


def check_partition_by(value: list) -> None:
    problems = []
    sources: dict[str, str] = {}
    for i, item in enumerate(value):
        try:
            if not isinstance(item, str):
                raise ValueError(f"must be a string, got {item!r}")
            transform, _, source = parse_partition(item)
        except ValueError as e:
            problems.append(f"[{i}]: {e}")
            continue
        if source in sources:
            problems.append(f"[{i}]: {source} is already partitioned by {sources[source]!r}")
        sources[source] = item
    if problems:
        raise Problems(problems)

"""Partitions of a lake as compaction sees them, and which ones are worth compacting.

Owns the walk over ``<root>/tag=…/dt=YYYY-MM-DD/hour=HH/`` (directories starting with
``_`` or ``.`` are not data: ``_staging``, ``_compaction``, ``_leases``), the names of
files compaction writes, the sealing rule and the "worth it" rule. Synchronous, through
the filesystem seam (``logrouter.lake.fs``).

Names: router writers name their files ``part-<writer_id>-<run>-<seq>.parquet``;
compaction names its outputs ``compacted-<run>-<nnnnn>.parquet``. A compacted name never
starts with ``part-``, so it can never collide with a writer's name, whatever the
writer id, and a compacted file is recognised by its name alone.
"""

from __future__ import annotations

import datetime
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from logrouter.lake.fs import Entry

HOUR_SECS = 3600
COMPACTED_PREFIX = "compacted-"
_COMPACTED = re.compile(r"compacted-([0-9a-f]+)-(\d{5})\.parquet")
_DT = re.compile(r"dt=(\d{4}-\d{2}-\d{2})")
_HOUR = re.compile(r"hour=(\d{2})")


def is_data_file(name: str) -> bool:
    """A Parquet file readers see (not hidden, not a temporary of some tool)."""
    return name.endswith(".parquet") and not name.startswith(("_", "."))


def is_compacted(name: str) -> bool:
    return _COMPACTED.fullmatch(name) is not None


def compacted_name(run_id: str, number: int) -> str:
    return f"{COMPACTED_PREFIX}{run_id}-{number:05d}.parquet"


@dataclass
class Partition:
    """One ``tag=…/dt=…/hour=…`` directory and its data files."""

    key: str  # "tag=<escaped>/dt=YYYY-MM-DD/hour=HH", relative to the lake root
    hour_start: float  # seconds since the epoch (UTC) of the partition's hour
    files: list[Entry] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def compacted_files(self) -> int:
        return sum(1 for f in self.files if is_compacted(f.name))

    def sealed(self, now: float, seal_after_secs: float) -> bool:
        """Sealed once ``seal_after_secs`` have passed since the end of its hour."""
        return now >= self.hour_start + HOUR_SECS + seal_after_secs


def hour_start(dt: str, hour: str) -> float | None:
    """Seconds since the epoch of ``dt=YYYY-MM-DD/hour=HH``; None if not of that form."""
    d, h = _DT.fullmatch(dt), _HOUR.fullmatch(hour)
    if d is None or h is None or int(h.group(1)) > 23:
        return None
    try:
        day = datetime.date.fromisoformat(d.group(1))
    except ValueError:
        return None
    return float((day.toordinal() - datetime.date(1970, 1, 1).toordinal()) * 86400 + int(h.group(1)) * HOUR_SECS)


def _visible_dirs(fs: Any, path: str, prefix: str) -> list[str]:
    return [e.name for e in fs.list_entries(path) if e.is_dir and e.name.startswith(prefix)]


def partition_from_key(fs: Any, root: str, key: str) -> Partition:
    """The partition ``key`` (``tag=…/dt=…/hour=…``) with its current files."""
    parts = key.strip("/").split("/")
    if len(parts) != 3 or not parts[0].startswith("tag="):
        raise ValueError(f"not a partition key (tag=…/dt=YYYY-MM-DD/hour=HH): {key!r}")
    start = hour_start(parts[1], parts[2])
    if start is None:
        raise ValueError(f"not a partition key (tag=…/dt=YYYY-MM-DD/hour=HH): {key!r}")
    key = "/".join(parts)
    files = [e for e in fs.list_entries(posixpath.join(root, key)) if not e.is_dir and is_data_file(e.name)]
    return Partition(key, start, files)


def list_partitions(fs: Any, root: str) -> list[Partition]:
    """Every partition directory of the lake, with its data files, sorted by key."""
    partitions = []
    for tag in _visible_dirs(fs, root, "tag="):
        tag_dir = posixpath.join(root, tag)
        for dt in _visible_dirs(fs, tag_dir, "dt="):
            dt_dir = posixpath.join(tag_dir, dt)
            for hour in _visible_dirs(fs, dt_dir, "hour="):
                start = hour_start(dt, hour)
                if start is None:
                    continue
                entries = fs.list_entries(posixpath.join(dt_dir, hour))
                files = [e for e in entries if not e.is_dir and is_data_file(e.name)]
                partitions.append(Partition(f"{tag}/{dt}/{hour}", start, files))
    return partitions


def worth_compacting(partition: Partition, min_files: int, target_file_bytes: int) -> tuple[bool, str]:
    """Whether rewriting the partition's files is worth a job, and why (or why not).

    Worth it when it has at least two files, at least one of them not written by
    compaction, and either ``min_files`` or more files or a mean file size under
    ``target_file_bytes``. A partition whose files all come from compaction is done
    (rewriting it again would change nothing); a late file arriving in it makes it a
    candidate again, and the next run rewrites it together with the compacted files.
    """
    files = partition.files
    count = len(files)
    if count < 2:
        return False, f"{count} file"
    if partition.compacted_files == count:
        return False, "already compacted"
    mean = partition.bytes / count
    if count >= min_files:
        return True, f"{count} files >= min_files {min_files}"
    if mean < target_file_bytes:
        return True, f"mean file size {mean:.0f} B < target {target_file_bytes} B"
    return False, f"{count} files < min_files {min_files}, mean file size {mean:.0f} B >= target"


def output_file_count(input_bytes: int, target_file_bytes: int) -> int:
    """How many files of about ``target_file_bytes`` the partition's bytes make."""
    return max(1, -(-input_bytes // target_file_bytes))


@dataclass
class Candidate:
    """A partition a run should work on, and why."""

    partition: Partition
    reason: str


def plan_lake(
    fs: Any, root: str, now: float, seal_after_secs: float, min_files: int, target_file_bytes: int
) -> list[Candidate]:
    """The partitions of a lake to compact now: sealed and worth it, plus every
    partition with an interrupted run (whose swap must be finished or undone)."""
    from logrouter.compaction.swap import interrupted  # noqa: PLC0415 - layout stays import-light

    unfinished = set(interrupted(fs, root))
    chosen = []
    for partition in list_partitions(fs, root):
        if partition.key in unfinished:
            unfinished.discard(partition.key)
            chosen.append(Candidate(partition, "an interrupted run to finish"))
            continue
        if not partition.sealed(now, seal_after_secs):
            continue
        worth, reason = worth_compacting(partition, min_files, target_file_bytes)
        if worth:
            chosen.append(Candidate(partition, reason))
    for key in sorted(unfinished):  # its directory is gone or not a partition we list
        try:
            chosen.append(Candidate(partition_from_key(fs, root, key), "an interrupted run to finish"))
        except ValueError:
            continue
    return chosen

"""The ``[compaction]`` config section: its keys, defaults and checks.

Registered as a ``config.sections.Section``: ``logrouter.config.load`` type-checks the
table against ``COMPACTION_OPTIONS`` like every other section, then ``check_compaction``
checks what needs the whole config (the sinks it names must be parquet or iceberg sinks).
The keys after ``sinks`` are for Iceberg tables only (``logrouter.compaction.iceberg``,
``logrouter.jobs.iceberg_maintain``).
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

from logrouter.config import sections
from logrouter.config.options import Option, list_of, non_negative, positive

DEFAULT_TARGET_FILE_BYTES = 256 << 20
MIN_ORPHAN_OLDER_THAN_SECS = 86400
ICEBERG_PROCEDURES = ("rewrite_data_files", "rewrite_manifests", "expire_snapshots", "remove_orphan_files")
PARQUET, ICEBERG = "parquet", "iceberg"
_MASTER = re.compile(
    r"local(\[(\*|\d+)(,\s*\d+)?\])?"  # local, local[4], local[*], local[4,2]
    r"|local-cluster\[\d+,\s*\d+,\s*\d+\]"
    r"|yarn"
    r"|(spark|mesos|k8s)://\S+"
)


def _check_master(value: str) -> None:
    if not _MASTER.fullmatch(value):
        raise ValueError(
            f"not a Spark master URL: {value!r} (local, local[N], local[*], spark://host:7077, yarn, k8s://https://host:443, …)"
        )


def _check_min_files(value: int) -> None:
    if value < 2:
        raise ValueError(f"must be 2 or more (one file has nothing to merge with), got {value!r}")


def _check_orphan_age(value: float) -> None:
    if value < MIN_ORPHAN_OLDER_THAN_SECS:
        raise ValueError(
            f"must be at least {MIN_ORPHAN_OLDER_THAN_SECS} (24 h: Iceberg refuses less, since files being written "
            f"or not yet committed would go), got {value!r}"
        )


def _check_procedures(value: list) -> None:
    for index, name in enumerate(value):
        if name not in ICEBERG_PROCEDURES:
            raise ValueError(f"[{index}]: unknown procedure {name!r} (one of: {', '.join(ICEBERG_PROCEDURES)})")


def _check_at_least_one(value: int) -> None:
    if value < 1:
        raise ValueError(f"must be 1 or more, got {value!r}")


def _check_spark_conf(value: dict) -> None:
    for key, setting in value.items():
        if not key.startswith("spark."):
            raise ValueError(f"key {key!r}: Spark settings start with 'spark.' (Hadoop ones with 'spark.hadoop.')")
        if not isinstance(setting, (str, int, float, bool)):
            raise ValueError(f"key {key!r}: must be a string, number or boolean, got {type(setting).__name__}")


def _check_spark_submit(value: str) -> None:
    if value and shutil.which(value) is None:
        where = "not an executable file" if os.path.exists(value) else "not found"
        raise ValueError(f"{value!r}: {where} (give the path of spark-submit, or leave it empty to run the job with this Python)")


COMPACTION_OPTIONS: dict[str, Option] = {
    "enabled": Option(bool, False, "run compaction from this router"),
    "schedule_secs": Option((int, float), 3600, "how often to look for partitions to compact (a round still running skips the next)", positive),
    "seal_after_secs": Option(
        (int, float), 3600, "a partition is sealed this long after the end of its hour; only sealed partitions are compacted", non_negative
    ),
    "min_files": Option(int, 2, "compact a partition with at least this many files …", _check_min_files),
    "target_file_bytes": Option(
        int, DEFAULT_TARGET_FILE_BYTES, "… or whose mean file size is under this; also the size of the files written", positive
    ),
    "spark_master": Option(str, "local[*]", "Spark master URL, passed through (`local[*]`, `spark://host:7077`, `yarn`, `k8s://…`)", _check_master),
    "spark_conf": Option(dict, {}, 'extra Spark settings (`spark.*`; Hadoop ones as `spark.hadoop.*`), e.g. `{ "spark.executor.memory" = "2g" }`', _check_spark_conf),
    "spark_submit": Option(
        str, "", "path of `spark-submit`; empty = `python -m logrouter.jobs.compact` with the router's own Python (pip's pyspark)", _check_spark_submit
    ),
    "timeout_secs": Option((int, float), 3600, "a job running longer is killed with its whole process group (SIGTERM, SIGKILL 30 s later)", positive),
    "sinks": Option(list, [], "parquet and iceberg sinks whose lakes and tables are compacted (empty = every one)", list_of(str)),
    "min_input_files": Option(
        int, 2, "iceberg: `rewrite_data_files` rewrites a group of at least this many small files (Iceberg's own default: 5)",
        _check_at_least_one,
    ),
    "snapshot_retention_secs": Option(
        (int, float), 3600, "iceberg: `expire_snapshots` removes snapshots older than this (and files only they name)", positive
    ),
    "retain_snapshots": Option(int, 100, "iceberg: … but always keeps this many of the newest", _check_at_least_one),
    "orphan_older_than_secs": Option(
        (int, float), 259200, "iceberg: `remove_orphan_files` removes unreferenced files older than this (at least 86400)",
        _check_orphan_age,
    ),
    "iceberg_procedures": Option(
        list, list(ICEBERG_PROCEDURES), "iceberg: the procedures each round runs, in this order", _check_procedures
    ),
    "jars_dir": Option(
        str, "", "iceberg: cache of the Iceberg Spark runtime and JDBC driver jars (empty = `~/.cache/logrouter/jars`)"
    ),
}


def check_compaction(compaction: dict[str, Any], sinks: dict[str, Any], errors: list[str]) -> None:
    """Checks across sections: ``sinks`` names parquet or iceberg sinks; enabled needs one."""
    compactable = [name for name, c in sinks.items() if getattr(c, "type", None) in (PARQUET, ICEBERG)]
    for index, name in enumerate(compaction.get("sinks") or []):
        if not isinstance(name, str):
            continue  # already reported by the type check
        if name not in sinks:
            errors.append(
                f"compaction.sinks[{index}]: unknown sink {name!r} (parquet and iceberg sinks: {', '.join(compactable) or 'none'})"
            )
        elif name not in compactable:
            errors.append(f"compaction.sinks[{index}]: sink {name!r} is neither a parquet nor an iceberg sink")
    if compaction.get("enabled") and not compactable:
        errors.append("compaction.enabled: there is no parquet or iceberg sink to compact")


def _check_section(compaction: dict[str, Any], tables: sections.Tables) -> list[str]:
    errors: list[str] = []
    check_compaction(compaction, tables.sinks, errors)
    return errors


SECTION = sections.register_section(sections.Section("compaction", COMPACTION_OPTIONS, _check_section))


def lake_urls(compaction: dict[str, Any], sinks: dict[str, Any]) -> list[str]:
    """The lake roots to compact: the chosen parquet sinks' paths, each once."""
    names = compaction.get("sinks") or [name for name, c in sinks.items() if c.type == PARQUET]
    urls: list[str] = []
    for name in names:
        if sinks[name].type != PARQUET:
            continue
        url = sinks[name].options["path"]
        if url not in urls:
            urls.append(url)
    return urls

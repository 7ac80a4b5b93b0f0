"""The command line of the compaction job, as the daemon and ``logrouter compact`` run it.

Owns how ``[compaction]`` settings become a process: either
``<python> -m logrouter.jobs.compact --master M --conf k=v … <job args>`` (the default:
the interpreter the router runs under, whose environment has pyspark), or, with
``spark_submit`` set, ``<spark-submit> --master M --conf k=v … <path of
logrouter/jobs/compact.py> <job args>`` (client deploy mode: the driver runs here,
executors run Spark SQL only and need no logrouter code).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import logrouter

#: Where the job's code lives (spark-submit runs it as a script).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(logrouter.__file__)))
JOB_SCRIPT = os.path.join(PACKAGE_PARENT, "logrouter", "jobs", "compact.py")
JOB_MODULE = "logrouter.jobs.compact"

#: The line prefix of the job's per-partition result (JSON follows) on its stdout.
RESULT_PREFIX = "compaction-result "


@dataclass(frozen=True)
class JobCounts:
    """The numbers of a ``compacted`` result that the scheduler counts, one meaning for
    both jobs: data files and bytes before and after (a parquet partition's; an Iceberg
    table's, its files as the rewrite left them), the rows compacted (a partition's rows;
    the rows an Iceberg rewrite moved), and ``files_appended``: Iceberg only, data files
    others appended while the job ran, in no counter (they are not compaction's doing)."""

    files_before: int = 0
    files_after: int = 0
    rows: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    files_appended: int = 0

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> "JobCounts":
        """From the job's result; a number it lacks (or sends as null) is 0."""
        return cls(**{name: int(result.get(name) or 0) for name in cls.__dataclass_fields__})


def conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def job_command(
    *,
    lake: str,
    partitions: Sequence[str],
    target_file_bytes: int,
    spark_master: str,
    spark_conf: Mapping[str, Any],
    spark_submit: str,
    python: str,
    lease_owner: str | None = None,
    lease_secs: float | None = None,
) -> list[str]:
    spark_args = ["--master", spark_master]
    for key in sorted(spark_conf):
        spark_args += ["--conf", f"{key}={conf_value(spark_conf[key])}"]
    job_args = ["--lake", lake, "--target-file-bytes", str(int(target_file_bytes))]
    for key in partitions:
        job_args += ["--partition", key]
    if lease_owner is not None:
        job_args += ["--lease-owner", lease_owner]
    if lease_secs is not None:
        job_args += ["--lease-secs", str(int(lease_secs))]
    if spark_submit:
        return [spark_submit, *spark_args, JOB_SCRIPT, *job_args]
    return [python, "-m", JOB_MODULE, *spark_args, *job_args]


def job_env(base: Mapping[str, str], python: str) -> dict[str, str]:
    """The job's environment: ``base`` with logrouter importable and pyspark's Python set."""
    env = dict(base)
    path = env.get("PYTHONPATH", "")
    if PACKAGE_PARENT not in path.split(os.pathsep):
        env["PYTHONPATH"] = PACKAGE_PARENT + (os.pathsep + path if path else "")
    env.setdefault("PYSPARK_PYTHON", python)
    env.setdefault("PYSPARK_DRIVER_PYTHON", python)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env

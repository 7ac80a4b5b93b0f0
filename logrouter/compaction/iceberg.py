"""Iceberg tables as the compaction scheduler sees them: which, and the job's command.

Owns ``IcebergTable`` (a catalog name, its pyiceberg properties, a table), how the
``[compaction]`` settings become the command line and environment of
``logrouter.jobs.iceberg_maintain``, and ``iceberg_tables``: the tables of the config's
``iceberg`` sinks.

No leases here, unlike the parquet lake: Iceberg commits are optimistic and validated,
so a rewrite racing the writers (or another router's rewrite) never loses or doubles a
row; the loser's commit is retried or fails cleanly. Run compaction from one router per
table all the same, or two rewrites of the same files waste each other's work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from logrouter.compaction.command import PACKAGE_PARENT, conf_value
from logrouter.lake.iceberg_catalog import catalog_properties

JOB_MODULE = "logrouter.jobs.iceberg_maintain"
JOB_SCRIPT = f"{PACKAGE_PARENT}/logrouter/jobs/iceberg_maintain.py"
CATALOG_ENV = "LOGROUTER_ICEBERG_CATALOG"  # the job reads the catalog's properties from it
SINK_TYPE = "iceberg"


@dataclass(frozen=True)
class IcebergTable:
    """One table to maintain: ``sink`` names it in logs and metrics."""

    sink: str
    catalog_name: str
    table: str
    properties: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold a password

    @property
    def label(self) -> str:
        return f"iceberg {self.catalog_name}.{self.table}"


def iceberg_command(options: Mapping[str, Any], table: IcebergTable, python: str) -> list[str]:
    """The job's command line (the catalog's properties travel in its environment)."""
    spark_args = ["--master", options["spark_master"]]
    conf = options["spark_conf"]
    for key in sorted(conf):
        spark_args += ["--conf", f"{key}={conf_value(conf[key])}"]
    job_args = [
        "--catalog-name", table.catalog_name,
        "--table", table.table,
        "--target-file-bytes", str(int(options["target_file_bytes"])),
        "--min-input-files", str(int(options["min_input_files"])),
        "--seal-after-secs", str(float(options["seal_after_secs"])),
        "--snapshot-retention-secs", str(float(options["snapshot_retention_secs"])),
        "--retain-last", str(int(options["retain_snapshots"])),
        "--orphan-older-than-secs", str(float(options["orphan_older_than_secs"])),
    ]
    if options["jars_dir"]:
        job_args += ["--jars-dir", options["jars_dir"]]
    for procedure in options["iceberg_procedures"]:
        job_args += ["--procedure", procedure]
    if options["spark_submit"]:
        return [options["spark_submit"], *spark_args, JOB_SCRIPT, *job_args]
    return [python, "-m", JOB_MODULE, *spark_args, *job_args]


def iceberg_env(env: Mapping[str, str], table: IcebergTable) -> dict[str, str]:
    """``env`` with the catalog's properties for the job (not on its command line: ``ps``)."""
    return {**env, CATALOG_ENV: json.dumps(dict(table.properties), sort_keys=True)}


def table_of_sink(name: str, sink: Any) -> IcebergTable:
    """The table an ``iceberg`` sink writes: its options ``catalog`` (the catalog's name),
    ``table``, and the pyiceberg catalog properties that ``warehouse``, ``catalog_uri``
    and ``catalog_properties`` make (``logrouter.lake.iceberg_catalog``), as the sink
    opens them."""
    o = sink.options
    properties = catalog_properties(o["warehouse"], o.get("catalog_uri", ""), o.get("catalog_properties") or {})
    return IcebergTable(name, o["catalog"], o["table"], {str(k): str(v) for k, v in properties.items()})


def iceberg_tables(compaction: Mapping[str, Any], sinks: Mapping[str, Any]) -> list[IcebergTable]:
    """The tables of the chosen (or every) ``iceberg`` sink, each table once."""
    chosen = compaction.get("sinks") or list(sinks)
    tables: list[IcebergTable] = []
    seen = set()
    for name in chosen:
        sink = sinks.get(name)
        if getattr(sink, "type", None) != SINK_TYPE:
            continue
        table = table_of_sink(name, sink)
        key = (table.catalog_name, table.properties.get("uri"), table.table)
        if key not in seen:
            seen.add(key)
            tables.append(table)
    return tables

"""The Spark job that maintains an Iceberg table with Iceberg's own procedures.

Run as its own process (the daemon's compaction scheduler starts it; never inside the
daemon)::

    LOGROUTER_ICEBERG_CATALOG='{"uri": "sqlite:///var/catalog.db", "warehouse": "file:///var/lake"}' \\
    python -m logrouter.jobs.iceberg_maintain --catalog-name lake --table logs.events

The catalog's pyiceberg properties come from the environment variable
``LOGROUTER_ICEBERG_CATALOG`` (JSON; a PostgreSQL password stays out of ``ps``) and/or
``--catalog-property KEY=VALUE``. Spark gets the Iceberg runtime and the JDBC drivers
from the jar cache (``logrouter.compaction.jars``, fetched with Maven on first use) and
the same catalog under the same name (``logrouter.lake.iceberg_engines``). Then, in
order, each of ``--procedure`` (default: all four):

1. ``rewrite_data_files``: binpack into ``--target-file-bytes`` files, groups of at least
   ``--min-input-files`` files (Iceberg's own default is 5), only files holding rows
   older than ``--seal-after-secs`` (the newest files are still growing: rewriting them
   every round would cost more than it saves), in up to ``PARTIAL_PROGRESS_COMMITS``
   commits. Appends committed meanwhile are kept: Iceberg validates the rewrite against
   them and retries its commit.
2. ``rewrite_manifests``: one manifest per partition range instead of one per append.
3. ``expire_snapshots``: snapshots older than ``--snapshot-retention-secs`` go, the last
   ``--retain-last`` always stay; data files only they reference are deleted.
4. ``remove_orphan_files``: files under the table location that no snapshot references
   and that are older than ``--orphan-older-than-secs`` (Iceberg refuses less than 24 h:
   a file being written, or written but not yet committed, is younger than that).

A procedure whose commit lost to a concurrent one (``ValidationException``,
``CommitFailedException``, also when Iceberg's own commit retries ran out under appends
every second) is planned and run again from the table's latest snapshot,
up to ``RETRIES`` times. The usual case: pyiceberg's appends drop manifests that hold
only deleted entries (a rewrite leaves one), so a ``rewrite_manifests`` that counted on
such a manifest finds it gone; planned again, it succeeds. Nothing is lost either way:
a failed commit changed nothing.

Prints one ``compaction-result {json}`` line (``status``: compacted, skipped or failed;
the numbers the scheduler counts, see ``round_counts``: the table's data files before,
the same files after the rewrite (appends during the job apart, in ``files_appended``),
the rows the rewrite moved) and exits 0, or 1 if a procedure failed (the others still ran).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from typing import Any

if __package__ in (None, ""):  # run as a script (spark-submit): the job's directory is sys.path[0]
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from logrouter.compaction.command import RESULT_PREFIX  # noqa: E402
from logrouter.compaction.jars import ensure_jars  # noqa: E402
from logrouter.lake.iceberg_engines import spark_catalog_conf  # noqa: E402

CATALOG_ENV = "LOGROUTER_ICEBERG_CATALOG"
PROCEDURES = ("rewrite_data_files", "rewrite_manifests", "expire_snapshots", "remove_orphan_files")
DEFAULT_TARGET_FILE_BYTES = 256 << 20
DEFAULT_MIN_INPUT_FILES = 2
DEFAULT_SEAL_AFTER_SECS = 3600.0
DEFAULT_SNAPSHOT_RETENTION_SECS = 3600.0
DEFAULT_RETAIN_LAST = 100
DEFAULT_ORPHAN_OLDER_THAN_SECS = 3 * 86400.0
MIN_ORPHAN_OLDER_THAN_SECS = 86400.0  # Iceberg's procedure refuses less
RETRIES = 3
#: Commits that lost to a concurrent commit: nothing changed, planning again is safe.
RETRIED = ("org.apache.iceberg.exceptions.ValidationException", "org.apache.iceberg.exceptions.CommitFailedException")
#: rewrite_data_files wraps them in a RuntimeException saying so.
RETRIED_REWRITE = "Cannot commit rewrite because of a ValidationException or CommitFailedException"
#: rewrite_data_files commits in up to this many smaller commits: under appends every few
#: seconds a smaller commit is likelier to win, and a group that loses does not undo the others.
PARTIAL_PROGRESS_COMMITS = 10
#: The numbers of a rewrite, by the snapshot summary keys Iceberg commits them under.
REWRITE_SUMMARY = {
    "files_rewritten": "deleted-data-files", "files_written": "added-data-files", "rows": "deleted-records",
    "bytes_rewritten": "removed-files-size", "bytes_written": "added-files-size",
}

DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}
LOCAL_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "4",  # expire/orphan scans of a small table: not 200 tasks
}


def catalog_properties(environ: dict[str, str], pairs: list[tuple[str, str]]) -> dict[str, str]:
    """The catalog's pyiceberg properties: ``$LOGROUTER_ICEBERG_CATALOG`` then the pairs."""
    properties: dict[str, str] = {}
    text = environ.get(CATALOG_ENV)
    if text:
        loaded = json.loads(text)
        if not isinstance(loaded, dict):
            raise ValueError(f"{CATALOG_ENV} must be a JSON object of catalog properties")
        properties.update({str(k): str(v) for k, v in loaded.items()})
    properties.update(pairs)
    for key in ("uri", "warehouse"):
        if key not in properties:
            raise ValueError(f"the catalog property {key!r} is missing (from {CATALOG_ENV} or --catalog-property)")
    return properties


def session_settings(master: str | None, catalog: str, properties: dict[str, str], jars: list[str],
                     conf: dict[str, str]) -> dict[str, str]:
    settings = dict(DEFAULT_CONF)
    if master and master.startswith("local"):
        settings.update(LOCAL_CONF)
    settings.update(conf)
    settings.update(spark_catalog_conf(catalog, properties))
    settings["spark.jars"] = ",".join([*jars, *filter(None, settings.get("spark.jars", "").split(","))])
    return settings


def start_spark(master: str | None, settings: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession  # noqa: PLC0415 - only the job process loads Spark

    builder = SparkSession.builder.appName("logrouter-iceberg-maintain")
    if master:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _timestamp(epoch_secs: float) -> str:
    moment = datetime.datetime.fromtimestamp(epoch_secs, tz=datetime.timezone.utc)
    return f"TIMESTAMP '{moment.strftime('%Y-%m-%d %H:%M:%S.%f')}'"


def procedure_sql(procedure: str, catalog: str, table: str, args: argparse.Namespace, now: float) -> str:
    """The ``CALL`` statement of one procedure."""
    call = f"CALL {catalog}.system.{procedure}(table => {_string(table)}"
    if procedure == "rewrite_data_files":
        options = {
            "target-file-size-bytes": str(args.target_file_bytes),
            "min-input-files": str(args.min_input_files),
            "partial-progress.enabled": "true",
            "partial-progress.max-commits": str(PARTIAL_PROGRESS_COMMITS),
        }
        pairs = ", ".join(f"{_string(k)}, {_string(v)}" for k, v in options.items())
        where = ""
        if args.seal_after_secs > 0:
            # a double-quoted literal, so the timestamp's own quotes need no escaping
            column = "`" + args.time_column.replace("`", "``") + "`"
            where = f', where => "{column} < {_timestamp(now - args.seal_after_secs)}"'
        return f"{call}, strategy => 'binpack', options => map({pairs}){where})"
    if procedure == "rewrite_manifests":
        return f"{call})"
    if procedure == "expire_snapshots":
        return f"{call}, older_than => {_timestamp(now - args.snapshot_retention_secs)}, retain_last => {args.retain_last})"
    if procedure == "remove_orphan_files":
        return f"{call}, older_than => {_timestamp(now - args.orphan_older_than_secs)})"
    raise ValueError(f"unknown procedure {procedure!r} (one of: {', '.join(PROCEDURES)})")


def _row_dict(rows: list[Any]) -> dict[str, Any]:
    """The procedure's one-row answer (remove_orphan_files: one row per file: counted)."""
    if not rows:
        return {}
    if "orphan_file_location" in rows[0].asDict():
        return {"orphan_files_removed": len(rows)}
    return {k: v for k, v in rows[0].asDict().items() if isinstance(v, (int, float, str))}


def run_procedure(spark: Any, statement: str, retries: int = RETRIES) -> tuple[dict[str, Any], int]:
    """The procedure's answer and how often it was run again after losing a commit race."""
    for attempt in range(retries + 1):
        try:
            return _row_dict(spark.sql(statement).collect()), attempt
        except Exception as error:
            text = describe(error)
            if attempt == retries or not (text.startswith(RETRIED) or RETRIED_REWRITE in text):
                raise
            print(f"{statement}: lost a commit race ({describe(error)}); planning again", file=sys.stderr, flush=True)
    raise AssertionError("not reached")


def table_files(spark: Any, catalog: str, table: str) -> tuple[int, int, int]:
    """(data files, bytes, rows) of the table's current snapshot."""
    row = spark.sql(
        f"SELECT count(*) AS files, coalesce(sum(file_size_in_bytes), 0) AS bytes, coalesce(sum(record_count), 0) AS rows "
        f"FROM {catalog}.{table}.files WHERE content = 0"
    ).collect()[0]
    return int(row["files"]), int(row["bytes"]), int(row["rows"])


def rewrite_summaries(spark: Any, catalog: str, table: str, since: float) -> list[dict[str, str]]:
    """The summaries of the data rewrites (``replace`` snapshots with data files in them:
    ``rewrite_manifests`` commits a ``replace`` too) committed since ``since`` (epoch
    seconds; the commits are this process's, stamped by this host's clock)."""
    rows = spark.sql(
        f"SELECT summary FROM {catalog}.{table}.snapshots "
        f"WHERE operation = 'replace' AND committed_at >= {_timestamp(since)}"
    ).collect()
    return [summary for summary in (dict(row["summary"] or {}) for row in rows) if "deleted-data-files" in summary]


def rewrite_totals(summaries: list[dict[str, str]]) -> dict[str, int]:
    """What the rewrite's commits (``replace`` snapshots) did, from their summaries: data
    files and bytes it replaced and wrote, rows it moved. Counted from the commits, not
    from the procedure's answer: a commit of an attempt that lost a later race stays."""
    totals = dict.fromkeys(REWRITE_SUMMARY, 0)
    for summary in summaries:
        for name, key in REWRITE_SUMMARY.items():
            totals[name] += int(summary.get(key, 0) or 0)
    return totals


def round_counts(before: tuple[int, int, int], end: tuple[int, int, int], totals: dict[str, int]) -> dict[str, int]:
    """A round's numbers, as the scheduler reads them (``files_before`` … ``rows``).

    ``files_before``/``bytes_before``: the table's data files when the round began;
    ``files_after``/``bytes_after``: those files as the rewrite left them (before, minus
    the files it replaced, plus the files it wrote); ``rows``: the rows the rewrite moved
    into new files; ``table_rows``: the table's rows when the round began. Files others
    appended while the job ran are not in ``files_after``: ``files_appended`` says how
    many (the table's data files at the end minus ``files_after``)."""
    files_before, bytes_before, table_rows = before
    files_after = files_before - totals["files_rewritten"] + totals["files_written"]
    bytes_after = bytes_before - totals["bytes_rewritten"] + totals["bytes_written"]
    return {
        "files_before": files_before, "bytes_before": bytes_before,
        "files_after": files_after, "bytes_after": bytes_after,
        "rows": totals["rows"], "table_rows": table_rows,
        "files_appended": max(end[0] - files_after, 0),
    }


def maintain(spark: Any, catalog: str, args: argparse.Namespace, now: float) -> dict[str, Any]:
    started = time.monotonic()
    table = args.table
    result: dict[str, Any] = {"table": f"{catalog}.{table}", "partition": table}
    before = table_files(spark, catalog, table)
    rewrites: list[dict[str, str]] = []
    failed = []
    for procedure in args.procedure or PROCEDURES:
        step_started, step_wall = time.monotonic(), time.time()
        try:
            answer, retries = run_procedure(spark, procedure_sql(procedure, catalog, table, args, now))
        except Exception as error:  # noqa: BLE001 - reported; the other procedures still run
            traceback.print_exc(file=sys.stderr)
            failed.append(f"{procedure}: {describe(error)}")
            answer = None
        if procedure == "rewrite_data_files":  # its commits, before expire_snapshots may drop them
            rewrites = rewrite_summaries(spark, catalog, table, step_wall)
        if answer is None:
            continue
        answer["seconds"] = round(time.monotonic() - step_started, 3)
        if retries:
            answer["retries"] = retries
        result[procedure] = answer
    totals = rewrite_totals(rewrites)
    result.update(round_counts(before, table_files(spark, catalog, table), totals))
    result["seconds"] = round(time.monotonic() - started, 3)
    rewritten = totals["files_rewritten"]
    if failed:
        result.update(status="failed", error="; ".join(failed))
    elif rewritten:
        result.update(status="compacted", reason=f"{rewritten} data files rewritten")
    else:
        result.update(status="skipped", reason="no data files worth rewriting; metadata maintained")
    return result


def describe(error: BaseException) -> str:
    """One line saying what went wrong (a Java exception: its class and message)."""
    java = getattr(error, "java_exception", None)
    text = str(java.toString()) if java is not None else f"{type(error).__name__}: {error}"
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="logrouter.jobs.iceberg_maintain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog-name", required=True, help="the catalog's name (the same as the writers')")
    parser.add_argument("--catalog-property", action="append", type=_conf_pair, default=[],
                        help=f"pyiceberg catalog property KEY=VALUE (also from ${CATALOG_ENV}, JSON)")
    parser.add_argument("--table", required=True, help="namespace.table")
    parser.add_argument("--master", default=None, help="Spark master (not with spark-submit, which has its own)")
    parser.add_argument("--conf", action="append", type=_conf_pair, default=[], help="Spark setting KEY=VALUE")
    parser.add_argument("--jars-dir", default=None, help="jar cache (default: ~/.cache/logrouter/jars)")
    parser.add_argument("--procedure", action="append", choices=PROCEDURES, default=[])
    parser.add_argument("--target-file-bytes", type=int, default=DEFAULT_TARGET_FILE_BYTES)
    parser.add_argument("--min-input-files", type=int, default=DEFAULT_MIN_INPUT_FILES)
    parser.add_argument("--seal-after-secs", type=float, default=DEFAULT_SEAL_AFTER_SECS,
                        help="rewrite only files with rows older than this (0: every file)")
    parser.add_argument("--time-column", default="time")
    parser.add_argument("--snapshot-retention-secs", type=float, default=DEFAULT_SNAPSHOT_RETENTION_SECS)
    parser.add_argument("--retain-last", type=int, default=DEFAULT_RETAIN_LAST)
    parser.add_argument("--orphan-older-than-secs", type=float, default=DEFAULT_ORPHAN_OLDER_THAN_SECS)
    args = parser.parse_args(argv)
    if args.orphan_older_than_secs < MIN_ORPHAN_OLDER_THAN_SECS:
        parser.error(f"--orphan-older-than-secs must be at least {MIN_ORPHAN_OLDER_THAN_SECS:.0f} (24 h)")
    if args.min_input_files < 1 or args.retain_last < 1:
        parser.error("--min-input-files and --retain-last must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, Any] = {"table": f"{args.catalog_name}.{args.table}", "partition": args.table}
    spark = None
    try:
        properties = catalog_properties(dict(os.environ), args.catalog_property)
        jars = ensure_jars(args.jars_dir)
        spark = start_spark(args.master, session_settings(args.master, args.catalog_name, properties, jars, dict(args.conf)))
        result = maintain(spark, args.catalog_name, args, time.time())
    except Exception as error:  # noqa: BLE001 - reported as the job's result
        traceback.print_exc(file=sys.stderr)
        result.update(status="failed", error=describe(error))
    finally:
        if spark is not None:
            spark.stop()
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True, default=str), flush=True)
    return 1 if result.get("status") == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())

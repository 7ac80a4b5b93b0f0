"""The Spark compaction job: rewrite a lake partition's small files into a few big ones.

Run as its own process, never inside the daemon::

    python -m logrouter.jobs.compact --lake var/lake --partition 'tag=app/dt=2024-05-01/hour=07'
    spark-submit --master yarn logrouter/jobs/compact.py --lake hdfs://nn:8020/logs …

Without ``--partition`` it picks the sealed partitions worth compacting itself. For each
partition, under the partition's lease (taken here, or held by the scheduler that
started us: ``--lease-owner``):

1. finish or undo any run a crash interrupted (``logrouter.compaction.swap.recover``);
2. skip the partition if it has fewer than two files or only compacted ones (so a
   second run changes nothing);
3. read the input files' footers (rows, schemas) and plan the schema merge
   (``logrouter.compaction.merge``);
4. Spark reads the files (``mergeSchema``, no partition-type inference, one read per
   group of files whose conflicting columns agree), moves the values of losing column
   variants into ``_extra``, and writes about ``target_file_bytes`` per file, sorted by
   ``time``, into ``<root>/_compaction/<partition>/<run>/``;
5. audit: the outputs' footers must hold as many rows as the inputs';
6. swap: commit marker, outputs renamed in, inputs removed, marker removed.

Prints one ``compaction-result {json}`` line per partition on stdout; exit status 0
if no partition failed, 1 otherwise. pyspark is imported only when a partition needs
rewriting, so recovery and skips cost no JVM.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import secrets
import socket
import sys
import time
import traceback
from functools import reduce
from typing import Any, Callable

if __package__ in (None, ""):  # run as a script (spark-submit): the job's directory is sys.path[0]
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow.parquet as pq  # noqa: E402

from logrouter.compaction import lease as leases  # noqa: E402
from logrouter.compaction.command import RESULT_PREFIX  # noqa: E402
from logrouter.compaction.layout import (  # noqa: E402
    compacted_name,
    is_data_file,
    output_file_count,
    partition_from_key,
    plan_lake,
    worth_compacting,
)
from logrouter.compaction.merge import EXTRA, TIME, InputFile, MergePlan, plan_merge  # noqa: E402
from logrouter.compaction.swap import FileInfo, Swap, recover  # noqa: E402
from logrouter.lake.fs import filesystem_for  # noqa: E402
from logrouter.lake.table import update_table  # noqa: E402

#: Settings the job's correctness depends on; applied after the user's spark_conf.
REQUIRED_CONF = {
    "spark.sql.caseSensitive": "true",  # "Status" and "status" are different columns here
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",  # the lake's time type; never INT96
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.files.ignoreMissingFiles": "false",
    "spark.sql.files.ignoreCorruptFiles": "false",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
}
#: Defaults the user's spark_conf may change.
DEFAULT_CONF = {
    "spark.sql.parquet.compression.codec": "zstd",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}
#: For local[…] masters: stay on loopback.
LOCAL_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}

DEFAULT_TARGET_FILE_BYTES = 256 << 20
DEFAULT_LEASE_SECS = 4 * 3600


class LeaseLost(Exception):
    """The partition's lease expired or was taken over while the job ran."""


def new_run_id() -> str:
    """Unique and sortable by start time (ms, hex) + random, like the writer's runs."""
    return "%x%s" % (time.time_ns() // 1_000_000, secrets.token_hex(4))


class Lake:
    """A lake URL as the job needs it: filesystem, root path, and URIs for Spark."""

    def __init__(self, url: str, hdfs_client: Any = None) -> None:
        self.url = url
        self.fs, root = filesystem_for(url, hdfs_client)
        if url.startswith("hdfs://"):
            self.root = root
            self.base = "hdfs://" + url[len("hdfs://") :].split("/", 1)[0]
        else:
            self.root = os.path.abspath(root)
            self.base = "file://"

    def uri(self, path: str) -> str:
        return self.base + path


# -- Spark -------------------------------------------------------------------------------


def spark_settings(master: str | None, conf: dict[str, str]) -> dict[str, str]:
    settings = dict(DEFAULT_CONF)
    if master and master.startswith("local"):
        settings.update(LOCAL_CONF)
    settings.update(conf)
    settings.update(REQUIRED_CONF)
    return settings


#: Our SQL settings are set on the session once it exists (they are runtime settings):
#: builder options would also become JVM-wide defaults for every later session.
SESSION_KEYS = frozenset(REQUIRED_CONF) | {"spark.sql.parquet.compression.codec"}


def start_spark(master: str | None, conf: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession  # noqa: PLC0415 - only the job process loads Spark

    settings = spark_settings(master, conf)
    builder = SparkSession.builder.appName("logrouter-compact")
    if master:
        builder = builder.master(master)
    for key, value in settings.items():
        if key not in SESSION_KEYS:
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key in SESSION_KEYS:
        spark.conf.set(key, settings[key])
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _add_to_extra(F: Any, name: str) -> Any:
    """``_extra`` with ``name``'s value added as JSON (unchanged where the value is null).

    ``to_json(struct(v AS name))`` encodes like the lake does: strings escaped, bytes
    as base64, NaN/±Infinity as strings, exact integers; the key is spliced into the
    existing object text, never parsed or re-encoded.
    """
    value = F.col(_quoted(name))
    extra = F.col(EXTRA)
    piece = F.to_json(F.struct(value.alias(name)))
    joined = F.concat(extra.substr(F.lit(1), F.length(extra) - 1), F.lit(","), piece.substr(F.lit(2), F.length(piece)))
    empty = extra.isNull() | (F.length(F.trim(extra)) <= 2)  # null, "{}" (or "" from a foreign writer)
    return F.when(value.isNull(), extra).when(empty, piece).otherwise(joined)


def merged_frame(spark: Any, plan: MergePlan, files: list[InputFile], uri: Callable[[str], str]) -> Any:
    """One DataFrame of every row of ``files`` in the plan's schema."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    frames = []
    for moved, group in plan.groups(files):
        frame = spark.read.option("mergeSchema", "true").parquet(*[uri(f.name) for f in group])
        if EXTRA not in frame.columns:
            frame = frame.withColumn(EXTRA, F.lit(None).cast("string"))
        for name, _ in moved:
            frame = frame.withColumn(EXTRA, _add_to_extra(F, name))
            frame = frame.select([F.col(_quoted(c)) for c in frame.columns if c != name])
        frames.append(frame)
    frame = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
    return frame.select([F.col(_quoted(name)) for name, _ in plan.columns])


def rewrite(spark: Any, plan: MergePlan, files: list[InputFile], uri: Callable[[str], str], out_uri: str, count: int) -> None:
    """Write the merged rows as ``count`` files sorted by ``time`` into ``out_uri``."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    frame = merged_frame(spark, plan, files, uri)
    time_column = F.col(TIME)
    frame.repartitionByRange(count, time_column).sortWithinPartitions(time_column).write.mode("errorifexists").parquet(
        out_uri
    )


# -- one partition -----------------------------------------------------------------------


def read_footers(fs: Any, directory: str, entries: list[Any]) -> list[InputFile]:
    files = []
    for entry in entries:
        stream = fs.open_read(posixpath.join(directory, entry.name))
        try:
            parquet = pq.ParquetFile(stream)
            meta = parquet.metadata
            data = sum(
                meta.row_group(g).column(c).total_compressed_size
                for g in range(meta.num_row_groups)
                for c in range(meta.num_columns)
            )
            files.append(InputFile(entry.name, entry.size, meta.num_rows, parquet.schema_arrow, data))
        finally:
            stream.close()
    return files


def stage_outputs(fs: Any, swap: Swap, out_dir: str) -> list[InputFile]:
    """Name Spark's part files ``compacted-<run>-<n>.parquet`` in the run directory, drop
    Spark's leftovers (``_SUCCESS``, checksums, ``_temporary``); the outputs' footers."""
    names = []
    produced = [e for e in fs.list_entries(out_dir) if not e.is_dir and is_data_file(e.name)]
    for number, entry in enumerate(produced, 1):
        name = compacted_name(swap.run_id, number)
        fs.replace(posixpath.join(out_dir, entry.name), swap.staged(name))
        names.append(name)
    fs.remove_tree(out_dir)
    fs.sync_dir(swap.run_dir)
    staged = [e for e in fs.list_entries(swap.run_dir) if e.name in names]
    return read_footers(fs, swap.run_dir, staged)


def footers_info(files: list[InputFile]) -> list[FileInfo]:
    return [FileInfo(f.name, f.bytes, f.rows) for f in files]


def audit(key: str, inputs: list[InputFile], outputs: list[InputFile], plan: MergePlan) -> None:
    """Outputs hold exactly the inputs' row count, in the planned columns."""
    rows_in = sum(f.rows for f in inputs)
    rows_out = sum(f.rows for f in outputs)
    if rows_in != rows_out:
        raise RuntimeError(f"{key}: audit failed: {rows_in} rows in the inputs, {rows_out} in the outputs")
    expected = [name for name, _ in plan.columns]
    for f in outputs:
        if f.schema.names != expected:
            raise RuntimeError(f"{key}: audit failed: {f.name} has columns {f.schema.names}, planned {expected}")


def _noop(step: str) -> None:
    pass


def compact_partition(
    spark: Callable[[], Any],
    lake: Lake,
    key: str,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
    *,
    lease_owner: str | None = None,
    lease_secs: float = DEFAULT_LEASE_SECS,
    hook: Callable[[str], None] = _noop,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Compact one partition; the result as a JSON-able dict (``status``: compacted,
    skipped, recovered or busy). ``spark`` returns the session (started on first use).
    Raises on failure, after removing the run's staging (an audit or Spark failure)."""
    started = time.monotonic()
    fs, root = lake.fs, lake.root
    result: dict[str, Any] = {"lake": lake.url, "partition": key}
    if lease_owner is not None:
        lease = leases.find(fs, root, key, lease_owner, clock())
        if lease is None:
            return {**result, "status": "busy", "reason": f"the lease is not held by {lease_owner}"}
    else:
        owner = f"compact-{socket.gethostname()}-{os.getpid()}"
        lease = leases.acquire(fs, root, key, owner, clock(), lease_secs)
        if lease is None:
            _, data = leases.current(fs, root, key)
            return {**result, "status": "busy", "reason": f"lease held by {leases.holder(data, clock())}"}
    try:
        recovered = recover(fs, root, key, hook)
        if recovered:
            result["recovered"] = [f"{run}: {action}" for run, action in recovered]
        partition = partition_from_key(fs, root, key)
        result.update(files_before=len(partition.files), bytes_before=partition.bytes)
        worth, reason = worth_compacting(partition, 2, target_file_bytes)
        if not worth:
            status = "recovered" if recovered else "skipped"
            return {**result, "status": status, "reason": reason, "files_after": len(partition.files),
                    "bytes_after": partition.bytes, "seconds": round(time.monotonic() - started, 3)}
        inputs = read_footers(fs, posixpath.join(root, key), partition.files)
        footers_done = time.monotonic()
        plan = plan_merge(inputs)
        # Sized by the inputs' column data: small files carry much footer and page overhead.
        count = output_file_count(sum(f.data_bytes for f in inputs), target_file_bytes)
        swap = Swap(fs, root, key, new_run_id(), hook)
        fs.makedirs(swap.run_dir)
        try:
            out_dir = posixpath.join(swap.run_dir, "spark")
            session = spark()
            spark_started = time.monotonic()
            rewrite(session, plan, inputs, lambda name: lake.uri(posixpath.join(root, key, name)), lake.uri(out_dir), count)
            rewritten = time.monotonic()
            outputs = stage_outputs(fs, swap, out_dir)
            hook("staged")
            audit(key, inputs, outputs, plan)
            hook("audited")
            if lease is not None and not leases.held_by(fs, root, lease, clock()):
                raise LeaseLost(f"{key}: the lease expired or was taken over; not committing")
        except Exception:
            swap.roll_back()
            raise
        # The lake's table has every column of the outputs before they are visible (files
        # of older writers may bring columns it lacks); additive, so cheap when it has them.
        update_table(fs, root, [(name, t) for name, t in plan.columns if name not in (TIME, EXTRA)])
        swap.commit(footers_info(inputs), footers_info(outputs))
        moved = sum(1 for f in inputs if f.name in plan.moves)
        after = partition_from_key(fs, root, key)  # the outputs, and any file that arrived meanwhile
        return {
            **result,
            "status": "compacted",
            "reason": reason,
            "run": swap.run_id,
            "rows": sum(f.rows for f in inputs),
            "files_after": len(after.files),
            "bytes_after": after.bytes,
            "outputs": len(outputs),
            "output_bytes": sum(o.bytes for o in outputs),
            "moved_to_extra": sorted({name for names in plan.moves.values() for name in names}),
            "files_with_moved_columns": moved,
            "seconds": round(time.monotonic() - started, 3),
            # where the time went: footers read, Spark started (first partition only),
            # Spark read+merge+sort+write, staging+audit+swap
            "phases": {
                "footers": round(footers_done - started, 3),
                "spark_start": round(spark_started - footers_done, 3),
                "rewrite": round(rewritten - spark_started, 3),
                "swap": round(time.monotonic() - rewritten, 3),
            },
        }
    finally:
        # Also a lease the scheduler took: if the router died meanwhile, nobody else would
        # release it. The scheduler's own release then finds it released already.
        leases.release(fs, root, lease, clock())


# -- command line ------------------------------------------------------------------------


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="logrouter.jobs.compact", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lake", required=True, help="lake root: a path, file://… or hdfs://namenode:8020/path")
    parser.add_argument("--partition", action="append", default=[], help="tag=…/dt=YYYY-MM-DD/hour=HH (repeatable)")
    parser.add_argument("--target-file-bytes", type=int, default=DEFAULT_TARGET_FILE_BYTES)
    parser.add_argument("--master", default=None, help="Spark master (not with spark-submit, which has its own)")
    parser.add_argument("--conf", action="append", type=_conf_pair, default=[], help="Spark setting KEY=VALUE")
    parser.add_argument("--lease-owner", default=None, help="the scheduler holding the partitions' leases")
    parser.add_argument("--lease-secs", type=float, default=DEFAULT_LEASE_SECS)
    parser.add_argument("--seal-after-secs", type=float, default=3600, help="without --partition: sealing rule")
    parser.add_argument("--min-files", type=int, default=2, help="without --partition: worth-it rule")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lake = Lake(args.lake)
    keys = args.partition or [
        c.partition.key
        for c in plan_lake(lake.fs, lake.root, time.time(), args.seal_after_secs, args.min_files, args.target_file_bytes)
    ]
    session: list[Any] = []

    def spark() -> Any:
        if not session:
            session.append(start_spark(args.master, dict(args.conf)))
        return session[0]

    status = 0
    try:
        for key in keys:
            try:
                result = compact_partition(
                    spark, lake, key, args.target_file_bytes, lease_owner=args.lease_owner, lease_secs=args.lease_secs
                )
            except Exception as error:  # noqa: BLE001 - reported per partition; the others go on
                traceback.print_exc(file=sys.stderr)
                result = {"lake": lake.url, "partition": key, "status": "failed", "error": f"{type(error).__name__}: {error}"}
                status = 1
            print(RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)
    finally:
        if session:
            session[0].stop()
    return status


if __name__ == "__main__":
    sys.exit(main())

"""Spark with the Iceberg runtime (one session for the module, ``tests/iceberg_spark.py``):
Spark's Iceberg procedures on a table that a writer process keeps appending to, and
Spark SQL reading tables pyiceberg wrote or ``logrouter lake import`` registered.

**Compaction while appending.**
A pyiceberg SQLite catalog and a table shaped like the Iceberg sink's (``day(time)``,
``identity(tag)``), 96 small data files in it. A writer process appends 40-row batches
in a loop (bounded in count and time), committing with the sink's snapshot summary
keys; meanwhile ``python -m logrouter.jobs.iceberg_maintain`` (the job the scheduler
runs, with the Iceberg runtime from Maven Central) runs ``rewrite_data_files``,
``rewrite_manifests``, ``expire_snapshots`` and ``remove_orphan_files``. Then:

- every id the writer says it committed is in the table exactly once (pyiceberg and
  Spark SQL through the same catalog, same name), none lost, none doubled, and appends
  committed while the rewrite ran;
- the small files were rewritten into a few (a ``replace`` snapshot without the writer's
  keys), the snapshot history was cut;
- of two files nothing references, the one older than the guard is removed and the
  fresh one (a write in flight) is kept, while every referenced file, however old its
  mtime, is kept.

**An imported lake.** ``logrouter lake import`` of a parquet lake (tests/
test_iceberg_lake_cli.py's): Spark SQL reads the same rows as pyarrow reads from the
lake, ``tag`` (a partition value only, in no file) included, and filters on it.

Slow (two JVMs, one after the other); skipped, with the reason, without java, pyspark
4.1 or the jars.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from repo_paths import REPO, TESTS
from iceberg_spark import JARS_DIR, IcebergSpark, events, jars_or_skip, new_events_table, open_catalog, run_job, spark_or_skip, sqlite_catalog
from logrouter.compaction.command import RESULT_PREFIX
from logrouter.compaction.iceberg import CATALOG_ENV
from test_iceberg_lake_cli import COLUMNS, catalog_flags, lake, lake_rows, write_lake

pytest.importorskip("pyiceberg")

BATCH = 40
INITIAL_APPENDS = 24
WRITER = r"""
import json, os, sys, time
sys.path[:0] = [sys.argv[1]]
from iceberg_spark import events, open_catalog
name, properties, first, stop_file = sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
table = open_catalog(name, properties).load_table("logs.events")
deadline = time.monotonic() + 300
n = first
for _ in range(400):
    if os.path.exists(stop_file) or time.monotonic() > deadline:
        break
    table.append(events(n, {batch}), snapshot_properties={{"logrouter.writer": "w1", "logrouter.spool-position": str(n + {batch})}})
    n += {batch}
    print("committed", n, time.time(), flush=True)
    time.sleep(1)  # pacing: a commit every second or so (a sink commits every few): not a wait for anything
print("done", n, flush=True)
""".format(batch=BATCH)


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    spark_or_skip()
    harness = IcebergSpark(jars_or_skip(), tmp_path_factory.mktemp("spark"))
    try:
        yield harness
    finally:
        harness.stop()


class Writer:
    """The writer process; its stdout lines collected by a thread."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.errors = open(cwd / "writer.err", "w+")  # noqa: SIM115 - closed by stop()
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.errors, text=True, cwd=cwd, env=env)
        self.lines: list[str] = []
        self.fresh: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            self.fresh.put(line)
        self.fresh.put(None)

    def wait_for(self, prefix: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.fresh.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self.errors.seek(0)
                raise AssertionError(f"the writer ended before {prefix!r}: {self.errors.read()[-2000:]}")
            if line.startswith(prefix):
                return
        raise AssertionError(f"no {prefix!r} from the writer within {timeout}s")

    def stop(self, stop_file: Path) -> int:
        stop_file.touch()
        try:
            return self.process.wait(120)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(30)
            self.errors.close()


def test_rewrite_while_a_writer_appends_loses_and_doubles_nothing(spark, tmp_path):
    name, properties = sqlite_catalog(tmp_path / "lake", "lake_compact")
    table = new_events_table(open_catalog(name, properties))
    for n in range(INITIAL_APPENDS):
        table.append(events(n * BATCH, BATCH), snapshot_properties={"logrouter.writer": "w0"})
    first_writer_id = INITIAL_APPENDS * BATCH
    files_before = len(list(table.scan().plan_files()))
    assert files_before == INITIAL_APPENDS * 4  # 2 days x 2 tags per append

    data_dir = Path(table.location().removeprefix("file://")) / "data"
    five_days_ago = time.time() - 5 * 86400
    for path in data_dir.rglob("*.parquet"):  # referenced files look old: only the references keep them
        os.utime(path, (five_days_ago, five_days_ago))
    old_orphan, fresh_orphan = data_dir / "orphan-old.parquet", data_dir / "orphan-fresh.parquet"
    old_orphan.write_bytes(b"PAR1 from a crashed writer, long ago")
    os.utime(old_orphan, (five_days_ago, five_days_ago))
    fresh_orphan.write_bytes(b"PAR1 being written right now")

    stop_file = tmp_path / "stop"
    writer = Writer(
        [sys.executable, "-c", WRITER, str(TESTS), name, json.dumps(properties), str(first_writer_id), str(stop_file)],
        tmp_path, {**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        writer.wait_for("committed", 60)
        started = time.time()
        job = run_job(
            [sys.executable, "-m", "logrouter.jobs.iceberg_maintain", "--catalog-name", name, "--table", "logs.events",
             "--master", "local[2]", "--jars-dir", str(JARS_DIR), "--seal-after-secs", "0", "--min-input-files", "2",
             "--target-file-bytes", str(64 << 20), "--snapshot-retention-secs", "1", "--retain-last", "3"],
            {CATALOG_ENV: json.dumps(properties)}, tmp_path,
        )
        ended = time.time()
        results = [json.loads(line[len(RESULT_PREFIX):]) for line in job.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
        assert job.returncode == 0 and results, job.stdout[-3000:]
        writer.wait_for("committed", 60)  # and it goes on after the job
    finally:
        status = writer.stop(stop_file)
    assert status == 0 and writer.lines[-1].startswith("done"), (tmp_path / "writer.err").read_text()[-2000:]
    commits = [line.split() for line in writer.lines if line.startswith("committed")]
    last_id = int(writer.lines[-1].split()[1])

    [result] = results
    assert result["status"] == "compacted", result
    rewrite = result["rewrite_data_files"]
    # partial progress: a file group whose commit lost to the writer stays for the next round
    # (Iceberg counts such groups nowhere, so no bound on rewritten + failed holds here)
    assert rewrite["rewritten_data_files_count"] >= files_before // 2
    assert rewrite["added_data_files_count"] <= 8
    # the round's numbers: the files it began with (the writer's too), those files as the
    # rewrite left them (the writer's appends meanwhile apart), the rows the rewrite moved
    assert result["files_before"] >= files_before and result["files_appended"] >= 1
    if "retries" not in rewrite:  # else the commits of an attempt that lost count too
        assert result["files_after"] == (result["files_before"] - rewrite["rewritten_data_files_count"]
                                         + rewrite["added_data_files_count"])
    assert 0 < result["rows"] <= result["table_rows"]
    assert result["rewrite_manifests"]["added_manifests_count"] >= 1
    assert result["expire_snapshots"]["deleted_manifest_lists_count"] >= INITIAL_APPENDS
    assert result["remove_orphan_files"] == {"orphan_files_removed": 1, "seconds": result["remove_orphan_files"]["seconds"]}
    assert not old_orphan.exists() and fresh_orphan.exists()

    table = open_catalog(name, properties).load_table("logs.events")
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    assert len(ids) == last_id and set(ids) == set(range(last_id)), "lost or doubled rows"
    replace = [s for s in table.snapshots()  # the data rewrite's (rewrite_manifests also makes a "replace")
               if s.summary.operation.value == "replace" and "deleted-data-files" in s.summary.additional_properties]
    assert replace and "logrouter.writer" not in replace[-1].summary.additional_properties
    rewrite_started = replace[-1].timestamp_ms / 1000 - rewrite["seconds"]
    during = [c for c in commits if rewrite_started <= float(c[2]) <= replace[-1].timestamp_ms / 1000]
    assert started < rewrite_started < ended
    assert during, f"no append committed while the rewrite ran: the test proved nothing"
    assert len(table.snapshots()) < INITIAL_APPENDS + len(commits)

    spark.add_catalog(name, properties)
    [row] = spark.sql(f"SELECT count(*) AS n, count(DISTINCT id) AS ids, max(id) AS top FROM {name}.logs.events")
    assert (row["n"], row["ids"], row["top"]) == (last_id, last_id, last_id - 1)
    [summary] = spark.sql(
        f"SELECT summary['logrouter.spool-position'] AS p FROM {name}.logs.events.snapshots "
        f"WHERE summary['logrouter.writer'] = 'w1' ORDER BY committed_at DESC LIMIT 1"
    )
    assert summary["p"] == str(last_id)


def test_spark_reads_an_imported_lake_as_pyarrow_reads_the_lake(spark, tmp_path):
    root = tmp_path / "parquet"
    write_lake(root)
    name, properties = sqlite_catalog(tmp_path / "iceberg", "lake_imported")
    code, out, _ = lake("import", *catalog_flags(name, properties), "--table", "logs.imported", "--path", str(root))
    assert "3 file(s) added" in out, out
    spark.add_catalog(name, properties)
    quoted = ", ".join(f"`{c}`" for c in COLUMNS)
    rows = spark.sql(f"SELECT {quoted} FROM {name}.logs.imported")
    expected = lake_rows(root)
    got = sorted(tuple(r[c] for c in COLUMNS) for r in rows)
    assert [r[1:] for r in got] == [r[1:] for r in expected]  # every column but time: equal values
    assert [r[0].timestamp() for r in got] == [r[0].timestamp() for r in expected]  # time: the same instants
    [row] = spark.sql(f"SELECT count(*) AS n FROM {name}.logs.imported WHERE tag = '100'")
    assert row["n"] == 3

"""Compaction on a real Spark standalone cluster over a lake on a real HDFS.

The session's MiniDFSCluster (tests/hdfs_cluster.py) and one Spark standalone master + worker,
both on loopback, the Spark pair started from pyspark's own launcher (``bin/spark-class``)
for the module. ``logrouter compact --master spark://127.0.0.1:PORT`` compacts many sealed
partitions of ``hdfs://127.0.0.1:PORT/lake`` in ONE job (one Spark application, no JVM
per partition), audited and swapped as on ``local[*]``; the lake is then read back with
pyarrow and with a Spark session on the same cluster. hdfs-native runs only in child
interpreters (``in_child``, tests/hdfs_cluster.py), so the in-process Spark session's
fork is safe.

Slow (JVMs); skipped, with the reason, when pyspark, java or mvn are missing or Maven
cannot fetch.
"""

from __future__ import annotations

import collections
import os
import queue
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hdfs_cluster import in_child
from process_log import ProcessLog
from repo_paths import REPO
from logrouter.compaction.layout import is_compacted, list_partitions
from logrouter.lake.dataset import lake_dataset
from logrouter.lake.fs import filesystem_for
from logrouter.lake.partition import HOUR_NS
from logrouter.lake.writer import LakeWriter

T0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z: long sealed
TAGS = ["app", "db", "web"]
HOURS = 2
FILES_PER_PARTITION = 3
ROWS_PER_FILE = 50


class Launched(ProcessLog):
    """A spark-class process (its own session), its log read by a thread and copied to ``log``."""

    LOG_NAME = "spark-class"
    LOG_TAIL = 4000

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self.process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.follow_output()

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        return super().wait_for(pattern, timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)


@pytest.fixture(scope="module")
def spark_master(hdfs, tmp_path_factory):
    pyspark = pytest.importorskip("pyspark")

    home = Path(pyspark.__file__).parent
    base = tmp_path_factory.mktemp("spark")
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_DIRS=str(base),
               SPARK_WORKER_DIR=str(base / "work"), PYSPARK_PYTHON=sys.executable, SPARK_LOG_DIR=str(base))
    spark_class = str(home / "bin" / "spark-class")
    started = []
    try:
        master = Launched([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                           "--webui-port", "0"], env, base / "master.log")
        started.append(master)
        url = master.wait_for(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)").group(1)
        worker = Launched([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0",
                           "--webui-port", "0", "--cores", "2", "--memory", "2g", "--work-dir", str(base / "work"), url],
                          env, base / "worker.log")
        started.append(worker)
        worker.wait_for(r"Successfully registered with master")
        yield url, master
    finally:
        for process in reversed(started):
            process.stop()


def write_lake(url: str) -> collections.Counter:
    fs, root = filesystem_for(url)
    ids = collections.Counter()
    for number in range(FILES_PER_PARTITION):
        writer = LakeWriter(root, f"w{number}", 1 << 30, 60, fs=fs)
        for tag in TAGS:
            events = []
            for hour in range(HOURS):
                for i in range(ROWS_PER_FILE):
                    record_id = f"{tag}-{hour}-{number}-{i}"
                    record = {"id": record_id, "n": i, "msg": "x" * 30}
                    if number == 1:
                        record["n"] = str(i)  # a type conflict between files: moved into _extra
                        record["late"] = True
                    events.append((T0 + hour * HOUR_NS + i * 1000, record))
                    ids[record_id] += 1
            writer.write(tag, events, now=0)
        writer.publish(writer.seal_all())
    return ids


def partitions(url: str) -> list[tuple[str, list[str]]]:
    fs, root = filesystem_for(url)
    return [(p.key, [f.name for f in p.files]) for p in list_partitions(fs, root)]


def read_back(url: str) -> tuple[collections.Counter, int, list]:
    fs, root = filesystem_for(url)
    table = lake_dataset(url).to_table()
    extra = sum(1 for e in table.column("_extra").to_pylist() if e)
    from logrouter.compaction.swap import interrupted

    return collections.Counter(table.column("id").to_pylist()), extra, interrupted(fs, root)


def test_one_job_on_the_standalone_cluster_compacts_every_partition_of_the_hdfs_lake(hdfs, spark_master, tmp_path):
    master_url, master = spark_master
    url = hdfs.url("/compact/lake")
    ids = in_child(write_lake, url)
    before = in_child(partitions, url)
    assert len(before) == len(TAGS) * HOURS and all(len(files) == FILES_PER_PARTITION for _, files in before)

    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "logrouter", "compact", "--path", url, "--master", master_url, "--seal-after-secs", "0",
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
         "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2", "--conf", "spark.sql.shuffle.partitions=2"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == len(before), done.stdout
    assert all(": compacted, 3 files" in line and f"{FILES_PER_PARTITION * ROWS_PER_FILE} rows" in line
               for line in lines), done.stdout
    # one Spark application for every partition, run by the standalone cluster
    registered = [line for line in master.lines if "Registering app logrouter-compact" in line]
    assert len(registered) == 1, "".join(master.lines[-20:])

    after = in_child(partitions, url)
    assert [key for key, _ in after] == [key for key, _ in before]
    assert all(len(files) == 1 and is_compacted(files[0]) for _, files in after)
    read_ids, extra, staging = in_child(read_back, url)
    assert read_ids == ids and staging == []
    assert extra == len(TAGS) * HOURS * ROWS_PER_FILE  # the losing "n" variant moved to _extra

    # and Spark reads the compacted lake on the same cluster
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master_url).appName("logrouter-read-test")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m").config("spark.cores.max", "2")
             .getOrCreate())
    try:
        frame = spark.read.parquet(url)
        assert {"id", "n", "msg", "late", "_extra", "tag", "dt", "hour"} <= set(frame.columns)
        assert frame.count() == sum(ids.values())
        assert frame.select("id").distinct().count() == len(ids)
    finally:
        spark.stop()


def iceberg_table_on_hdfs(catalog_dir: str, warehouse: str, batches: int) -> int:
    """A pyiceberg table with its files on HDFS (our HdfsFileIO), ``batches`` appends."""
    from iceberg_spark import events, new_events_table, open_catalog

    table = new_events_table(open_catalog("lake_hdfs", iceberg_catalog(catalog_dir, warehouse)))
    for n in range(batches):
        table.append(events(n * 25, 25), snapshot_properties={"logrouter.writer": "w0"})
    return len(list(table.scan().plan_files()))


def iceberg_ids(catalog_dir: str, warehouse: str) -> tuple[list[int], int, list[str]]:
    from iceberg_spark import open_catalog

    table = open_catalog("lake_hdfs", iceberg_catalog(catalog_dir, warehouse)).load_table("logs.events")
    files = [task.file.file_path for task in table.scan().plan_files()]
    return table.scan().to_arrow().column("id").to_pylist(), len(files), files


def iceberg_catalog(catalog_dir: str, warehouse: str) -> dict[str, str]:
    return {"uri": f"sqlite:///{catalog_dir}/catalog.db", "warehouse": warehouse,
            "py-io-impl": "logrouter.lake.iceberg_hdfs_io.HdfsFileIO"}


def test_iceberg_maintenance_on_the_standalone_cluster_of_a_table_on_hdfs(hdfs, spark_master, tmp_path):
    """The Iceberg job on the cluster: pyiceberg wrote through our HdfsFileIO, Spark's
    executors rewrite through Hadoop's client, pyiceberg reads the result back."""
    pytest.importorskip("pyiceberg")
    import json

    from iceberg_spark import JARS_DIR, jars_or_skip, spark_or_skip

    spark_or_skip()
    jars_or_skip()
    master_url, master = spark_master
    warehouse = hdfs.url("/iceberg/warehouse")
    files_before = in_child(iceberg_table_on_hdfs, str(tmp_path), warehouse, 6)
    assert files_before == 6 * 4
    env = dict(os.environ, PYTHONPATH=str(REPO),
               LOGROUTER_ICEBERG_CATALOG=json.dumps(iceberg_catalog(str(tmp_path), warehouse)))
    done = subprocess.run(
        [sys.executable, "-m", "logrouter.jobs.iceberg_maintain", "--catalog-name", "lake_hdfs", "--table", "logs.events",
         "--master", master_url, "--jars-dir", str(JARS_DIR), "--seal-after-secs", "0",
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
         "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2", "--conf", "spark.sql.shuffle.partitions=2"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    [result] = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("compaction-result")]
    assert result["rewrite_data_files"]["rewritten_data_files_count"] == files_before
    assert [line for line in master.lines if "Registering app logrouter-iceberg-maintain" in line]
    ids, files_after, paths = in_child(iceberg_ids, str(tmp_path), warehouse)
    assert sorted(ids) == list(range(150)) and files_after == 4
    assert all(path.startswith(warehouse + "/logs/events/data/") for path in paths)

"""Two routers (two real daemons) writing one Iceberg table: one PostgreSQL catalog
(``tests/postgres_server.py``), one HDFS warehouse (the MiniDFSCluster,
``tests/hdfs_cluster.py``) through ``logrouter.lake.iceberg_hdfs_io.HdfsFileIO``.

Each router has its own spool, ``writer_id`` and client; both commit into the table at
once (optimistic concurrency: a loser retries). Under load, one of them is killed with
``-9`` and started again, once; the other keeps appending meanwhile. The table then holds
every acked event of both clients exactly once, read by a pyiceberg scan (in a child
interpreter: hdfs-native stays out of the pytest process) and by Spark SQL through
Iceberg's ``JdbcCatalog`` on the same database under the same catalog name, with Hadoop's
own HDFS client; every data file is on the NameNode.

Bounds: every client run is bounded in chunks and time, every wait has a timeout;
loopback. Skipped, saying why, without PostgreSQL, java/mvn, hdfs-native, pyspark 4.1 or the
Iceberg jars.
"""

from __future__ import annotations

import collections
import random
import threading
import time

import pytest

pytest.importorskip("pyiceberg")

from chunk_client import Client, expected_ids  # noqa: E402
from crash_cycles import finish, run_cycles  # noqa: E402
from daemon import Daemon  # noqa: E402
from hdfs_cluster import in_child  # noqa: E402
from iceberg_spark import IcebergSpark, jars_or_skip, spark_or_skip  # noqa: E402

pytestmark = pytest.mark.timeout(900)

IO_IMPL = "logrouter.lake.iceberg_hdfs_io.HdfsFileIO"
CONFIG = """
[router]
shutdown_timeout_secs = 60

[spool]
path = "spool"
segment_bytes = 65536

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "iceberg"
inputs = ["forward"]
warehouse = "{warehouse}"
catalog_uri = "{uri}"
catalog_properties = {{ "py-io-impl" = "{io}" }}
writer_id = "{writer}"
roll_secs = 0.5
roll_bytes = 200000
row_group_rows = 500
retry_initial_secs = 0.2
flatten = true
"""


def scan(uri: str, warehouse: str) -> dict:
    """In a child interpreter: the table's ids, writers and whether its files are on HDFS."""
    from logrouter.lake.fs import filesystem_for
    from logrouter.lake.iceberg_catalog import open_catalog

    table = open_catalog("lake", {"type": "sql", "uri": uri, "warehouse": warehouse, "py-io-impl": IO_IMPL}).load_table("logs.events")
    fs, _ = filesystem_for(warehouse)
    files = [task.file.file_path for task in table.scan().plan_files()]
    return {
        "ids": table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist(),
        "writers": sorted({s.summary["logrouter.writer"] for s in table.snapshots() if s.summary["logrouter.writer"]}),
        "files_on_hdfs": bool(files) and all(f.startswith(warehouse + "/") and fs.exists(f.split(fs.url, 1)[1]) for f in files),
        "location": table.location(),
    }


def test_two_routers_on_one_postgres_catalog_and_one_hdfs_warehouse_one_killed(postgres, hdfs, tmp_path):
    spark_or_skip()
    jars = jars_or_skip()
    warehouse = hdfs.url("/routers/warehouse")  # the HDFS is the session's: a directory of its own
    workdirs = [tmp_path / "router1", tmp_path / "router2"]
    configs = []
    for n, workdir in enumerate(workdirs, 1):
        workdir.mkdir()
        configs.append(CONFIG.format(warehouse=warehouse, uri=postgres.uri, io=IO_IMPL, writer=f"router{n}"))
    steady, crashing = Client(), Client()
    crashing.next_chunk = 100_000  # their own chunk numbers
    with Daemon(workdirs[0], configs[0]) as first:
        first.start(timeout=120)
        port = first.port("forward")
        stop = threading.Event()

        def send() -> None:  # router1 under load the whole time, paced by its acks
            deadline = time.monotonic() + 600
            while not stop.is_set() and time.monotonic() < deadline and steady.next_chunk < 3000:
                steady.run(port, 3000, deadline, stop=stop)

        sender = threading.Thread(target=send)
        sender.start()
        try:
            # router2: started, loaded, killed with -9 at a random moment; started again, the
            # unacked chunks resent, stopped gracefully
            run_cycles(workdirs[1], configs[1], ("load",), crashing, random.Random(20261128), delay=0.5)
            second = finish(workdirs[1], configs[1], crashing)
        finally:
            stop.set()
            sender.join(120)
        if steady.unacked:
            steady.run(port, len(steady.unacked) + 5, time.monotonic() + 120)
        assert not steady.unacked
        first.stop_gracefully()
    assert len(steady.acked) >= 10 and len(crashing.acked) >= 3
    assert "iceberg sink lake committed" in second.output
    result = in_child(scan, postgres.uri, warehouse)
    doubled = [i for i, c in collections.Counter(result["ids"]).items() if c > 1]
    assert not doubled, f"{len(doubled)} ids landed more than once, e.g. {doubled[:5]}"
    expected = expected_ids(steady.acked | crashing.acked)
    found = set(result["ids"])
    assert found == expected, f"missing {len(expected - found)}, unexpected {len(found - expected)}"
    assert result["writers"] == ["router1", "router2"]
    assert result["files_on_hdfs"] and result["location"] == warehouse + "/logs/events"

    spark = IcebergSpark(jars, tmp_path / "spark")  # one session, after hdfs-native ran in a child only
    try:
        spark.add_catalog("lake", {"uri": postgres.uri, "warehouse": warehouse})
        [row] = spark.sql("SELECT count(*) AS n, count(DISTINCT id) AS ids FROM lake.logs.events")
        assert (row["n"], row["ids"]) == (len(expected), len(expected))
        writers = spark.sql("SELECT DISTINCT summary['logrouter.writer'] AS w FROM lake.logs.events.snapshots "
                            "WHERE operation = 'append'")
        assert sorted(r["w"] for r in writers) == ["router1", "router2"]
    finally:
        spark.stop()

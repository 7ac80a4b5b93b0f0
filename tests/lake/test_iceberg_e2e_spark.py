"""The iceberg sink in the real daemon, read by the real Iceberg runtime in Spark.

One Spark session for the module (``tests/iceberg_spark.py``: 10-20 s to start here); each
test's table gets its own catalog name, which the sink (``catalog``) and Spark
(``spark.sql.catalog.<name>``) share, as they must:

* kill -9 cycles under load (``tests/crash_cycles.py``): Spark SQL counts every acked
  event exactly once;
* a schema that grows mid-stream (new fields, a flattened one, a type conflict): Spark
  reads every column, with the values each record had;
* ``[compaction]`` in the daemon while it appends: the scheduler runs
  ``logrouter.jobs.iceberg_maintain`` (its own Spark) on the sink's table; the table ends
  with fewer data files than were committed, its snapshots expired, and every acked event
  once (pyiceberg and Spark).

Bounds: every client run is bounded in chunks and time, every wait has a timeout;
loopback. Skipped, saying why, without java, pyspark 4.1 or the Iceberg jars.
"""

from __future__ import annotations

import collections
import datetime
import os
import random
import re
import threading
import time

import pytest

pytest.importorskip("pyiceberg")

from chunk_client import Client, expected_ids  # noqa: E402
from crash_cycles import finish, run_cycles  # noqa: E402
from daemon import Daemon  # noqa: E402
from iceberg_spark import JARS_DIR, IcebergSpark, jars_or_skip, spark_or_skip  # noqa: E402
from logrouter.lake.iceberg_catalog import open_catalog  # noqa: E402
from test_iceberg_e2e import send_records  # noqa: E402

pytestmark = pytest.mark.timeout(900)

CONFIG = """
[router]
shutdown_timeout_secs = 60
workers = 1

[spool]
path = "spool"
segment_bytes = 65536

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "iceberg"
inputs = ["forward"]
warehouse = "lake"
catalog = "{catalog}"
roll_secs = {roll_secs}
roll_bytes = 200000
row_group_rows = 500
retry_initial_secs = 0.2
flatten = true
{more}
"""


def config(catalog: str, roll_secs: float = 0.3, more: str = "") -> str:
    return CONFIG.format(catalog=catalog, roll_secs=roll_secs, more=more)


def properties(tmp_path) -> dict[str, str]:
    """The pyiceberg properties the sink makes of ``warehouse = "lake"`` in ``tmp_path``."""
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/lake/catalog.db", "warehouse": f"file://{tmp_path}/lake"}


def pyiceberg_table(tmp_path, catalog: str):
    return open_catalog(catalog, properties(tmp_path)).load_table("logs.events")


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    spark_or_skip()
    harness = IcebergSpark(jars_or_skip(), tmp_path_factory.mktemp("spark"))
    try:
        yield harness
    finally:
        harness.stop()


def spark_ids(spark, tmp_path, catalog: str) -> list[str]:
    spark.add_catalog(catalog, properties(tmp_path))
    [row] = spark.sql(f"SELECT count(*) AS n, count(DISTINCT id) AS ids FROM {catalog}.logs.events")
    ids = [r["id"] for r in spark.sql(f"SELECT id FROM {catalog}.logs.events")]
    assert (row["n"], row["ids"]) == (len(ids), len(set(ids)))
    return ids


def assert_once(ids: list[str], acked: set[int], who: str) -> None:
    doubled = [i for i, c in collections.Counter(ids).items() if c > 1]
    assert not doubled, f"{who}: {len(doubled)} ids more than once, e.g. {doubled[:5]}"
    expected = expected_ids(acked)
    assert set(ids) == expected, f"{who}: missing {len(expected - set(ids))}, unexpected {len(set(ids) - expected)}"


def test_spark_counts_every_acked_event_once_after_kill_9_cycles(spark, tmp_path):
    rng = random.Random(int(os.environ.get("LOGROUTER_CRASH_SEED", "20261128")))
    client = Client()
    text = config("lake_crash")
    kills = run_cycles(tmp_path, text, ("load", "start_kill", "load", "stop_kill"), client, rng, delay=0.3)
    finish(tmp_path, text, client)
    assert kills == 4 and client.acked
    ids = spark_ids(spark, tmp_path, "lake_crash")
    assert_once(ids, client.acked, "Spark")
    [writer] = spark.sql("SELECT DISTINCT summary['logrouter.writer'] AS w FROM lake_crash.logs.events.snapshots "
                         "WHERE operation = 'append'")
    assert writer["w"]  # the sink's commits, as Spark sees them


def test_spark_reads_a_schema_that_grew_mid_stream_with_every_column(spark, tmp_path):
    with Daemon(tmp_path, config("lake_schema")) as daemon:
        daemon.start()
        port = daemon.port("forward")
        send_records(port, "app", [{"id": f"a{i}", "n": i} for i in range(50)], "c1")
        daemon.wait_for(r"iceberg sink lake committed .* 50 rows", timeout=60)
        send_records(port, "app", [{"id": f"b{i}", "n": i, "status": 200, "http": {"method": "GET"}} for i in range(50)], "c2")
        daemon.wait_for(r"added column\(s\) status, http.method", timeout=60)
        send_records(port, "web", [{"id": f"c{i}", "n": "not a number", "late": True, "size": 1.5} for i in range(50)], "c3")
        daemon.wait_for(r"added column\(s\) late, size", timeout=60)
        daemon.stop_gracefully()
    spark.add_catalog("lake_schema", properties(tmp_path))
    frame = spark.session.table("lake_schema.logs.events")
    assert frame.columns == ["time", "id", "n", "status", "http.method", "late", "size", "_extra", "tag"]
    assert dict(frame.dtypes) == {"time": "timestamp", "id": "string", "n": "bigint", "status": "bigint",
                                  "http.method": "string", "late": "boolean", "size": "double", "_extra": "string",
                                  "tag": "string"}
    rows = {r["id"]: r.asDict() for r in frame.collect()}
    assert len(rows) == 150
    assert rows["a1"] | {"time": None} == {"time": None, "id": "a1", "n": 1, "status": None, "http.method": None,
                                           "late": None, "size": None, "_extra": None, "tag": "app"}
    assert (rows["b7"]["n"], rows["b7"]["status"], rows["b7"]["http.method"], rows["b7"]["late"]) == (7, 200, "GET", None)
    assert rows["c3"]["n"] is None and rows["c3"]["_extra"] == '{"n":"not a number"}'
    assert (rows["c3"]["late"], rows["c3"]["size"], rows["c3"]["tag"]) == (True, 1.5, "web")
    [count] = spark.sql("SELECT count(*) AS n FROM lake_schema.logs.events WHERE tag = 'app' AND status = 200")
    assert count["n"] == 50


COMPACTION = f"""
[compaction]
enabled = true
schedule_secs = 5
spark_master = "local[1]"
jars_dir = "{JARS_DIR}"
seal_after_secs = 0
min_input_files = 2
snapshot_retention_secs = 1
retain_snapshots = 2
iceberg_procedures = ["rewrite_data_files", "rewrite_manifests", "expire_snapshots"]
timeout_secs = 600
"""
COMPACTED = re.compile(r"compaction of iceberg lake_compact\.logs\.events \S+: (\d+) files \(\d+ B\) -> (\d+) .*, ([\d.]+)s$")
COMMITTED = re.compile(r"iceberg sink lake committed (\d+) file")


def logged_at(line: str) -> float:
    """The time of a daemon log line (twistd's ``2026-11-27T05:01:16+0000 [...]`` prefix)."""
    return datetime.datetime.strptime(line.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%S%z").timestamp()


def test_compaction_in_the_daemon_compacts_the_sinks_table_while_it_appends(spark, tmp_path):
    client = Client()
    with Daemon(tmp_path, config("lake_compact", roll_secs=1.0, more=COMPACTION)) as daemon:
        daemon.start()
        port = daemon.port("forward")
        stop = threading.Event()

        def send() -> None:  # a few chunks, a pause: the sink commits every second until the round is over
            deadline = time.monotonic() + 600
            while not stop.is_set() and time.monotonic() < deadline and client.next_chunk < 20_000:
                client.run(port, 5, deadline, stop=stop)
                stop.wait(0.2)  # pacing, not a wait for anything

        sender = threading.Thread(target=send)
        sender.start()
        try:
            done = daemon.wait_for(COMPACTED.pattern, timeout=600)
            stop.set()
            sender.join(120)
            if client.unacked:
                client.run(port, len(client.unacked) + 5, time.monotonic() + 120)
            assert not client.unacked
            daemon.stop_gracefully()
        finally:
            stop.set()
            sender.join(120)
            if daemon.process.poll() is None:
                daemon.stop()  # SIGTERM: the daemon kills its running job (a kill -9 would leave the job running)
    result_line = next(line for line in daemon.lines if COMPACTED.search(line))
    ended = logged_at(result_line)
    started = ended - float(done.group(3)) - 1  # the line's time has whole seconds
    during = [line for line in daemon.lines if COMMITTED.search(line) and started <= logged_at(line) <= ended]
    assert int(done.group(1)) >= 2, daemon.output[-3000:]  # the job found small files to rewrite
    assert len(during) >= 2, "no appends while the job ran: the test proved nothing"

    table = pyiceberg_table(tmp_path, "lake_compact")
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    assert_once(ids, client.acked, "pyiceberg")
    committed = [int(m.group(1)) for m in COMMITTED.finditer(daemon.output)]
    files_now = len(list(table.scan().plan_files()))
    assert files_now < sum(committed), (files_now, sum(committed))  # the table compacted
    print(f"{len(committed)} commits of {sum(committed)} files, {len(during)} while the job ran; the table has "
          f"{files_now} files, {len(table.snapshots())} snapshots; the first round: {done.group(0)}")
    assert len(table.snapshots()) < len(committed)  # expire_snapshots cut the history
    assert_once(spark_ids(spark, tmp_path, "lake_compact"), client.acked, "Spark")

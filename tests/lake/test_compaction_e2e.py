"""End to end: the running daemon compacts what it wrote.

``twistd -n logrouter`` with ``[compaction] enabled = true``: events stamped two hours
ago arrive in several acked PackedForward batches, each sealed into its own file
(``roll_bytes = 1``); with ``seal_after_secs = 0`` the partition is sealed at once, the
scheduler starts the real Spark job (``python -m logrouter.jobs.compact``, ``local[1]``)
as a child process, and the partition ends up as one compacted file holding every
event exactly once. Slow (a JVM); skipped, with the reason, without pyspark or java.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import socket
import struct
import time

import msgpack
import pytest

from daemon import Daemon
from helpers import recv_exactly
from logrouter.lake.dataset import lake_dataset

CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
roll_bytes = 1          # every batch seals its own file: many small files
roll_secs = 3600

[compaction]
enabled = true
schedule_secs = 2
seal_after_secs = 0
spark_master = "local[1]"
spark_conf = { "spark.sql.shuffle.partitions" = "1" }
timeout_secs = 600
"""

BATCHES = 5
PER_BATCH = 40
DONE = re.compile(r"compaction of lake (tag=app/dt=\S+/hour=\d+): (\d+) files \(\d+ B\) -> (\d+) \(")


def _skip_without_spark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError as error:
        pytest.skip(f"pyspark is not installed: {error}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("java is not installed (no `java` on PATH and no JAVA_HOME)")


def packed_forward(tag: str, entries: list, chunk: str) -> bytes:
    blob = b"".join(msgpack.packb(e) for e in entries)
    return msgpack.packb([tag, blob, {"size": len(entries), "chunk": chunk}])


def next_line(daemon: Daemon, regex: re.Pattern, seen: int, timeout: float) -> tuple[re.Match, int]:
    """The first line matching ``regex`` after the ``seen`` ones already returned."""
    deadline = time.monotonic() + timeout
    while True:
        matches = [m for line in list(daemon.lines) if (m := regex.search(line))]
        if len(matches) > seen:
            return matches[seen], seen + 1
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no new line matching {regex.pattern!r}:\n{daemon.output}")
        try:
            if daemon._queue.get(timeout=left) is None:  # the reader thread's end-of-output mark
                raise AssertionError(f"daemon exited:\n{daemon.output}")
        except queue.Empty:
            continue


def test_the_daemon_compacts_the_partitions_it_wrote(tmp_path):
    _skip_without_spark()
    hour = (int(time.time()) // 3600 - 2) * 3600  # two hours ago: sealed with seal_after_secs = 0
    expected = set()
    with Daemon(tmp_path, CONFIG) as daemon:
        daemon.start()
        port = daemon.port("forward")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            for batch in range(BATCHES):
                entries = []
                for i in range(PER_BATCH):
                    n = batch * PER_BATCH + i
                    stamp = msgpack.ExtType(0, struct.pack(">II", hour + 60 + n, 0))
                    entries.append([stamp, {"n": n, "msg": f"event {n}"}])
                    expected.add(n)
                chunk = f"c{batch}"
                sock.sendall(packed_forward("app", entries, chunk))
                ack = msgpack.packb({"ack": chunk})
                assert recv_exactly(sock, len(ack)) == ack  # durable in the spool
        # Rounds run every 2 s; the first may catch only some of the files, later ones the
        # rest (with the compacted file). Wait until one round leaves a single file holding all.
        seen = 0
        for _ in range(BATCHES):
            match, seen = next_line(daemon, DONE, seen, timeout=300)
            key = match.group(1)
            names = [n for n in os.listdir(tmp_path / "lake" / key) if n.endswith(".parquet")]
            if int(match.group(3)) == 1 and len(names) == 1:
                rows = lake_dataset(str(tmp_path / "lake")).to_table(columns=["n"]).num_rows
                if rows == len(expected):
                    break
        else:
            raise AssertionError(f"never compacted into one file:\n{daemon.output}")
        values = daemon.metrics()
        daemon.stop_gracefully()

    assert values["logrouter_compaction_partitions_total"] >= 1
    assert values["logrouter_compaction_failures_total"] == 0
    assert values['logrouter_sink_files_published_total{sink="lake",type="parquet"}'] == BATCHES
    table = lake_dataset(str(tmp_path / "lake")).to_table()
    ids = table.column("n").to_pylist()
    assert sorted(ids) == sorted(expected)  # every event exactly once
    assert set(table.column("msg").to_pylist()) == {f"event {n}" for n in expected}
    files = [n for n in os.listdir(tmp_path / "lake" / key) if n.endswith(".parquet")]
    assert len(files) == 1 < BATCHES and files[0].startswith("compacted-")
    assert not os.path.exists(tmp_path / "lake" / "_compaction" / key)


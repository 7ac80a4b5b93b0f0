"""The lake on a real HDFS: one MiniDFSCluster (hadoop-client-minicluster, see
tests/hdfs_cluster.py) for the module, on loopback.

* the filesystem seam (``HdfsFileSystem`` through hdfs-native) against the real
  NameNode: create refuses an existing name, rename with overwrite replaces, exclusive
  publish refuses an existing name, hsync'd bytes are readable, trees go;
* the real daemon landing forward events in ``hdfs://127.0.0.1:PORT/lake``, read back
  with pyarrow; one ``kill -9`` under load and a restart: every acked event once;
* two routers writing one HDFS lake while the NameNode is stopped and started again in
  the middle of the run: the sinks fail, retry and replay; every acked event once.

Skipped, with the reason, only when java/mvn are missing or Maven cannot fetch. Every
hdfs-native call of the test itself runs in a child interpreter (``in_child``: see
tests/hdfs_cluster.py), never in the pytest process.
"""

from __future__ import annotations

import collections
import signal
import threading
import time

import pytest

from chunk_client import EVENTS_PER_CHUNK, Client
from daemon import Daemon
from hdfs_cluster import cluster_or_skip, in_child
from logrouter.lake.dataset import lake_dataset
from logrouter.lake.fs import HdfsFileSystem, filesystem_for

CONFIG = """
[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "{lake}"
writer_id = "{writer_id}"
roll_secs = 0.3                # commits all the time, so the kill lands among them
roll_bytes = 200000
row_group_rows = 500
retry_initial_secs = 0.2
retry_max_secs = 1
"""


@pytest.fixture(scope="module")
def hdfs(tmp_path_factory):
    cluster = cluster_or_skip(tmp_path_factory.mktemp("hdfs"))
    try:
        yield cluster
    finally:
        cluster.stop()


def lake_ids(url: str) -> list[str]:
    return lake_dataset(url).to_table(columns=["id"]).column("id").to_pylist()


def lake_summary(url: str) -> tuple[list[str], list[str], list[str]]:
    """(ids, column names, tags) of the lake, and its staged files: in a child."""
    table = lake_dataset(url).to_table()
    return table.column("id").to_pylist(), table.column_names, sorted(set(table.column("tag").to_pylist())), staged_files(url)


def staged_files(url: str) -> list[str]:
    fs, root = filesystem_for(url)
    names = []
    for writer in fs.list_entries(f"{root}/_staging"):
        names += fs.list_files(f"{root}/_staging/{writer.name}")
    return names


def assert_exactly_once(ids: list[str], acked: set[int]) -> None:
    counts = collections.Counter(ids)
    doubled = [i for i, c in counts.items() if c > 1]
    expected = {f"{c}-{i}" for c in acked for i in range(EVENTS_PER_CHUNK)}
    assert not doubled, f"{len(doubled)} ids landed more than once, e.g. {doubled[:5]}"
    assert set(ids) == expected, f"missing {len(expected - set(ids))}, unexpected {len(set(ids) - expected)}"


def test_filesystem_seam_against_the_real_namenode(hdfs):
    assert in_child(check_seam, hdfs.url("/seam")) == "ok"


def check_seam(url: str) -> str:
    fs, root = filesystem_for(url)
    assert isinstance(fs, HdfsFileSystem) and root == "/seam"
    fs.makedirs("/seam/a/b")
    fs.makedirs("/seam/a/b")  # fine if it exists
    stream = fs.open_write("/seam/a/b/f")
    stream.write(b"x" * 1000)
    assert stream.tell() == 1000
    fs.sync_close(stream)
    assert fs.read_bytes("/seam/a/b/f") == b"x" * 1000
    with pytest.raises(FileExistsError):
        fs.open_write("/seam/a/b/f")  # names are never reused
    other = fs.open_write("/seam/a/b/g")
    other.write(b"new")
    fs.sync_close(other)
    fs.replace("/seam/a/b/g", "/seam/a/b/f")  # atomic, overwriting
    assert fs.read_bytes("/seam/a/b/f") == b"new" and not fs.exists("/seam/a/b/g")
    fs.create_exclusive("/seam/a/marker", b"one")
    with pytest.raises(FileExistsError):
        fs.create_exclusive("/seam/a/marker", b"two")
    assert fs.read_bytes("/seam/a/marker") == b"one"
    assert [(e.name, e.is_dir) for e in fs.list_entries("/seam/a")] == [("b", True), ("marker", False)]
    assert fs.list_files("/seam/a/b") == ["f"] and fs.list_entries("/seam/nothing") == []
    with fs.open_read("/seam/a/b/f") as f:
        f.seek(1)
        assert f.read() == b"ew"
    fs.remove("/seam/a/b/f")
    fs.remove_tree("/seam/a")
    fs.remove_tree("/seam/a")  # fine if it is gone
    assert not fs.exists("/seam/a")
    return "ok"


def test_daemon_lands_events_on_hdfs_exactly_once_across_a_kill_9(hdfs, tmp_path):
    url = hdfs.url("/crash/lake")
    config = CONFIG.format(lake=url, writer_id="crash")
    client = Client()
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        target = 25

        def killer() -> None:
            with client.progress:
                client.progress.wait_for(lambda: client.acked_this_cycle >= target, timeout=60)
            daemon.wait_for(r"parquet sink lake committed", timeout=30)  # files are on HDFS
            daemon.process.send_signal(signal.SIGKILL)

        thread = threading.Thread(target=killer)
        thread.start()
        client.run(daemon.port("forward"), 2000, time.monotonic() + 120)
        thread.join(90)
        assert daemon.process.wait(30) == -signal.SIGKILL
    assert len(client.acked) >= target
    # The restart redoes the last commit's renames, discards uncommitted staged files
    # and replays the spool from the cursor; the client resends what was not acked.
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        client.run(daemon.port("forward"), len(client.unacked) + 10, time.monotonic() + 120)
        assert not client.unacked
        daemon.stop_gracefully()
        assert "resuming from spool position" in daemon.output
    ids, columns, tags, staged = in_child(lake_summary, url)
    assert_exactly_once(ids, client.acked)
    assert staged == []
    assert {"time", "id", "n", "msg", "_extra", "tag", "dt", "hour"} <= set(columns)
    assert tags == ["crash.test"]

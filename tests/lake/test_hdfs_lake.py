"""The lake on a real HDFS: one MiniDFSCluster (hadoop-client-minicluster, see
tests/hdfs_cluster.py), the session's (tests/lake/conftest.py), on loopback.

* the filesystem seam (``HdfsFileSystem`` through hdfs-native) against the real
  NameNode: create refuses an existing name, rename with overwrite replaces, exclusive
  publish refuses an existing name, hsync'd bytes are readable, trees go;
* the real daemon landing forward events in ``hdfs://127.0.0.1:PORT/lake``, read back
  with pyarrow; one ``kill -9`` under load and a restart: every acked event once;
* the NameNode stopped and started again under load: the sink fails, backs off and
  recovers by itself, the spool keeps acking; every acked event once;
* two routers (writer ids a and b, each adding a column) writing one HDFS lake at once:
  every event of each once, the lake's table schema holds both columns.

Skipped, with the reason, only when java/mvn are missing or Maven cannot fetch. Every
hdfs-native call of the test itself runs in a child interpreter (``in_child``: see
tests/hdfs_cluster.py), never in the pytest process.
"""

from __future__ import annotations

import collections
import queue
import re
import signal
import threading
import time

import pytest

from chunk_client import EVENTS_PER_CHUNK, Client
from daemon import Daemon
from hdfs_cluster import in_child
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


def lines_after(daemon: Daemon, start: int, pattern: str, timeout: float) -> str:
    """The first log line matching ``pattern`` among those after the first ``start``."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while True:
        for line in daemon.lines[start:]:
            if regex.search(line):
                return line
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no log line matching {pattern!r} after line {start} within {timeout}s:\n{daemon.output}")
        try:
            if daemon._queue.get(timeout=min(left, 1)) is None:  # the reader thread's end-of-output mark
                raise AssertionError(f"daemon exited while waiting for {pattern!r}:\n{daemon.output}")
        except queue.Empty:
            continue


def wait_acked(client: Client, count: int, timeout: float) -> None:
    with client.progress:
        assert client.progress.wait_for(lambda: len(client.acked) >= count, timeout=timeout), (len(client.acked), count)


FAILED = re.compile(r"parquet sink lake failed: .*; retrying from spool position \d+ in [\d.]+s")


def test_a_namenode_restart_mid_run_is_survived_by_retry(hdfs, tmp_path):
    """The NameNode goes away under load and comes back (same port, same metadata): the
    sink fails, backs off, and recovers by itself; the client never stops getting acks
    (the spool holds the events); every acked event lands once."""
    url = hdfs.url("/restart/lake")
    client = Client()
    stop = threading.Event()
    with Daemon(tmp_path, CONFIG.format(lake=url, writer_id="restart")) as daemon:
        daemon.start()
        port = daemon.port("forward")
        sender = threading.Thread(target=client.run, args=(port, 100_000, time.monotonic() + 120), kwargs={"stop": stop})
        sender.start()
        try:
            wait_acked(client, 20, 30)
            daemon.wait_for(r"parquet sink lake committed", timeout=30)
            # A sink call in flight when the NameNode goes fails ("RPC listener
            # disconnected"); calls made while it is down wait in hdfs-native's reconnect
            # until it is back. Most outages catch one in flight; three are allowed.
            down_at = len(daemon.lines)
            for outage in range(3):
                hdfs.stop_namenode()
                try:
                    wait_acked(client, len(client.acked) + 20, 30)  # the spool takes them meanwhile
                    up_at = len(daemon.lines)
                finally:  # the cluster is the session's: the next tests need its NameNode
                    hdfs.start_namenode()
                lines_after(daemon, up_at, r"parquet sink lake committed", 90)  # recovered by itself
                if any(FAILED.search(line) for line in daemon.lines[down_at:]):
                    break
            assert any(FAILED.search(line) for line in daemon.lines[down_at:]), daemon.output
            wait_acked(client, len(client.acked) + 10, 30)
        finally:
            stop.set()
            sender.join(60)
        assert not sender.is_alive()
        client.run(port, len(client.unacked) + 10, time.monotonic() + 60)  # whatever was in flight
        assert not client.unacked
        daemon.stop_gracefully()
    # A staged file whose write the outage cut may be left in _staging (the abort could
    # not remove it while the NameNode was away; readers never see _staging): the next
    # start discards it.
    with Daemon(tmp_path, CONFIG.format(lake=url, writer_id="restart")) as daemon:
        daemon.start()
        daemon.stop_gracefully()
    ids, _, tags, staged = in_child(lake_summary, url)
    assert_exactly_once(ids, client.acked)
    assert staged == [] and tags == ["crash.test"]


ROUTER_CONFIG = """
[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[filters.stamp]
type = "set"
inputs = ["forward"]
fields = {{ {column} = "{writer_id}" }}

[sinks.lake]
type = "parquet"
inputs = ["stamp"]
path = "{lake}"
writer_id = "{writer_id}"
roll_secs = 0.3
roll_bytes = 200000
row_group_rows = 500
retry_initial_secs = 0.2
retry_max_secs = 1
"""


def two_router_summary(url: str) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """Each router's ids (by the column only it sets), the lake table's columns and
    the writer schema files: in a child."""
    from logrouter.lake.table import read_table_schema

    table = lake_dataset(url).to_table(columns=["id", "router_a", "router_b"])
    ids: dict[str, list[str]] = {"a": [], "b": []}
    for i, a, b in zip(*(table.column(n).to_pylist() for n in ("id", "router_a", "router_b"))):
        assert (a is None) != (b is None), (i, a, b)
        ids["a" if a is not None else "b"].append(i)
    fs, root = filesystem_for(url)
    return ids, read_table_schema(fs, root).names, sorted(fs.list_files(f"{root}/_schema")), staged_files(url)


def test_two_routers_write_one_hdfs_lake(hdfs, tmp_path):
    """Two daemons (writer ids a and b, each its own spool) land in one lake at once;
    each adds a column of its own, and the lake's table schema ends up with both."""
    url = hdfs.url("/shared/lake")
    routers = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        routers[name] = Daemon(tmp_path / name, ROUTER_CONFIG.format(lake=url, writer_id=name, column=f"router_{name}"))
    clients = {name: Client() for name in routers}
    stop = threading.Event()
    try:
        ports = {name: daemon.start().port("forward") for name, daemon in routers.items()}
        senders = [threading.Thread(target=clients[n].run, args=(ports[n], 100_000, time.monotonic() + 60), kwargs={"stop": stop})
                   for n in routers]
        for sender in senders:
            sender.start()
        try:
            for name, client in clients.items():
                wait_acked(client, 30, 30)
                routers[name].wait_for(r"parquet sink lake committed", timeout=30)
        finally:
            stop.set()
            for sender in senders:
                sender.join(60)
        assert not any(s.is_alive() for s in senders)
        for name, client in clients.items():
            client.run(ports[name], len(client.unacked) + 10, time.monotonic() + 60)
            assert not client.unacked
        for daemon in routers.values():
            daemon.stop_gracefully()
    finally:
        for daemon in routers.values():
            daemon.__exit__()
    ids, columns, schema_files, staged = in_child(two_router_summary, url)
    for name, client in clients.items():
        assert_exactly_once(ids[name], client.acked)
    assert {"time", "id", "n", "msg", "router_a", "router_b", "_extra", "tag", "dt", "hour"} <= set(columns), columns
    assert schema_files == ["a.json", "b.json"] and staged == []

"""The iceberg sink in the real daemon: kill -9 at each commit step, under load, two workers,
a schema that grows mid-stream; the table read back with pyiceberg each time.

A client streams forward chunks with ``chunk`` ids and resends what was not acked after a
reconnect (``chunk_client``); at the end the table must hold every acked event exactly
once. ``LOGROUTER_FAULTS`` (``logrouter.faults``) stops the daemon between two steps of a
commit: after the data files are in place but before the append, in the catalog database's
transaction (new table metadata written, the commit not yet), and after the append landed
but before the cursor was saved; or it makes the append's answer get lost.

Bounds: every client run is bounded in chunks and time, every wait has a timeout; loopback.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import socket
import threading
import time

import msgpack
import pytest

pytest.importorskip("pyiceberg")

from chunk_client import T0, Client, expected_ids  # noqa: E402
from crash_cycles import finish, run_cycles  # noqa: E402
from daemon import REPO, Daemon  # noqa: E402
from lake_sinks import column, with_sink  # noqa: E402
from logrouter.lake.iceberg_catalog import open_catalog  # noqa: E402
from fixtures.forward_encode import encode_packed_forward  # noqa: E402
from logrouter.workers.plan import worker_for  # noqa: E402

pytestmark = pytest.mark.timeout(420)

CONFIG = """
[router]
shutdown_timeout_secs = 60
{router}

[spool]
path = "spool"
segment_bytes = 65536          # many segments, so trimming runs while we kill

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "iceberg"
inputs = ["forward"]
warehouse = "lake"
roll_secs = 0.3                # commits all the time, so kills land inside them
roll_bytes = 200000
row_group_rows = 500
retry_initial_secs = 0.2
flatten = true
"""


def config(router: str = "workers = 1") -> str:
    return CONFIG.format(router=router)


def table(tmp_path):
    catalog = open_catalog("lake", {"type": "sql", "uri": f"sqlite:///{tmp_path}/lake/catalog.db",
                                    "warehouse": f"file://{tmp_path}/lake"})
    return catalog.load_table("logs.events")


def check_exactly_once(tmp_path, acked) -> None:
    ids = table(tmp_path).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    doubled = [i for i, c in collections.Counter(ids).items() if c > 1]
    assert not doubled, f"{len(doubled)} ids landed more than once, e.g. {doubled[:5]}"
    expected = expected_ids(acked)
    assert set(ids) == expected, f"missing {len(expected - set(ids))}, unexpected {len(set(ids) - expected)}"
    assert not list((tmp_path / "lake" / "logs" / "events" / "_staging").rglob("*.parquet"))


@pytest.mark.parametrize("fault", ["iceberg.before-commit=kill@3", "iceberg.catalog-commit=kill@6", "iceberg.after-commit=kill@3",
                                   "iceberg.after-commit=raise@3"])
def test_a_crash_or_a_lost_answer_at_a_commit_step_loses_and_doubles_nothing(tmp_path, fault):
    client = Client()
    env = dict(os.environ, PYTHONPATH=str(REPO), LOGROUTER_FAULTS=fault)
    with Daemon(tmp_path, config(), env=env) as daemon:
        daemon.start()
        port = daemon.port("forward")
        if "=kill@" in fault:
            client.run(port, 5000, time.monotonic() + 120)  # until the daemon dies at that step
            assert daemon.process.wait(60) == -signal.SIGKILL, daemon.output
        else:
            stop = threading.Event()
            sender = threading.Thread(target=client.run, args=(port, 5000, time.monotonic() + 120), kwargs={"stop": stop})
            sender.start()
            daemon.wait_for(r"iceberg sink lake failed: fault injected at iceberg.after-commit", timeout=60)
            daemon.wait_for(r"the table holds this writer's commits up to spool position", timeout=60)
            daemon.wait_for(r"iceberg sink lake committed .* spool (?!0\.\.)", timeout=60)
            stop.set()
            sender.join(60)
            daemon.stop_gracefully()
    restarted = finish(tmp_path, config(), client)
    if fault.startswith(("iceberg.before-commit", "iceberg.catalog-commit")):  # the commit did not land
        assert "is not in the table; deleted its" in restarted.output, restarted.output
    if fault == "iceberg.after-commit=kill@3":
        assert "the table holds this writer's commits up to spool position" in restarted.output, restarted.output
    check_exactly_once(tmp_path, client.acked)


# The parquet sink's cycles (test_crash_recovery.py): kills under load, a kill or a SIGTERM
# while the daemon starts, a kill in the middle of a graceful stop.
CYCLE_ENDINGS = ("load", "start_kill", "load", "start_term", "stop_kill", "load", "start_kill", "stop_kill")


def test_kill_9_at_random_moments_under_load_loses_and_doubles_nothing(tmp_path):
    rng = random.Random(int(os.environ.get("LOGROUTER_CRASH_SEED", "20261127")))
    client = Client()
    kills = run_cycles(tmp_path, config(), CYCLE_ENDINGS, client, rng, delay=0.3)
    finish(tmp_path, config(), client)
    print(f"{kills} kills, {len(client.acked)} chunks acked, {client.resent} resent after a kill")
    assert kills == len(CYCLE_ENDINGS)
    assert len(client.acked) >= CYCLE_ENDINGS.count("load") * 3
    check_exactly_once(tmp_path, client.acked)


def test_two_workers_write_one_table_exactly_once(tmp_path):
    clients = [Client(), Client()]
    for n, client in enumerate(clients):
        client.next_chunk = n * 100_000  # their own chunk numbers
    with Daemon(tmp_path, config("workers = 2")) as daemon:
        daemon.start()
        port = daemon.port("forward")
        addresses = [next(f"127.0.0.{i}" for i in range(2, 250) if worker_for(f"127.0.0.{i}", 2) == w) for w in (0, 1)]
        threads = [threading.Thread(target=c.run, args=(port, 40, time.monotonic() + 120), kwargs={"source": a})
                   for c, a in zip(clients, addresses)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        daemon.stop_gracefully()
    assert all(len(c.acked) == 40 for c in clients)
    check_exactly_once(tmp_path, clients[0].acked | clients[1].acked)
    writers = {s.summary["logrouter.writer"] for s in table(tmp_path).snapshots()}
    assert len(writers) == 2 and any(w.endswith("-w1") for w in writers), writers


def send_records(port: int, tag: str, records: list[dict], chunk: str) -> None:
    """One acked forward chunk of ``records``."""
    events = [(T0 + i, record) for i, record in enumerate(records)]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(encode_packed_forward(tag, events, {"size": len(events), "chunk": chunk}))
        unpacker = msgpack.Unpacker(raw=True)
        while True:
            data = sock.recv(4096)
            assert data, "closed before the ack"
            unpacker.feed(data)
            for reply in unpacker:
                assert reply == {b"ack": chunk.encode()}
                return


def test_a_schema_that_grows_mid_stream_is_read_back_with_every_column(tmp_path):
    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        port = daemon.port("forward")
        send_records(port, "app", [{"id": f"a{i}", "n": i} for i in range(50)], "c1")
        daemon.wait_for(r"iceberg sink lake committed .* 50 rows", timeout=60)
        send_records(port, "app", [{"id": f"b{i}", "n": i, "status": 200, "http": {"method": "GET"}} for i in range(50)], "c2")
        daemon.wait_for(r"added column\(s\) status, http.method", timeout=60)
        send_records(port, "web", [{"id": f"c{i}", "n": "not a number", "late": True} for i in range(50)], "c3")
        daemon.wait_for(r"added column\(s\) late", timeout=60)
        daemon.stop_gracefully()
    t = table(tmp_path)
    schema = {f.name: str(f.field_type) for f in t.schema().fields}
    assert schema == {"time": "timestamptz", "id": "string", "n": "long", "status": "long", "http.method": "string",
                      "late": "boolean", "_extra": "string", "tag": "string"}
    rows = {r["id"]: r for r in t.scan().to_arrow().to_pylist()}
    assert len(rows) == 150
    assert rows["a1"]["status"] is None and rows["a1"]["n"] == 1 and rows["a1"]["tag"] == "app"
    assert rows["b1"]["status"] == 200 and rows["b1"]["http.method"] == "GET"
    assert rows["c1"]["n"] is None and rows["c1"]["_extra"] == '{"n":"not a number"}' and rows["c1"]["late"] is True
    assert rows["c1"]["tag"] == "web"


PARQUET = """
[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
"""


def test_a_parquet_sink_turned_into_an_iceberg_sink_goes_on_from_its_cursor(tmp_path):
    """What an older `make run` leaves (a parquet sink "lake" in var/lake, its state in the
    spool) under the new default (an iceberg sink "lake" with another directory): the table
    starts where the parquet sink stopped, and the old lake stays readable."""
    with Daemon(tmp_path, PARQUET) as daemon:
        daemon.start()
        send_records(daemon.port("forward"), "app", [{"id": f"a{i}"} for i in range(20)], "c1")
        daemon.stop_gracefully()
    with Daemon(tmp_path, with_sink(PARQUET, "iceberg").replace('warehouse = "lake"', 'warehouse = "warehouse"')) as daemon:
        daemon.start()
        send_records(daemon.port("forward"), "app", [{"id": f"b{i}"} for i in range(30)], "c2")
        daemon.stop_gracefully()
    assert sorted(column("parquet", tmp_path / "lake", "id")) == sorted(f"a{i}" for i in range(20))
    assert sorted(column("iceberg", tmp_path / "warehouse", "id")) == sorted(f"b{i}" for i in range(30))

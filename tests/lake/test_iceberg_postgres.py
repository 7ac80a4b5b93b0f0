"""The iceberg sink on a PostgreSQL catalog: several writers on one table, and a cut connection.

A real PostgreSQL server (Debian's, started on loopback by ``postgres_server``) holds the
SQL catalog, as it would for several routers or machines: two writers commit into one table
at the same time (optimistic concurrency: the loser retries), and the catalog connection is
cut right after a commit landed, so its answer is lost.
"""

from __future__ import annotations

import collections
import threading

import pytest

pytest.importorskip("pyiceberg")

from test_iceberg_sink_commit import make_sink, record, stop, tick  # noqa: E402

from logrouter.lake import iceberg_commit  # noqa: E402
from logrouter.lake.iceberg_catalog import open_catalog  # noqa: E402
from logrouter.sinks.worker_sink import RESET  # noqa: E402

ROUNDS = 12


@pytest.fixture
def database(postgres, request):
    name = "t_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")[:50]
    postgres.sql(f"CREATE DATABASE {name}", database="postgres")
    return postgres.uri.rsplit("/", 1)[0] + "/" + name


def pg_sink(tmp_path, uri, writer, spool):
    return make_sink(tmp_path, writer=writer, spool=spool, catalog_uri=uri)


def ids(tmp_path, uri, catalog="lake"):
    catalog = open_catalog(catalog, {"type": "sql", "uri": uri, "warehouse": f"file://{tmp_path}/warehouse"})
    table = catalog.load_table("logs.events")
    return table, table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()


def test_two_writers_commit_into_one_table_at_once_and_each_row_lands_once(tmp_path, database, caplog):
    sinks = [pg_sink(tmp_path, database, f"router{n}", f"spool{n}") for n in range(2)]
    for sink in sinks:
        sink._recover()
    errors: list = []
    start = threading.Barrier(2)

    def writer(n: int) -> None:
        sink = sinks[n]
        try:
            start.wait(30)
            for i in range(ROUNDS):
                base = n * 100_000 + i * 10
                # files opened at 10*i, due at 10*i + 10: every round commits
                sink._run([*record(i * 100, range(base, base + 10), hour=i % 3, tag=f"t{n}")])
                sink._run([tick(10.0 * i + 10, i * 100 + 100)])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    table, found = ids(tmp_path, database)
    counts = collections.Counter(found)
    assert len(found) == 2 * ROUNDS * 10 and set(counts.values()) == {1}
    for n in range(2):
        assert iceberg_commit.last_commit(table, f"router{n}").end == ROUNDS * 100
    assert sum(s.commits for s in sinks) == 2 * ROUNDS
    retried = [r for r in caplog.records if "concurrent update" in r.getMessage()]
    print(f"{len(retried)} commits retried by pyiceberg, {sum(s.commit_conflicts for s in sinks)} beyond its retries")


def test_a_commit_whose_connection_is_cut_is_found_after_reconnecting(tmp_path, database, postgres):
    sink = pg_sink(tmp_path, database, "router0", "spool0")
    sink._recover()
    sink._run([*record(0, range(0, 10))])
    sink._run([tick(11.0, 100)])  # the first commit (and the schema update for "id") goes through
    real = sink.catalog.commit_table
    name = database.rsplit("/", 1)[1]

    def cut(*args, **kwargs):
        real(*args, **kwargs)  # landed in PostgreSQL
        postgres.sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'", database="postgres")
        raise OSError("server closed the connection unexpectedly")  # what the client saw instead of the answer

    sink.catalog.commit_table = cut
    sink._run([*record(100, range(10, 20))])
    with pytest.raises(OSError):
        sink._run([tick(22.0, 200)])
    sink.catalog.commit_table = real
    assert sink.state.load()["cursor"] == 100 and sink.state.load()["pending"]["end"] == 200
    sink.epoch += 1
    # The reset reconnects (the pool's connections were cut) and reads the table's history.
    assert sink._run([((RESET,), 23.0, 100, sink.epoch)])[1] == 200
    # The router replays from the cursor it had: the rows are not written again.
    replay = record(100, range(10, 20))
    sink._run([(replay[0][0], 24.0, 100, sink.epoch), (replay[1][0], 24.0, 200, sink.epoch),
               ((("stop",)), 25.0, 200, sink.epoch)])
    assert sorted(ids(tmp_path, database)[1]) == list(range(20))


def test_the_catalog_name_is_part_of_the_key(tmp_path, database):
    sink = pg_sink(tmp_path, database, "router0", "spool0")
    sink._recover()
    sink._run([*record(0, range(0, 3)), stop(1.0, 100)])
    from pyiceberg.exceptions import NoSuchTableError

    with pytest.raises(NoSuchTableError):
        ids(tmp_path, database, catalog="spark_catalog")
    assert sorted(ids(tmp_path, database)[1]) == [0, 1, 2]

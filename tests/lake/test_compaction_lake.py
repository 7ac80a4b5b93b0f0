"""Compaction's lake side, no Spark: the HDFS adapter (fake client at the seam), leases,
partition planning, the schema-merge plan, and the swap with a crash injected between
every two steps, on the local disk and on the fake HDFS.

The swap tests stage "compacted" files with pyarrow (what the Spark job would have
written): the swap and its recovery do not care who wrote the files, and this keeps
Spark out of the many crash cases (tests/lake/test_compaction_spark.py runs the real job).
"""

from __future__ import annotations

import json
import os
import posixpath
import subprocess
import sys
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fake_hdfs import FakeHdfsClient
from logrouter.compaction import lease as leases
from logrouter.compaction.command import PACKAGE_PARENT
from logrouter.compaction.layout import (
    compacted_name,
    is_compacted,
    list_partitions,
    output_file_count,
    partition_from_key,
    plan_lake,
    worth_compacting,
)
from logrouter.compaction.merge import InputFile, plan_merge
from logrouter.compaction.swap import FileInfo, Swap, SwapError, interrupted, recover, staging_dir
from logrouter.config.load import ConfigError, load_string
from logrouter.lake.fs import HdfsFileSystem, LocalFileSystem, MissingPackageError, check_lake_url, filesystem_for
from logrouter.lake.writer import LakeWriter

T0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z
HOUR0 = 1_714_546_800.0
KEY = "tag=app/dt=2024-05-01/hour=07"


class Crash(BaseException):
    """A simulated kill -9: not an Exception, so no cleanup code catches it."""


# -- filesystems ----------------------------------------------------------------------------


def fake_hdfs() -> tuple[HdfsFileSystem, FakeHdfsClient]:
    client = FakeHdfsClient()
    fs, root = filesystem_for("hdfs://namenode:8020/logs/lake", hdfs_client=client)
    assert root == "/logs/lake" and isinstance(fs, HdfsFileSystem) and fs.url == "hdfs://namenode:8020"
    return fs, client


@pytest.fixture(params=["local", "hdfs"])
def lake(request, tmp_path):
    """(filesystem, root) of an empty lake on the local disk or the fake HDFS."""
    if request.param == "local":
        return LocalFileSystem(), str(tmp_path / "lake")
    fs, _ = fake_hdfs()
    return fs, "/logs/lake"


def test_check_lake_url_names_the_package_to_install():
    check_lake_url("var/lake")
    check_lake_url("file:///var/lake")
    with pytest.raises(ValueError, match="not supported"):
        check_lake_url("s3://bucket/lake")
    with pytest.raises(ValueError, match="needs a directory"):
        check_lake_url("hdfs://namenode:8020")
    try:
        import hdfs_native  # noqa: F401
    except ImportError:
        with pytest.raises(MissingPackageError, match=r"needs the 'hdfs-native' package: pip install hdfs-native"):
            check_lake_url("hdfs://namenode:8020/logs")
        with pytest.raises(ConfigError) as info:
            load_string('[sources.f]\ntype = "fluent_forward"\n[sinks.lake]\ntype = "parquet"\ninputs = ["f"]\n'
                        'path = "hdfs://namenode:8020/logs"\n')
        assert info.value.errors == [
            "sinks.lake.path: hdfs:// needs the 'hdfs-native' package: pip install hdfs-native  "
            "(or: pip install 'logrouter[hdfs]')"
        ]


def test_lake_writer_writes_through_the_hdfs_adapter():
    fs, client = fake_hdfs()
    writer = LakeWriter("/logs/lake", "w1", 1 << 30, 60, fs=fs)
    writer.write("app", [(T0 + i, {"i": i}) for i in range(5)], now=0)
    sealed = writer.seal_all()
    writer.publish(sealed)
    [file] = sealed
    assert file.final_path.startswith("/logs/lake/tag=app/dt=2024-05-01/hour=07/part-w1-")
    # created exclusively in staging, hsync'd and closed, renamed into place
    assert ("create", file.staging_path, False) in client.calls
    assert ("close", file.staging_path) in client.calls
    assert ("rename", file.staging_path, file.final_path, True) in client.calls
    assert file.staging_path not in client.files
    table = pq.read_table(pa.BufferReader(client.files[file.final_path]))
    assert table.column("i").to_pylist() == list(range(5)) and file.bytes == len(client.files[file.final_path])
    assert fs.list_files("/logs/lake/tag=app/dt=2024-05-01/hour=07") == [posixpath.basename(file.final_path)]
    assert writer.discard_staging() == []


def test_create_exclusive_refuses_an_existing_name(lake):
    fs, root = lake
    fs.makedirs(root)
    path = posixpath.join(root, "x.json")
    fs.create_exclusive(path, b"one")
    with pytest.raises(FileExistsError):
        fs.create_exclusive(path, b"two")
    assert fs.read_bytes(path) == b"one"
    assert [e.name for e in fs.list_entries(root)] == ["x.json"]  # no temporary left behind
    with pytest.raises(FileExistsError):
        fs.open_write(path)


# -- leases ------------------------------------------------------------------------------------


def test_lease_is_exclusive_until_released_or_expired(lake):
    fs, root = lake
    a = leases.acquire(fs, root, KEY, "router-a", now=100, ttl=50)
    assert a is not None and a.generation == 1
    assert leases.acquire(fs, root, KEY, "router-b", now=120, ttl=50) is None
    assert leases.held_by(fs, root, a, now=120)
    assert leases.find(fs, root, KEY, "router-a", now=120) == a
    assert leases.find(fs, root, KEY, "router-b", now=120) is None
    assert leases.release(fs, root, a, now=130)
    b = leases.acquire(fs, root, KEY, "router-b", now=131, ttl=50)
    assert b is not None and b.generation == 3
    # router-b crashes holding it; past expiry router-a takes it over
    assert leases.acquire(fs, root, KEY, "router-a", now=180, ttl=50) is None
    c = leases.acquire(fs, root, KEY, "router-a", now=181.5, ttl=50)
    assert c is not None and c.generation == 4
    assert not leases.held_by(fs, root, b, now=182)  # b learns it lost the lease
    assert not leases.release(fs, root, b, now=182)  # and cannot release someone else's
    assert leases.held_by(fs, root, c, now=182)
    # old generations are cleaned up; other partitions are independent
    names = [e.name for e in fs.list_entries(leases.lease_dir(root, KEY))]
    assert names == ["lease-000000000004.json"]
    assert leases.acquire(fs, root, "tag=app/dt=2024-05-01/hour=08", "router-b", now=182, ttl=50) is not None


def test_two_routers_racing_for_a_stale_lease_cannot_both_win(tmp_path):
    fs, root = LocalFileSystem(), str(tmp_path)
    assert leases.acquire(fs, root, KEY, "dead", now=0, ttl=10) is not None
    # both saw generation 1 expired; whoever creates generation 2 first wins
    generation, data = leases.current(fs, root, KEY)
    assert generation == 1 and leases.holder(data, now=20) is None
    wins = [leases.acquire(fs, root, KEY, owner, now=20, ttl=10) for owner in ("a", "b")]
    assert [w is not None for w in wins] == [True, False]

    class Racing(LocalFileSystem):
        """b's create of generation 3 loses to a's, made between b's read and b's create."""

        def create_exclusive(self, path, data):
            if path.endswith("lease-000000000003.json") and not self.raced:
                self.raced = True
                LocalFileSystem().create_exclusive(path, json.dumps({"owner": "a", "state": "held", "expires": 99}).encode())
            super().create_exclusive(path, data)

    racing = Racing()
    racing.raced = False
    assert leases.acquire(racing, root, KEY, "b", now=40, ttl=10) is None
    assert leases.holder(leases.current(fs, root, KEY)[1], now=41) == "a"


def test_a_damaged_lease_file_does_not_block_forever(tmp_path):
    fs, root = LocalFileSystem(), str(tmp_path)
    directory = leases.lease_dir(root, KEY)
    fs.makedirs(directory)
    fs.create_exclusive(posixpath.join(directory, "lease-000000000007.json"), b"{not json")
    lease = leases.acquire(fs, root, KEY, "a", now=0, ttl=10)
    assert lease is not None and lease.generation == 8


# -- planning --------------------------------------------------------------------------------


def write_files(fs, root, count, tag="app", hour=0, rows=10, writer_id="w1", start=0, **extra):
    """``count`` published files of ``rows`` rows each in one partition; their ids."""
    ids = []
    for n in range(count):
        writer = LakeWriter(root, f"{writer_id}-{n}", 1 << 30, 60, fs=fs)
        events = []
        for i in range(rows):
            ident = start + n * rows + i
            events.append((T0 + hour * 3600 * 10**9 + ident * 1000, {"id": ident, **extra}))
            ids.append(ident)
        writer.write(tag, events, now=0)
        writer.publish(writer.seal_all())
    return ids


def test_partitions_sealing_and_worth_it(lake):
    fs, root = lake
    write_files(fs, root, 3, hour=0)
    write_files(fs, root, 1, hour=1)
    write_files(fs, root, 2, tag="007", hour=2)
    fs.makedirs(posixpath.join(root, "_staging", "w9"))
    fs.makedirs(posixpath.join(root, "tag=app", "dt=2024-05-01", "hour=07", "_tmp"))
    parts = {p.key: p for p in list_partitions(fs, root)}
    assert sorted(parts) == ["tag=007/dt=2024-05-01/hour=09", KEY, "tag=app/dt=2024-05-01/hour=08"]
    p = parts[KEY]
    assert len(p.files) == 3 and p.hour_start == HOUR0 and p.bytes == sum(f.size for f in p.files)
    # sealed seal_after_secs after the end of the hour
    assert not p.sealed(HOUR0 + 3600 + 59, 60) and p.sealed(HOUR0 + 3600 + 60, 60)
    assert worth_compacting(p, 2, 1 << 30)[0]
    assert not worth_compacting(p, 4, 1)[0]  # 3 < min_files and big files (mean >= target)
    assert worth_compacting(p, 4, 1 << 30)[0]  # small files
    assert worth_compacting(p, 3, 1)[0]
    assert worth_compacting(parts["tag=app/dt=2024-05-01/hour=08"], 2, 1 << 30) == (False, "1 file")
    # the plan: sealed and worth it, nothing else
    now = HOUR0 + 2 * 3600 + 10
    chosen = plan_lake(fs, root, now, 0, 2, 1 << 30)
    assert [c.partition.key for c in chosen] == [KEY]
    chosen = plan_lake(fs, root, now + 3600, 0, 2, 1 << 30)
    assert [c.partition.key for c in chosen] == ["tag=007/dt=2024-05-01/hour=09", KEY]
    assert partition_from_key(fs, root, KEY).files == p.files
    with pytest.raises(ValueError):
        partition_from_key(fs, root, "tag=app/dt=2024-05-01")


def test_compacted_files_are_named_apart_from_writers_files():
    name = compacted_name("1a2b3c", 7)
    assert name == "compacted-1a2b3c-00007.parquet" and is_compacted(name)
    assert not is_compacted("part-compacted-1a2b3c-000007.parquet")  # a writer with id "compacted"
    assert not name.startswith("part-")  # every writer file starts with part-
    assert output_file_count(0, 100) == 1 and output_file_count(250, 100) == 3


# -- the merge plan ----------------------------------------------------------------------------


def schema(*fields):
    return pa.schema([("time", pa.timestamp("us", tz="UTC")), *fields, ("_extra", pa.string())])


def test_merge_plan_unions_columns_and_moves_losing_variants_to_extra():
    files = [
        InputFile("a.parquet", 1, 10, schema(("seq", pa.int64()), ("msg", pa.string()))),
        InputFile("b.parquet", 1, 30, schema(("seq", pa.int64()), ("new", pa.float64()))),
        InputFile("c.parquet", 1, 20, schema(("seq", pa.string()), ("Msg", pa.string()), ("x", pa.bool_()))),
        InputFile("d.parquet", 1, 5, schema(("x", pa.int64()))),
    ]
    plan = plan_merge(list(reversed(files)))  # input order does not matter
    assert plan.columns == [
        ("time", pa.timestamp("us", tz="UTC")),
        ("seq", pa.int64()),  # 40 rows of int64 beat 20 rows of string
        ("Msg", pa.string()),  # case variants of one name: 20 rows of "Msg" beat 10 of "msg"
        ("new", pa.float64()),  # a column only some files have
        ("x", pa.bool_()),  # 20 rows of bool beat 5 of int64
        ("_extra", pa.string()),
    ]
    assert plan.moves == {"a.parquet": ["msg"], "c.parquet": ["seq"], "d.parquet": ["x"]}
    groups = plan.groups(files)
    assert [(key, [f.name for f in g]) for key, g in groups] == [
        ((), ["b.parquet"]),
        ((("msg", "string"),), ["a.parquet"]),
        ((("seq", "string"),), ["c.parquet"]),
        ((("x", "int64"),), ["d.parquet"]),
    ]
    assert plan_merge(files) == plan  # deterministic


def test_merge_plan_ties_go_to_the_first_file():
    files = [
        InputFile("b.parquet", 1, 10, schema(("v", pa.string()))),
        InputFile("a.parquet", 1, 10, schema(("v", pa.int64()))),
    ]
    assert dict(plan_merge(files).columns)["v"] == pa.int64()
    assert plan_merge(files).moves == {"b.parquet": ["v"]}


# -- the swap, with a crash between every two steps ------------------------------------------------


def stage_compacted(fs, root, key, run_id, ids_per_output):
    """Outputs of a run as the job would stage them (pyarrow instead of Spark)."""
    swap = Swap(fs, root, key, run_id)
    fs.makedirs(swap.run_dir)
    outputs = []
    for number, ids in enumerate(ids_per_output, 1):
        name = compacted_name(run_id, number)
        table = pa.table({
            "time": pa.array([T0 + i * 1000 for i in ids], pa.timestamp("ns", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
            "id": pa.array(ids, pa.int64()),
            "_extra": pa.array([None] * len(ids), pa.string()),
        })
        stream = fs.open_write(swap.staged(name))
        pq.write_table(table, stream)
        fs.sync_close(stream)
        outputs.append(FileInfo(name, len(fs.read_bytes(swap.staged(name))), len(ids)))
    return outputs


def partition_ids(fs, root, key=KEY):
    ids = []
    for entry in partition_from_key(fs, root, key).files:
        ids += pq.read_table(pa.BufferReader(fs.read_bytes(posixpath.join(root, key, entry.name)))).column("id").to_pylist()
    return Counter(ids)


STEPS = ["marker", "moved 1", "moved 2", "removed 1", "removed 2", "removed 3", "unmarked", "done"]


@pytest.mark.parametrize("crash_after", [None, "staged", *STEPS])
def test_a_crash_at_any_step_is_finished_or_undone_by_the_next_run(lake, crash_after):
    fs, root = lake
    ids = write_files(fs, root, 3, rows=4)
    before = partition_from_key(fs, root, KEY).files
    inputs = [FileInfo(e.name, e.size, 4) for e in before]
    outputs = stage_compacted(fs, root, KEY, "aa01", [ids[:6], ids[6:]])

    def hook(step):
        if step == crash_after:
            raise Crash(step)

    swap = Swap(fs, root, KEY, "aa01", hook)
    try:
        if crash_after == "staged":
            raise Crash("killed while the job was writing")
        swap.commit(inputs, outputs)
    except Crash:
        pass
    # whatever a reader sees at rest right after the crash:
    names = {e.name for e in partition_from_key(fs, root, KEY).files}
    committed = crash_after != "staged"
    if crash_after in (None, "unmarked", "done", "removed 3"):
        assert names == {o.name for o in outputs}
    # the next run (under the lease) repairs it
    actions = recover(fs, root, KEY)
    if crash_after is None or crash_after == "done":
        assert actions == []
    elif crash_after == "unmarked":
        assert actions == [("aa01", "rolled back")]  # only the empty run directory was left
    else:
        assert actions == [("aa01", "rolled forward" if committed else "rolled back")]
    after = {e.name for e in partition_from_key(fs, root, KEY).files}
    assert after == ({o.name for o in outputs} if committed else {e.name for e in before})
    assert partition_ids(fs, root) == Counter(ids)  # every row exactly once
    assert fs.list_entries(staging_dir(root, KEY)) == [] and interrupted(fs, root) == []
    assert recover(fs, root, KEY) == []  # and again: nothing to do


def test_a_crash_during_recovery_is_recovered_too(lake):
    fs, root = lake
    ids = write_files(fs, root, 3, rows=4)
    inputs = [FileInfo(e.name, e.size, 4) for e in partition_from_key(fs, root, KEY).files]
    outputs = stage_compacted(fs, root, KEY, "aa01", [ids])
    swap = Swap(fs, root, KEY, "aa01", lambda step: (_ for _ in ()).throw(Crash()) if step == "moved 1" else None)
    with pytest.raises(Crash):
        swap.commit(inputs, outputs)
    assert interrupted(fs, root) == [KEY]
    with pytest.raises(Crash):
        recover(fs, root, KEY, lambda step: (_ for _ in ()).throw(Crash()) if step == "removed 2" else None)
    assert recover(fs, root, KEY) == [("aa01", "rolled forward")]
    assert partition_ids(fs, root) == Counter(ids)


def test_late_files_during_a_swap_are_left_alone(lake):
    fs, root = lake
    ids = write_files(fs, root, 2, rows=3)
    inputs = [FileInfo(e.name, e.size, 3) for e in partition_from_key(fs, root, KEY).files]
    outputs = stage_compacted(fs, root, KEY, "aa01", [ids])
    late = write_files(fs, root, 1, rows=2, writer_id="late", start=100)
    Swap(fs, root, KEY, "aa01").commit(inputs, outputs)
    assert partition_ids(fs, root) == Counter(ids + late)
    assert sum(1 for e in partition_from_key(fs, root, KEY).files if is_compacted(e.name)) == 1


def test_the_marker_refuses_an_audit_mismatch_and_a_lost_output(lake):
    fs, root = lake
    write_files(fs, root, 2, rows=3)
    inputs = [FileInfo(e.name, e.size, 3) for e in partition_from_key(fs, root, KEY).files]
    outputs = stage_compacted(fs, root, KEY, "aa01", [[0, 1, 2, 3, 4]])
    with pytest.raises(SwapError, match="audit failed: 6 rows in, 5 rows out"):
        Swap(fs, root, KEY, "aa01").commit(inputs, outputs)
    assert fs.exists(posixpath.join(root, KEY, inputs[0].name))
    # a committed run whose output vanished keeps the originals and says so
    outputs = stage_compacted(fs, root, KEY, "aa02", [list(range(6))])
    swap = Swap(fs, root, KEY, "aa02")
    swap.write_marker(inputs, outputs)
    fs.remove(swap.staged(outputs[0].name))
    with pytest.raises(SwapError, match="are gone; the originals are kept"):
        swap.roll_forward()
    assert all(fs.exists(posixpath.join(root, KEY, f.name)) for f in inputs)


# -- the operator's command and the job's settings (no Spark started) ----------------------------


def run_logrouter(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
    return subprocess.run([sys.executable, "-m", "logrouter", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env)


def test_logrouter_compact_dry_run_shows_the_plan_and_changes_nothing(tmp_path):
    fs, root = LocalFileSystem(), str(tmp_path / "lake")
    write_files(fs, root, 3, rows=4)
    write_files(fs, root, 1, hour=1)
    before = sorted(p.name for p in (tmp_path / "lake").rglob("*"))
    done = run_logrouter("compact", "--path", root, "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"lake {root}: 1 partition(s), 3 files, ")
    assert lines[1].startswith(f"  {KEY}  3 files  ") and lines[1].endswith("(3 files >= min_files 2)")
    assert lines[-1] == "dry run: nothing changed"
    done = run_logrouter("compact", "--path", root, "--dry-run", "--partition", "tag=app/dt=2024-05-01/hour=08")
    assert "(nothing to do: 1 file)" in done.stdout
    # the config's [compaction] settings and parquet sink paths are used without --path
    config = tmp_path / "logrouter.toml"
    config.write_text('[sources.f]\ntype = "fluent_forward"\n[sinks.lake]\ntype = "parquet"\ninputs = ["f"]\n'
                      'path = "lake"\n[compaction]\nmin_files = 4\n')
    done = run_logrouter("compact", "--config", str(config), "--dry-run", cwd=tmp_path)
    line = done.stdout.splitlines()[1]
    assert line.startswith(f"  {KEY}  3 files  ") and line.endswith(f" B < target {256 << 20} B)")  # min_files 4: small files
    assert sorted(p.name for p in (tmp_path / "lake").rglob("*")) == before


def test_the_daemon_side_never_imports_pyspark():
    code = ("import sys, logrouter.service, logrouter.tap, logrouter.compaction.scheduler, logrouter.compaction.tool, "
            "logrouter.jobs.compact; print(sorted(m for m in sys.modules if m.startswith(('pyspark', 'py4j'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=PACKAGE_PARENT))
    assert done.stdout.strip() == "[]", done.stderr


def test_the_jobs_correctness_settings_cannot_be_overridden():
    from logrouter.jobs.compact import REQUIRED_CONF, spark_settings

    settings = spark_settings("local[*]", {"spark.sql.caseSensitive": "false", "spark.executor.memory": "2g",
                                           "spark.sql.parquet.compression.codec": "snappy"})
    assert settings["spark.sql.caseSensitive"] == "true"
    assert settings["spark.sql.sources.partitionColumnTypeInference.enabled"] == "false"
    assert settings["spark.sql.parquet.outputTimestampType"] == "TIMESTAMP_MICROS"
    assert settings["spark.executor.memory"] == "2g" and settings["spark.sql.parquet.compression.codec"] == "snappy"
    assert settings["spark.driver.host"] == "127.0.0.1"
    assert "spark.driver.host" not in spark_settings("yarn", {})
    assert all(spark_settings("yarn", {})[k] == v for k, v in REQUIRED_CONF.items())

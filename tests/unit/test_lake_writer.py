"""LakeWriter: files per partition, rolling, sealing, publishing, staging cleanup."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from logrouter.lake.dataset import lake_dataset
from logrouter.lake.fs import LocalFileSystem, filesystem_for
from logrouter.lake.partition import HOUR_NS, PartitionError
from logrouter.lake.schema import ColumnTypes
from logrouter.lake.writer import STAGING_DIR, LakeWriter, SealedFile

T0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z


def events(count, start=0, tag_hour=T0, **extra):
    return [
        (tag_hour + (start + i) * 1000, {"seq": start + i, "msg": f"message {start + i}", **extra})
        for i in range(count)
    ]


def parquet_files(path):
    found = []
    for directory, _, names in os.walk(path):
        found.extend(os.path.join(directory, n) for n in names if n.endswith(".parquet"))
    return sorted(found)


def published(root):
    return [p for p in parquet_files(root) if f"/{STAGING_DIR}/" not in p]


def staged(root):
    return [p for p in parquet_files(root) if f"/{STAGING_DIR}/" in p]


def test_every_event_and_field_reads_back(tmp_path):
    root = str(tmp_path)
    writer = LakeWriter(root, "w1", 1 << 30, 60, row_group_rows=7)
    batch_a = [
        (T0 + 1_000, {"host": "h1", "n": 1, "f": 0.5, "ok": True, "raw": b"\x01", "obj": {"k": [1, 2]}}),
        (T0 + 2_000, {"host": "h2", "n": "two", "time": "shadow", "tag": "shadow"}),
    ] + events(20, start=100)
    batch_b = [(T0 + HOUR_NS + 5_000, {"host": "h3", "n": 3, "late": "x"})]
    writer.write("app.web", batch_a, now=0)
    writer.write("app.web", batch_b, now=1)
    writer.write("db", events(3), now=2)
    writer.publish(writer.seal_all())

    table = lake_dataset(root).to_table()
    assert len(table) == len(batch_a) + len(batch_b) + 3
    micros = table.column("time").cast(pa.int64()).to_pylist()
    by_key = {(r["tag"], us): r for r, us in zip(table.to_pylist(), micros)}

    def row(tag, time_ns):
        return by_key[(tag, time_ns // 1000)]

    first = row("app.web", T0 + 1_000)
    assert (first["host"], first["n"], first["f"], first["ok"], first["raw"]) == ("h1", 1, 0.5, True, b"\x01")
    assert json.loads(first["_extra"]) == {"obj": {"k": [1, 2]}}
    assert (first["dt"], first["hour"]) == ("2024-05-01", 7)
    second = row("app.web", T0 + 2_000)
    assert second["n"] is None
    assert json.loads(second["_extra"]) == {"n": "two", "time": "shadow", "tag": "shadow"}
    assert second["tag"] == "app.web"  # the partition value, not the record's field
    third = row("app.web", T0 + HOUR_NS + 5_000)
    assert (third["host"], third["n"], third["late"], third["hour"]) == ("h3", 3, "x", 8)
    for i in range(100, 120):
        assert row("app.web", T0 + i * 1000)["msg"] == f"message {i}"
    assert sorted(r["seq"] for r in table.to_pylist() if r["tag"] == "db") == [0, 1, 2]


def test_one_file_per_partition_and_hour(tmp_path):
    root = str(tmp_path)
    writer = LakeWriter(root, "w1", 1 << 30, 60)
    writer.write("a", events(5) + events(5, tag_hour=T0 + HOUR_NS), now=0)
    writer.write("a", events(5, start=5), now=0)
    writer.write("b", events(5), now=0)
    assert writer.open_files == 3
    sealed = writer.seal_all()
    assert writer.open_files == 0
    assert sorted((s.tag, s.dt, s.hour, s.rows) for s in sealed) == [
        ("a", "2024-05-01", "07", 10), ("a", "2024-05-01", "08", 5), ("b", "2024-05-01", "07", 5)
    ]
    writer.publish(sealed)
    assert sorted(os.path.relpath(os.path.dirname(p), root) for p in published(root)) == [
        "tag=a/dt=2024-05-01/hour=07", "tag=a/dt=2024-05-01/hour=08", "tag=b/dt=2024-05-01/hour=07"
    ]


def test_files_are_zstd_parquet_with_row_groups(tmp_path):
    writer = LakeWriter(str(tmp_path), "w1", 1 << 30, 60, row_group_rows=10)
    writer.write("a", events(25), now=0)
    [sealed] = writer.seal_all()
    metadata = pq.ParquetFile(sealed.staging_path).metadata
    assert metadata.num_row_groups == 3 and metadata.num_rows == 25 == sealed.rows
    assert metadata.row_group(0).column(0).compression == "ZSTD"
    assert os.path.getsize(sealed.staging_path) == sealed.bytes
    schema = pq.read_schema(sealed.staging_path)
    assert schema.field("time").type == pa.timestamp("us", tz="UTC")


def test_the_time_column_is_written_without_a_dictionary(tmp_path):
    writer = LakeWriter(str(tmp_path), "w1", 1 << 30, 60, row_group_rows=100)
    writer.write("a", events(250, level="info"), now=0)
    [sealed] = writer.seal_all()
    metadata = pq.ParquetFile(sealed.staging_path).metadata
    names = metadata.schema.to_arrow_schema().names
    for group in range(metadata.num_row_groups):
        encodings = {names[i]: metadata.row_group(group).column(i).encodings for i in range(len(names))}
        assert not any("DICTIONARY" in e for e in encodings["time"]), encodings
        assert any("DICTIONARY" in e for e in encodings["level"]), encodings  # the others keep Arrow's default
    table = pq.read_table(sealed.staging_path)
    assert table.column("time").cast(pa.int64()).to_pylist() == [t // 1000 for t, _ in events(250)]


def test_mostly_distinct_text_columns_are_written_without_a_dictionary(tmp_path):
    writer = LakeWriter(str(tmp_path), "w1", 1 << 30, 60, row_group_rows=100)
    # msg is distinct per row in the first row group, level repeats, seq is an int.
    writer.write("a", events(250, level="info"), now=0)
    [sealed] = writer.seal_all()
    metadata = pq.ParquetFile(sealed.staging_path).metadata
    names = metadata.schema.to_arrow_schema().names
    for group in range(metadata.num_row_groups):
        encodings = {names[i]: metadata.row_group(group).column(i).encodings for i in range(len(names))}
        assert not any("DICTIONARY" in e for e in encodings["msg"]), encodings
        assert any("DICTIONARY" in e for e in encodings["level"]), encodings
        assert any("DICTIONARY" in e for e in encodings["seq"]), encodings
    assert pq.read_table(sealed.staging_path).column("msg").to_pylist() == [r["msg"] for _, r in events(250)]


def test_roll_by_size(tmp_path):
    root = str(tmp_path)
    writer = LakeWriter(root, "w1", roll_bytes=4000, roll_secs=3600, row_group_rows=50)
    for start in range(0, 1000, 100):
        writer.write("a", events(100, start=start), now=0)
    rolled = writer.seal_due(now=0)  # size-rolled files are handed out here, aged or not
    assert len(rolled) >= 3
    assert all(s.bytes >= 4000 for s in rolled)
    # no file grows far past the limit: at most one row group beyond it
    assert all(s.bytes < 4000 + 3 * 2000 for s in rolled)
    rest = writer.seal_all()
    writer.publish(rolled + rest)
    table = lake_dataset(root).to_table()
    assert sorted(table.column("seq").to_pylist()) == list(range(1000))
    assert sum(s.rows for s in rolled + rest) == 1000


def test_one_big_write_stays_in_one_file_then_rolls(tmp_path):
    """A file rolls between writes only (``test_a_roll_never_splits_one_writes_rows_across_files``):
    a write far past ``roll_bytes`` is encoded in row groups, into one file, sealed after it."""
    writer = LakeWriter(str(tmp_path), "w1", roll_bytes=3000, roll_secs=3600, row_group_rows=100)
    writer.write("a", events(2000), now=0, mark=1)
    rolled = writer.seal_due(now=0)
    assert [(s.rows, s.first_mark, s.last_mark) for s in rolled] == [(2000, 1, 1)]
    assert pq.ParquetFile(rolled[0].staging_path).metadata.num_row_groups == 20
    writer.write("a", events(10, start=2000), now=0, mark=2)
    assert [s.rows for s in writer.seal_all()] == [10]


def test_a_file_rolls_once_it_holds_roll_row_groups(tmp_path):
    """Parquet keeps every row group's footer entry in memory until the file closes: a
    file of many small row groups is sealed at ``roll_row_groups`` however small it is."""
    root = str(tmp_path)
    writer = LakeWriter(root, "w1", 1 << 30, 3600, row_group_rows=10, roll_row_groups=3)
    for start in range(0, 75, 5):
        writer.write("a", events(5, start=start), now=0)
    rolled = writer.seal_due(now=0)
    assert [s.rows for s in rolled] == [30, 30]
    assert [pq.ParquetFile(s.staging_path).metadata.num_row_groups for s in rolled] == [3, 3]
    rest = writer.seal_all()
    writer.publish(rolled + rest)
    assert sorted(lake_dataset(root).to_table().column("seq").to_pylist()) == list(range(75))
    with pytest.raises(ValueError, match="roll_row_groups"):
        LakeWriter(root, "w2", 1 << 30, 3600, roll_row_groups=0)


@pytest.mark.parametrize("roll", [{"roll_row_groups": 1}, {"roll_bytes": 1}])
def test_a_roll_never_splits_one_writes_rows_across_files(tmp_path, roll):
    """The parquet sink commits a sealed file's ``last_mark`` as published for its
    partition and replays from the oldest open file's ``first_mark``, skipping the rows of
    published marks: a record whose rows were split between a sealed file and the open
    one would lose the open file's share in a crash. So a file rolls only between writes."""
    root = str(tmp_path)
    options = {"roll_bytes": 1 << 30, "roll_row_groups": 1000, **roll}
    writer = LakeWriter(root, "w1", roll_secs=3600, row_group_rows=10, **options)
    handed = []
    for mark in range(6):
        writer.write("a", events(15, start=15 * mark), now=0, mark=mark)
        sealed = writer.seal_due(now=0)
        oldest = writer.oldest_open_mark()
        assert all(oldest is None or file.last_mark < oldest for file in sealed), (mark, oldest, sealed)
        handed += sealed
    assert len(handed) >= 5  # it did roll, once per write
    writer.publish(handed + writer.seal_all())
    assert sorted(lake_dataset(root).to_table().column("seq").to_pylist()) == list(range(90))


def test_roll_by_age(tmp_path):
    writer = LakeWriter(str(tmp_path), "w1", 1 << 30, roll_secs=60)
    assert writer.next_due() is None
    writer.write("a", events(3), now=1000.0)
    writer.write("b", events(3), now=1030.0)
    writer.write("a", events(3, start=3), now=1050.0)  # appending does not make a file younger
    assert writer.next_due() == 1060.0
    assert writer.seal_due(now=1059.9) == []
    [sealed_a] = writer.seal_due(now=1060.0)
    assert (sealed_a.tag, sealed_a.rows) == ("a", 6)
    assert writer.open_files == 1 and writer.next_due() == 1090.0
    writer.write("a", events(1, start=6), now=1061.0)  # a new file for "a"
    assert [s.tag for s in writer.seal_due(now=1090.0)] == ["b"]
    assert writer.next_due() == 1121.0


def test_publish_is_the_only_way_into_the_lake(tmp_path):
    root = str(tmp_path)
    writer = LakeWriter(root, "w1", 1 << 30, 60)
    writer.write("a", events(10), now=0)
    writer.flush()  # row groups on disk, file still open
    assert published(root) == []
    sealed = writer.seal_all()
    assert [s.staging_path for s in sealed] == staged(root)
    assert all(not os.path.exists(s.final_path) for s in sealed)
    assert published(root) == []
    # the dataset reader ignores _staging (ignore_prefixes defaults to ['.', '_'])
    assert ds.FileSystemFactoryOptions().selector_ignore_prefixes == [".", "_"]
    assert ds.dataset(root, partitioning="hive").to_table().num_rows == 0
    writer.publish(sealed)
    assert staged(root) == []
    assert published(root) == [s.final_path for s in sealed]
    assert ds.dataset(root, partitioning="hive").to_table().num_rows == 10


def test_publish_is_idempotent_for_recovery(tmp_path):
    writer = LakeWriter(str(tmp_path), "w1", 1 << 30, 60)
    writer.write("a", events(4), now=0)
    sealed = writer.seal_all()
    record = json.dumps([s.to_dict() for s in sealed])  # what a commit record would hold
    writer.publish(sealed)
    redo = [SealedFile.from_dict(d) for d in json.loads(record)]
    assert redo == sealed
    LakeWriter(str(tmp_path), "w1", 1 << 30, 60).publish(redo)  # a restarted writer redoes it
    assert len(published(str(tmp_path))) == 1
    os.remove(sealed[0].final_path)
    with pytest.raises(FileNotFoundError):
        writer.publish(redo)


def test_file_names_unique_across_writers_and_runs(tmp_path):
    root = str(tmp_path)
    names = []
    for writer_id in ("w1", "w2", "w1", "w1"):  # w1 runs three times
        writer = LakeWriter(root, writer_id, 1 << 30, 60)
        writer.write("a", events(2), now=0)
        writer.write("a", events(2, tag_hour=T0 + HOUR_NS), now=0)
        sealed = writer.seal_all()
        writer.publish(sealed)
        names.extend(os.path.basename(s.final_path) for s in sealed)
    assert len(set(names)) == len(names) == 8
    assert all(n.startswith(("part-w1-", "part-w2-")) for n in names)
    assert lake_dataset(root).to_table().num_rows == 16


def test_discard_staging_removes_only_this_writers_leftovers(tmp_path):
    root = str(tmp_path)
    crashed = LakeWriter(root, "w1", 1 << 30, 60)
    crashed.write("a", events(5), now=0)
    crashed.seal_all()  # sealed, never committed
    crashed.write("a", events(5, start=5), now=0)
    crashed.flush()  # open file with a row group on disk
    other = LakeWriter(root, "w2", 1 << 30, 60)
    other.write("a", events(1), now=0)
    other_sealed = other.seal_all()

    restarted = LakeWriter(root, "w1", 1 << 30, 60)
    removed = restarted.discard_staging()
    assert len(removed) == 2
    assert staged(root) == [other_sealed[0].staging_path]
    assert restarted.discard_staging() == []
    restarted.write("a", events(1), now=0)
    with pytest.raises(RuntimeError):
        restarted.discard_staging()
    assert LakeWriter(str(tmp_path / "fresh"), "w1", 1, 1).discard_staging() == []


def test_abort_throws_away_unpublished_work(tmp_path):
    root = str(tmp_path)
    writer = LakeWriter(root, "w1", roll_bytes=500, roll_secs=60, row_group_rows=10)
    writer.write("a", events(100), now=0)  # some files rolled by size, one open
    writer.write("b", events(3), now=0)  # buffered only
    assert staged(root)
    writer.abort()
    assert staged(root) == [] and writer.open_files == 0
    assert writer.seal_all() == []
    writer.write("a", events(2), now=1)
    writer.publish(writer.seal_all())
    assert lake_dataset(root).to_table().num_rows == 2


def test_marks_track_what_is_not_handed_out(tmp_path):
    writer = LakeWriter(str(tmp_path), "w1", 1 << 30, 60)
    assert writer.oldest_open_mark() is None
    writer.write("a", events(2), now=0, mark=10)
    writer.write("b", events(2), now=5, mark=11)
    writer.write("a", events(2), now=6, mark=12)
    assert writer.oldest_open_mark() == 10
    [sealed] = writer.seal_due(now=60)
    assert sealed.first_mark == 10
    assert writer.oldest_open_mark() == 11


def test_metrics_introspection(tmp_path):
    writer = LakeWriter(str(tmp_path), "w1", 1 << 30, 60, row_group_rows=100)
    assert (writer.open_files, writer.buffered_rows, writer.buffered_bytes) == (0, 0, 0)
    writer.write("a", events(150), now=0)
    writer.write("b", events(10), now=0)
    assert writer.open_files == 2
    assert writer.buffered_rows == 60
    assert writer.buffered_bytes > 0
    writer.flush()
    assert writer.buffered_rows == 0 and writer.buffered_bytes == 0


def test_writer_wide_column_types_across_tags(tmp_path):
    root = str(tmp_path)
    writer = LakeWriter(root, "w1", 1 << 30, 60, column_types=ColumnTypes({"level": "string"}))
    writer.write("a", [(T0, {"code": 1})], now=0)
    writer.write("b", [(T0, {"code": "E1"})], now=0)
    writer.publish(writer.seal_all())
    table = lake_dataset(root).to_table()  # unifies: one type per column across the lake
    assert table.schema.field("code").type == pa.int64()
    assert table.schema.field("level").type == pa.string()
    rows = {r["tag"]: r for r in table.to_pylist()}
    assert rows["a"]["code"] == 1
    assert rows["b"]["code"] is None and json.loads(rows["b"]["_extra"]) == {"code": "E1"}


def test_bad_tag_is_refused_before_anything_is_buffered(tmp_path):
    writer = LakeWriter(str(tmp_path), "w1", 1 << 30, 60)
    with pytest.raises(PartitionError):
        writer.write("x" * 300, events(1), now=0)
    assert writer.open_files == 0


@pytest.mark.parametrize("writer_id", ["", "a/b", "_x", "..", "a b", "x" * 65])
def test_writer_id_must_be_a_safe_name(tmp_path, writer_id):
    with pytest.raises(ValueError):
        LakeWriter(str(tmp_path), writer_id, 1, 1)


class RecordingFileSystem(LocalFileSystem):
    """The local filesystem, logging the calls that matter for durability."""

    def __init__(self):
        self.calls = []

    def sync_close(self, stream):
        self.calls.append(("sync_close", stream.name))
        super().sync_close(stream)

    def sync_dir(self, path):
        self.calls.append(("sync_dir", path))
        super().sync_dir(path)

    def replace(self, source, target):
        self.calls.append(("replace", source, target))
        super().replace(source, target)


def test_durability_order_through_the_filesystem_seam(tmp_path):
    fs = RecordingFileSystem()
    writer = LakeWriter(str(tmp_path), "w1", 1 << 30, 60, fs=fs)
    writer.write("a", events(3), now=0)
    [sealed] = writer.seal_all()
    # the data is fsync'd, then the staging directory entry, before anyone sees it
    assert fs.calls[-2:] == [("sync_close", sealed.staging_path), ("sync_dir", writer.staging_dir)]
    fs.calls.clear()
    writer.publish([sealed])
    final_dir = os.path.dirname(sealed.final_path)
    replace_at = fs.calls.index(("replace", sealed.staging_path, sealed.final_path))
    # new partition directories are made durable before the rename, the target dir after
    assert ("sync_dir", os.path.dirname(final_dir)) in fs.calls[:replace_at]
    assert fs.calls[-1] == ("sync_dir", final_dir)


def test_filesystem_for():
    fs, path = filesystem_for("file:///var/lake")
    assert isinstance(fs, LocalFileSystem) and path == "/var/lake"
    assert filesystem_for("var/lake")[1] == "var/lake"
    with pytest.raises(ValueError):
        filesystem_for("s3://bucket/logs")  # no adapter for it

"""Iceberg tables on a real HDFS through ``logrouter.lake.iceberg_hdfs_io.HdfsFileIO``.

The session's MiniDFSCluster (tests/hdfs_cluster.py, tests/lake/conftest.py). A pyiceberg SQL catalog on a
SQLite file with its warehouse at ``hdfs://127.0.0.1:PORT/warehouse`` and
``py-io-impl`` naming our FileIO: create a partitioned table, append twice, scan every
row back; every data, manifest and metadata file is on the NameNode. And the FileIO's
own contract there: create refuses an existing name, hsync'd bytes read back
(buffered, with seeks), delete.

Every hdfs-native call runs in a child interpreter (``in_child``, see
tests/hdfs_cluster.py). Skipped, with the reason, where java/mvn are missing or Maven
cannot fetch.
"""

from __future__ import annotations

import pytest

from hdfs_cluster import in_child

pytest.importorskip("pyiceberg")

IO_IMPL = "logrouter.lake.iceberg_hdfs_io.HdfsFileIO"


def file_io_contract(base: str) -> dict:
    from logrouter.lake.iceberg_hdfs_io import HdfsFileIO

    io = HdfsFileIO({})
    location = f"{base}/io/one.bin"
    result: dict = {"exists_before": io.new_input(location).exists()}
    with io.new_output(location).create() as stream:
        stream.write(b"0123456789" * 200_000)  # 2 MB: more than one read buffer
    result["len"] = len(io.new_input(location))
    try:
        io.new_output(location).create()
        result["second_create"] = "allowed"
    except FileExistsError:
        result["second_create"] = "refused"
    with io.new_input(location).open() as stream:
        stream.seek(-5, 2)
        result["tail"] = stream.read()
        stream.seek(1_500_000)
        result["middle"] = stream.read(4)
    with io.new_output(location).create(overwrite=True) as stream:
        stream.write(b"new")
    with io.new_input(location).open() as stream:
        result["overwritten"] = stream.read()
    io.delete(location)
    result["exists_after"] = io.new_input(location).exists()
    try:
        io.delete(location)
    except FileNotFoundError:
        result["delete_missing"] = "FileNotFoundError"
    return result


def test_the_file_io_contract_on_a_real_namenode(hdfs):
    result = in_child(file_io_contract, hdfs.url("/contract"))
    assert result == {
        "exists_before": False,
        "len": 2_000_000,
        "second_create": "refused",
        "tail": b"56789",
        "middle": b"0123",
        "overwritten": b"new",
        "exists_after": False,
        "delete_missing": "FileNotFoundError",
    }


def table_round_trip(catalog_dir: str, warehouse: str) -> dict:
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform, IdentityTransform
    from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

    from logrouter.lake.fs import filesystem_for

    catalog = SqlCatalog("lake", uri=f"sqlite:///{catalog_dir}/catalog.db", warehouse=warehouse, **{"py-io-impl": IO_IMPL})
    catalog.create_namespace("logs")
    schema = Schema(
        NestedField(1, "time", TimestamptzType(), required=False),
        NestedField(2, "tag", StringType(), required=False),
        NestedField(3, "n", LongType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(source_id=1, field_id=1000, transform=DayTransform(), name="time_day"),
        PartitionField(source_id=2, field_id=1001, transform=IdentityTransform(), name="tag"),
    )
    table = catalog.create_table("logs.events", schema=schema, partition_spec=spec, properties={"format-version": "2"})
    day_us = 86_400 * 10**6
    arrow_schema = pa.schema([("time", pa.timestamp("us", tz="UTC")), ("tag", pa.string()), ("n", pa.int64())])
    for batch in range(2):
        rows = range(batch * 100, batch * 100 + 100)
        table.append(pa.table({
            "time": [1_714_546_800 * 10**6 + (n % 3) * day_us for n in rows],
            "tag": ["app" if n % 2 else "web" for n in rows],
            "n": list(rows),
        }, schema=arrow_schema))
    again = SqlCatalog("lake", uri=f"sqlite:///{catalog_dir}/catalog.db", warehouse=warehouse, **{"py-io-impl": IO_IMPL})
    reread = again.load_table("logs.events")
    scanned = reread.scan().to_arrow()
    files = [task.file.file_path for task in reread.scan().plan_files()]
    fs, root = filesystem_for(warehouse)
    metadata = fs.list_files(f"{root}/logs/events/metadata")
    return {
        "n": sorted(scanned.column("n").to_pylist()),
        "tags": sorted(set(scanned.column("tag").to_pylist())),
        "metadata_location": reread.metadata_location,
        "data_files": files,
        "data_files_exist": all(fs.exists(f.split(fs.url, 1)[1]) for f in files),
        "metadata_files": sorted(name.rsplit(".", 1)[-1] for name in metadata),
        "snapshots": len(reread.snapshots()),
        "filtered": len(reread.scan(row_filter="tag == 'app'").to_arrow()),
    }


def test_a_sql_catalog_with_an_hdfs_warehouse_round_trips(hdfs, tmp_path):
    warehouse = hdfs.url("/warehouse")
    result = in_child(table_round_trip, str(tmp_path), warehouse)
    assert result["n"] == list(range(200))
    assert result["tags"] == ["app", "web"]
    assert result["metadata_location"].startswith(warehouse + "/logs/events/metadata/")
    assert result["data_files"] and all(f.startswith(warehouse + "/logs/events/data/") for f in result["data_files"])
    assert len(result["data_files"]) == 12  # 2 appends x 3 days x 2 tags
    assert result["data_files_exist"]
    assert result["metadata_files"].count("json") == 3  # create + 2 appends
    assert "avro" in result["metadata_files"]  # manifests and manifest lists
    assert result["snapshots"] == 2
    assert result["filtered"] == 100

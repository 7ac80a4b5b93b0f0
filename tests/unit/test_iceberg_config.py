"""The iceberg sink's config: every problem named by its key path, and the catalog's properties."""

from __future__ import annotations

import pytest

from logrouter.config.load import ConfigError, load_string
from logrouter.lake.iceberg_catalog import catalog_properties, redact
from repo_paths import DOCS

BASE = """
[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "iceberg"
inputs = ["forward"]
warehouse = "{warehouse}"
{extra}
"""


def errors(extra: str, warehouse: str = "var/lake") -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_string(BASE.format(warehouse=warehouse, extra=extra))
    return info.value.errors


def test_partition_by_problems_name_the_item():
    assert errors('partition_by = ["day(time)", 3]') == ["sinks.lake.partition_by: item 1 must be a string, got 3"]
    found = errors('partition_by = ["day(time)", "hour(time)", "identity(host)", "bucket(tag)", "week(time)"]')
    assert [e.split(":")[0] for e in found] == [f"sinks.lake.partition_by[{i}]" for i in (1, 2, 3, 4)]
    assert "already partitioned by 'day(time)'" in found[0]
    assert "only time and tag" in found[1] and "positive number first" in found[2] and "year(time)" in found[3]


def test_catalog_keys_are_checked():
    found = errors('table = "events"\ncatalog = "my.catalog"\ncatalog_uri = "mysql://x"\n'
                   'catalog_properties = { uri = "sqlite:///x.db", type = "rest", "py-io-impl" = 3 }')
    assert [e.split(":")[0] for e in found] == [
        "sinks.lake.table", "sinks.lake.catalog", "sinks.lake.catalog_uri", "sinks.lake.catalog_properties.uri",
        "sinks.lake.catalog_properties.type", "sinks.lake.catalog_properties.py-io-impl",
    ]


def test_a_warehouse_on_hdfs_needs_a_catalog_uri():
    pytest.importorskip("hdfs_native")
    assert errors("", warehouse="hdfs://namenode:8020/warehouse") == [
        "sinks.lake.catalog_uri: must be set for a warehouse on hdfs:// (a SQLite file on a local disk, or PostgreSQL for several routers)"
    ]
    load_string(BASE.format(warehouse="hdfs://namenode:8020/warehouse", extra='catalog_uri = "postgresql+psycopg2://u@h/db"'))


def test_the_catalog_properties_pass_through_beside_the_sinks_own(tmp_path):
    config = load_string(BASE.format(warehouse=tmp_path / "lake", extra='catalog_properties = { "py-io-impl" = "my.HdfsFileIO" }'))
    options = config.sinks["lake"].options
    assert options["catalog"] == "lake" and options["table"] == "logs.events"
    assert options["partition_by"] == ["day(time)", "identity(tag)"]
    assert catalog_properties(options["warehouse"], options["catalog_uri"], options["catalog_properties"]) == {
        "type": "sql",
        "pool_pre_ping": "true",
        "py-io-impl": "my.HdfsFileIO",
        "uri": f"sqlite:///{tmp_path}/lake/catalog.db",
        "warehouse": f"file://{tmp_path}/lake",
    }
    assert redact("postgresql+psycopg2://router:s3cret@db:5432/iceberg") == "postgresql+psycopg2://router:***@db:5432/iceberg"


def test_the_manuals_option_table_is_the_specs():
    from logrouter.config import docs

    text = (DOCS / "sinks" / "iceberg.md").read_text(encoding="utf-8")
    block = text.split("<!-- options:sinks.iceberg -->\n", 1)[1].split(docs.END_MARKER, 1)[0]
    assert block == docs.table(docs.sections()["sinks.iceberg"]), "regenerate with: python -m logrouter.config.docs sinks.iceberg"

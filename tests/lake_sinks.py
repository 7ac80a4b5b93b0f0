"""The two lake sinks side by side, for the tests that must hold for both.

A test written for the ``parquet`` sink runs against the ``iceberg`` sink too by rewriting
one ``[sinks.<name>]`` section of its config (``with_sink``: ``type`` and ``path`` become
``type = "iceberg"`` and ``warehouse``, the rest is kept) and reading the rows back with
``column`` / ``rows``: the Hive-partitioned lake with pyarrow, the table (``logs.events`` in
the SQLite catalog ``catalog.db`` of the warehouse) with pyiceberg.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from logrouter.lake.dataset import lake_dataset

KINDS = ("parquet", "iceberg")
CATALOG = "lake"
TABLE = "logs.events"


def with_sink(config: str, kind: str, section: str = "lake") -> str:
    """``config`` with its ``[sinks.<section>]`` (a ``parquet`` sink) turned into a ``kind`` sink."""
    if kind == "parquet":
        return config
    assert kind == "iceberg", kind
    header = re.search(rf"^\[sinks\.{re.escape(section)}\]\n", config, re.M)
    assert header, f"no [sinks.{section}] in the config"
    rest = config[header.end():]
    end = re.search(r"^\[", rest, re.M)
    body, tail = (rest[: end.start()], rest[end.start():]) if end else (rest, "")
    body, types = re.subn(r'^type = "parquet"', 'type = "iceberg"', body, flags=re.M)
    body, paths = re.subn(r"^path = ", "warehouse = ", body, flags=re.M)
    assert types == 1 and paths == 1, body
    return config[: header.end()] + body + tail


def table(warehouse: Path | str) -> Any:
    """The iceberg sink's table in a local warehouse (its default catalog and table)."""
    from logrouter.lake.iceberg_catalog import catalog_properties, open_catalog, table_identifier

    catalog = open_catalog(CATALOG, catalog_properties(str(warehouse)))
    return catalog.load_table(table_identifier(TABLE))


def column(kind: str, directory: Path | str, name: str) -> list:
    """One column of every row the sink landed in ``directory`` (its ``path`` or ``warehouse``)."""
    if kind == "parquet":
        return lake_dataset(str(directory)).to_table(columns=[name]).column(name).to_pylist()
    return table(directory).scan(selected_fields=(name,)).to_arrow().column(name).to_pylist()


def rows(kind: str, directory: Path | str) -> list[dict]:
    if kind == "parquet":
        return lake_dataset(str(directory)).to_table().to_pylist()
    return table(directory).scan().to_arrow().to_pylist()


def staged(kind: str, directory: Path | str) -> list[Path]:
    """Staged (uncommitted) data files left in the lake."""
    root = Path(directory) / ("_staging" if kind == "parquet" else "logs/events/_staging")
    return list(root.rglob("*.parquet"))

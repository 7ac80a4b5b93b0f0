"""Iceberg test harness: jars, catalogs, tables written with pyiceberg, a Spark reader.

- ``jars_or_skip()``: the Iceberg Spark runtime and JDBC drivers
  (``logrouter.compaction.jars``), cached outside the checkout in
  ``~/.cache/logrouter-tests/iceberg-jars/`` (fetched once with Maven); skips, saying
  why, where java/mvn/Maven Central are missing.
- ``sqlite_catalog(directory, name)``: the pyiceberg properties of a SQLite catalog with
  its warehouse beside it, and ``open_catalog`` to open one.
- ``new_events_table`` / ``events``: a table shaped like the Iceberg sink's (``time``,
  ``tag``, columns, ``_extra``; ``day(time)`` and ``identity(tag)``), and rows for it.
- ``IcebergSpark``: ONE Spark session with the Iceberg runtime for a test module
  (starting Spark costs 10-20 s here); ``add_catalog`` registers a catalog at run time
  under the pyiceberg name (a catalog name is loaded once per session: use a new name
  per table directory). ``stop()`` also takes its builder options back, because
  pyspark's builder keeps them for every later session in the process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from go_binary import cache_root
from logrouter.lake.iceberg_engines import ICEBERG_EXTENSIONS, spark_catalog_conf

JARS_DIR = cache_root() / "iceberg-jars"
T0_US = 1_714_546_800 * 10**6  # 2024-05-01T07:00:00Z
DAY_US = 86_400 * 10**6


def jars_or_skip() -> list[str]:
    from logrouter.compaction.jars import JarsUnavailable, ensure_jars

    if shutil.which("java") is None:
        pytest.skip("java is not installed (Spark needs it)")
    try:
        return ensure_jars(JARS_DIR)
    except JarsUnavailable as reason:
        pytest.skip(str(reason))


def spark_or_skip() -> None:
    pyspark = pytest.importorskip("pyspark")
    if not pyspark.__version__.startswith("4.1."):
        pytest.skip(f"the Iceberg runtime 1.12 is built for Spark 4.1; pyspark is {pyspark.__version__}")


def sqlite_catalog(directory: Path, name: str = "lake") -> tuple[str, dict[str, str]]:
    directory.mkdir(parents=True, exist_ok=True)
    return name, {"uri": f"sqlite:///{directory}/catalog.db", "warehouse": f"file://{directory}/warehouse"}


def open_catalog(name: str, properties: dict[str, str]) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(name, **properties)


def new_events_table(catalog: Any, identifier: str = "logs.events") -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform, IdentityTransform
    from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

    namespace = identifier.rsplit(".", 1)[0]
    if (namespace,) not in catalog.list_namespaces():
        catalog.create_namespace(namespace)
    schema = Schema(
        NestedField(1, "time", TimestamptzType(), required=False),
        NestedField(2, "tag", StringType(), required=False),
        NestedField(3, "id", LongType(), required=False),
        NestedField(4, "msg", StringType(), required=False),
        NestedField(5, "_extra", StringType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(source_id=1, field_id=1000, transform=DayTransform(), name="time_day"),
        PartitionField(source_id=2, field_id=1001, transform=IdentityTransform(), name="tag"),
    )
    return catalog.create_table(identifier, schema=schema, partition_spec=spec, properties={"format-version": "2"})


def events(first_id: int, count: int, days: int = 2) -> Any:
    import pyarrow as pa

    ids = range(first_id, first_id + count)
    return pa.table({
        "time": pa.array([T0_US + (i % days) * DAY_US + i for i in ids], pa.timestamp("us", tz="UTC")),
        "tag": pa.array(["app" if (i // days) % 2 else "web" for i in ids]),
        "id": pa.array(list(ids), pa.int64()),
        "msg": pa.array([f"m{i}" for i in ids]),
        "_extra": pa.array([None] * count, pa.string()),
    })


class IcebergSpark:
    """One local Spark session with the Iceberg runtime (see the module docstring)."""

    def __init__(self, jars: list[str], home: Path) -> None:
        self.jars = jars
        self.home = home
        self._session: Any = None
        self._options: dict[str, str] = {}
        self._catalogs: set[str] = set()

    @property
    def session(self) -> Any:
        if self._session is None:
            from pyspark.sql import SparkSession

            self._options = {
                "spark.jars": ",".join(self.jars),
                "spark.sql.extensions": ICEBERG_EXTENSIONS,
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.sql.session.timeZone": "UTC",
                "spark.sql.shuffle.partitions": "2",
                "spark.sql.warehouse.dir": str(self.home / "spark-warehouse"),
            }
            builder = SparkSession.builder.master("local[2]").appName("logrouter-iceberg-tests")
            for key, value in self._options.items():
                builder = builder.config(key, value)
            self._session = builder.getOrCreate()
            self._session.sparkContext.setLogLevel("ERROR")
        return self._session

    def add_catalog(self, name: str, properties: dict[str, str]) -> None:
        if name in self._catalogs:
            raise ValueError(f"catalog {name!r} is registered already: use a new name per catalog")
        for key, value in spark_catalog_conf(name, properties).items():
            if key != "spark.sql.extensions":
                self.session.conf.set(key, value)
        self._catalogs.add(name)

    def sql(self, statement: str) -> list[Any]:
        return self.session.sql(statement).collect()

    def stop(self) -> None:
        if self._session is not None:
            from pyspark.sql import SparkSession

            self._session.stop()
            self._session = None
            for key in self._options:
                SparkSession.builder._options.pop(key, None)


def run_job(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """A logrouter job as a child process, with this checkout importable."""
    checkout = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, **env, "PYTHONPATH": checkout + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)

"""What Spark, Trino and DuckDB need to read (and Spark to maintain) our Iceberg tables.

Owns the translation of a pyiceberg SQL catalog (its name and properties: ``uri`` as a
SQLAlchemy URL, ``warehouse``, pass-through properties) into each engine's settings:

- ``spark_catalog_conf``: the ``spark.sql.catalog.<name>.*`` settings of Iceberg's
  ``SparkCatalog`` over ``org.apache.iceberg.jdbc.JdbcCatalog`` on the same database,
  with ``jdbc.schema-version = V1`` (the table layout pyiceberg creates) and the same
  catalog name: the name is part of every row's key, so a different name sees no tables;
- ``trino_catalog_properties``: an ``etc/catalog/<name>.properties`` for Trino's Iceberg
  connector with its JDBC catalog (PostgreSQL; Trino ships no SQLite driver);
- ``duckdb_statements``: DuckDB reads a table from its current metadata file
  (``iceberg_scan``): it has no SQL-catalog support, so the statement names one snapshot.

Pure functions (no pyiceberg, no pyspark imports), shared by ``logrouter lake engines``,
the compaction job and the tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping
from urllib.parse import unquote, urlsplit

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
SPARK_CATALOG = "org.apache.iceberg.spark.SparkCatalog"
JDBC_CATALOG = "org.apache.iceberg.jdbc.JdbcCatalog"
#: pyiceberg's SqlCatalog makes the tables with an ``iceberg_type`` column: Iceberg's "V1".
JDBC_SCHEMA_VERSION = "V1"

#: pyiceberg catalog properties that are not the database or the warehouse: never handed
#: to other engines (``py-io-impl`` names a Python class).
PYTHON_ONLY = ("uri", "warehouse", "type", "py-io-impl", "init_catalog_tables", "echo", "pool_pre_ping")


@dataclass(frozen=True)
class JdbcDatabase:
    """The catalog database as JDBC names it."""

    url: str  # jdbc:sqlite:/abs/path or jdbc:postgresql://host:port/db
    driver: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("jdbc:sqlite:")


def jdbc_database(uri: str, cwd: str | None = None) -> JdbcDatabase:
    """The JDBC form of a SQLAlchemy URL (``sqlite:///…``, ``postgresql+psycopg2://…``).

    A relative SQLite path is made absolute against ``cwd`` (pyiceberg resolves it
    against the working directory; Spark may run elsewhere)."""
    parts = urlsplit(uri)
    scheme = parts.scheme.split("+", 1)[0].lower()
    if scheme == "sqlite":
        # sqlite:///relative/path, sqlite:////absolute/path
        path = unquote(uri.split(":///", 1)[1]) if ":///" in uri else ""
        if not path or path == ":memory:":
            raise ValueError(f"a catalog other engines read must be a SQLite file, got {uri!r}")
        path = path.split("?", 1)[0]
        return JdbcDatabase(f"jdbc:sqlite:{os.path.join(cwd or os.getcwd(), path)}", "org.sqlite.JDBC")
    if scheme in ("postgresql", "postgres"):
        host = parts.hostname or "localhost"
        port = f":{parts.port}" if parts.port else ""
        query = f"?{parts.query}" if parts.query else ""
        return JdbcDatabase(
            f"jdbc:postgresql://{host}{port}{parts.path}{query}", "org.postgresql.Driver",
            unquote(parts.username) if parts.username else None,
            unquote(parts.password) if parts.password else None,
        )
    raise ValueError(f"catalog uri {uri!r}: only SQLite and PostgreSQL catalogs are supported")


def warehouse_location(warehouse: str, cwd: str | None = None) -> str:
    """The warehouse as a URI every engine takes: a bare path becomes ``file://…``."""
    if "://" in warehouse:
        return warehouse.rstrip("/")
    return "file://" + os.path.join(cwd or os.getcwd(), warehouse).rstrip("/")


def spark_catalog_conf(name: str, properties: Mapping[str, str], cwd: str | None = None) -> dict[str, str]:
    """Spark settings for the catalog ``name`` (the Iceberg SQL extensions included)."""
    database = jdbc_database(properties["uri"], cwd)
    prefix = f"spark.sql.catalog.{name}"
    conf = {
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        prefix: SPARK_CATALOG,
        f"{prefix}.catalog-impl": JDBC_CATALOG,
        f"{prefix}.uri": database.url,
        f"{prefix}.jdbc.schema-version": JDBC_SCHEMA_VERSION,
        f"{prefix}.warehouse": warehouse_location(properties["warehouse"], cwd),
    }
    if database.user:
        conf[f"{prefix}.jdbc.user"] = database.user
    if database.password:
        conf[f"{prefix}.jdbc.password"] = database.password
    return conf


def trino_catalog_properties(name: str, properties: Mapping[str, str], cwd: str | None = None) -> dict[str, str]:
    """Trino's Iceberg connector on the same JDBC catalog (``etc/catalog/<name>.properties``)."""
    database = jdbc_database(properties["uri"], cwd)
    warehouse = warehouse_location(properties["warehouse"], cwd)
    settings = {
        "connector.name": "iceberg",
        "iceberg.catalog.type": "jdbc",
        "iceberg.jdbc-catalog.catalog-name": name,
        "iceberg.jdbc-catalog.driver-class": database.driver,
        "iceberg.jdbc-catalog.connection-url": database.url,
        "iceberg.jdbc-catalog.schema-version": JDBC_SCHEMA_VERSION,
        "iceberg.jdbc-catalog.default-warehouse-dir": warehouse,
    }
    if database.user:
        settings["iceberg.jdbc-catalog.connection-user"] = database.user
    if database.password:
        settings["iceberg.jdbc-catalog.connection-password"] = database.password
    if warehouse.startswith("hdfs://"):
        settings["fs.hadoop.enabled"] = "true"
    return settings


def duckdb_statements(metadata_location: str, view: str = "logs") -> list[str]:
    """DuckDB statements that read one snapshot of a table (its metadata file)."""
    location = metadata_location
    if location.startswith("file://"):
        location = location[len("file://") :]
    quoted = location.replace("'", "''")
    return [
        "INSTALL iceberg; LOAD iceberg;  -- or LOAD the .duckdb_extension files of the duckdb-extension-iceberg package",
        f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM iceberg_scan('{quoted}');",
    ]


def spark_sql_flags(conf: Mapping[str, str], jars: list[str]) -> list[str]:
    """``spark-sql`` command-line flags for ``conf`` and ``jars`` (passwords as given)."""
    flags = ["--jars", ",".join(jars)] if jars else []
    for key, value in conf.items():
        flags += ["--conf", f"{key}={value}"]
    return flags

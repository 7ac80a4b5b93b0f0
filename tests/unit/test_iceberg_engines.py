"""The catalog settings other engines get (``logrouter.lake.iceberg_engines``) and the jar
cache (``logrouter.compaction.jars``), without any engine.

The Spark settings themselves are exercised by tests/lake/test_iceberg_spark.py (its harness
registers catalogs with ``spark_catalog_conf``); here: the translation of each kind of
catalog URL, PostgreSQL credentials, bare warehouse paths, Trino's HDFS switch, DuckDB's
quoting, and a jar cache that needs no Maven once filled and says why it cannot fill.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from logrouter.compaction import jars
from logrouter.lake.iceberg_engines import (
    duckdb_statements,
    jdbc_database,
    spark_catalog_conf,
    trino_catalog_properties,
)


def test_sqlite_urls_become_absolute_jdbc_urls():
    assert jdbc_database("sqlite:////var/lib/lr/catalog.db").url == "jdbc:sqlite:/var/lib/lr/catalog.db"
    assert jdbc_database("sqlite:///var/catalog.db", cwd="/srv/lr").url == "jdbc:sqlite:/srv/lr/var/catalog.db"
    assert jdbc_database("sqlite:////x/c.db").driver == "org.sqlite.JDBC"
    with pytest.raises(ValueError, match="SQLite file"):
        jdbc_database("sqlite:///:memory:")
    with pytest.raises(ValueError, match="only SQLite and PostgreSQL"):
        jdbc_database("mysql+pymysql://u@h/db")


def test_postgresql_with_credentials():
    database = jdbc_database("postgresql+psycopg2://lr:p%40ss@db.example:5433/catalog?sslmode=require")
    assert (database.url, database.driver, database.user, database.password) == (
        "jdbc:postgresql://db.example:5433/catalog?sslmode=require", "org.postgresql.Driver", "lr", "p@ss")
    assert "p@ss" not in repr(database)


def test_spark_settings_name_the_same_catalog_and_the_v1_layout():
    conf = spark_catalog_conf("lake", {"uri": "postgresql://lr:pw@127.0.0.1/cat", "warehouse": "var/warehouse"}, cwd="/srv")
    assert conf == {
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.lake.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        "spark.sql.catalog.lake.uri": "jdbc:postgresql://127.0.0.1/cat",
        "spark.sql.catalog.lake.jdbc.schema-version": "V1",
        "spark.sql.catalog.lake.warehouse": "file:///srv/var/warehouse",
        "spark.sql.catalog.lake.jdbc.user": "lr",
        "spark.sql.catalog.lake.jdbc.password": "pw",
    }


def test_trino_properties():
    settings = trino_catalog_properties("lake", {"uri": "postgresql://lr:pw@db/cat", "warehouse": "hdfs://nn:8020/wh/"})
    assert settings["iceberg.jdbc-catalog.catalog-name"] == "lake"
    assert settings["iceberg.jdbc-catalog.connection-url"] == "jdbc:postgresql://db/cat"
    assert settings["iceberg.jdbc-catalog.schema-version"] == "V1"
    assert settings["iceberg.jdbc-catalog.default-warehouse-dir"] == "hdfs://nn:8020/wh"
    assert settings["fs.hadoop.enabled"] == "true"
    assert "fs.hadoop.enabled" not in trino_catalog_properties("lake", {"uri": "sqlite:////c.db", "warehouse": "/w"})


def test_duckdb_quotes_the_metadata_path():
    assert duckdb_statements("file:///it's/v3.metadata.json", "events")[1] == (
        "CREATE OR REPLACE VIEW events AS SELECT * FROM iceberg_scan('/it''s/v3.metadata.json');")


def test_a_filled_jar_cache_needs_no_maven(tmp_path, monkeypatch):
    for artifact in jars.ARTIFACTS:
        (tmp_path / artifact.file_name).write_bytes(b"jar")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert jars.ensure_jars(tmp_path) == [str(tmp_path / a.file_name) for a in jars.ARTIFACTS]


def test_a_jar_cache_without_maven_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(jars.JarsUnavailable, match="Maven \\(mvn\\) is not installed .* put the jar there by hand"):
        jars.ensure_jars(tmp_path)


def test_the_default_cache_follows_xdg():
    assert jars.default_cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/logrouter/jars")
    assert jars.default_cache_dir({"XDG_CACHE_HOME": "relative"}) == Path.home() / ".cache" / "logrouter" / "jars"

"""Fixtures of the lake tests only (tests/conftest.py holds those every kind shares).

Lake tests read and write the lake with the engines around it: Spark (``spark_ddl``,
pyspark on ``local[1]``), an HDFS MiniDFSCluster (``hdfs_cluster``), Iceberg tables with
pyiceberg and a PostgreSQL catalog (``postgres_server``). Without java, the tarballs or
the servers they need they are skipped, saying why.

The MiniDFSCluster and the PostgreSQL server are started once for the whole session
(``hdfs``, ``postgres``), by the first test that asks, and stopped at its end: starting
a MiniDFSCluster costs 10-20 s, and four modules use one. Each test keeps to its own
HDFS directory and its own database, so sharing them hides nothing between tests.
"""

import os
import shutil

import pytest


@pytest.fixture(scope="session", autouse=True)
def spark_jvm_with_the_iceberg_runtime():
    """pyspark starts one JVM per process, and its classpath is fixed then: the first lake
    test to open a Spark session decides it for all. The Iceberg runtime and the JDBC
    drivers go on it from the start (``PYSPARK_SUBMIT_ARGS``), whichever test comes first,
    so a plain Spark session opened earlier cannot leave the Iceberg tests without
    ``SparkCatalog``. Without java, pyspark 4.1 or the jars, nothing is set (the tests that
    need them skip, saying why)."""
    if "PYSPARK_SUBMIT_ARGS" not in os.environ and shutil.which("java") is not None:
        try:
            import pyspark

            from iceberg_spark import JARS_DIR
            from logrouter.compaction.jars import JarsUnavailable, ensure_jars

            if pyspark.__version__.startswith("4.1."):
                jars = ensure_jars(JARS_DIR)
                os.environ["PYSPARK_SUBMIT_ARGS"] = (
                    f"--jars {','.join(jars)} --driver-class-path {':'.join(jars)} pyspark-shell"
                )
        except (ImportError, JarsUnavailable):
            pass
    yield


@pytest.fixture(scope="session")
def hdfs(tmp_path_factory):
    """One MiniDFSCluster for every lake test that needs one; a test that stops its
    NameNode starts it again before it ends, whatever happened."""
    from hdfs_cluster import cluster_or_skip

    cluster = cluster_or_skip(tmp_path_factory.mktemp("hdfs"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for every lake test that needs one (its ``uri`` names the
    ``iceberg`` database; a test that needs a database of its own creates it)."""
    from postgres_server import PostgresServer, skip_reason

    if skip_reason():
        pytest.skip(skip_reason())
    with PostgresServer() as server:
        yield server

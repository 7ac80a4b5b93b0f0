"""Fixtures of the lake tests only (tests/conftest.py holds those every kind shares).

Lake tests read and write the lake with the engines around it: Spark (``spark_ddl``,
pyspark on ``local[1]``), an HDFS MiniDFSCluster (``hdfs_cluster``), Iceberg tables with
pyiceberg and a PostgreSQL catalog (``postgres_server``). Without java, the tarballs or
the servers they need they are skipped, saying why.
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

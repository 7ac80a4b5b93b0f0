"""Fixtures of the lake tests only (tests/conftest.py holds those every kind shares).

Lake tests read and write the lake with the engines around it: Spark (``spark_ddl``,
pyspark on ``local[1]``), an HDFS MiniDFSCluster (``hdfs_cluster``), Iceberg tables with
pyiceberg and a PostgreSQL catalog (``postgres_server``). Without java, the tarballs or
the servers they need they are skipped, saying why.
"""

"""The lake: Hive-partitioned Parquet files written by the parquet sink.

Synchronous library code run in a worker thread (no Twisted imports):

* ``partition`` - partition directories, Hive escaping, splitting a batch by hour;
* ``schema``    - which fields get typed columns and which type (the rules);
* ``extra``     - JSON encoding of the catch-all ``_extra`` column;
* ``convert``   - events -> Arrow table of a file's schema (the per-event path);
* ``fs``        - the filesystem seam: the local disk, and HDFS through hdfs-native;
* ``writer``    - open files per partition, rolling, sealing, publishing;
* ``dataset``   - reading a lake back with pyarrow (tests, audits, tools).
"""

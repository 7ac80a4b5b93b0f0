"""Compaction of Iceberg tables, the daemon's side and the job's statements, without Spark:

* the scheduler runs one ``logrouter.jobs.iceberg_maintain`` per table and round, after
  the parquet partitions, with the exact command line; the catalog's properties (a
  password among them) travel in the job's environment, never on its command line;
  results and failures reach the log and the metrics;
* the ``CALL`` statements the job sends (binpack options, the sealing filter, retention,
  the orphan guard) and the guards the config and the job put on them;
* ``iceberg_tables``: the tables of the config's iceberg sinks, each once.
"""

from __future__ import annotations

import argparse
import json
import types

import pytest
from twisted.internet import task
from twisted.logger import capturedLogs, formatEvent

from logrouter.compaction.iceberg import CATALOG_ENV, IcebergTable, iceberg_tables
from logrouter.compaction.options import COMPACTION_OPTIONS
from logrouter.compaction.scheduler import CompactionService
from logrouter.config.load import ConfigError, load_string
from logrouter.jobs import iceberg_maintain
from test_compaction_scheduler import PYTHON, FakeRunner, synchronous

TABLE = IcebergTable("events", "lake", "logs.events", {"uri": "postgresql+psycopg2://lr:s3cret@127.0.0.1:5432/cat",
                                                       "warehouse": "hdfs://nn:8020/wh"})


def options(**changes) -> dict:
    values = {k: o.default for k, o in COMPACTION_OPTIONS.items()}
    values.update(enabled=True, schedule_secs=60)
    values.update(changes)
    return values


def service(clock, runner, **changes) -> CompactionService:
    return CompactionService(options(**changes), [], clock, runner=runner, blocking=synchronous, owner="a", python=PYTHON,
                             env={"PATH": "/usr/bin"}, iceberg_tables=[TABLE])


def test_one_job_per_table_with_the_catalog_in_its_environment():
    clock, runner = task.Clock(), FakeRunner()
    compaction = service(clock, runner, jars_dir="/var/cache/jars", spark_conf={"spark.executor.memory": "2g"})
    compaction.startService()
    clock.advance(60)
    [job] = runner.jobs
    assert job.argv == [
        PYTHON, "-m", "logrouter.jobs.iceberg_maintain", "--master", "local[*]", "--conf", "spark.executor.memory=2g",
        "--catalog-name", "lake", "--table", "logs.events", "--target-file-bytes", str(256 << 20),
        "--min-input-files", "2", "--seal-after-secs", "3600.0", "--snapshot-retention-secs", "3600.0",
        "--retain-last", "100", "--orphan-older-than-secs", "259200.0", "--jars-dir", "/var/cache/jars",
        "--procedure", "rewrite_data_files", "--procedure", "rewrite_manifests", "--procedure", "expire_snapshots",
        "--procedure", "remove_orphan_files",
    ]
    assert not any("s3cret" in arg for arg in job.argv)
    assert json.loads(job.env[CATALOG_ENV]) == dict(TABLE.properties)
    assert job.env["PYSPARK_PYTHON"] == PYTHON
    with capturedLogs() as events:
        job.finish({"partition": "logs.events", "status": "compacted", "files_before": 40, "files_after": 4,
                    "bytes_before": 4000, "bytes_after": 3000, "reason": "36 data files rewritten"})
    lines = [formatEvent(e) for e in events]
    assert any("iceberg lake.logs.events logs.events: 40 files (4000 B) -> 4 (3000 B)" in line for line in lines), lines
    samples = {name: value for name, _, _, value in compaction.samples()}
    assert samples["logrouter_compaction_partitions_total"] == 1
    assert samples["logrouter_compaction_files_before_total"] == 40
    assert samples["logrouter_compaction_files_after_total"] == 4
    assert samples["logrouter_compaction_failures_total"] == 0
    clock.advance(60)
    assert len(runner.jobs) == 2  # every round
    with capturedLogs() as events:
        runner.jobs[1].finish({"partition": "logs.events", "status": "failed", "error": "ValidationException: x"}, code=1)
    assert any("failed (exit status 1): ValidationException: x" in formatEvent(e) for e in events)
    assert {name: value for name, _, _, value in compaction.samples()}["logrouter_compaction_failures_total"] == 1
    compaction.stopService()


def test_procedures_and_spark_submit_are_taken_from_the_options(tmp_path):
    submit = tmp_path / "spark-submit"
    submit.write_text("#!/bin/sh\n")
    submit.chmod(0o755)
    clock, runner = task.Clock(), FakeRunner()
    compaction = service(clock, runner, spark_submit=str(submit), spark_master="spark://h:7077",
                         iceberg_procedures=["expire_snapshots"])
    compaction.tick()
    argv = runner.jobs[0].argv
    assert argv[:3] == [str(submit), "--master", "spark://h:7077"]
    assert argv[3].endswith("logrouter/jobs/iceberg_maintain.py")
    assert argv[argv.index("--procedure") + 1] == "expire_snapshots" and argv.count("--procedure") == 1


def args(**changes) -> argparse.Namespace:
    values = iceberg_maintain.parse_args(["--catalog-name", "lake", "--table", "logs.events"])
    for key, value in changes.items():
        setattr(values, key, value)
    return values


NOW = 1_714_550_400.0  # 2024-05-01T08:00:00Z


def test_the_call_statements():
    sql = iceberg_maintain.procedure_sql
    assert sql("rewrite_data_files", "lake", "logs.events", args(target_file_bytes=1000, min_input_files=3), NOW) == (
        "CALL lake.system.rewrite_data_files(table => 'logs.events', strategy => 'binpack', "
        "options => map('target-file-size-bytes', '1000', 'min-input-files', '3', 'partial-progress.enabled', 'true', "
        "'partial-progress.max-commits', '10'), "
        "where => \"`time` < TIMESTAMP '2024-05-01 07:00:00.000000'\")"
    )
    assert "where" not in sql("rewrite_data_files", "lake", "logs.events", args(seal_after_secs=0), NOW)
    assert sql("rewrite_manifests", "lake", "logs.events", args(), NOW) == "CALL lake.system.rewrite_manifests(table => 'logs.events')"
    assert sql("expire_snapshots", "lake", "logs.events", args(snapshot_retention_secs=3600, retain_last=7), NOW) == (
        "CALL lake.system.expire_snapshots(table => 'logs.events', older_than => TIMESTAMP '2024-05-01 07:00:00.000000', "
        "retain_last => 7)"
    )
    assert sql("remove_orphan_files", "lake", "logs.events", args(), NOW) == (
        "CALL lake.system.remove_orphan_files(table => 'logs.events', older_than => TIMESTAMP '2024-04-28 08:00:00.000000')"
    )
    assert "'it\\'s'" in sql("rewrite_manifests", "lake", "it's", args(), NOW)


def test_the_job_refuses_an_orphan_guard_under_a_day(capsys):
    with pytest.raises(SystemExit):
        iceberg_maintain.parse_args(["--catalog-name", "l", "--table", "t", "--orphan-older-than-secs", "3600"])
    assert "at least 86400" in capsys.readouterr().err


def test_the_catalog_comes_from_the_environment_and_the_command_line():
    env = {CATALOG_ENV: json.dumps({"uri": "sqlite:////x/c.db", "warehouse": "file:///x"})}
    assert iceberg_maintain.catalog_properties(env, [("warehouse", "hdfs://nn/w")]) == {
        "uri": "sqlite:////x/c.db", "warehouse": "hdfs://nn/w"}
    with pytest.raises(ValueError, match="'uri' is missing"):
        iceberg_maintain.catalog_properties({}, [("warehouse", "w")])


def test_config_checks_of_the_iceberg_keys():
    base = '[sources.f]\ntype = "fluent_forward"\n[sinks.lake]\ntype = "parquet"\ninputs = ["f"]\npath = "lake"\n'
    with pytest.raises(ConfigError) as info:
        load_string(base + "[compaction]\norphan_older_than_secs = 3600\nmin_input_files = 0\n"
                    'iceberg_procedures = ["rewrite_data_files", "vacuum"]\n')
    assert sorted(info.value.errors) == [
        "compaction.iceberg_procedures[1]: unknown procedure 'vacuum' (one of: rewrite_data_files, rewrite_manifests, "
        "expire_snapshots, remove_orphan_files)",
        "compaction.min_input_files: must be 1 or more, got 0",
        "compaction.orphan_older_than_secs: must be at least 86400 (24 h: Iceberg refuses less, since files being "
        "written or not yet committed would go), got 3600",
    ]


def sink(kind: str, **options):
    return types.SimpleNamespace(type=kind, options=options)


def test_the_tables_of_the_iceberg_sinks_each_once():
    options = {"catalog": "lake", "warehouse": "/v/lake", "catalog_uri": "", "catalog_properties": {}}
    sinks = {
        "lake": sink("parquet", path="/v/lake"),
        "a": sink("iceberg", table="logs.events", **options),
        "b": sink("iceberg", table="logs.events", **options),
        "c": sink("iceberg", table="logs.audit", **options),
    }
    assert [(t.sink, t.table) for t in iceberg_tables({"sinks": []}, sinks)] == [("a", "logs.events"), ("c", "logs.audit")]
    assert [t.sink for t in iceberg_tables({"sinks": ["lake", "c"]}, sinks)] == ["c"]
    table = iceberg_tables({"sinks": ["a"]}, sinks)[0]
    assert table.catalog_name == "lake"
    assert table.properties["uri"] == "sqlite:////v/lake/catalog.db" and table.properties["warehouse"] == "file:///v/lake"


class JavaError(Exception):
    def __init__(self, text: str) -> None:
        super().__init__("An error occurred while calling o54.sql.")
        self.java_exception = types.SimpleNamespace(toString=lambda: text)


class Row(dict):
    def asDict(self) -> dict:
        return dict(self)


class FakeSpark:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.statements: list[str] = []

    def sql(self, statement: str):
        self.statements.append(statement)
        if self.failures:
            raise self.failures.pop(0)
        return types.SimpleNamespace(collect=lambda: [Row(rewritten_manifests_count=7, added_manifests_count=1)])


def test_a_procedure_that_lost_a_commit_race_is_planned_again():
    lost = "org.apache.iceberg.exceptions.ValidationException: Deleted manifest m9.avro could not be found in the latest snapshot"
    rewrite = ("java.lang.RuntimeException: Cannot commit rewrite because of a ValidationException or "
               "CommitFailedException. This usually means that this rewrite has conflicted with another concurrent …")
    spark = FakeSpark([JavaError(lost), JavaError("org.apache.iceberg.exceptions.CommitFailedException: x"), JavaError(rewrite)])
    answer, retries = iceberg_maintain.run_procedure(spark, "CALL x")
    assert (answer, retries, len(spark.statements)) == ({"rewritten_manifests_count": 7, "added_manifests_count": 1}, 3, 4)
    with pytest.raises(JavaError):  # anything else is not retried
        iceberg_maintain.run_procedure(FakeSpark([JavaError("java.lang.OutOfMemoryError: heap")]), "CALL x")
    spark = FakeSpark([JavaError(lost)] * 4)
    with pytest.raises(JavaError):  # nor forever
        iceberg_maintain.run_procedure(spark, "CALL x")
    assert len(spark.statements) == iceberg_maintain.RETRIES + 1
    assert iceberg_maintain.describe(JavaError(lost)) == lost

"""What an Iceberg round reports, from the job's Spark answers to the scheduler's log line
and metrics, without Spark: ``maintain`` on a fake session (a rewrite of 36 of the
table's 40 data files into 4 while another writer appended 2), its ``compaction-result``
line read by ``CompactionService`` as the scheduler reads every job's.

The round reports the table's data files before (40), the same files as the rewrite left
them (40 - 36 + 4 = 8; the 2 appended meanwhile are in ``files_appended``, in no
counter), the rows the rewrite moved (900) and the table's rows (1000).
"""

from __future__ import annotations

import json
import types

from twisted.internet import defer, task
from twisted.logger import capturedLogs, formatEvent

from logrouter.compaction.command import RESULT_PREFIX, JobCounts
from logrouter.compaction.iceberg import IcebergTable
from logrouter.compaction.options import COMPACTION_OPTIONS
from logrouter.compaction.runner import JobExit
from logrouter.compaction.scheduler import CompactionService
from logrouter.jobs import iceberg_maintain

REWRITE = {"deleted-data-files": "36", "added-data-files": "4", "deleted-records": "900", "added-records": "900",
           "removed-files-size": "3600", "added-files-size": "3000", "total-data-files": "8"}


class Row(dict):
    def asDict(self) -> dict:
        return dict(self)


class FakeSpark:
    """The table: 40 files, 4000 B, 1000 rows; a rewrite commit, 2 files appended meanwhile."""

    def __init__(self) -> None:
        self.rewritten = False

    def sql(self, statement: str):
        return types.SimpleNamespace(collect=lambda: self.answer(statement))

    def answer(self, statement: str) -> list[Row]:
        if ".files WHERE" in statement:
            if self.rewritten:
                return [Row(files=10, bytes=3600, rows=1040)]
            return [Row(files=40, bytes=4000, rows=1000)]
        if ".snapshots WHERE operation = 'replace'" in statement:  # the rewrite's commits (and rewrite_manifests')
            return [Row(summary=REWRITE), Row(summary={"manifests-created": "1"})] if self.rewritten else []
        if "rewrite_data_files" in statement:
            self.rewritten = True
            return [Row(rewritten_data_files_count=36, added_data_files_count=4, rewritten_bytes_count=3600,
                        failed_data_files_count=0)]
        if "rewrite_manifests" in statement:
            return [Row(rewritten_manifests_count=7, added_manifests_count=1)]
        if "expire_snapshots" in statement:
            return [Row(deleted_data_files_count=0)]
        return []  # remove_orphan_files: one row per file removed


def round_result() -> dict:
    args = iceberg_maintain.parse_args(["--catalog-name", "lake", "--table", "logs.events"])
    return iceberg_maintain.maintain(FakeSpark(), "lake", args, 1_714_546_800.0)


def test_the_job_reports_files_before_and_after_the_rewrite_and_the_rows_it_moved():
    result = round_result()
    assert result["status"] == "compacted"
    assert {k: result[k] for k in ("files_before", "files_after", "files_appended", "bytes_before", "bytes_after",
                                   "rows", "table_rows")} == {
        "files_before": 40, "files_after": 8, "files_appended": 2, "bytes_before": 4000, "bytes_after": 3400,
        "rows": 900, "table_rows": 1000,
    }
    assert JobCounts.of(result) == JobCounts(files_before=40, files_after=8, rows=900, bytes_before=4000,
                                             bytes_after=3400, files_appended=2)


def test_rewrite_totals_add_up_every_commit_of_the_rewrite():
    totals = iceberg_maintain.rewrite_totals([REWRITE, {"deleted-data-files": "3", "added-data-files": "1",
                                                        "deleted-records": "30"}, {}])
    assert totals == {"files_rewritten": 39, "files_written": 5, "rows": 930, "bytes_rewritten": 3600,
                      "bytes_written": 3000}


def test_counts_of_a_result_lacking_a_number_are_zero():
    assert JobCounts.of({"status": "compacted", "files_before": 3, "rows": None}) == JobCounts(files_before=3)


class OneJob:
    def __init__(self) -> None:
        self.jobs = []

    def spawn(self, argv, env, cwd, on_line):
        job = types.SimpleNamespace(pid=1, ended=defer.Deferred(), on_line=on_line, signal_group=lambda sig: None)
        self.jobs.append(job)
        return job


def test_the_scheduler_logs_and_counts_what_the_iceberg_job_reports():
    values = {k: o.default for k, o in COMPACTION_OPTIONS.items()}
    values.update(enabled=True, schedule_secs=60)
    clock, runner = task.Clock(), OneJob()
    compaction = CompactionService(values, [], clock, runner=runner, blocking=defer.maybeDeferred, owner="a",
                                   python="/venv/bin/python", env={}, iceberg_tables=[IcebergTable("events", "lake", "logs.events")])
    compaction.startService()
    clock.advance(60)
    [job] = runner.jobs
    with capturedLogs() as events:
        job.on_line("stdout", RESULT_PREFIX + json.dumps(round_result(), sort_keys=True))
        job.ended.callback(JobExit(0, None))
    lines = [formatEvent(e) for e in events]
    assert any("iceberg lake.logs.events logs.events: 40 files (4000 B) -> 8 (3400 B), 900 rows "
               "(2 files appended meanwhile)" in line for line in lines), lines
    samples = {name: value for name, _, _, value in compaction.samples()}
    assert (samples["logrouter_compaction_files_before_total"], samples["logrouter_compaction_files_after_total"],
            samples["logrouter_compaction_rows_total"]) == (40, 8, 900)
    compaction.stopService()

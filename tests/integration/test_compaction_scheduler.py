"""The daemon's compaction scheduler, driven by ``task.Clock`` with a fake process runner:
the exact command line, the sealing rule, min_files, lease contention with a second
router, the timeout that kills the job's process group, metrics and log lines, a
graceful stop. One test runs the real ``TwistedProcessRunner`` in a child reactor to
show the whole process group is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from twisted.internet import defer, task
from twisted.logger import capturedLogs, formatEvent

from logrouter.compaction import lease as leases
from logrouter.compaction.command import JOB_SCRIPT, PACKAGE_PARENT, RESULT_PREFIX
from logrouter.compaction.options import COMPACTION_OPTIONS
from logrouter.compaction.runner import JobExit
from logrouter.compaction.scheduler import KILL_GRACE_SECS, CompactionService
from logrouter.config.load import ConfigError, load_string
from logrouter.lake.fs import LocalFileSystem
from logrouter.lake.writer import LakeWriter

T0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z
HOUR0 = 1_714_546_800
KEY7 = "tag=app/dt=2024-05-01/hour=07"
KEY8 = "tag=app/dt=2024-05-01/hour=08"
PYTHON = "/venv/bin/python"


class FakeJob:
    def __init__(self, argv, env, cwd, on_line) -> None:
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.on_line = on_line
        self.pid = 4242
        self.ended: defer.Deferred = defer.Deferred()
        self.signals: list[int] = []

    def signal_group(self, sig: int) -> None:
        if not self.ended.called:
            self.signals.append(sig)

    def partition(self) -> str:
        return self.argv[self.argv.index("--partition") + 1]

    def finish(self, result: dict | None = None, code: int | None = 0, sig: int | None = None, stderr=()) -> None:
        for line in stderr:
            self.on_line("stderr", line)
        if result is not None:
            self.on_line("stdout", RESULT_PREFIX + json.dumps(result))
        self.ended.callback(JobExit(code, sig))


class FakeRunner:
    def __init__(self) -> None:
        self.jobs: list[FakeJob] = []

    def spawn(self, argv, env, cwd, on_line) -> FakeJob:
        job = FakeJob(argv, env, cwd, on_line)
        self.jobs.append(job)
        return job


def synchronous(function, *args, **kwargs) -> defer.Deferred:
    return defer.maybeDeferred(function, *args, **kwargs)


def options(**changes) -> dict:
    values = {k: o.default for k, o in COMPACTION_OPTIONS.items()}
    values.update(enabled=True, schedule_secs=60, seal_after_secs=600, target_file_bytes=1 << 20)
    values.update(changes)
    return values


def write_partition(root: str, hour: int, files: int, rows: int = 5) -> None:
    for n in range(files):
        writer = LakeWriter(root, f"w{hour}-{n}", 1 << 30, 60)
        writer.write("app", [(T0 + hour * 3600 * 10**9 + i, {"i": i}) for i in range(rows)], now=0)
        writer.publish(writer.seal_all())


def scheduler(root: str, clock: task.Clock, runner: FakeRunner, owner: str = "router-a", **changes) -> CompactionService:
    return CompactionService(
        options(**changes), [root], clock, runner=runner, blocking=synchronous, owner=owner, python=PYTHON,
        env={"PATH": "/usr/bin"},
    )


def result(key: str, **values) -> dict:
    base = {"partition": key, "status": "compacted", "files_before": 3, "files_after": 1, "rows": 15,
            "bytes_before": 3000, "bytes_after": 900}
    base.update(values)
    return base


@pytest.fixture
def lake(tmp_path):
    root = str(tmp_path / "lake")
    write_partition(root, 0, 3)  # hour 07: sealed at HOUR0 + 3600 + 600
    write_partition(root, 1, 3)  # hour 08: sealed at HOUR0 + 7200 + 600
    return root


def start_at(service: CompactionService, clock: task.Clock, first_tick: float) -> None:
    clock.advance(first_tick - clock.seconds() - service.options["schedule_secs"])
    service.startService()


def test_the_exact_command_line_and_environment(lake):
    clock, runner = task.Clock(), FakeRunner()
    service = scheduler(lake, clock, runner, spark_master="spark://10.0.0.1:7077",
                        spark_conf={"spark.executor.memory": "2g", "spark.sql.shuffle.partitions": 8})
    start_at(service, clock, HOUR0 + 4200)
    clock.advance(60)
    [job] = runner.jobs
    assert job.argv == [
        PYTHON, "-m", "logrouter.jobs.compact",
        "--master", "spark://10.0.0.1:7077",
        "--conf", "spark.executor.memory=2g", "--conf", "spark.sql.shuffle.partitions=8",
        "--lake", lake, "--target-file-bytes", str(1 << 20), "--partition", KEY7,
        "--lease-owner", "router-a",
    ]
    assert job.env["PYTHONPATH"] == PACKAGE_PARENT and job.env["PYSPARK_PYTHON"] == PYTHON and job.env["PATH"] == "/usr/bin"
    assert service.lease_secs > service.options["timeout_secs"] + KILL_GRACE_SECS
    job.finish(result(KEY7))
    service.stopService()

    submit = scheduler(lake, task.Clock(), FakeRunner(), spark_submit="/opt/spark/bin/spark-submit", spark_master="yarn")
    assert submit.command(lake, KEY8) == [
        "/opt/spark/bin/spark-submit", "--master", "yarn", JOB_SCRIPT,
        "--lake", lake, "--target-file-bytes", str(1 << 20), "--partition", KEY8,
        "--lease-owner", "router-a",
    ]


def test_sealed_partitions_one_at_a_time_with_metrics_and_log_lines(lake):
    clock, runner = task.Clock(), FakeRunner()
    service = scheduler(lake, clock, runner)
    fs = LocalFileSystem()
    start_at(service, clock, HOUR0 + 4200 - 60)
    clock.advance(60)  # hour 07 ends at +3600, sealed only 600 s later
    assert runner.jobs == [] and service.rounds == 1
    clock.advance(60)
    [job] = runner.jobs
    assert job.partition() == KEY7
    assert service.job_running and leases.find(fs, lake, KEY7, "router-a", clock.seconds()) is not None
    clock.advance(60)  # a tick while the round is still going does nothing
    assert len(runner.jobs) == 1 and service.rounds == 2
    clock.advance(5)
    with capturedLogs() as events:
        job.finish(result(KEY7, seconds=65))
    assert not service.job_running
    assert leases.find(fs, lake, KEY7, "router-a", clock.seconds()) is None  # released
    assert (service.runs, service.failures, service.partitions_compacted) == (1, 0, 1)
    assert (service.files_before, service.files_after, service.rows_compacted) == (3, 1, 15)
    assert service.seconds == 65 and service.last_success == clock.seconds()
    [line] = [e for e in events if "compaction of" in e["log_format"]]
    text = formatEvent(line)
    assert text == f"compaction of {lake} {KEY7}: 3 files (3000 B) -> 1 (900 B), 15 rows, 65.0s"
    samples = {name: value for name, _, _, value in service.samples()}
    assert samples["logrouter_compaction_partitions_total"] == 1
    assert samples["logrouter_compaction_files_before_total"] == 3
    assert samples["logrouter_compaction_running"] == 0
    # hour 08 is sealed later; hour 07 is picked again (the fake job did not compact it)
    clock.advance(HOUR0 + 7800 - clock.seconds())
    assert [j.partition() for j in runner.jobs[1:]] == [KEY7]
    runner.jobs[-1].finish(result(KEY7, status="skipped", reason="already compacted"))
    assert [j.partition() for j in runner.jobs[1:]] == [KEY7, KEY8]  # same round, one at a time
    runner.jobs[-1].finish(result(KEY8))
    assert service.partitions_compacted == 2 and not service.job_running
    service.stopService()


def test_min_files_and_mean_size_rules(tmp_path):
    root = str(tmp_path / "lake")
    write_partition(root, 0, 3)
    clock, runner = task.Clock(), FakeRunner()
    service = scheduler(root, clock, runner, min_files=4, target_file_bytes=1)  # files are "big": mean >= 1 B
    start_at(service, clock, HOUR0 + 4200)
    clock.advance(60)
    assert runner.jobs == []  # 3 files < min_files 4, and not small
    write_partition(root, 0, 1)
    clock.advance(60)
    [job] = runner.jobs
    job.finish(result(KEY7))
    service.stopService()


def test_two_routers_sharing_a_lake_never_run_the_same_partition(lake):
    clock = task.Clock()
    runner_a, runner_b = FakeRunner(), FakeRunner()
    a = scheduler(lake, clock, runner_a, owner="router-a")
    b = scheduler(lake, clock, runner_b, owner="router-b")
    clock.advance(HOUR0 + 4200 - 60)
    a.startService()
    b.startService()
    clock.advance(60)
    assert len(runner_a.jobs) == 1 and runner_b.jobs == []
    assert (b.lease_busy, b.runs, b.failures) == (1, 0, 0)
    runner_a.jobs[0].finish(result(KEY7, status="skipped", reason="x"))
    clock.advance(60)  # the lease is free again: whoever ticks first takes it
    assert len(runner_a.jobs) + len(runner_b.jobs) == 2
    [pending] = [j for j in runner_a.jobs + runner_b.jobs if not j.ended.called]
    pending.finish(result(KEY7, status="skipped", reason="x"))
    a.stopService()
    b.stopService()
    assert clock.getDelayedCalls() == []


def test_a_job_past_its_timeout_is_killed_with_its_process_group(lake):
    clock, runner = task.Clock(), FakeRunner()
    service = scheduler(lake, clock, runner, timeout_secs=100)
    start_at(service, clock, HOUR0 + 4200)
    clock.advance(60)
    [job] = runner.jobs
    clock.advance(99)
    assert job.signals == []
    with capturedLogs() as events:
        clock.advance(1)
        assert job.signals == [signal.SIGTERM]
        clock.advance(KILL_GRACE_SECS)
        assert job.signals == [signal.SIGTERM, signal.SIGKILL]
        job.finish(code=None, sig=signal.SIGKILL, stderr=["Spark: stage 3 …"])
    assert (service.failures, service.timeouts, service.partitions_compacted) == (1, 1, 0)
    texts = [formatEvent(e) for e in events if "compaction of" in e["log_format"]]
    assert texts[-1] == f"compaction of {lake} {KEY7} failed (killed by signal 9, timed out): Spark: stage 3 …"
    assert leases.acquire(LocalFileSystem(), lake, KEY7, "someone", clock.seconds(), 10) is not None  # released
    service.stopService()
    assert clock.getDelayedCalls() == []


def test_failures_are_counted_and_logged_with_the_jobs_last_words(lake):
    clock, runner = task.Clock(), FakeRunner()
    service = scheduler(lake, clock, runner)
    start_at(service, clock, HOUR0 + 4200)
    clock.advance(60)
    with capturedLogs() as events:
        runner.jobs[0].finish({"partition": KEY7, "status": "failed", "error": "RuntimeError: audit failed"}, code=1,
                              stderr=["Traceback …", "RuntimeError: audit failed"])
    assert (service.runs, service.failures, service.timeouts) == (1, 1, 0)
    text = [formatEvent(e) for e in events if "compaction of" in e["log_format"]][-1]
    assert text == f"compaction of {lake} {KEY7} failed (exit status 1): RuntimeError: audit failed"
    clock.advance(60)  # the next round tries again
    runner.jobs[1].finish(code=1, stderr=["java not found"])
    assert service.failures == 2
    # a job that says another router held the lease is not a failure
    clock.advance(60)
    runner.jobs[2].finish(result(KEY7, status="busy", reason="the lease is not held by router-a"))
    assert (service.failures, service.lease_busy) == (2, 1)
    service.stopService()


def test_a_graceful_stop_kills_the_running_job_and_waits_for_it(lake):
    clock, runner = task.Clock(), FakeRunner()
    service = scheduler(lake, clock, runner)
    start_at(service, clock, HOUR0 + 4200)
    clock.advance(60)
    [job] = runner.jobs
    stopped = service.stopService()
    assert job.signals == [signal.SIGTERM] and not stopped.called
    job.finish(code=None, sig=signal.SIGTERM)
    assert stopped.called and not service.job_running
    assert leases.acquire(LocalFileSystem(), lake, KEY7, "other", clock.seconds(), 10) is not None
    assert clock.getDelayedCalls() == []


def test_compaction_config_section_is_validated():
    base = '[sources.f]\ntype = "fluent_forward"\n[sinks.lake]\ntype = "parquet"\ninputs = ["f"]\npath = "lake"\n'
    base += '[sinks.out]\ntype = "parquet"\ninputs = ["f"]\npath = "other"\n'
    config = load_string(base + '[compaction]\nenabled = true\nspark_conf = { "spark.executor.memory" = "2g" }\n')
    assert config.compaction["spark_master"] == "local[*]" and config.compaction["min_files"] == 2
    assert config.compaction["target_file_bytes"] == 256 << 20 and config.compaction["seal_after_secs"] == 3600
    assert load_string(base).compaction["enabled"] is False
    with pytest.raises(ConfigError) as info:
        load_string(base + textwrap.dedent("""
            [compaction]
            enabled = "yes"
            schedule_secs = 0
            min_files = 1
            spark_master = "local[x]"
            spark_conf = { "executor.memory" = "2g" }
            spark_submit = "/nonexistent/spark-submit"
            sinks = ["lake", "nope"]
            target = 5
        """))
    assert info.value.errors == [
        "compaction.enabled: must be a boolean, got string 'yes'",
        "compaction.schedule_secs: must be greater than 0, got 0",
        "compaction.min_files: must be 2 or more (one file has nothing to merge with), got 1",
        "compaction.spark_master: not a Spark master URL: 'local[x]' (local, local[N], local[*], spark://host:7077, "
        "yarn, k8s://https://host:443, …)",
        "compaction.spark_conf: key 'executor.memory': Spark settings start with 'spark.' (Hadoop ones with "
        "'spark.hadoop.')",
        "compaction.spark_submit: '/nonexistent/spark-submit': not found (give the path of spark-submit, or leave it "
        "empty to run the job with this Python)",
        "compaction.target: unknown key (allowed: enabled, iceberg_procedures, jars_dir, min_files, min_input_files, "
        "orphan_older_than_secs, retain_snapshots, schedule_secs, seal_after_secs, sinks, snapshot_retention_secs, "
        "spark_conf, spark_master, spark_submit, target_file_bytes, timeout_secs)",
        "compaction.sinks[1]: unknown sink 'nope' (parquet and iceberg sinks: lake, out)",
    ]
    for master in ("local", "local[4]", "local[*]", "local[2,3]", "yarn", "spark://h:7077", "k8s://https://h:443"):
        assert load_string(base + f'[compaction]\nspark_master = "{master}"\n').compaction["spark_master"] == master


SPAWN_SCRIPT = r"""
import os, signal, sys
from twisted.internet import reactor
from logrouter.compaction.runner import TwistedProcessRunner

# the job starts a grandchild that inherits its stdout: processEnded (``ended``) only
# fires once every holder of the pipe is gone, so it proves the whole group died
CHILD = ("import os, subprocess, sys, time; "
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
         "print('ready', os.getpid(), os.getpgid(0), flush=True); time.sleep(120)")

def on_line(stream, line):
    if line.startswith("ready"):
        _, pid, pgid = line.split()
        print("leader", pid == pgid == str(job.pid), flush=True)
        job.signal_group(signal.SIGTERM)

def ended(exit):
    print("ended", exit.exit_code, exit.signal, flush=True)
    reactor.stop()

job = TwistedProcessRunner(reactor).spawn([sys.executable, "-c", CHILD], dict(os.environ), None, on_line)
job.ended.addCallback(ended)
reactor.callLater(60, lambda: (print("timeout", flush=True), job.signal_group(signal.SIGKILL)))
reactor.run()
"""


def test_the_real_runner_kills_the_whole_process_group():
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
    done = subprocess.run([sys.executable, "-c", SPAWN_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert done.stdout.splitlines() == ["leader True", f"ended None {signal.SIGTERM}"], done.stdout + done.stderr


def test_trouble_with_one_partition_does_not_end_the_round(lake):
    clock, runner = task.Clock(), FakeRunner()

    class Flaky(FakeRunner):
        def spawn(self, argv, env, cwd, on_line):
            if "--partition" in argv and argv[argv.index("--partition") + 1] == KEY7:
                raise OSError("fork failed")
            return super().spawn(argv, env, cwd, on_line)

    runner = Flaky()
    service = scheduler(lake, clock, runner)
    start_at(service, clock, HOUR0 + 7800)
    with capturedLogs() as events:
        clock.advance(60)
    assert [j.partition() for j in runner.jobs] == [KEY8] and service.failures == 1
    assert any("compaction of" in e["log_format"] and e.get("log_failure") for e in events)
    assert leases.acquire(LocalFileSystem(), lake, KEY7, "other", clock.seconds(), 10) is not None  # released
    runner.jobs[0].finish(result(KEY8))
    service.stopService()
    assert clock.getDelayedCalls() == []

"""``CompactionService``: the daemon's side of compaction.

Every ``schedule_secs`` (on the injected clock) it looks at each lake for partitions
that are sealed and worth compacting (``layout.plan_lake``), and works through them
one at a time: take the partition's lease in the lake, run the job
(``python -m logrouter.jobs.compact`` or ``spark-submit``, see ``command``) as a child
process in its own process group, kill that group if it runs past ``timeout_secs``,
release the lease, log one line and update the metrics, next partition. Then each
Iceberg table (``iceberg``): one ``python -m logrouter.jobs.iceberg_maintain`` run per
table and round, no lease (Iceberg validates its commits). A tick that comes while a
round is still going is skipped.

Lake I/O (listing, leases) runs through ``blocking`` (default: a thread), so the
reactor never waits on a disk or a namenode; the job runs in another process, so the
daemon never imports pyspark. A graceful stop kills a running job (the swap is
crash-safe: the next run finishes or undoes it) and releases its lease.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections import deque
from typing import Any, Callable, Iterator

from twisted.application import service
from twisted.internet import defer, task, threads
from twisted.logger import Logger

from logrouter.compaction import lease as leases
from logrouter.compaction.command import RESULT_PREFIX, JobCounts, job_command, job_env
from logrouter.compaction.iceberg import IcebergTable, iceberg_command, iceberg_env
from logrouter.compaction.layout import Candidate, plan_lake
from logrouter.compaction.runner import JobExit, ProcessRunner, RunningJob, TwistedProcessRunner
from logrouter.lake.fs import filesystem_for

KILL_GRACE_SECS = 30.0  # SIGTERM, then SIGKILL this much later
LEASE_MARGIN_SECS = 300.0  # a lease outlives the job's timeout and kill by this much
STDERR_LINES_KEPT = 20


def _default_owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class _Lake:
    def __init__(self, url: str, fs: Any, root: str) -> None:
        self.url = url
        self.fs = fs
        self.root = root


class CompactionService(service.Service):
    log = Logger(namespace="logrouter.compaction")
    name = "compaction"

    def __init__(
        self,
        options: dict[str, Any],
        lakes: list[str],
        reactor: Any,
        *,
        runner: ProcessRunner | None = None,
        blocking: Callable[..., defer.Deferred] | None = None,
        owner: str | None = None,
        python: str = sys.executable,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        filesystems: Callable[[str], tuple[Any, str]] = filesystem_for,
        iceberg_tables: list[IcebergTable] | None = None,
    ) -> None:
        self.options = options
        self.reactor = reactor
        self.runner = runner if runner is not None else TwistedProcessRunner(reactor, python)
        self.blocking = blocking if blocking is not None else threads.deferToThread
        self.owner = owner or _default_owner()
        self.python = python
        self.cwd = cwd
        self.env = env if env is not None else dict(os.environ)
        self.lakes = [_Lake(url, *filesystems(url)) for url in lakes]
        self.iceberg_tables = list(iceberg_tables or [])
        self.lease_secs = float(options["timeout_secs"]) + KILL_GRACE_SECS + LEASE_MARGIN_SECS
        self.loop = task.LoopingCall(self.tick)
        self.loop.clock = reactor
        self._round: defer.Deferred | None = None
        self._queue: deque[tuple[_Lake, Candidate] | IcebergTable] = deque()
        self._job: RunningJob | None = None
        self._timers: list[Any] = []
        self._stopping = False
        # metrics
        self.rounds = 0
        self.runs = 0
        self.failures = 0
        self.timeouts = 0
        self.lease_busy = 0
        self.partitions_compacted = 0
        self.files_before = 0
        self.files_after = 0
        self.rows_compacted = 0
        self.bytes_before = 0
        self.bytes_after = 0
        self.seconds = 0.0
        self.last_success: float | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self._stopping = False
        self.loop.start(float(self.options["schedule_secs"]), now=False)
        self.log.info(
            "compaction every {secs}s of {lakes} (master {master})",
            secs=self.options["schedule_secs"],
            lakes=", ".join([*(lake.url for lake in self.lakes), *(t.label for t in self.iceberg_tables)]),
            master=self.options["spark_master"],
        )

    def stopService(self) -> defer.Deferred:
        super().stopService()
        self._stopping = True
        self._queue.clear()
        if self.loop.running:
            self.loop.stop()
        if self._job is not None:
            self.log.info("compaction: stopping; killing the running job (the next run finishes or undoes its swap)")
            self._terminate(self._job)
        if self._round is None:
            return defer.succeed(None)
        done: defer.Deferred = defer.Deferred()
        self._round.addBoth(lambda result: done.callback(None))
        return done

    @property
    def job_running(self) -> bool:
        """Whether a compaction job process is running now."""
        return self._job is not None

    # -- one round ----------------------------------------------------------------------

    def tick(self) -> defer.Deferred | None:
        """Plan and work through a round, unless the previous one is still going."""
        if self._round is not None or self._stopping:
            return None
        self.rounds += 1
        now = self.reactor.seconds()
        round_done: defer.Deferred = defer.Deferred()
        self._round = round_done

        def finished(result: Any) -> None:
            self._round = None
            round_done.callback(None)

        d = defer.maybeDeferred(self._plan, now)
        d.addCallback(self._work)
        d.addErrback(self._round_failed)
        d.addBoth(finished)
        return round_done

    @defer.inlineCallbacks
    def _plan(self, now: float) -> Any:
        found = []
        for lake in self.lakes:
            candidates = yield self.blocking(
                plan_lake,
                lake.fs,
                lake.root,
                now,
                float(self.options["seal_after_secs"]),
                int(self.options["min_files"]),
                int(self.options["target_file_bytes"]),
            )
            found.extend((lake, c) for c in candidates)
        if found:
            self.log.info("compaction: {count} partition(s) to compact", count=len(found))
        return [*found, *self.iceberg_tables]

    @defer.inlineCallbacks
    def _work(self, found: list[tuple[_Lake, Candidate] | IcebergTable]) -> Any:
        self._queue = deque(found)
        while self._queue and not self._stopping:
            item = self._queue.popleft()
            try:
                if isinstance(item, IcebergTable):
                    yield self._run(item.label, item.table, iceberg_command(self.options, item, self.python),
                                    iceberg_env(job_env(self.env, self.python), item))
                else:
                    yield self._one(*item)
            except Exception:  # noqa: BLE001 - one partition's trouble must not end the round
                self.failures += 1
                what = item.label if isinstance(item, IcebergTable) else f"{item[0].url} {item[1].partition.key}"
                self.log.failure("compaction of {what} failed", what=what)
        self._queue.clear()

    def _round_failed(self, failure: Any) -> None:
        self.failures += 1
        self.log.failure("compaction round failed", failure)

    # -- one partition --------------------------------------------------------------------

    @defer.inlineCallbacks
    def _one(self, lake: _Lake, candidate: Candidate) -> Any:
        key = candidate.partition.key
        now = self.reactor.seconds()
        lease = yield self.blocking(leases.acquire, lake.fs, lake.root, key, self.owner, now, self.lease_secs)
        if lease is None:
            self.lease_busy += 1
            self.log.info("compaction of {lake} {key}: skipped, another router holds its lease", lake=lake.url, key=key)
            return
        if self._stopping:  # stopped while the lease was being taken
            yield self._release(None, lake, lease)
            return
        ran = defer.maybeDeferred(self._run_job, lake, candidate, lease)
        ran.addBoth(self._release, lake, lease)
        yield ran

    def _release(self, result: Any, lake: _Lake, lease: leases.Lease) -> defer.Deferred:
        """Give the lease back once the job has ended; pass ``result`` on."""
        d = self.blocking(leases.release, lake.fs, lake.root, lease, self.reactor.seconds())

        def failed(failure: Any) -> None:  # it expires on its own
            self.log.failure("compaction of {key}: releasing the lease failed", failure, key=lease.key)

        d.addErrback(failed)
        d.addCallback(lambda _: result)
        return d

    def command(self, lake_url: str, key: str) -> list[str]:
        o = self.options
        return job_command(
            lake=lake_url,
            partitions=[key],
            target_file_bytes=o["target_file_bytes"],
            spark_master=o["spark_master"],
            spark_conf=o["spark_conf"],
            spark_submit=o["spark_submit"],
            python=self.python,
            lease_owner=self.owner,
        )

    def _run_job(self, lake: _Lake, candidate: Candidate, lease: leases.Lease) -> defer.Deferred:
        key = candidate.partition.key
        return self._run(lake.url, key, self.command(lake.url, key), job_env(self.env, self.python))

    def _run(self, where: str, key: str, argv: list[str], env: dict[str, str]) -> defer.Deferred:
        """Run one job (``where``/``key`` name it in log lines); fires when it has ended."""
        results: list[dict[str, Any]] = []
        stderr: deque[str] = deque(maxlen=STDERR_LINES_KEPT)

        def on_line(stream: str, line: str) -> None:
            if stream == "stdout" and line.startswith(RESULT_PREFIX):
                try:
                    results.append(json.loads(line[len(RESULT_PREFIX) :]))
                except ValueError:
                    stderr.append(line)
            elif line.strip():
                stderr.append(line)

        started = self.reactor.seconds()
        self.runs += 1
        job = self.runner.spawn(argv, env, self.cwd, on_line)
        self._job = job
        timed_out = []

        def timeout() -> None:
            timed_out.append(True)
            self.log.warn(
                "compaction of {lake} {key}: still running after {secs}s; killing its process group",
                lake=where, key=key, secs=self.options["timeout_secs"],
            )
            self._terminate(job)

        self._timers = [self.reactor.callLater(float(self.options["timeout_secs"]), timeout)]

        def ended(exit: JobExit) -> None:
            self._job = None
            for call in self._timers:
                if call.active():
                    call.cancel()
            self._timers = []
            elapsed = max(self.reactor.seconds() - started, 0.0)
            self.seconds += elapsed
            result = results[-1] if results else {}
            status = result.get("status")
            if timed_out:
                self.timeouts += 1
            if exit.ok and status in ("compacted", "skipped", "recovered", "busy") and not timed_out:
                self._succeeded(where, key, result, elapsed)
            else:
                self.failures += 1
                why = result.get("error") or (stderr[-1] if stderr else "no output")
                self.log.error(
                    "compaction of {lake} {key} failed ({how}{timeout}): {why}",
                    lake=where, key=key, how=exit.describe(), why=why,
                    timeout=", timed out" if timed_out else "",
                )

        job.ended.addCallback(ended)
        return job.ended

    def _succeeded(self, where: str, key: str, result: dict[str, Any], elapsed: float) -> None:
        status = result["status"]
        if status == "compacted":
            counts = JobCounts.of(result)
            self.partitions_compacted += 1
            self.files_before += counts.files_before
            self.files_after += counts.files_after
            self.rows_compacted += counts.rows
            self.bytes_before += counts.bytes_before
            self.bytes_after += counts.bytes_after
            self.last_success = self.reactor.seconds()
            self.log.info(
                "compaction of {lake} {key}: {before} files ({bytes_before} B) -> {after} ({bytes_after} B), "
                "{rows} rows{appended}, {secs:.1f}s",
                lake=where, key=key, before=counts.files_before, after=counts.files_after,
                bytes_before=counts.bytes_before, bytes_after=counts.bytes_after, rows=counts.rows,
                appended=f" ({counts.files_appended} files appended meanwhile)" if counts.files_appended else "",
                secs=elapsed,
            )
        else:
            if status == "busy":
                self.lease_busy += 1
            self.log.info(
                "compaction of {lake} {key}: {status} ({reason}), {secs:.1f}s",
                lake=where, key=key, status=status, reason=result.get("reason", ""), secs=elapsed,
            )

    def _terminate(self, job: RunningJob) -> None:
        """SIGTERM to the job's process group, SIGKILL if it is still there later."""
        job.signal_group(signal.SIGTERM)
        self._timers.append(self.reactor.callLater(KILL_GRACE_SECS, job.signal_group, signal.SIGKILL))

    # -- metrics ----------------------------------------------------------------------------

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        """Prometheus samples, in ``logrouter.metrics``' form."""
        yield "logrouter_compaction_rounds_total", "counter", {}, self.rounds
        yield "logrouter_compaction_runs_total", "counter", {}, self.runs
        yield "logrouter_compaction_failures_total", "counter", {}, self.failures
        yield "logrouter_compaction_timeouts_total", "counter", {}, self.timeouts
        yield "logrouter_compaction_lease_busy_total", "counter", {}, self.lease_busy
        yield "logrouter_compaction_partitions_total", "counter", {}, self.partitions_compacted
        yield "logrouter_compaction_files_before_total", "counter", {}, self.files_before
        yield "logrouter_compaction_files_after_total", "counter", {}, self.files_after
        yield "logrouter_compaction_rows_total", "counter", {}, self.rows_compacted
        yield "logrouter_compaction_bytes_before_total", "counter", {}, self.bytes_before
        yield "logrouter_compaction_bytes_after_total", "counter", {}, self.bytes_after
        yield "logrouter_compaction_seconds_total", "counter", {}, round(self.seconds, 3)
        yield "logrouter_compaction_running", "gauge", {}, int(self.job_running)
        yield "logrouter_compaction_queued", "gauge", {}, len(self._queue)

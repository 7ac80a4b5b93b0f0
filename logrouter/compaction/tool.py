"""``logrouter compact``: the operator's command to see or run compaction by hand.

Shows what it would do (partitions, files, bytes, why), and unless ``--dry-run`` runs
the same job the daemon runs (one process per lake, every chosen partition in one
Spark session). Progress (``Progress``): on a terminal one line updated in place
(``partitions 3/12 · rows 1,234,567 · 45.6 MiB``, carriage returns, a newline only when
done; failures are printed above it); otherwise, or with ``--verbose`` (Spark's log
would break the line), one plain line per partition as it finishes. Both end with a
summary line of totals. The job takes each partition's lease itself, so running this
next to compacting routers is safe.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, TextIO

from logrouter.compaction.command import RESULT_PREFIX, job_command, job_env
from logrouter.compaction.layout import Candidate, partition_from_key, plan_lake, worth_compacting
from logrouter.compaction.options import COMPACTION_OPTIONS, lake_urls
from logrouter.lake.fs import filesystem_for
from logrouter.units import human_bytes


def add_arguments(parser: Any) -> None:
    parser.add_argument("--config", "-c", default=None, help="config file ([compaction] settings, parquet sink paths)")
    parser.add_argument("--path", action="append", default=[], help="lake root (path, file://, hdfs://); repeatable")
    parser.add_argument("--partition", action="append", default=[], help="only tag=…/dt=YYYY-MM-DD/hour=HH; repeatable")
    parser.add_argument("--dry-run", action="store_true", help="show what would be compacted, change nothing")
    parser.add_argument("--master", default=None, help="Spark master (default: [compaction] spark_master or local[*])")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark setting KEY=VALUE; repeatable")
    parser.add_argument("--target-file-bytes", type=int, default=None)
    parser.add_argument("--seal-after-secs", type=float, default=None, help="treat partitions as sealed this long after their hour")
    parser.add_argument("--verbose", "-v", action="store_true", help="show the job's own output (Spark's log)")


def _settings(args: Any, out: TextIO) -> tuple[dict[str, Any], list[str]] | None:
    from logrouter.config.load import DEFAULT_CONFIG, ConfigError, load_file  # noqa: PLC0415

    options = {k: o.default for k, o in COMPACTION_OPTIONS.items()}
    lakes = list(args.path)
    config_path = args.config
    if config_path is None and not lakes:
        config_path = DEFAULT_CONFIG
    if config_path is not None:
        try:
            config = load_file(config_path)
        except ConfigError as e:
            print(f"{config_path}: invalid config:", file=out)
            for error in e.errors:
                print(f"  {error}", file=out)
            return None
        options.update(config.compaction)
        if not lakes:
            lakes = lake_urls(config.compaction, config.sinks)
    if args.master:
        options["spark_master"] = args.master
    if args.target_file_bytes:
        options["target_file_bytes"] = args.target_file_bytes
    if args.seal_after_secs is not None:
        options["seal_after_secs"] = args.seal_after_secs
    conf = dict(options["spark_conf"])
    for pair in args.conf:
        key, sep, value = pair.partition("=")
        if not sep:
            print(f"--conf {pair!r}: expected KEY=VALUE", file=out)
            return None
        conf[key] = value
    options["spark_conf"] = conf
    if not lakes:
        print("no lake to compact: give --path or a config with a parquet sink", file=out)
        return None
    return options, lakes


def _plan(fs: Any, root: str, args: Any, options: dict[str, Any]) -> list[Candidate]:
    if not args.partition:
        return plan_lake(
            fs, root, time.time(), float(options["seal_after_secs"]), int(options["min_files"]),
            int(options["target_file_bytes"]),
        )
    chosen = []
    for key in args.partition:
        partition = partition_from_key(fs, root, key)
        worth, reason = worth_compacting(partition, 2, int(options["target_file_bytes"]))
        chosen.append(Candidate(partition, reason if worth else f"nothing to do: {reason}"))
    return chosen


def _result_line(index: int, total: int, r: dict[str, Any]) -> str:
    head = f"[{index}/{total}] {r.get('partition')}: {r.get('status')}"
    if r.get("status") == "compacted":
        return (
            f"{head}, {r['files_before']} files ({human_bytes(r['bytes_before'])}) -> {r['files_after']} "
            f"({human_bytes(r['bytes_after'])}), {r['rows']} rows, {r['seconds']:.1f}s"
        )
    if r.get("status") == "failed":
        return f"{head}: {r.get('error')}"
    return f"{head} ({r.get('reason', '')})"


class Progress:
    """Partitions finished (of ``total``, every lake), rows and input bytes compacted.

    ``live``: one line redrawn in place after a carriage return (a terminal); lines that
    must stay (failures, the job's exit) are printed above it. Otherwise each
    partition's plain line as it finishes. ``finish()`` ends either with the totals.
    """

    def __init__(self, out: TextIO, total: int, live: bool, clock: Any = time.monotonic) -> None:
        self.out = out
        self.total = total
        self.live = live
        self.clock = clock
        self.started = clock()
        self.done = 0
        self.rows = 0
        self.bytes = 0
        self.statuses: collections.Counter[str] = collections.Counter()
        self._width = 0  # of the live line on screen; 0 when none is

    def status_line(self) -> str:
        return f"partitions {self.done}/{self.total} · rows {self.rows:,} · {human_bytes(self.bytes)}"

    def show(self) -> None:
        if self.live:
            self._draw()

    def add(self, result: dict[str, Any], line: str) -> None:
        self.done += 1
        status = str(result.get("status"))
        self.statuses[status] += 1
        if status == "compacted":
            self.rows += int(result.get("rows", 0))
            self.bytes += int(result.get("bytes_before", 0))
        if not self.live:
            print(line, file=self.out, flush=True)
            return
        if status == "failed":
            self.message(line)  # stays, and the live line is drawn again below it
        else:
            self._draw()

    def message(self, text: str) -> None:
        """A line that stays (above the live line, which is drawn again after it)."""
        if self.live and self._width:
            self.out.write("\r" + " " * self._width + "\r")
            self._width = 0
            print(text, file=self.out, flush=True)
            self._draw()
        else:
            print(text, file=self.out, flush=True)

    def _draw(self) -> None:
        text = self.status_line()
        self.out.write("\r" + text + " " * max(0, self._width - len(text)))
        self.out.flush()
        self._width = len(text)

    def summary_line(self) -> str:
        statuses = ", ".join(f"{count} {status}" for status, count in sorted(self.statuses.items()))
        return (f"done: {self.done}/{self.total} partition(s) ({statuses or 'none finished'}) · rows {self.rows:,} · "
                f"{human_bytes(self.bytes)} in {self.clock() - self.started:.1f}s")

    def finish(self) -> None:
        if self.live and self._width:
            self.out.write("\n")
            self._width = 0
        print(self.summary_line(), file=self.out, flush=True)


def _isatty(out: TextIO) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):  # not a real stream, or closed
        return False


def compact(args: Any, out: TextIO = sys.stdout) -> int:
    settings = _settings(args, out)
    if settings is None:
        return 1
    options, lakes = settings
    plans = []
    for url in lakes:
        try:
            fs, root = filesystem_for(url)
            candidates = _plan(fs, root, args, options)
        except (ValueError, OSError) as e:
            print(f"{url}: {e}", file=out)
            return 1
        plans.append((url, candidates))
        files = sum(len(c.partition.files) for c in candidates)
        size = sum(c.partition.bytes for c in candidates)
        print(f"lake {url}: {len(candidates)} partition(s), {files} files, {human_bytes(size)}", file=out)
        for c in candidates:
            p = c.partition
            print(f"  {p.key}  {len(p.files)} files  {human_bytes(p.bytes)}  ({c.reason})", file=out)
    if args.dry_run:
        print("dry run: nothing changed", file=out)
        return 0
    total = sum(len(candidates) for _, candidates in plans)
    if not total:
        return 0
    progress = Progress(out, total, live=not args.verbose and _isatty(out))
    failed = False
    try:
        for url, candidates in plans:
            if not candidates:
                continue
            failed |= not _run(url, [c.partition.key for c in candidates], options, args, out, progress)
    finally:
        progress.finish()
    return 1 if failed else 0


def _run(url: str, keys: list[str], options: dict[str, Any], args: Any, out: TextIO, progress: Progress) -> bool:
    argv = job_command(
        lake=url, partitions=keys, target_file_bytes=options["target_file_bytes"],
        spark_master=options["spark_master"], spark_conf=options["spark_conf"],
        spark_submit=options["spark_submit"], python=sys.executable,
    )
    progress.message(f"compacting {len(keys)} partition(s) of {url} with Spark ({options['spark_master']}) …")
    progress.show()
    ok = True
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            argv, env=job_env(os.environ, sys.executable), stdout=subprocess.PIPE,
            stderr=None if args.verbose else log, text=True,
        )
        index = 0
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(RESULT_PREFIX):
                index += 1
                result = json.loads(line[len(RESULT_PREFIX) :])
                ok &= result.get("status") != "failed"
                progress.add(result, _result_line(index, len(keys), result))
            elif args.verbose:
                print(line.rstrip("\n"), file=out)
        status = process.wait()
        if status != 0:
            ok = False
            progress.message(f"the job ended with exit status {status}")
            if not args.verbose:
                log.seek(0)
                tail = log.read().splitlines()[-30:]
                progress.message("\n".join(["its last lines:", *("  " + t for t in tail)]))
    return ok

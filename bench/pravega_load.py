#!/usr/bin/env python3
"""Pravega → Parquet load benchmark: events/s written and flushed by the official client.

It starts its own daemon (``twistd -n logrouter``) on loopback with a temporary spool and
lake (``pravega`` source with its controller → ``parquet`` sink, ``durability = "fsync"``
by default) and runs ``--writers`` processes of the official Pravega client (PyPI
``pravega``; its blocking calls hold the GIL, so each writer is its own process, this
script run with ``--child``). Each creates the scope and a stream of ``--segments``
segments (an existing one is fine), makes one writer with ``max_inflight_events =
--inflight``, says it is ready and waits for "go" on stdin; then it writes small JSON
events (~200 bytes: seq, writer, level, host, request line, duration, user, log path,
timestamp) with routing keys ``k0`` … ``k63`` spread over the segments for ``--seconds``, calls
``flush()`` (every event acknowledged by the segment store, which acknowledges only
durable appends) and reports its count and time.

Reported: events/s acknowledged (events flushed, all writers, over the time from "go" to
the last flush), the count of each writer, the daemon's CPU seconds per million events
(utime + stime of ``/proc/<pid>/stat`` over that time; includes the gRPC controller's
threads, idle while writing), fsyncs/s, peak RSS (VmHWM), events/s end to end (lake rows /
(load + graceful stop)); then the daemon is stopped
with SIGTERM and the rows read back from the lake must equal the events acknowledged
(exit 1 otherwise, or if a writer fails). Every process it starts is stopped at the end,
on errors too.

Run by hand, e.g. ``.venv/bin/python bench/pravega_load.py --seconds 10 --writers 2``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forward_load import fsyncs, launch, measure, source_to_lake  # noqa: E402

SCOPE, STREAM, KEYS = "bench", "load", 64


def event(n: int, writer: str) -> str:
    return json.dumps({
        "seq": n,
        "writer": writer,
        "level": "info" if n % 5 else "warn",
        "host": "web-%02d" % (n % 17),
        "msg": "GET /api/v1/items/%06d 200 %d" % (n % 1000000, 512 + n % 100),
        "duration_ms": 3.25 + n % 50,
        "user": "u%05d" % (n % 10007),
        "path": "/var/log/app/access.log",
        "@timestamp": "2026-11-23T08:00:%02d.%03dZ" % (n // 1000 % 60, n % 1000),
    }, separators=(",", ":"))


# --- a writer process -------------------------------------------------------------------------


def child(args: argparse.Namespace) -> int:
    import pravega_client

    manager = pravega_client.StreamManager(args.controller)
    manager.create_scope(SCOPE)
    manager.create_stream(SCOPE, STREAM, args.segments)
    writer = manager.create_writer(SCOPE, STREAM, args.inflight)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 2
    cpu0, start = time.process_time(), time.monotonic()
    deadline = start + args.seconds
    n = 0
    while True:  # bounded by the deadline, checked every 100 events
        for _ in range(100):
            writer.write_event(event(n, args.name), "k%d" % (n % KEYS))
            n += 1
        if time.monotonic() >= deadline:
            break
    writer.flush()
    elapsed = time.monotonic() - start
    print(f"flushed {n} {elapsed:.3f} {time.process_time() - cpu0:.3f}", flush=True)
    return 0


# --- the benchmark ----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14, 15 of stat


class Writer:
    """One ``--child`` process; its stdout lines are collected by a thread."""

    def __init__(self, name: str, controller: str, args: argparse.Namespace) -> None:
        self.name = name
        argv = [sys.executable, __file__, "--child", "--name", name, "--controller", controller,
                "--seconds", str(args.seconds), "--segments", str(args.segments), "--inflight", str(args.inflight)]
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        self.count = 0
        self.secs = self.cpu = 0.0

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            if line.startswith("ready"):
                self.ready.set()
        self.ready.set()  # exited: whoever waits stops waiting

    def go(self) -> None:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def finish(self, timeout: float) -> None:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"writer {self.name} did not finish in {timeout:.0f}s:\n" + "".join(self.lines[-20:]))
        done = [line for line in self.lines if line.startswith("flushed ")]
        if code != 0 or not done:
            raise RuntimeError(f"writer {self.name} exited {code}:\n" + "".join(self.lines[-20:]))
        _, count, secs, cpu = done[-1].split()
        self.count, self.secs, self.cpu = int(count), float(secs), float(cpu)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


class Stats:
    def __init__(self) -> None:
        self.writers: list[Writer] = []
        self.cpu = 0.0  # daemon CPU seconds from "go" to the last flush
        self.fsyncs = 0.0

    @property
    def acked(self) -> int:
        return sum(w.count for w in self.writers)


def drive(pid: int, metrics_port: int, controller: str, args: argparse.Namespace, stats: Stats) -> float:
    try:
        for i in range(args.writers):
            stats.writers.append(Writer(f"w{i}", controller, args))
        for w in stats.writers:
            if not w.ready.wait(60) or w.process.poll() is not None:
                raise RuntimeError(f"writer {w.name} did not get ready:\n" + "".join(w.lines[-20:]))
        cpu_before, fsyncs_before = cpu_seconds(pid), fsyncs(metrics_port)
        start = time.monotonic()
        for w in stats.writers:
            w.go()
        for w in stats.writers:
            w.finish(max(1.0, start + args.seconds + 120 - time.monotonic()))
        elapsed = time.monotonic() - start
        stats.cpu = cpu_seconds(pid) - cpu_before
        stats.fsyncs = fsyncs(metrics_port) - fsyncs_before
        return elapsed
    finally:
        for w in stats.writers:
            w.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--writers", type=int, default=2, help="writer processes, one client writer each")
    parser.add_argument("--inflight", type=int, default=1000, help="the client's max_inflight_events")
    parser.add_argument("--segments", type=int, default=4, help="segments of the stream")
    parser.add_argument("--durability", default="fsync", choices=["fsync", "os", "none"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--controller", help=argparse.SUPPRESS)
    parser.add_argument("--name", default="w0", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.exit(child(args))
    stats = Stats()
    with tempfile.TemporaryDirectory(prefix="logrouter-bench-") as tmp:
        workdir = Path(tmp)
        config = source_to_lake("pv", "pravega", args.durability, controller_listen="tcp:0:interface=127.0.0.1")
        proc, _, metrics_port, lines = launch(workdir, config, "pv")
        try:
            match = next(m for line in lines if (m := re.search(r"pravega source pv controller listening on port (\d+)", line)))
        except StopIteration:
            proc.kill()
            proc.wait()
            raise SystemExit("no controller port in the daemon's log:\n" + "".join(lines))
        controller = f"tcp://127.0.0.1:{match.group(1)}"
        try:
            run = measure(workdir, proc, metrics_port, lambda: drive(proc.pid, metrics_port, controller, args, stats))
        except Exception as error:  # measure() has stopped the daemon; the writers are killed
            sys.stdout.write("".join(lines[-40:]))
            raise SystemExit(f"benchmark failed: {error}")
    elapsed, acked = run.elapsed, stats.acked
    print(f"durability={args.durability} writers={args.writers} max_inflight_events={args.inflight} "
          f"segments={args.segments} keys={KEYS} (~{len(event(123456, 'w0'))} bytes/event as JSON)")
    print(f"  {acked / elapsed:,.0f} events/s acked ({acked:,} events flushed in {elapsed:.1f}s)")
    for w in stats.writers:
        print(f"    {w.name}: {w.count:,} events in {w.secs:.1f}s ({w.count / w.secs:,.0f}/s), writer CPU {w.cpu:.1f}s")
    per_million = stats.cpu / acked * 1e6 if acked else float("nan")
    print(f"  daemon CPU {stats.cpu:.1f}s over the load ({per_million:,.1f} CPU s per million events, "
          f"{stats.cpu / elapsed:.2f} cores)")
    print(run.end_to_end_line(run.rows))
    print(run.cpu_line(run.rows))
    print(f"  {stats.fsyncs / elapsed:,.1f} fsyncs/s, peak RSS {run.rss_mb:,.0f} MiB, "
          f"graceful stop {run.stop_secs:.1f}s (exit {run.exit_code})")
    print(f"  lake rows {run.rows:,} ({'matches' if run.rows == acked else 'MISMATCH with'} acked events)")
    if run.rows != acked or not run.clean_stop:
        sys.stdout.write("".join(lines[-40:]))
        sys.exit(1)


if __name__ == "__main__":
    main()

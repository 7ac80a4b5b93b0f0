#!/usr/bin/env python3
"""logrouter and Fluent Bit on the same forward load, one after the other.

The load is ``bench/forward_load.py``'s: PackedForward messages of ``--events-per-chunk``
~100-byte records, each with a ``chunk`` id that is waited for, over ``--connections``
connections (each from its own loopback address), ``--window`` chunks in flight on each,
for ``--seconds``. It drives, in turn:

* logrouter: ``twistd -n logrouter`` with ``[router] workers`` (default ``auto``, the
  daemon's default), a ``fluent_forward`` source into a Parquet lake, ``durability =
  "fsync"`` (an ack means the batch is fsync'd in the spool); stopped with SIGTERM, which
  commits what the sink still holds;
* Fluent Bit 1.8.15 (``tests/fluent_bit.py`` builds it, or ``LOGROUTER_FLUENT_BIT_BIN``):
  ``forward`` input with ``storage.type filesystem`` → ``file`` output (an ack means
  received: in_forward answers a ``chunk`` as soon as it has appended the records to its
  input chunk); stopped with SIGTERM once the file holds every acked event.

For each it prints acked events/s (while sending), end-to-end events/s (events landed in
the lake / the file over the time from the start of the load until the last one landed),
the peak RSS of its process tree (the sum of each process's VmHWM; then each process's
peak and current RSS, idle after start-up and after the load, from ``process_memory.py``)
and its CPU seconds per million events (user + system of the tree, from the start of the load until every event
landed). Run by hand, e.g. ``.venv/bin/python bench/vs_fluent_bit.py --seconds 20``;
``--only logrouter`` or ``--only fluent-bit`` runs one side; ``--runs N`` runs N rounds
(logrouter, then Fluent Bit) and ends with the medians, the ranges and logrouter's ratios
to Fluent Bit round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from forward_load import Stats, drive, launch, measure, peak_rss_mb, source_to_lake, tree_cpu_secs, tree_pids  # noqa: E402

import fluent_bit  # noqa: E402
from process_memory import table, tree_memory  # noqa: E402


class Result:
    def __init__(self, system: str, acked: int, load_secs: float, landed: int, landed_secs: float,
                 rss_mib: float, cpu_secs: float, an_ack_means: str, memory: list[str] | None = None) -> None:
        self.system, self.acked, self.load_secs = system, acked, load_secs
        self.memory = memory or []
        self.landed, self.landed_secs = landed, landed_secs
        self.rss_mib, self.cpu_secs, self.an_ack_means = rss_mib, cpu_secs, an_ack_means

    def lines(self) -> list[str]:
        per_million = self.cpu_secs / self.landed * 1e6 if self.landed else float("nan")
        return [
            f"{self.system}",
            f"  {self.acked / self.load_secs:,.0f} events/s acked ({self.acked:,} in {self.load_secs:.1f}s; an ack means {self.an_ack_means})",
            f"  {self.landed / self.landed_secs:,.0f} events/s end to end ({self.landed:,} landed {self.landed_secs:.1f}s after the load's start)",
            f"  peak RSS {self.rss_mib:,.0f} MiB (process tree, summed)",
            f"  CPU {self.cpu_secs:,.1f} s = {per_million:,.2f} CPU s per million events",
        ] + self.memory


def tree_rss_sum(pid: int) -> float:
    return sum(p for p in (peak_rss_mb(each) for each in tree_pids(pid)) if p == p)


def run_logrouter(args: argparse.Namespace) -> Result:
    with tempfile.TemporaryDirectory(prefix="vs-fluent-bit-logrouter-") as tmp:
        workdir = Path(tmp)
        config = source_to_lake("forward", "fluent_forward", "fsync").replace(
            "workers = 1\n", f"workers = {json.dumps(args.workers)}\n")
        proc, port, metrics_port, lines = launch(workdir, config, "forward")
        stats = Stats()
        rss: list[float] = []
        memory = table("idle after start-up", tree_memory(proc.pid, tree_pids(proc.pid)))

        def load() -> float:
            elapsed = asyncio.run(drive("127.0.0.1", port, args, stats))
            rss.append(tree_rss_sum(proc.pid))
            memory.extend(table("after the load", tree_memory(proc.pid, tree_pids(proc.pid))))
            return elapsed

        run = measure(workdir, proc, metrics_port, load)
        if run.rows != stats.acked_events or not run.clean_stop:
            sys.stdout.write("".join(lines[-40:]))
            raise SystemExit(f"logrouter: {run.rows:,} rows in the lake for {stats.acked_events:,} acked events, exit {run.exit_code}")
        # the graceful stop commits what the sink still held: the last row lands by its end
        return Result(f"logrouter, workers={args.workers}, forward -> Parquet", stats.acked_events, run.elapsed,
                      run.rows, run.elapsed + run.stop_secs, rss[0], run.cpu_secs, "fsync'd in the spool", memory)


FLUENT_BIT_CONFIG = """\
[SERVICE]
    Flush          1
    Grace          5
    Log_Level      warn
    storage.path   {storage}

[INPUT]
    Name           forward
    Listen         127.0.0.1
    Port           {port}
    storage.type   filesystem

[OUTPUT]
    Name           file
    Match          *
    Path           {out}
"""


def count_lines(directory: Path) -> int:
    """out_file's default format writes one line per record."""
    total = 0
    for path in directory.iterdir():
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                total += block.count(b"\n")
    return total


def run_fluent_bit(args: argparse.Namespace) -> Result:
    binary, why = fluent_bit.ensure_built_with_reason()
    if binary is None:
        raise SystemExit(why)
    with tempfile.TemporaryDirectory(prefix="vs-fluent-bit-fb-") as tmp:
        workdir = Path(tmp)
        (workdir / "out").mkdir()
        port = fluent_bit.free_port()
        config = FLUENT_BIT_CONFIG.format(storage=workdir / "storage", port=port, out=workdir / "out")
        with fluent_bit.FluentBit(binary, workdir, config) as shipper:
            shipper.start()
            fluent_bit.wait_for_port(port, 60, shipper)
            stats = Stats()
            cpu_at_start = tree_cpu_secs(shipper.process.pid)
            start = time.monotonic()
            elapsed = asyncio.run(drive("127.0.0.1", port, args, stats))
            deadline = time.monotonic() + args.land_timeout
            landed = count_lines(workdir / "out")
            while landed < stats.acked_events and time.monotonic() < deadline:
                time.sleep(0.05)  # poll interval; the bound is the deadline
                landed = count_lines(workdir / "out")
            landed_secs = time.monotonic() - start
            cpu = tree_cpu_secs(shipper.process.pid) - cpu_at_start
            rss = tree_rss_sum(shipper.process.pid)
            memory = table("after the load", tree_memory(shipper.process.pid, tree_pids(shipper.process.pid)))
            shipper.process.send_signal(signal.SIGTERM)
            try:
                shipper.process.wait(60)
            except subprocess.TimeoutExpired:
                pass
        if landed < stats.acked_events:
            sys.stdout.write(shipper.output[-4000:])
            raise SystemExit(f"Fluent Bit: {landed:,} events in the file for {stats.acked_events:,} acked")
        return Result(f"Fluent Bit {fluent_bit.VERSION}, forward -> file, filesystem storage", stats.acked_events,
                      elapsed, landed, landed_secs, rss, cpu, "received", memory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--window", type=int, default=1, help="chunks in flight per connection")
    parser.add_argument("--events-per-chunk", type=int, default=1000)
    parser.add_argument("--workers", default="auto", help="logrouter's [router] workers (default: auto)")
    parser.add_argument("--only", choices=["logrouter", "fluent-bit"], help="run one side only")
    parser.add_argument("--land-timeout", type=float, default=300, help="seconds to wait for Fluent Bit's file")
    parser.add_argument("--runs", type=int, default=1,
                        help="rounds of both systems, one after the other; with more than one, a summary of medians and spreads")
    args = parser.parse_args()
    if args.workers != "auto":
        args.workers = int(args.workers)
    args.compress = "text"
    print(f"load: {args.connections} connections x {args.window} chunk(s) in flight of {args.events_per_chunk} events, "
          f"{args.seconds:.0f}s per system")
    rounds: list[dict[str, Result]] = []
    for run in range(args.runs):
        if args.runs > 1:
            print(f"-- round {run + 1} of {args.runs}", flush=True)
        results: dict[str, Result] = {}
        if args.only in (None, "logrouter"):
            results["logrouter"] = run_logrouter(args)
            print("\n".join(results["logrouter"].lines()), flush=True)
        if args.only in (None, "fluent-bit"):
            results["fluent-bit"] = run_fluent_bit(args)
            print("\n".join(results["fluent-bit"].lines()), flush=True)
        rounds.append(results)
    if args.runs > 1:
        print("\n".join(summary(rounds)), flush=True)


def spread(values: list[float], form: str) -> str:
    """The median of ``values`` and their range, each written with ``form``."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return f"median {median:{form}} ({ordered[0]:{form}}-{ordered[-1]:{form}})"


def summary(rounds: list[dict[str, Result]]) -> list[str]:
    """Medians and ranges over the rounds, per system, and logrouter's ratios to Fluent Bit
    round by round (each ratio of two runs a few minutes apart)."""
    lines = [f"summary of {len(rounds)} rounds"]
    for system in rounds[0]:
        runs = [each[system] for each in rounds]
        lines += [
            f"  {system}",
            f"    acked/s      {spread([r.acked / r.load_secs for r in runs], ',.0f')}",
            f"    end to end/s {spread([r.landed / r.landed_secs for r in runs], ',.0f')}",
            f"    peak RSS MiB {spread([r.rss_mib for r in runs], '.0f')}",
            f"    CPU s/M      {spread([r.cpu_secs / r.landed * 1e6 for r in runs], '.2f')}",
        ]
    if len(rounds[0]) == 2:
        ours, theirs = [each["logrouter"] for each in rounds], [each["fluent-bit"] for each in rounds]
        lines += [
            "  logrouter / Fluent Bit, round by round",
            f"    acked        {spread([(a.acked / a.load_secs) / (b.acked / b.load_secs) for a, b in zip(ours, theirs)], '.2f')}",
            f"    end to end   {spread([(a.landed / a.landed_secs) / (b.landed / b.landed_secs) for a, b in zip(ours, theirs)], '.2f')}",
            f"    peak RSS     {spread([a.rss_mib / b.rss_mib for a, b in zip(ours, theirs)], '.2f')}",
        ]
    return lines


if __name__ == "__main__":
    main()

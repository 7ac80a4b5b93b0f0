#!/usr/bin/env python3
"""Forward → Iceberg against Forward → Parquet, and what Iceberg commits cost over time.

Part 1, the daemon (``--rounds``): ``bench/forward_load.py``'s load (4 connections each
keeping 4 PackedForward chunks of 1000 ~100-byte events in flight, each one waited for)
drives a daemon whose one sink is a ``parquet`` sink, then one whose sink is an ``iceberg``
sink (SQLite catalog in the temporary directory), alternately, the same number of rounds
each, with the same ``roll_secs``, so both see the same load in the same minutes. Per run:
acked events/s, events/s end to end (rows in the lake or table over the load plus the
graceful stop), the daemon's CPU seconds per million events, and for the table the commits
(the latency each commit's log line ends with: p50, p99, max) and the commit time per
event. The lake's or table's rows must equal the acked events.

Part 2, the commits (``--commits``): the iceberg sink itself (``IcebergSink``, in this
process, its clock injected) commits ``--commits`` times with ``roll_secs = 1``: each
commit one second of ``--tags`` tags × ``--rows`` rows. 120 such commits stand for an hour
of 30-second commits, scaled down. Run twice: without expiring snapshots, and with
pyiceberg's ``expire_snapshots`` (``table.maintenance``) run every ``--expire-every`` commits
from a catalog handle of its own, as a maintenance job would, keeping the newest
``--keep``. Reported: snapshots in the table's metadata, the size of the current metadata
file, the files and bytes under ``metadata/``, the manifests the current snapshot lists,
the commit latency of the first and last tenth, and whether the sink still finds its own
last commit. pyiceberg's expiry only drops snapshots from the metadata: it deletes no
manifest lists, manifests or data files (Spark's ``expire_snapshots`` does), so the
``metadata/`` directory is not expected to shrink here.

Run by hand, e.g. ``.venv/bin/python bench/iceberg_load.py --rounds 2 --seconds 8 --commits 120``
(``--rounds 0`` or ``--commits 0`` skips a part).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forward_load import Stats, drive, launch, measure, source_to_lake  # noqa: E402

KINDS = ("parquet", "iceberg")
COMMIT = re.compile(r"iceberg sink lake committed \d+ file\(s\), (\d+) rows, .* in ([\d.]+) s")
T0_NS = int(time.time()) * 10**9


# -- part 1: the daemon ----------------------------------------------------------------


def daemon_config(kind: str, roll_secs: float, durability: str) -> str:
    text = source_to_lake("forward", "fluent_forward", durability) + f"roll_secs = {roll_secs}\n"
    if kind == "iceberg":
        text = text.replace('type = "parquet"', 'type = "iceberg"').replace('path = "lake"', 'warehouse = "lake"')
    return text


def open_table(warehouse: Path):
    from logrouter.lake.iceberg_catalog import catalog_properties, open_catalog

    catalog = open_catalog("lake", catalog_properties(str(warehouse)))
    return catalog, catalog.load_table(("logs", "events"))


def table_rows(warehouse: Path) -> int:
    from logrouter.lake.iceberg_catalog import close_catalog

    catalog, table = open_table(warehouse)
    try:
        return table.scan(selected_fields=("time",)).to_arrow().num_rows
    finally:
        close_catalog(catalog)


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` of 1)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(fraction * len(ordered) + 0.5)) - 1))]


def one_run(kind: str, args: argparse.Namespace) -> dict:
    load = argparse.Namespace(seconds=args.seconds, connections=4, window=4, events_per_chunk=1000, compress="text")
    with tempfile.TemporaryDirectory(prefix=f"logrouter-bench-{kind}-") as tmp:
        workdir = Path(tmp)
        proc, port, metrics_port, lines = launch(workdir, daemon_config(kind, args.roll_secs, args.durability), "forward")
        stats = Stats()
        count = (lambda: table_rows(workdir / "lake")) if kind == "iceberg" else None
        run = measure(workdir, proc, metrics_port, lambda: asyncio.run(drive("127.0.0.1", port, load, stats)), count)
        deadline = time.monotonic() + 10
        while not any("Server Shut Down" in line for line in lines[-5:]) and time.monotonic() < deadline:
            time.sleep(0.05)  # the reader thread takes the last lines off the pipe
        commits = [(int(m.group(1)), float(m.group(2))) for line in lines if (m := COMMIT.search(line))]
        if run.rows != stats.acked_events or not run.clean_stop:
            sys.stdout.write("".join(lines[-40:]))
            raise SystemExit(f"{kind}: {run.rows:,} rows for {stats.acked_events:,} acked events (exit {run.exit_code})")
    return {
        "kind": kind,
        "acked": stats.acked_events / run.elapsed,
        "end_to_end": run.rows / (run.elapsed + run.stop_secs),
        "cpu_per_million": run.cpu_secs / run.rows * 1e6 if run.rows else float("nan"),
        "rows": run.rows,
        "stop_secs": run.stop_secs,
        "commits": commits,
    }


def daemon_part(args: argparse.Namespace) -> None:
    print(f"part 1: forward_load's load, {args.seconds:.0f} s per run, roll_secs = {args.roll_secs}, "
          f"durability = {args.durability}; load average {os.getloadavg()[0]:.1f} at the start")
    results = []
    for round_ in range(args.rounds):
        for kind in (KINDS if round_ % 2 == 0 else KINDS[::-1]):  # P I I P P I …: neither always goes first
            result = one_run(kind, args)
            results.append(result)
            line = (f"  round {round_ + 1} {kind:8} {result['acked']:>9,.0f} acked ev/s  {result['end_to_end']:>9,.0f} end to end"
                    f"  {result['cpu_per_million']:5.1f} CPU s/M  stop {result['stop_secs']:4.1f} s  rows {result['rows']:,}")
            if kind == "iceberg":
                latencies = [secs for _, secs in result["commits"]]
                line += f"  {len(latencies)} commits, p50 {percentile(latencies, 0.5) * 1000:.0f} ms"
            print(line, flush=True)
    by_kind = {kind: [r for r in results if r["kind"] == kind] for kind in KINDS}
    mean = {kind: {key: statistics.mean(r[key] for r in runs) for key in ("acked", "end_to_end", "cpu_per_million")}
            for kind, runs in by_kind.items()}
    print("  mean over the rounds:")
    for kind in KINDS:
        m = mean[kind]
        print(f"    {kind:8} {m['acked']:>9,.0f} acked ev/s  {m['end_to_end']:>9,.0f} end to end  {m['cpu_per_million']:5.1f} CPU s/M")
    print(f"    iceberg / parquet: acked {mean['iceberg']['acked'] / mean['parquet']['acked']:.2f}, end to end "
          f"{mean['iceberg']['end_to_end'] / mean['parquet']['end_to_end']:.2f}, CPU per event "
          f"{mean['iceberg']['cpu_per_million'] / mean['parquet']['cpu_per_million']:.2f}")
    commits = [c for r in by_kind["iceberg"] for c in r["commits"]]
    latencies = [secs for _, secs in commits]
    rows = sum(n for n, _ in commits)
    print(f"  iceberg commits: {len(commits)}, {rows / len(commits):,.0f} rows each on average; latency p50 "
          f"{percentile(latencies, 0.5) * 1000:.0f} ms, p99 {percentile(latencies, 0.99) * 1000:.0f} ms, max "
          f"{max(latencies) * 1000:.0f} ms; {sum(latencies) / rows * 1e6:.2f} µs of commit per event")


# -- part 2: the commits -----------------------------------------------------------------


def make_sink(workdir: Path):
    from twisted.internet import task

    from logrouter.config.options import REQUIRED
    from logrouter.sinks.iceberg import IcebergSink
    from logrouter.sinks.state import SinkState

    options = {key: option.default for key, option in IcebergSink.OPTIONS.items() if option.default is not REQUIRED}
    options.update(warehouse=str(workdir / "warehouse"), writer_id="bench", roll_secs=1.0)
    sink = IcebergSink("lake", options, errors=lambda *a: None, reactor=task.Clock())
    sink.state = SinkState(str(workdir / "spool" / "sinks" / "lake.json"))
    return sink


def metadata_footprint(table, warehouse: Path) -> dict:
    location = table.metadata_location.removeprefix("file://")
    directory = warehouse / "logs" / "events" / "metadata"
    files = [p for p in directory.iterdir() if p.is_file()]
    snapshot = table.current_snapshot()
    return {
        "snapshots": len(table.snapshots()),
        "metadata_json": os.path.getsize(location),
        "metadata_files": len(files),
        "metadata_bytes": sum(p.stat().st_size for p in files),
        "manifests": len(snapshot.manifests(table.io)) if snapshot is not None else 0,
    }


def expire(warehouse: Path, keep: int) -> float:
    """Expire every snapshot but the newest ``keep``, from a catalog handle of its own; the seconds it took."""
    from logrouter.lake.iceberg_catalog import close_catalog

    began = time.monotonic()
    catalog, table = open_table(warehouse)
    try:
        ordered = sorted(table.snapshots(), key=lambda s: s.sequence_number)
        old = [s.snapshot_id for s in ordered[:-keep]]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
    finally:
        close_catalog(catalog)
    return time.monotonic() - began


def commits_run(commits: int, tags: int, rows: int, expire_every: int, keep: int) -> dict:
    from logrouter.batch import Batch
    from logrouter.lake import iceberg_commit
    from logrouter.lake.iceberg_catalog import close_catalog
    from logrouter.sinks.iceberg import ADVANCED
    from logrouter.sinks.worker_sink import ROWS, STOP, TICK

    with tempfile.TemporaryDirectory(prefix="logrouter-bench-commits-") as tmp:
        workdir = Path(tmp)
        sink = make_sink(workdir)
        sink._recover()
        position, latencies, expiring = 0, [], []
        for n in range(commits):
            now = float(n)
            items = []
            for t in range(tags):
                events = [(T0_NS + (n * rows + i) * 1000, {"host": f"web-{i % 17:02d}", "level": "info", "msg": f"GET /items/{i}",
                                                           "bytes": 512 + i}) for i in range(rows)]
                items += [((ROWS, Batch(f"app.{t}", events), position, 100), now, position, 0), ((ADVANCED,), now, position + 100, 0)]
                position += 100
            sink._run(items)  # files opened at n
            before = sink.commit_seconds
            sink._run([((TICK,), now + 1.0, position, 0)])  # due a second later: one commit
            assert sink.commits == n + 1, (sink.commits, n)
            latencies.append(sink.commit_seconds - before)
            if expire_every and (n + 1) % expire_every == 0:
                expiring.append(expire(workdir / "warehouse", keep))
        sink._run([((STOP,), commits + 1.0, position, 0)])
        catalog, table = open_table(workdir / "warehouse")
        try:
            found = iceberg_commit.last_commit(table, "bench")
            result = metadata_footprint(table, workdir / "warehouse")
            result["rows"] = table.scan(selected_fields=("time",)).to_arrow().num_rows
        finally:
            close_catalog(catalog)
    tenth = max(1, commits // 10)
    result.update(
        first=statistics.median(latencies[:tenth]), last=statistics.median(latencies[-tenth:]),
        p99=percentile(latencies, 0.99), expire_secs=statistics.median(expiring) if expiring else float("nan"),
        found=found is not None and found.end == position,
    )
    return result


def commits_part(args: argparse.Namespace) -> None:
    print(f"part 2: the iceberg sink in process, {args.commits} commits (roll_secs = 1), each {args.tags} tags x {args.rows} "
          f"rows; load average {os.getloadavg()[0]:.1f} at the start")
    variants = [("no expiry", 0), (f"expire every {args.expire_every} commits, keep {args.keep}", args.expire_every)]
    for label, every in variants:
        r = commits_run(args.commits, args.tags, args.rows, every, args.keep)
        print(f"  {label}: {r['snapshots']} snapshots, current metadata file {r['metadata_json'] / 1024:,.1f} KiB, metadata/ "
              f"{r['metadata_files']} files {r['metadata_bytes'] / 1024:,.0f} KiB, {r['manifests']} manifests in the current "
              f"snapshot; commit latency median first tenth {r['first'] * 1000:.0f} ms, last tenth {r['last'] * 1000:.0f} ms, "
              f"p99 {r['p99'] * 1000:.0f} ms" + (f"; expiry {r['expire_secs'] * 1000:.0f} ms each" if every else "")
              + f"; rows {r['rows']:,}; the sink finds its last commit: {'yes' if r['found'] else 'NO'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="daemon runs per sink, alternating (0: skip part 1)")
    parser.add_argument("--seconds", type=float, default=8, help="load per daemon run")
    parser.add_argument("--roll-secs", type=float, default=5, help="both sinks' roll_secs in part 1")
    parser.add_argument("--durability", default="fsync", choices=["fsync", "os", "none"])
    parser.add_argument("--commits", type=int, default=120, help="commits in part 2 (0: skip it)")
    parser.add_argument("--tags", type=int, default=4, help="part 2: tags (so data files) per commit")
    parser.add_argument("--rows", type=int, default=250, help="part 2: rows per tag and commit")
    parser.add_argument("--expire-every", type=int, default=10, help="part 2: expire snapshots every N commits")
    parser.add_argument("--keep", type=int, default=10, help="part 2: snapshots an expiry keeps")
    args = parser.parse_args()
    if args.rounds:
        daemon_part(args)
    if args.commits:
        commits_part(args)


if __name__ == "__main__":
    main()

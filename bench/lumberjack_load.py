#!/usr/bin/env python3
"""Lumberjack → Parquet load benchmark: events/s with acknowledged Beats windows.

It starts its own daemon (``twistd -n logrouter``) on loopback with a temporary spool and
lake (``lumberjack`` source → ``parquet`` sink, ``durability = "fsync"`` by default) and
drives it the way Filebeat does: several connections, each sending v2 windows of 2048
events (``W`` 2048, then one ``C`` frame of zlib level 3 holding ``J`` frames numbered
1..2048), ~200-byte JSON events shaped like Filebeat's, and waiting for each window's
final ACK before sending the next (``--pipelining 2`` keeps two in flight, Beats'
default). The window is encoded once and sent again and again, so the generator costs
next to nothing. Then it stops the daemon with SIGTERM and reports:

* acked events/s while sending (an ACK only comes once the events are durable), events/s
  end to end (lake rows / (load + graceful stop)) and the daemon's CPU s per million events,
* the daemon's peak RSS (VmHWM) and fsyncs per second (from its metrics endpoint),
* the rows read back from the lake, which must equal the events acknowledged (exit 1
  otherwise).

Run by hand, e.g. ``.venv/bin/python bench/lumberjack_load.py --seconds 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forward_load import launch, measure, source_to_lake  # noqa: E402

from logrouter.wire import lumberjack as lj  # noqa: E402


def filebeat_event(i: int) -> dict:
    return {
        "@timestamp": "2026-11-22T08:00:%02d.%03dZ" % (i // 1000 % 60, i % 1000),
        "@metadata": {"beat": "filebeat", "version": "8.11.0"},
        "message": "GET /api/v1/items/%06d 200 %d" % (i, 512 + i % 100),
        "log": {"offset": 1000 + 64 * i, "file": {"path": "/var/log/app.log"}},
        "host": {"name": "web-%02d" % (i % 17)},
    }


def make_window(events: int, level: int) -> bytes:
    return lj.encode_window_frames((filebeat_event(i) for i in range(events)), version=2, compress_level=level)


class Stats:
    def __init__(self) -> None:
        self.acked_events = 0
        self.windows = 0
        self.keepalives = 0


async def connection(port: int, window: bytes, events: int, pipelining: int, deadline: float, stats: Stats) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    in_flight = 0
    for _ in range(pipelining):
        writer.write(window)
        in_flight += 1
    buffer = b""
    while in_flight:
        data = await reader.read(65536)
        if not data:
            raise RuntimeError("server closed the connection")
        buffer += data
        while len(buffer) >= 6:
            version, kind, seq = struct.unpack_from(">BBI", buffer)
            buffer = buffer[6:]
            if (version, kind) != (0x32, 0x41) or seq > events:
                raise RuntimeError(f"unexpected reply {version:#x} {kind:#x} {seq}")
            if seq == 0:
                stats.keepalives += 1
            if seq < events:
                continue  # partial ack or keepalive: the window is not done yet
            in_flight -= 1
            stats.acked_events += events
            stats.windows += 1
            if time.monotonic() < deadline:
                writer.write(window)
                in_flight += 1
    writer.close()
    await writer.wait_closed()


async def drive(port: int, args: argparse.Namespace, stats: Stats) -> float:
    window = make_window(args.window_size, args.compression_level)
    start = time.monotonic()
    deadline = start + args.seconds
    await asyncio.gather(*(
        connection(port, window, args.window_size, args.pipelining, deadline, stats) for _ in range(args.connections)
    ))
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--window-size", type=int, default=2048, help="events per window (Beats' bulk_max_size)")
    parser.add_argument("--pipelining", type=int, default=1, help="windows in flight per connection")
    parser.add_argument("--compression-level", type=int, default=3, help="zlib level of the C frame (0 = plain J frames)")
    parser.add_argument("--durability", default="fsync", choices=["fsync", "os", "none"])
    parser.add_argument("--tag", default="beats.${@metadata.beat}", help="the source's tag option")
    args = parser.parse_args()
    window = make_window(args.window_size, args.compression_level)
    stats = Stats()
    with tempfile.TemporaryDirectory(prefix="logrouter-bench-") as tmp:
        workdir = Path(tmp)
        proc, port, metrics_port, lines = launch(workdir, source_to_lake("beats", "lumberjack", args.durability, tag=args.tag), "beats")
        run = measure(workdir, proc, metrics_port, lambda: asyncio.run(drive(port, args, stats)))
        elapsed, fsync_count, rss, code, stop_secs, rows = (
            run.elapsed, run.fsyncs, run.rss_mb, run.exit_code, run.stop_secs, run.rows)
        event_bytes = len(json.dumps(filebeat_event(1234), separators=(",", ":")))
        print(f"durability={args.durability} connections={args.connections} window={args.window_size} "
              f"pipelining={args.pipelining} compression_level={args.compression_level} "
              f"(window {len(window):,} bytes on the wire, ~{event_bytes} bytes/event as JSON)")
        print(f"  {stats.acked_events / elapsed:,.0f} events/s acked ({stats.acked_events:,} events, "
              f"{stats.windows:,} windows in {elapsed:.1f}s; {stats.keepalives} keepalive ACKs)")
        print(f"  {fsync_count / elapsed:,.1f} fsyncs/s, peak RSS {rss:,.0f} MiB, graceful stop {stop_secs:.1f}s (exit {code})")
        print(run.end_to_end_line(rows))
        print(run.cpu_line(rows))
        print(f"  lake rows {rows:,} ({'matches' if rows == stats.acked_events else 'MISMATCH with'} acked events)")
        if rows != stats.acked_events or not run.clean_stop:
            sys.stdout.write("".join(lines[-40:]))
            sys.exit(1)


if __name__ == "__main__":
    main()

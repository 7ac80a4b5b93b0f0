#!/usr/bin/env python3
"""Log Courier → Parquet load benchmark: events/s with acknowledged payloads.

It starts its own daemon (``twistd -n logrouter``) on loopback with a temporary spool and
lake (``log_courier`` source → ``parquet`` sink, ``durability = "fsync"`` by default) and
drives it the way the Go shipper does: several connections, each sending ``HELO``, then
``EVNT`` payloads of 1024 events (its default ``spool size``; zlib level 3, as the
shipper compresses) with several payloads in flight per connection (``max pending
payloads``), each kept until its full ``ACKN``. A payload is encoded once; every send
carries a fresh nonce spliced into it (a repeated nonce would be a retransmission, acked
without being stored), so the generator costs next to nothing. Then it stops the daemon
with SIGTERM and reports acked events/s, events/s end to end (lake rows / (load + graceful
stop)), the daemon's CPU seconds per million events, fsyncs/s, peak RSS, and the rows read
back from the lake, which must equal the events acknowledged (exit 1 otherwise).

Run by hand, e.g. ``.venv/bin/python bench/log_courier_load.py --seconds 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forward_load import launch, measure, source_to_lake  # noqa: E402

from logrouter.wire import log_courier as lc  # noqa: E402

NONCE_AT = 8  # EVNT: type, length 0xFFFFFFFF, then the 16-byte nonce


def courier_event(i: int) -> dict:
    # What log-courier ships for a line read from a file: the line, its origin, its time.
    return {
        "@timestamp": "2026-11-23T08:00:%02d.%03d123Z" % (i // 1000 % 60, i % 1000),
        "message": "GET /api/v1/items/%06d 200 %d" % (i, 512 + i % 100),
        "host": "web-%02d" % (i % 17),
        "path": "/var/log/app.log",
        "offset": 1000 + 64 * i,
        "type": "app",
    }


class Stats:
    def __init__(self) -> None:
        self.acked_events = 0
        self.payloads = 0
        self.partial = 0


async def connection(port: int, payload: bytes, events: int, pending: int, deadline: float, stats: Stats, nonces) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(lc.encode_helo())
    replies = lc.AcknDecoder()
    in_flight: set[bytes] = set()

    def send() -> None:
        nonce = next(nonces).to_bytes(16, "big")
        in_flight.add(nonce)
        writer.write(payload[:NONCE_AT] + nonce + payload[NONCE_AT + 16 :])

    started = False
    while True:
        data = await reader.read(65536)
        if not data:
            raise RuntimeError("server closed the connection")
        for frame in replies.feed(data):
            if isinstance(frame, lc.Vers):
                if not frame.supports_evnt:
                    raise RuntimeError("the server does not take EVNT")
                started = True
                for _ in range(pending):
                    send()
            elif isinstance(frame, lc.Ackn) and frame.nonce in in_flight:
                if frame.sequence < events:
                    stats.partial += 1
                    continue
                in_flight.discard(frame.nonce)
                stats.acked_events += events
                stats.payloads += 1
                if time.monotonic() < deadline:
                    send()
        if started and not in_flight:
            break
    writer.close()
    await writer.wait_closed()


async def drive(port: int, args: argparse.Namespace, stats: Stats) -> float:
    payload = lc.encode_evnt(b"\0" * 16, [courier_event(i) for i in range(args.payload_size)], level=3)
    nonces = itertools.count(1)
    start = time.monotonic()
    deadline = start + args.seconds
    await asyncio.gather(*(
        connection(port, payload, args.payload_size, args.pending, deadline, stats, nonces) for _ in range(args.connections)
    ))
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--payload-size", type=int, default=1024, help="events per payload (log-courier's spool size)")
    parser.add_argument("--pending", type=int, default=4, help="payloads in flight per connection (max pending payloads)")
    parser.add_argument("--durability", default="fsync", choices=["fsync", "os", "none"])
    parser.add_argument("--tag", default="courier.${type}", help="the source's tag option")
    args = parser.parse_args()
    stats = Stats()
    with tempfile.TemporaryDirectory(prefix="logrouter-bench-") as tmp:
        workdir = Path(tmp)
        proc, port, metrics_port, lines = launch(workdir, source_to_lake("courier", "log_courier", args.durability, tag=args.tag), "courier")
        run = measure(workdir, proc, metrics_port, lambda: asyncio.run(drive(port, args, stats)))
        elapsed = run.elapsed
        event_bytes = len(json.dumps(courier_event(1234), separators=(",", ":")))
        print(f"durability={args.durability} connections={args.connections} payload={args.payload_size} "
              f"pending={args.pending} (~{event_bytes} bytes/event as JSON)")
        print(f"  {stats.acked_events / elapsed:,.0f} events/s acked ({stats.acked_events:,} events, "
              f"{stats.payloads:,} payloads in {elapsed:.1f}s; {stats.partial} partial ACKNs)")
        print(f"  {run.fsyncs / elapsed:,.1f} fsyncs/s, peak RSS {run.rss_mb:,.0f} MiB, "
              f"graceful stop {run.stop_secs:.1f}s (exit {run.exit_code})")
        print(run.end_to_end_line(run.rows))
        print(run.cpu_line(run.rows))
        print(f"  lake rows {run.rows:,} ({'matches' if run.rows == stats.acked_events else 'MISMATCH with'} acked events)")
        if run.rows != stats.acked_events or not run.clean_stop:
            sys.stdout.write("".join(lines[-40:]))
            sys.exit(1)


if __name__ == "__main__":
    main()

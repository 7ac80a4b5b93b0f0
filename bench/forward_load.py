#!/usr/bin/env python3
"""Forward → Parquet load benchmark: events/s with acknowledged PackedForward chunks.

By default it starts its own daemon (``twistd -n logrouter``) on loopback with a
temporary spool and lake, drives it with several connections that each keep a window of
chunks in flight (out_forward-style PackedForward, ~100-byte records, a ``chunk`` id on
every message, each one waited for), stops the daemon with SIGTERM, and reports:

* acked events/s while sending (the ack only comes once the batch is durable),
* the daemon's peak RSS (VmHWM) and the number of fsyncs per second,
* the rows read back from the lake (must equal the events acknowledged).

Run by hand, e.g. ``.venv/bin/python bench/forward_load.py --seconds 20 --durability fsync``.
``--compress gzip`` sends CompressedPackedForward (the entries gzip'd at level 6, as
out_forward's ``compress gzip`` does); ``--tls`` makes the daemon listen on ``ssl:`` with a
throwaway self-signed certificate generated into the temporary directory, and the clients
connect over TLS trusting it. ``--port`` drives an already running daemon instead (no
lake check then).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import re
import signal
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack

REPO = Path(__file__).resolve().parent.parent
CHUNK_ID_LEN = 24


def make_message(tag: str, events_per_chunk: int, start: int, compress: str = "text") -> tuple[bytes, int]:
    """A (Compressed)PackedForward message with a fixed-width chunk id; returns it and the id's offset."""
    now = int(time.time())
    entries = []
    for i in range(events_per_chunk):
        record = {
            "host": "web-%02d" % (i % 17),
            "level": "info" if i % 5 else "warn",
            "msg": "GET /api/v1/items/%06d 200" % (start + i),
            "bytes": 512 + i,
        }
        entries.append(msgpack.packb([msgpack.ExtType(0, struct.pack(">II", now, i * 1000)), record]))
    blob = b"".join(entries)
    if compress == "gzip":
        blob = gzip.compress(blob, 6)  # out_forward: Zlib::GzipWriter, default level
    options = msgpack.packb({"size": events_per_chunk, "compressed": compress, "chunk": "X" * CHUNK_ID_LEN})
    message = b"\x93" + msgpack.packb(tag) + b"\xdb" + struct.pack(">I", len(blob)) + blob + options
    return message, len(message) - CHUNK_ID_LEN


class Stats:
    def __init__(self) -> None:
        self.acked_events = 0
        self.acked_chunks = 0


async def connection(host: str, port: int, conn_id: int, message: bytes, id_offset: int, events: int,
                     window: int, deadline: float, stats: Stats, tls: ssl.SSLContext | None = None) -> None:
    # Each connection from its own loopback address, like senders on different hosts:
    # with [router] workers the supervisor spreads connections by peer address.
    local = (f"127.0.0.{2 + conn_id % 250}", 0) if host == "127.0.0.1" else None
    if tls is None:
        reader, writer = await asyncio.open_connection(host, port, local_addr=local)
    else:
        reader, writer = await asyncio.open_connection(host, port, ssl=tls, server_hostname="localhost", local_addr=local)
    unpacker = msgpack.Unpacker(raw=True)
    in_flight: set[bytes] = set()
    sent = 0

    def send_one() -> None:
        nonlocal sent
        chunk_id = b"%04d-%019d" % (conn_id, sent)
        assert len(chunk_id) == CHUNK_ID_LEN
        writer.write(message[:id_offset] + chunk_id)
        in_flight.add(chunk_id)
        sent += 1

    for _ in range(window):
        send_one()
    while in_flight:
        data = await reader.read(65536)
        if not data:
            raise RuntimeError("server closed the connection")
        unpacker.feed(data)
        for reply in unpacker:
            in_flight.discard(reply[b"ack"])
            stats.acked_events += events
            stats.acked_chunks += 1
            if time.monotonic() < deadline:
                send_one()
    writer.close()
    await writer.wait_closed()


async def drive(host: str, port: int, args: argparse.Namespace, stats: Stats, tls: ssl.SSLContext | None = None) -> float:
    message, id_offset = make_message("bench.load", args.events_per_chunk, 0, args.compress)
    start = time.monotonic()
    deadline = start + args.seconds
    await asyncio.gather(*(
        connection(host, port, c, message, id_offset, args.events_per_chunk, args.window, deadline, stats, tls)
        for c in range(args.connections)
    ))
    return time.monotonic() - start


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for localhost/127.0.0.1 (EC P-256), written at run time."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "bench-cert.pem", directory / "bench-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def client_context(cert: Path) -> ssl.SSLContext:
    """Verifies the daemon's certificate and its name (localhost) like a real client."""
    return ssl.create_default_context(cafile=str(cert))


def source_to_lake(name: str, source_type: str, durability: str, listen: str = "tcp:0:interface=127.0.0.1",
                   workers: int = 1, lake_compression: str = "zstd", **source: str) -> str:
    """The benchmarks' config: one source straight into a parquet lake, metrics on."""
    extra = "".join(f"{key} = {json.dumps(value)}\n" for key, value in source.items())
    return f"""
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"
workers = {workers}
# no limit: the stop lets a slowed sink catch up, so the lake holds every acked row
shutdown_timeout_secs = 0
[spool]
path = "spool"
durability = "{durability}"
[sources.{name}]
type = "{source_type}"
listen = {json.dumps(listen)}
{extra}[sinks.lake]
type = "parquet"
inputs = ["{name}"]
path = "lake"
compression = "{lake_compression}"
"""


def start_daemon(workdir: Path, durability: str, listen: str = "tcp:0:interface=127.0.0.1",
                 workers: int = 1, lake_compression: str = "zstd") -> tuple[subprocess.Popen, int, int, list[str]]:
    return launch(workdir, source_to_lake("forward", "fluent_forward", durability, listen, workers, lake_compression), "forward")


def launch(workdir: Path, config_text: str, source: str) -> tuple[subprocess.Popen, int, int, list[str]]:
    """Start ``twistd -n logrouter`` with ``config_text``; the port ``source`` listens on and the metrics port."""
    config = workdir / "bench.toml"
    config.write_text(config_text)
    twistd = Path(sys.executable).parent / "twistd"
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([str(twistd), "-n", "--pidfile=", "logrouter", "--config", str(config)],
                            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    port = metrics_port = None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        lines.append(line)
        if m := re.search(rf"source {source} listening on \S+ port (\d+)", line):
            port = int(m.group(1))
        if m := re.search(r"metrics listening on \S+ port (\d+)", line):
            metrics_port = int(m.group(1))
        if "logrouter running" in line or time.monotonic() > deadline:
            break
    if port is None:
        proc.kill()
        raise SystemExit("daemon did not start:\n" + "".join(lines))
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, port, metrics_port, lines


def peak_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:  # gone meanwhile
        pass
    return float("nan")


def fsyncs(metrics_port: int) -> float:
    return metric_sums(metrics_port, ("logrouter_spool_fsyncs_total",)).get("logrouter_spool_fsyncs_total", float("nan"))


SINK_METRICS = ("logrouter_sink_holds_total", "logrouter_sink_held_seconds_total", "logrouter_sink_overflows_total")


def metric_sums(metrics_port: int, names: tuple[str, ...]) -> dict[str, float]:
    """The samples of ``names`` on the daemon's /metrics, each summed over its labels."""
    import urllib.request

    sums: dict[str, float] = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in names:
                sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return sums


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its live descendants (a supervisor's workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def tree_cpu_secs(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid``, its live descendants and the
    descendants they have reaped."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for each in tree_pids(pid):
        try:
            with open(f"/proc/{each}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / ticks


def tree_peak_rss_mb(pid: int) -> float:
    """The largest peak RSS (VmHWM) of ``pid`` and its descendants: per process, not summed."""
    peaks = [peak_rss_mb(each) for each in tree_pids(pid)]
    return max((p for p in peaks if p == p), default=float("nan"))


class Run:
    """What one measured run of a daemon gave: throughput inputs, fsyncs, memory, the stop,
    and the daemon's CPU seconds from the start of the load to the end of its stop."""

    def __init__(self, elapsed: float, fsyncs: float, rss_mb: float, exit_code: int, stop_secs: float, rows: int,
                 cpu_secs: float = float("nan"), sink: dict[str, float] | None = None):
        self.elapsed, self.fsyncs, self.rss_mb = elapsed, fsyncs, rss_mb
        self.exit_code, self.stop_secs, self.rows = exit_code, stop_secs, rows
        self.cpu_secs = cpu_secs
        self.sink = sink or {}

    def sink_line(self) -> str:
        """How often the lake sink held the sources, and how often its queue's bound sent
        it to the spool instead (where it decodes those records again) during the load."""
        get = self.sink.get
        return (f"  sink: held the sources {get('logrouter_sink_holds_total', 0):,.0f} times for "
                f"{get('logrouter_sink_held_seconds_total', 0):,.1f} s, read from the spool after an overflow "
                f"{get('logrouter_sink_overflows_total', 0):,.0f} times")

    def end_to_end_line(self, rows: int) -> str:
        """Rows in the lake over the load plus the graceful stop, during which a sink
        behind catches up and commits: the rate at which events really land in Parquet."""
        return (f"  {rows / (self.elapsed + self.stop_secs):,.0f} events/s end to end into Parquet "
                f"(all rows committed by the end of the graceful stop)")

    def cpu_line(self, events: int) -> str:
        per_million = self.cpu_secs / events * 1e6 if events else float("nan")
        return (f"  daemon CPU {self.cpu_secs:,.1f} s for the load and the stop = "
                f"{per_million:,.1f} CPU s per million events")

    @property
    def clean_stop(self) -> bool:
        return self.exit_code in (0, -signal.SIGTERM)  # twistd re-raises the SIGTERM it got


def measure(workdir: Path, proc: subprocess.Popen, metrics_port: int, drive_load, count_rows=None) -> Run:
    """Run ``drive_load()`` (it returns the seconds it drove), then stop the daemon with
    SIGTERM, and count the rows its lake holds (``count_rows()``: another sink's count)."""
    import resource

    try:
        fsyncs_before = fsyncs(metrics_port)
        cpu_at_start = tree_cpu_secs(proc.pid)  # the start-up (imports, recovery) is not the load's
        elapsed = drive_load()
        fsync_count = fsyncs(metrics_port) - fsyncs_before
        sink = metric_sums(metrics_port, SINK_METRICS)
        rss = tree_peak_rss_mb(proc.pid)
        stop_start = time.monotonic()
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        stop_secs = time.monotonic() - stop_start
        # the reaped daemon's whole life (with the workers it reaped), less its start-up
        children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_secs = (children_after.ru_utime - children_before.ru_utime
                    + children_after.ru_stime - children_before.ru_stime) - cpu_at_start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if count_rows is None:
        import pyarrow.dataset as ds

        rows = ds.dataset(str(workdir / "lake"), partitioning="hive").count_rows()
    else:
        rows = count_rows()
    return Run(elapsed, fsync_count, rss, code, stop_secs, rows, cpu_secs, sink)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--window", type=int, default=4, help="chunks in flight per connection")
    parser.add_argument("--events-per-chunk", type=int, default=1000)
    parser.add_argument("--durability", default="fsync", choices=["fsync", "os", "none"])
    parser.add_argument("--compress", default="text", choices=["text", "gzip"],
                        help="gzip: CompressedPackedForward (default: plain PackedForward)")
    parser.add_argument("--tls", action="store_true", help="listen on ssl: with a throwaway self-signed certificate")
    parser.add_argument("--port", type=int, help="drive a running daemon on 127.0.0.1:PORT instead")
    parser.add_argument("--workers", type=int, default=1, help="[router] workers of the daemon")
    parser.add_argument("--slow-sink", action="store_true",
                        help="slow the Parquet sink down (brotli instead of zstd), so it falls behind the senders: "
                             "what the sink's queue and the spool's backlog cost in memory")
    args = parser.parse_args()
    stats = Stats()
    if args.port:
        if args.tls:
            raise SystemExit("--tls needs the daemon this script starts (it makes the certificate)")
        elapsed = asyncio.run(drive("127.0.0.1", args.port, args, stats))
        print(f"{stats.acked_events / elapsed:,.0f} events/s acked ({stats.acked_events:,} in {elapsed:.1f}s)")
        return
    with tempfile.TemporaryDirectory(prefix="logrouter-bench-") as tmp:
        workdir = Path(tmp)
        listen = "tcp:0:interface=127.0.0.1"
        context = None
        if args.tls:
            cert, key = make_certificate(workdir)
            escape = lambda path: str(path).replace(":", r"\:")  # noqa: E731 - endpoint strings split on ':'
            listen = f"ssl:0:privateKey={escape(key)}:certKey={escape(cert)}:interface=127.0.0.1"
            context = client_context(cert)
        proc, port, metrics_port, lines = start_daemon(workdir, args.durability, listen, args.workers,
                                                       "brotli" if args.slow_sink else "zstd")
        run = measure(workdir, proc, metrics_port, lambda: asyncio.run(drive("127.0.0.1", port, args, stats, context)))
        elapsed, fsync_count, rss, code, stop_secs, rows = (
            run.elapsed, run.fsyncs, run.rss_mb, run.exit_code, run.stop_secs, run.rows)
        variant = ((f" compress={args.compress}" if args.compress != "text" else "") + (" tls=on" if args.tls else "")
                   + (" slow-sink (brotli)" if args.slow_sink else ""))
        print(f"workers={args.workers} durability={args.durability} connections={args.connections} window={args.window} "
              f"events/chunk={args.events_per_chunk}{variant}")
        print(f"  {stats.acked_events / elapsed:,.0f} events/s acked ({stats.acked_events:,} events in {elapsed:.1f}s)")
        print(f"  {fsync_count / elapsed:,.1f} fsyncs/s, peak RSS {rss:,.0f} MiB, graceful stop {stop_secs:.1f}s (exit {code})")
        print(run.sink_line())
        print(run.end_to_end_line(rows))
        print(run.cpu_line(rows))
        print(f"  lake rows {rows:,} ({'matches' if rows == stats.acked_events else 'MISMATCH with'} acked events)")
        if rows != stats.acked_events or not run.clean_stop:
            sys.stdout.write("".join(lines[-40:]))
            sys.exit(1)


if __name__ == "__main__":
    main()

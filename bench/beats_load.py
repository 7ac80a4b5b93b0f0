#!/usr/bin/env python3
"""Beats → Parquet load benchmark driven by go-lumber, the client library Beats send with.

The load is the real Go client library: ``github.com/elastic/go-lumber`` ``client/v2``,
the one libbeat's Logstash output is built on, in one of two senders, both built once with
the Go toolchain through ``tests/go_binary.py`` and cached outside the checkout
(``~/.cache/logrouter-tests/``):

- ``--sender tst-send`` (the default, so that figures stay comparable with earlier runs):
  go-lumber's own test sender, ``cmd/tst-send`` of v0.1.0. It hands the library its batch
  as 2048 ``map[string]interface{}`` events, which the library's default encoder
  (``encoding/json``, by reflection) encodes again for every window. On a 2-core machine
  that costs it about as much CPU per event as the daemon spends receiving, storing and
  acking them (~3–4 CPU s per million each), so the two share this figure's ceiling.
- ``--sender lumber-send``: ``bench/lumber_send/main.go``, the same library, flags and
  behaviour, and the same kind of events (byte for byte the same JSON), but each event is
  encoded once at start-up and the client gets ``v2.JSONEncoder`` returning those bytes,
  as Beats give go-lumber their own fast encoder instead of ``encoding/json``. The
  windows, their framing, zlib compression and pipelining are the library's, as with
  Beats; only the per-window reflection is gone. Use it to see what the daemon itself
  can take.

Each sender process runs with ``GOMAXPROCS=1`` (``--go-procs``; 0 leaves Go's default of
one per core): it has one connection and one window to encode at a time, and 4 of them
on 2 cores with Go's default spent 20–45% more CPU per event in 4 of 5 paired runs
(3.5–4.4 against 2.5–3.6 s per million over a day, ``--receiver null``) in the
scheduler's spinning and the parallel collector, CPU this machine's daemon shares. Figures before 2026-11-24 afternoon were taken with Go's
default.

``--event`` chooses the events' shape (``-event`` of lumber-send; tst-send has only the
first):

- ``flat`` (the default): tst-send's small flat events (``@timestamp``, ``type:
  filebeat``, a lorem-ipsum ``message``, ``offset``, ~165 bytes as JSON); the source's
  tag is ``beats.${type}``.
- ``filebeat``: events as Filebeat 8.11 ships them to Logstash from a filestream input
  reading an nginx access log, with ``add_host_metadata`` on: ``@timestamp`` (UTC,
  milliseconds), ``@metadata``, an nginx ``combined`` line as ``message`` (client,
  request, status, bytes, user agent vary per event), and the nested objects ``log``
  (``offset``, ``file``), ``input``, ``ecs``, ``host`` (``os``, ``ip``, ``mac``, …) and
  ``agent``, ~1 KB as JSON. Besides ``@timestamp`` and ``message`` every field is an
  object: the lake writer stores them in its JSON ``_extra`` column, a costlier path
  than typed columns. The source's tag is ``beats.${@metadata.beat}`` (the same
  ``beats.filebeat``).

``--tag`` overrides the tag either way. ``--show-row`` prints the lake's columns and its
first row after the figures.

Each sender process keeps one connection and sends one precomputed batch of ``--batch``
events (2048: Beats' ``bulk_max_size``) again and again, forever, as v2 windows (``W``
then one zlib ``C`` frame, ``--compress`` level 3 as Beats' default; ``--compress 0``
sends the ``J`` frames plainly), ``--pipelining`` windows in flight (``-pipeline 2``,
Beats' default ``pipelining``). Its events are encoded once, at start-up, whatever
their shape: per window it only frames and compresses.

How acks are counted. The senders have no event count and no way to stop: they run until
killed, and count the events of the windows they got the final ACK for only in an expvar
(``ACKed`` at ``/debug/vars``). Killed at an arbitrary moment, a sender would leave
windows the daemon had stored but whose ACK it never counted, so the rows could not be
checked exactly. So every sender connects through a small relay in this script (loopback,
one daemon connection per sender) that forwards whole windows only and reads the daemon's
ACKs on the way back. To find the end of a window cheaply it trusts what go-lumber sends:
``W`` N and then exactly one ``C`` frame holding all N ``J`` frames, so a window is
complete when its top-level ``C`` frame is; only the first window of each connection is
inflated, to check that its ``C`` frame does hold N events and to measure the JSON bytes
per event (``--verify-frames`` inflates every ``C`` frame and counts its ``J`` frames,
the relay's old way, which costs it ~0.8 CPU s per million events). Plain ``J`` frames
are counted one by one. At the end of ``--seconds`` the relay stops forwarding (a window
not yet forwarded is dropped: the daemon never sees it), waits for the final ACK of every
window it did forward, and that is the acked count. It checks it against the senders'
own ``ACKed`` counters (their sum must come to the same number once the last ACKs are
through), then ends the senders and their daemon connections (at a window boundary) and
stops the daemon with SIGTERM. The lake must hold exactly the acked events (exit 1
otherwise): that is the real check, whatever the relay trusted. The relay costs this
script some CPU (reported), not the daemon.

It starts its own daemon (``twistd -n logrouter``) on loopback with a temporary spool and
lake (``lumberjack`` source → ``parquet`` sink, ``durability = "fsync"`` by default) and
reports: acked events/s, events/s end to end (lake rows / (load + graceful stop)), the
daemon's CPU seconds per million events, its peak RSS and fsyncs per second, and the
CPU seconds of the senders and of the relay.

Run by hand, e.g. ``.venv/bin/python bench/beats_load.py --seconds 20`` or
``.venv/bin/python bench/beats_load.py --seconds 20 --sender lumber-send`` or
``.venv/bin/python bench/beats_load.py --seconds 20 --sender lumber-send --event filebeat``.
``--workers N`` sets ``[router] workers = N``; the relay opens each daemon connection from
its own loopback address (127.0.0.2, .3, …) so that the supervisor, which spreads
connections by peer address, can give them to different workers.

``--receiver null`` starts no daemon: the relay answers each whole window with its final
ACK as soon as it has it. That is what the senders alone can send on this machine, and
what they cost per million events when nothing else competes for the cores; with the
daemon on the same cores, the senders' share of them is the ceiling of any figure.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from forward_load import launch, measure, source_to_lake  # noqa: E402
from go_binary import GoBinary  # noqa: E402

TST_SEND = GoBinary(
    name="go-lumber tst-send",
    module="github.com/elastic/go-lumber",
    package="github.com/elastic/go-lumber/cmd/tst-send",
    binary="tst-send",
    default_version="v0.1.0",
    bin_env="LOGROUTER_BENCH_TST_SEND_BIN",
    version_env="LOGROUTER_BENCH_GO_LUMBER_VERSION",
    timeout_env="LOGROUTER_BENCH_GO_LUMBER_BUILD_TIMEOUT",
)
LUMBER_SEND = GoBinary(
    name="lumber-send (bench/lumber_send, go-lumber client/v2)",
    module="github.com/elastic/go-lumber",
    main_source=Path(__file__).resolve().parent / "lumber_send",
    binary="lumber-send",
    default_version="v0.1.0",
    bin_env="LOGROUTER_BENCH_LUMBER_SEND_BIN",
    version_env="LOGROUTER_BENCH_GO_LUMBER_VERSION",
    timeout_env="LOGROUTER_BENCH_GO_LUMBER_BUILD_TIMEOUT",
)
SENDERS = {"tst-send": TST_SEND, "lumber-send": LUMBER_SEND}
DRAIN_TIMEOUT = 60.0  # after the cut: the most seconds to wait for the forwarded windows' ACKs
EXPVAR_TIMEOUT = 5.0  # after the last ACK: the most seconds for the senders' counters to catch up
EVENT_SHAPES = ("flat", "filebeat")  # lumber-send's -event; tst-send sends flat ones only
DEFAULT_TAGS = {"flat": "beats.${type}", "filebeat": "beats.${@metadata.beat}"}


class ProtocolError(Exception):
    pass


def data_frames(inflated: bytes) -> tuple[int, int]:
    """The ``J`` frames in the content of a ``C`` frame (nested ``C`` frames included) and
    the bytes of their JSON documents."""
    count, json_bytes, pos, end = 0, 0, 0, len(inflated)
    while pos < end:
        kind = inflated[pos + 1:pos + 2]
        if kind == b"J":
            (length,) = struct.unpack_from(">I", inflated, pos + 6)
            pos += 10 + length
            count += 1
            json_bytes += length
        elif kind == b"C":
            (length,) = struct.unpack_from(">I", inflated, pos + 2)
            inner = data_frames(zlib.decompress(inflated[pos + 6:pos + 6 + length]))
            count, json_bytes = count + inner[0], json_bytes + inner[1]
            pos += 6 + length
        else:
            raise ProtocolError(f"unexpected frame {inflated[pos:pos + 2]!r} inside a C frame")
    return count, json_bytes


class WindowSplitter:
    """Cuts one client→server v2 stream into whole windows: ``feed()`` returns the bytes of
    the windows it completed and their sizes, and keeps an incomplete one for later.

    A top-level ``C`` frame completes its window (go-lumber sends ``W`` N and one ``C``
    frame of all N ``J`` frames); it is inflated only for the first window (to check that
    it does hold N events, and for the JSON bytes per event), or for every window with
    ``verify`` (then its ``J`` frames are counted and a window may span several ``C``
    frames). Plain ``J`` frames are always counted.
    """

    def __init__(self, verify: bool = False) -> None:
        self.verify = verify
        self.pending = bytearray()
        self.pos = 0  # parsed up to here
        self.size = 0  # the current window's announced size (0: between windows)
        self.left = 0  # its events not seen yet
        self.json_bytes = 0  # of the J frames seen (inflated or plain), for the report
        self.json_events = 0  # the J frames they were in
        self.windows_seen = 0

    def feed(self, data: bytes) -> tuple[bytes, list[int]]:
        self.pending += data
        buf, pos, done, sizes = self.pending, self.pos, 0, []
        while len(buf) - pos >= 6:
            if buf[pos] != 0x32:
                raise ProtocolError(f"not a v2 frame: {bytes(buf[pos:pos + 2])!r}")
            kind = buf[pos + 1]
            (value,) = struct.unpack_from(">I", buf, pos + 2)
            if kind == 0x57:  # W
                if self.left:
                    raise ProtocolError("a window started before the previous one was complete")
                if not value:
                    raise ProtocolError("a window of 0 events")
                self.size = self.left = value
                pos += 6
            elif kind == 0x43:  # C
                if len(buf) - pos < 6 + value:
                    break
                if not self.left:
                    raise ProtocolError("a C frame outside a window")
                if self.verify or not self.windows_seen:
                    count, json_bytes = data_frames(zlib.decompress(buf[pos + 6:pos + 6 + value]))
                    self.json_events += count
                    self.json_bytes += json_bytes
                    if not self.verify and count != self.left:
                        raise ProtocolError(
                            f"the first window's C frame holds {count} of its {self.left} events left: this "
                            "relay assumes one C frame per window (as go-lumber sends); use --verify-frames")
                    self.left -= count
                else:
                    self.left = 0  # trusted: the window's one C frame holds all of it
                pos += 6 + value
            elif kind == 0x4A:  # J: seq, then the length
                if len(buf) - pos < 10:
                    break
                (length,) = struct.unpack_from(">I", buf, pos + 6)
                if len(buf) - pos < 10 + length:
                    break
                self.left -= 1
                self.json_events += 1
                self.json_bytes += length
                pos += 10 + length
            else:
                raise ProtocolError(f"unexpected frame {bytes(buf[pos:pos + 2])!r}")
            if self.left < 0:
                raise ProtocolError("more events than the window announced")
            if self.size and not self.left:
                sizes.append(self.size)
                self.windows_seen += 1
                self.size = 0
                done = pos
        out = bytes(buf[:done])
        del buf[:done]
        self.pos = pos - done
        return out, sizes


class Relay:
    """Forwards whole windows from the senders to the daemon and counts their final ACKs.

    Without a daemon (``daemon_port`` None, ``--receiver null``) it answers each whole
    window itself at once: what the senders alone can send on this machine."""

    def __init__(self, daemon_port: int | None, verify_frames: bool = False) -> None:
        self.daemon_port = daemon_port
        self.verify_frames = verify_frames
        self.cut = False  # stop forwarding: the load is over
        self.acked_events = 0
        self.windows = 0
        self.keepalives = 0
        self.ack_latencies: list[float] = []  # s from a whole window forwarded to its final ACK
        self.forwarded_events = 0
        self.forwarded_bytes = 0  # on the wire
        self.json_bytes = 0  # of the J frames the relay looked into
        self.json_events = 0  # their number
        self.accepted = 0
        self.connections: list[dict] = []
        self.errors: list[str] = []
        self.drained = asyncio.Event()

    def outstanding(self) -> int:
        return sum(len(c["outstanding"]) for c in self.connections)

    def check_drained(self) -> None:
        if self.cut and not self.outstanding():
            self.drained.set()

    async def accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        # Each daemon connection from its own loopback address, like senders on different
        # hosts: with [router] workers the supervisor spreads connections by peer address
        # (the senders cannot choose their source address).
        local = (f"127.0.0.{2 + self.accepted % 250}", 0)
        self.accepted += 1
        if self.daemon_port is None:
            conn = {"outstanding": collections.deque(), "writers": (client_writer,)}
            self.connections.append(conn)
            task = asyncio.ensure_future(self.upstream(client_reader, None, conn, client_writer))
            conn["tasks"] = (task,)
            task.add_done_callback(self.task_done)
            return
        try:
            daemon_reader, daemon_writer = await asyncio.open_connection("127.0.0.1", self.daemon_port, local_addr=local)
        except OSError as e:
            self.errors.append(f"connecting to the daemon: {e!r}")
            client_writer.close()
            return
        conn = {"outstanding": collections.deque(), "sent_at": collections.deque(), "writers": (client_writer, daemon_writer)}
        self.connections.append(conn)
        up = asyncio.ensure_future(self.upstream(client_reader, daemon_writer, conn))
        down = asyncio.ensure_future(self.downstream(daemon_reader, client_writer, conn))
        conn["tasks"] = (up, down)
        for task in (up, down):
            task.add_done_callback(self.task_done)

    def task_done(self, task: asyncio.Future) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(repr(task.exception()))
            self.drained.set()  # wake the waiter: it reports the error

    async def upstream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None, conn: dict,
                       client: asyncio.StreamWriter | None = None) -> None:
        splitter = WindowSplitter(self.verify_frames)
        while not self.cut:
            data = await reader.read(1 << 16)
            if not data or self.cut:
                return  # a sender that ends, or one cut off: what it sent after the cut is dropped
            whole, sizes = splitter.feed(data)
            if whole:
                if writer is None:  # no daemon: each window's final ACK at once
                    client.write(b"".join(struct.pack(">BBI", 0x32, 0x41, size) for size in sizes))
                    self.acked_events += sum(sizes)
                    self.windows += len(sizes)
                    await client.drain()
                    continue
                conn["outstanding"].extend(sizes)
                conn["sent_at"].extend([time.monotonic()] * len(sizes))
                self.forwarded_events += sum(sizes)
                self.forwarded_bytes += len(whole)
                self.json_bytes += splitter.json_bytes
                self.json_events += splitter.json_events
                splitter.json_bytes = splitter.json_events = 0
                writer.write(whole)
                await writer.drain()

    async def downstream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: dict) -> None:
        buffer = b""
        outstanding, sent_at = conn["outstanding"], conn["sent_at"]
        while True:
            data = await reader.read(1 << 16)
            if not data:
                if outstanding:
                    raise ProtocolError(f"the daemon closed a connection with {len(outstanding)} windows unacked")
                return
            writer.write(data)  # the sender gets every ACK as it came
            buffer += data
            end = len(buffer) - len(buffer) % 6
            for pos in range(0, end, 6):
                version, kind, seq = struct.unpack_from(">BBI", buffer, pos)
                if (version, kind) != (0x32, 0x41):
                    raise ProtocolError(f"unexpected reply {buffer[pos:pos + 6]!r}")
                if seq == 0:
                    self.keepalives += 1
                    continue
                if not outstanding or seq > outstanding[0]:
                    raise ProtocolError(f"ACK {seq} for no window in flight ({list(outstanding)[:3]})")
                if seq == outstanding[0]:  # the window's final ACK; a smaller one is partial
                    self.acked_events += outstanding.popleft()
                    self.windows += 1
                    self.ack_latencies.append(time.monotonic() - sent_at.popleft())
            buffer = buffer[end:]
            self.check_drained()

    def close(self) -> None:
        for conn in self.connections:
            for task in conn.get("tasks", ()):
                task.cancel()
            for writer in conn["writers"]:
                writer.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def expvar_acked(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/vars", timeout=5) as r:
        return int(json.load(r)["ACKed"])


def proc_cpu_secs(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Load:
    """The senders and the relay for one run; what they counted."""

    def __init__(self, binary: Path, daemon_port: int, args: argparse.Namespace, workdir: Path) -> None:
        self.name = args.sender
        self.binary, self.daemon_port, self.args, self.workdir = binary, daemon_port, args, workdir
        self.senders: list[tuple[subprocess.Popen, int]] = []
        self.sender_acked = 0
        self.sender_cpu = 0.0
        self.relay_cpu = 0.0
        self.relay: Relay | None = None

    def sender_argv(self, relay_port: int, http_port: int) -> list[str]:
        a = self.args
        argv = [str(self.binary), "-c", f"127.0.0.1:{relay_port}", "-batch", str(a.batch),
                "-pipeline", str(a.pipelining), "-compress", str(a.compress), "-httpprof", f"127.0.0.1:{http_port}"]
        if a.sender == "lumber-send":
            argv += ["-event", a.event]
        return argv

    def sender_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("GOMAXPROCS", None)  # 0 means Go's own default, whatever the caller's environment says
        if self.args.go_procs:
            env["GOMAXPROCS"] = str(self.args.go_procs)
        return env

    async def run(self) -> float:
        relay = self.relay = Relay(self.daemon_port, self.args.verify_frames)
        server = await asyncio.start_server(relay.accept, "127.0.0.1", 0)
        relay_port = server.sockets[0].getsockname()[1]
        cpu0 = time.process_time()
        start = time.monotonic()
        try:
            for i in range(self.args.senders):
                http_port = free_port()
                log = open(self.workdir / f"{self.name}-{i}.log", "wb")
                proc = subprocess.Popen(self.sender_argv(relay_port, http_port), stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT, env=self.sender_env())
                log.close()
                self.senders.append((proc, http_port))
            await asyncio.sleep(self.args.seconds)
            relay.cut = True
            server.close()
            relay.check_drained()
            try:
                await asyncio.wait_for(relay.drained.wait(), DRAIN_TIMEOUT)
            except asyncio.TimeoutError:
                raise SystemExit(f"{relay.outstanding()} windows still unacked {DRAIN_TIMEOUT:.0f}s after the cut")
            if relay.errors:
                raise SystemExit("relay failed: " + "; ".join(relay.errors))
            elapsed = time.monotonic() - start
            self.relay_cpu = time.process_time() - cpu0
            # a sender counts an ACK after it read it: give its counters a moment to catch up
            deadline = time.monotonic() + EXPVAR_TIMEOUT
            while True:
                self.sender_acked = sum([await asyncio.to_thread(expvar_acked, port) for _, port in self.senders])
                if self.sender_acked == relay.acked_events or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            self.sender_cpu = sum(proc_cpu_secs(proc.pid) for proc, _ in self.senders)
            return elapsed
        finally:
            relay.cut = True
            server.close()
            relay.close()  # at a window boundary: the daemon sees each connection end cleanly
            self.stop_senders()

    def stop_senders(self) -> None:
        for proc, _ in self.senders:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.senders:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def logs(self) -> str:
        return "".join(
            f"--- {self.name} {i}:\n" + (self.workdir / f"{self.name}-{i}.log").read_text(errors="replace")[-2000:]
            for i in range(len(self.senders))
        )


def config_text(args: argparse.Namespace) -> str:
    # The senders send one batch again and again: with keys (the filebeat events have all of
    # "auto"'s fields) every copy after the first would be acked as a resend and not stored.
    return source_to_lake("beats", "lumberjack", args.durability, workers=args.workers, tag=args.tag,
                          idempotency_key="off")


def show_row(lake: Path) -> None:
    """The lake's columns and the first row of its first file."""
    import pyarrow.dataset as ds

    dataset = ds.dataset(str(lake), partitioning="hive")
    print(f"  lake columns: {', '.join(f'{field.name} ({field.type})' for field in dataset.schema)}")
    rows = dataset.head(1).to_pylist()
    if rows:
        print("  first row: " + json.dumps(rows[0], default=str, ensure_ascii=False))


def null_receiver(binary: Path, args: argparse.Namespace) -> None:
    """The senders against no daemon: the relay acks every whole window as it arrives."""
    with tempfile.TemporaryDirectory(prefix="logrouter-bench-") as tmp:
        load = Load(binary, None, args, Path(tmp))  # type: ignore[arg-type]
        try:
            elapsed = asyncio.run(load.run())
        except BaseException:
            sys.stdout.write(load.logs())
            raise
        relay = load.relay
        acked = relay.acked_events
        million = acked / 1e6 if acked else float("nan")
        print(f"receiver=null senders={args.senders} ({args.sender} -batch {args.batch} -pipeline {args.pipelining} "
              f"-compress {args.compress}, GOMAXPROCS={args.go_procs or 'default'}) event={args.event}")
        print(f"  {acked / elapsed:,.0f} events/s acked by this script ({acked:,} events, {relay.windows:,} windows "
              f"in {elapsed:.1f}s; {args.sender} counted {load.sender_acked:,})")
        print(f"  senders' CPU {load.sender_cpu:,.1f} s ({load.sender_cpu / million:,.2f} s per million), "
              f"relay CPU {load.relay_cpu:,.1f} s ({load.relay_cpu / million:,.2f} s per million)")
        if load.sender_acked != acked:
            print(f"  {args.sender}'s ACKed counters ({load.sender_acked:,}) differ from the relay's count")
            sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20, help="how long the senders send")
    parser.add_argument("--sender", default="tst-send", choices=sorted(SENDERS),
                        help="the load generator: go-lumber's tst-send (reflection JSON per window) or "
                             "bench/lumber_send (events pre-encoded, as Beats' own encoder hands them over)")
    parser.add_argument("--senders", type=int, default=4, help="sender processes (one connection each)")
    parser.add_argument("--go-procs", type=int, default=1,
                        help="GOMAXPROCS of each sender process (0: Go's default, one per core). Each sender has "
                             "one connection; with the default, 4 senders on 2 cores spent 20-45%% more CPU per event "
                             "in Go's scheduler and parallel collector")
    parser.add_argument("--batch", type=int, default=2048, help="events per window (Beats' bulk_max_size)")
    parser.add_argument("--pipelining", type=int, default=2, help="-pipeline: windows in flight (Beats' default 2)")
    parser.add_argument("--compress", type=int, default=3, help="zlib level of the C frame (Beats' default 3)")
    parser.add_argument("--durability", default="fsync", choices=["fsync", "os", "none"])
    parser.add_argument("--workers", type=int, default=1, help="[router] workers (written only when not 1)")
    parser.add_argument("--event", default="flat", choices=EVENT_SHAPES,
                        help="the events' shape: flat (tst-send's, ~165 bytes) or filebeat (Filebeat 8 filestream "
                             "events with nested objects, ~1 KB; lumber-send only)")
    parser.add_argument("--tag", help="the source's tag option (default: beats.${type} for flat events, "
                                      "beats.${@metadata.beat} for filebeat ones)")
    parser.add_argument("--receiver", default="logrouter", choices=["logrouter", "null"],
                        help="null: no daemon, this script acks each whole window at once (the senders' own ceiling "
                             "on this machine, and their CPU per million events)")
    parser.add_argument("--show-row", action="store_true", help="print the lake's columns and its first row at the end")
    parser.add_argument("--verify-frames", action="store_true",
                        help="inflate every C frame and count its J frames (default: only each connection's first)")
    args = parser.parse_args()
    if not (0 < args.seconds <= 3600 and 0 < args.senders <= 64 and args.pipelining >= 1 and args.go_procs >= 0):
        raise SystemExit("--seconds must be in (0, 3600], --senders in 1..64, --pipelining at least 1, "
                         "--go-procs at least 0")
    if args.event != "flat" and args.sender != "lumber-send":
        raise SystemExit(f"--event {args.event} needs --sender lumber-send: {args.sender} sends only flat events")
    if args.tag is None:
        args.tag = DEFAULT_TAGS[args.event]
    binary, why = SENDERS[args.sender].ensure_built_with_reason()
    if binary is None:
        raise SystemExit(why)
    if args.receiver == "null":
        if args.workers != 1 or args.show_row or args.durability != "fsync":
            raise SystemExit("--receiver null starts no daemon: --workers, --durability and --show-row do not apply")
        null_receiver(binary, args)
        return
    with tempfile.TemporaryDirectory(prefix="logrouter-bench-") as tmp:
        workdir = Path(tmp)
        proc, port, metrics_port, lines = launch(workdir, config_text(args), "beats")
        load = Load(binary, port, args, workdir)
        try:
            run = measure(workdir, proc, metrics_port, lambda: asyncio.run(load.run()))
        except BaseException:
            sys.stdout.write("".join(lines[-40:]) + load.logs())
            raise
        relay = load.relay
        acked, elapsed, rows = relay.acked_events, run.elapsed, run.rows
        workers = f" workers={args.workers}" if args.workers != 1 else ""
        per_event = relay.json_bytes / relay.json_events if relay.json_events else float("nan")
        per_window = relay.forwarded_bytes / relay.forwarded_events * args.batch if relay.forwarded_events else float("nan")
        print(f"durability={args.durability} senders={args.senders} ({args.sender} -batch {args.batch} "
              f"-pipeline {args.pipelining} -compress {args.compress}, GOMAXPROCS={args.go_procs or 'default'}) event={args.event}{workers} "
              f"(window ~{per_window:,.0f} bytes on the wire, ~{per_event:.0f} bytes/event as JSON)")
        print(f"  {acked / elapsed:,.0f} events/s acked ({acked:,} events, {relay.windows:,} windows in {elapsed:.1f}s; "
              f"{args.sender} counted {load.sender_acked:,}; {relay.keepalives} keepalive ACKs)")
        print(run.end_to_end_line(rows))
        print(run.cpu_line(rows))
        print(f"  {run.fsyncs / elapsed:,.1f} fsyncs/s, peak RSS {run.rss_mb:,.0f} MiB, "
              f"graceful stop {run.stop_secs:.1f}s (exit {run.exit_code})")
        print(run.sink_line())
        if relay.ack_latencies:
            ordered = sorted(relay.ack_latencies)
            at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3  # noqa: E731
            print(f"  window ack latency (forwarded to final ACK, at the relay): median {at(0.5):.1f} ms, "
                  f"p90 {at(0.9):.1f} ms, p99 {at(0.99):.1f} ms, max {ordered[-1] * 1e3:.1f} ms")
        million = acked / 1e6 if acked else float("nan")
        checked = "every C frame inflated" if args.verify_frames else "first window per connection inflated"
        print(f"  senders' CPU {load.sender_cpu:,.1f} s ({load.sender_cpu / million:,.2f} s per million), "
              f"relay CPU {load.relay_cpu:,.1f} s ({load.relay_cpu / million:,.2f} s per million; "
              f"this script, {checked})")
        print(f"  lake rows {rows:,} ({'matches' if rows == acked else 'MISMATCH with'} acked events)")
        if args.show_row:
            show_row(workdir / "lake")
        if rows != acked or load.sender_acked != acked or not run.clean_stop:
            if load.sender_acked != acked:
                print(f"  {args.sender}'s ACKed counters ({load.sender_acked:,}) differ from the relay's count")
            sys.stdout.write("".join(lines[-40:]) + load.logs())
            sys.exit(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""logjam → Parquet load benchmark: a device's PUB stream and DEALER agents into the lake.

It starts its own daemon (``twistd -n logrouter``) on loopback with a temporary spool and
lake (``logjam`` source → ``parquet`` sink, ``durability = "fsync"`` by default), once per
mode, and drives it with Rails-like logjam request logs (a JSON body: action, started_at,
started_ms, total_time, code, severity, a 32-hex request_id, timings, a few log lines;
snappy by default, ``--compression``). A pool of messages is encoded once; each send only
appends a fresh sequence number to the meta-info frame's first 16 bytes (the sequence is
its last 8), so the generator costs little.

* ``--mode sub``: the benchmark binds a pyzmq PUB socket on 127.0.0.1 and the source
  ``connect``s to it, as the importer reads a logjam-device. Heartbeats of device
  ``--device`` (sequence counting up) beat the slow joiner: they go out until the daemon's
  ``logrouter_source_heartbeats_total`` > 0. Then messages are published as fast as one
  Python thread can for ``--seconds`` (same device, the sequence counting on per message),
  the benchmark waits until the source took the last one it will get, and a trailing
  heartbeat makes a gap at the very end visible. PUB cannot wait: what the daemon cannot
  take is dropped by ZeroMQ, so the high-water marks are set high (``--sndhwm`` on the
  PUB, the source's ``receive_hwm``), so the figure is the source's rate, not its drops.
  The check: rows in the lake + ``logrouter_logjam_lost_messages_total`` (less any
  trailing heartbeat lost, normally 0) == messages published.
* ``--mode router``: ``--agents`` DEALER sockets (one thread, a ``zmq.Poller``) send
  request-reply messages (empty first frame + the 4 frames) to the source's
  ``listen_router``, each keeping ``--in-flight`` messages unanswered, and count the
  ``202 Accepted`` replies (sent only once the batch is durable). The check: rows in the
  lake == messages accepted.

Each run reports events/s, the daemon's CPU seconds per million events (utime + stime of
``/proc/<pid>/stat`` around the load), its peak RSS (VmHWM), fsyncs/s, and for ``sub`` the
lost messages and the drop share. The daemon is stopped with SIGTERM at the end (also on
errors), then the lake is read back with pyarrow. Exit 1 if a check fails.

Run by hand, e.g. ``.venv/bin/python bench/logjam_load.py --seconds 10`` (both modes).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forward_load import launch, measure, source_to_lake  # noqa: E402

from logrouter.wire import logjam as lj  # noqa: E402

SOURCE = "jam"
# launch() looks for rf"source {source} listening on \S+ port (\d+)" in the daemon's log and
# gives up without it; the logjam source logs "logjam source jam: ROUTER socket bound to
# tcp://127.0.0.1:PORT" ("SUB socket connected to …") instead. So the name handed to it is
# a pattern for that line, ending in a regex comment "(?#" that swallows the rest of launch's.
PORT_LINE = rf"{SOURCE}: \S+ socket (?:bound|connected) to tcp://127\.0\.0\.1:(\d+)(?#"
COMPRESSIONS = {"none": lj.NONE, "zlib": lj.ZLIB_COMPRESSION, "snappy": lj.SNAPPY, "lz4": lj.LZ4}
APPS = (("shop", 6), ("api", 3), ("admin", 1))  # app, weight; env is always production
ACTIONS = (
    ("ProductsController#show", "GET", "/products/%d"),
    ("ProductsController#index", "GET", "/products?page=%d"),
    ("CartsController#update", "PATCH", "/cart/items/%d"),
    ("OrdersController#create", "POST", "/orders"),
    ("Api::V2::ItemsController#show", "GET", "/api/v2/items/%d"),
    ("SessionsController#create", "POST", "/login"),
)
HEARTBEATS = "logrouter_source_heartbeats_total"
MESSAGES = "logrouter_source_messages_total"
LOST = "logrouter_logjam_lost_messages_total"
DUPLICATES = "logrouter_logjam_duplicates_total"
RESTARTS = "logrouter_logjam_restarts_total"
DROPPED = "logrouter_logjam_dropped_messages_total"
WAIT_SECS = 30  # bound of every wait for the daemon (a heartbeat, a reply, a quiet source)


def request_body(i: int, rng: random.Random, now_ms: int) -> dict:
    """A Rails request log as logjam-agent sends it (fields trimmed to the usual ones)."""
    action, method, path = ACTIONS[i % len(ACTIONS)]
    started_ms = now_ms - rng.randrange(5000)
    total = round(rng.lognormvariate(3.3, 0.9), 3)
    db = round(total * rng.uniform(0.1, 0.6), 3)
    view = round((total - db) * rng.uniform(0.2, 0.8), 3)
    code = rng.choices((200, 201, 302, 404, 500), (80, 5, 8, 5, 2))[0]
    severity = 3 if code >= 500 else 2 if code == 404 else 1
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started_ms / 1000)) + "+00:00"
    url = path % rng.randrange(1, 100000) if "%d" in path else path
    request_id = "%032x" % rng.getrandbits(128)
    return {
        "action": action,
        "started_at": started_at,
        "started_ms": started_ms,
        "total_time": total,
        "db_time": db,
        "db_calls": rng.randrange(1, 40),
        "view_time": view,
        "gc_time": round(total * 0.03, 3),
        "allocated_objects": rng.randrange(2000, 200000),
        "code": code,
        "severity": severity,
        "caller_id": "",
        "caller_action": "",
        "request_id": request_id,
        "host": "app-%02d" % (i % 12),
        "ip": "10.%d.%d.%d" % (i % 4, i % 200, 1 + i % 250),
        "process_id": 20000 + i % 64,
        "user_id": rng.randrange(1, 10**6),
        "lines": [
            [1, started_at, f"Started {method} \"{url}\" for 10.0.{i % 200}.{i % 250}"],
            [1, started_at, f"Processing by {action} as HTML"],
            [severity, started_at, f"Completed {code} in {total}ms (Views: {view}ms | ActiveRecord: {db}ms)"],
        ],
        "request_info": {"method": method, "url": url, "query_parameters": {}},
    }


def message_pool(size: int, compression: int, device: int, seed: int = 11) -> list[tuple[bytes, bytes, bytes, bytes]]:
    """``size`` encoded messages: (app-env, topic, compressed body, meta-info without its
    sequence); a sender appends the 8-byte sequence."""
    rng = random.Random(seed)
    now_ms = int(time.time() * 1000)
    apps = [app for app, weight in APPS for _ in range(weight)]
    pool = []
    for i in range(size):
        app = apps[i % len(apps)]
        body = request_body(i, rng, now_ms)
        meta = lj.Meta(compression=compression, device=device, created_ms=body["started_ms"], sequence=0)
        stream, topic, blob, meta_frame = lj.encode_message(app, "production", "logs", body, meta)
        pool.append((stream, topic, blob, meta_frame[:-8]))
    return pool


def scrape(metrics_port: int) -> dict[str, float]:
    """Every sample of /metrics summed over its labels, by name."""
    totals: dict[str, float] = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14, 15 of stat


class Stats:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.published = 0  # sub: data messages published; router: sent
        self.acked = 0  # router: 202 replies
        self.bad = 0  # router: other replies
        self.taken = 0  # the source's messages_total over the run
        self.lost = 0  # sub: lost messages less lost trailing heartbeats
        self.lost_heartbeats = 0
        self.duplicates = self.restarts = self.dropped = 0
        self.send_secs = 0.0  # how long the generator sent
        self.intake_secs = 0.0  # first send to the source's last message taken (sub) / last reply (router)
        self.cpu = 0.0  # daemon CPU seconds over the load
        self.generator_cpu = 0.0  # this process's CPU seconds over the load


def on_error_stop(proc: subprocess.Popen, drive):
    """``drive`` for ``measure``; if it fails, SIGTERM the daemon (measure's cleanup would SIGKILL it)."""

    def run() -> float:
        try:
            return drive()
        except BaseException:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    pass
            raise

    return run


def config(durability: str, receive_hwm: int, **endpoints) -> str:
    text = source_to_lake(SOURCE, "logjam", durability, receive_hwm=receive_hwm, **endpoints)
    listen = '\nlisten = "tcp:0:interface=127.0.0.1"\n'  # stream sources' key; logjam has connect/listen_router
    assert listen in text
    return text.replace(listen, "\n")


# --- sub: a device's PUB ---------------------------------------------------------------------


class Sampler:
    """Polls the source's messages counter (every ``interval``) to see when intake ended."""

    def __init__(self, metrics_port: int, interval: float = 0.2) -> None:
        self.metrics_port, self.interval = metrics_port, interval
        self.value, self.changed_at = 0.0, time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            value = scrape(self.metrics_port).get(MESSAGES, 0.0)
            if value != self.value:
                self.value, self.changed_at = value, time.monotonic()


def drive_sub(pub: zmq.Socket, endpoint: str, pid: int, metrics_port: int, args: argparse.Namespace, stats: Stats) -> float:
    device = args.device
    sequence = itertools.count(1)

    def heartbeat() -> None:
        pub.send_multipart(lj.encode_heartbeat(endpoint, device, next(sequence), int(time.time() * 1000)))

    # The slow joiner: a PUB drops everything until the SUB's subscription reached it.
    give_up = time.monotonic() + WAIT_SECS
    while scrape(metrics_port).get(HEARTBEATS, 0) == 0:
        if time.monotonic() > give_up:
            raise RuntimeError(f"no heartbeat reached the daemon in {WAIT_SECS}s")
        heartbeat()
        time.sleep(0.05)
    time.sleep(0.3)  # the few heartbeats sent meanwhile arrive (nothing is queued yet)
    before = scrape(metrics_port)

    pool = message_pool(args.pool, COMPRESSIONS[args.compression], device)
    sampler = Sampler(metrics_port)
    sampler.value = before.get(MESSAGES, 0.0)
    send = pub.send_multipart
    cpu_before, gen_before = cpu_seconds(pid), time.process_time()
    start = sampler.changed_at = time.monotonic()
    sampler.thread.start()
    deadline = start + args.seconds
    published = 0
    messages = itertools.cycle(pool)
    try:
        while published < args.max_messages and time.monotonic() < deadline:
            for _ in range(1000):
                stream, topic, body, meta = next(messages)
                send([stream, topic, body, meta + next(sequence).to_bytes(8, "big")])
            published += 1000
        stats.send_secs = time.monotonic() - start
        stats.published = published
        # Wait until the source took all it will (its counter quiet for a second), then
        # a heartbeat after the last message shows a gap at the very end, if any.
        give_up = time.monotonic() + max(WAIT_SECS, 10 * args.seconds)
        while time.monotonic() - sampler.changed_at < 1.0:
            if time.monotonic() > give_up:
                raise RuntimeError("the source did not go quiet after the load")
            time.sleep(0.1)
    finally:
        sampler.stop.set()
        sampler.thread.join()
    stats.intake_secs = max(sampler.changed_at - start, 1e-6)
    stats.cpu = cpu_seconds(pid) - cpu_before
    stats.generator_cpu = time.process_time() - gen_before
    trailing = 0
    give_up = time.monotonic() + WAIT_SECS
    while scrape(metrics_port).get(HEARTBEATS, 0) <= before.get(HEARTBEATS, 0):
        if time.monotonic() > give_up:
            raise RuntimeError(f"no trailing heartbeat reached the daemon in {WAIT_SECS}s")
        heartbeat()
        trailing += 1
        time.sleep(0.1)
    time.sleep(0.3)
    after = scrape(metrics_port)
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    stats.taken = int(delta.get(MESSAGES, 0))
    stats.lost_heartbeats = trailing - int(delta.get(HEARTBEATS, 0))
    stats.lost = int(delta.get(LOST, 0)) - stats.lost_heartbeats
    stats.duplicates = int(delta.get(DUPLICATES, 0))
    stats.restarts = int(delta.get(RESTARTS, 0))
    stats.dropped = int(delta.get(DROPPED, 0))
    return stats.intake_secs


def run_sub(args: argparse.Namespace) -> bool:
    stats = Stats("sub")
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    try:
        pub.setsockopt(zmq.SNDHWM, args.sndhwm)
        pub.setsockopt(zmq.LINGER, 0)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
        with tempfile.TemporaryDirectory(prefix="logrouter-bench-") as tmp:
            workdir = Path(tmp)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc, _, metrics_port, lines = launch(workdir, config(args.durability, args.receive_hwm, connect=[endpoint]), PORT_LINE)
            run = measure(workdir, proc, metrics_port,
                          on_error_stop(proc, lambda: drive_sub(pub, endpoint, proc.pid, metrics_port, args, stats)))
            life_cpu = cpu_since(children)
    finally:
        pub.close(0)
        context.term()
    ok = run.rows + stats.lost == stats.published and run.rows == stats.taken and run.clean_stop
    lost_share = stats.lost / stats.published if stats.published else 0.0
    print(f"sub: PUB → SUB connect, compression={args.compression} durability={args.durability} "
          f"sndhwm={args.sndhwm:,} receive_hwm={args.receive_hwm:,} ({body_note(args)})")
    print(f"  published {stats.published:,} in {stats.send_secs:.1f}s ({stats.published / stats.send_secs:,.0f}/s, "
          f"generator CPU {stats.generator_cpu:.1f}s)")
    print(f"  {stats.taken / stats.intake_secs:,.0f} events/s taken by the source ({stats.taken:,} in {stats.intake_secs:.1f}s, "
          f"first publish to last message taken)")
    print(f"  lost {stats.lost:,} ({lost_share:.2%} of published), duplicates {stats.duplicates}, restarts {stats.restarts}, "
          f"dropped as bad {stats.dropped}, trailing heartbeats lost {stats.lost_heartbeats}")
    report_daemon(stats, run, stats.taken, life_cpu)
    print(f"  lake rows {run.rows:,} + lost {stats.lost:,} = {run.rows + stats.lost:,} "
          f"({'matches' if ok else 'MISMATCH with'} published {stats.published:,}; source took {stats.taken:,})")
    if not ok:
        sys.stdout.write("".join(lines[-40:]))
    return ok


# --- router: DEALER agents ---------------------------------------------------------------------


def drive_router(endpoint: str, pid: int, args: argparse.Namespace, stats: Stats) -> float:
    """``--agents`` DEALER sockets driven from one thread with a ``zmq.Poller``: each keeps
    ``--in-flight`` messages unanswered and sends the next one per reply. (zmq.asyncio
    agents cost the generator about 3 times the CPU per message here and halved the
    figure on 2 shared cores.)"""
    pool = message_pool(args.pool, COMPRESSIONS[args.compression], 0)  # agents: device 0
    context = zmq.Context()
    poller = zmq.Poller()
    agents: dict[zmq.Socket, list] = {}  # socket -> [in flight, its messages, its sequence]
    try:
        for k in range(args.agents):
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            poller.register(sock, zmq.POLLIN)
            offset = k * len(pool) // args.agents
            agents[sock] = [0, itertools.islice(itertools.cycle(pool), offset, None), itertools.count(1)]
        budget = args.max_messages

        def send(sock: zmq.Socket) -> None:
            nonlocal budget
            agent = agents[sock]
            stream, topic, body, meta = next(agent[1])
            sock.send_multipart([b"", stream, topic, body, meta + next(agent[2]).to_bytes(8, "big")])
            agent[0] += 1
            budget -= 1
            stats.published += 1

        cpu_before, gen_before = cpu_seconds(pid), time.process_time()
        start = time.monotonic()
        deadline = start + args.seconds
        for sock in agents:
            for _ in range(args.in_flight):
                send(sock)
        while any(agent[0] for agent in agents.values()):
            ready = dict(poller.poll(WAIT_SECS * 1000))
            if not ready:
                in_flight = sum(agent[0] for agent in agents.values())
                raise RuntimeError(f"no reply in {WAIT_SECS}s ({in_flight} in flight)")
            for sock in ready:
                for _ in range(args.in_flight):  # at most what this agent has in flight
                    try:
                        reply = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    agents[sock][0] -= 1
                    if reply[-1] == lj.ACCEPTED:
                        stats.acked += 1
                    else:
                        stats.bad += 1
                    if budget > 0 and time.monotonic() < deadline:
                        send(sock)
        stats.intake_secs = stats.send_secs = time.monotonic() - start
        stats.cpu = cpu_seconds(pid) - cpu_before
        stats.generator_cpu = time.process_time() - gen_before
    finally:
        for sock in agents:
            sock.close(0)
        context.term()
    return stats.intake_secs


def run_router(args: argparse.Namespace) -> bool:
    stats = Stats("router")
    with tempfile.TemporaryDirectory(prefix="logrouter-bench-") as tmp:
        workdir = Path(tmp)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc, port, metrics_port, lines = launch(
            workdir, config(args.durability, args.receive_hwm, listen_router="tcp://127.0.0.1:*"), PORT_LINE)
        endpoint = f"tcp://127.0.0.1:{port}"
        run = measure(workdir, proc, metrics_port, on_error_stop(proc, lambda: drive_router(endpoint, proc.pid, args, stats)))
        life_cpu = cpu_since(children)
    ok = run.rows == stats.acked and stats.bad == 0 and run.clean_stop
    print(f"router: {args.agents} DEALER agents × {args.in_flight} in flight, compression={args.compression} "
          f"durability={args.durability} ({body_note(args)})")
    print(f"  {stats.acked / stats.intake_secs:,.0f} events/s acked (202 Accepted: {stats.acked:,} in {stats.intake_secs:.1f}s, "
          f"{stats.bad} other replies; generator CPU {stats.generator_cpu:.1f}s)")
    report_daemon(stats, run, stats.acked, life_cpu)
    print(f"  lake rows {run.rows:,} ({'matches' if run.rows == stats.acked else 'MISMATCH with'} acked)")
    if not ok:
        sys.stdout.write("".join(lines[-40:]))
    return ok


# --- both ------------------------------------------------------------------------------------


def cpu_since(before: resource.struct_rusage) -> float:
    """CPU seconds of the children reaped since ``before`` (here: the one daemon, start to exit)."""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def body_note(args: argparse.Namespace) -> str:
    pool = message_pool(min(args.pool, 200), COMPRESSIONS[args.compression], 1)
    raw = sum(len(json.dumps(request_body(i, random.Random(i), 0), separators=(",", ":"))) for i in range(200)) / 200
    sent = sum(len(body) for _, _, body, _ in pool) / len(pool)
    return f"~{raw:.0f} bytes of JSON/body, ~{sent:.0f} as sent"


def report_daemon(stats: Stats, run, events: int, life_cpu: float) -> None:
    per_m = stats.cpu / events * 1e6 if events else float("nan")
    life_per_m = life_cpu / events * 1e6 if events else float("nan")
    print(f"  daemon CPU {stats.cpu:.1f}s during the load = {per_m:.1f} CPU s per million events "
          f"({life_cpu:.1f}s = {life_per_m:.1f} s/M over its whole life, start-up and stop included)")
    print(run.end_to_end_line(run.rows))
    print(run.cpu_line(run.rows))
    print(f"  {run.fsyncs / run.elapsed:,.1f} fsyncs/s, peak RSS {run.rss_mb:,.0f} MiB, "
          f"graceful stop {run.stop_secs:.1f}s (exit {run.exit_code})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="both", choices=["sub", "router", "both"])
    parser.add_argument("--seconds", type=float, default=10, help="sending time per mode")
    parser.add_argument("--compression", default="snappy", choices=sorted(COMPRESSIONS))
    parser.add_argument("--durability", default="fsync", choices=["fsync", "os", "none"])
    parser.add_argument("--pool", type=int, default=1024, help="distinct messages encoded up front")
    parser.add_argument("--max-messages", type=int, default=50_000_000, help="bound on messages sent per mode")
    parser.add_argument("--device", type=int, default=7, help="sub: the device number published as")
    parser.add_argument("--sndhwm", type=int, default=2_000_000, help="sub: the PUB's SNDHWM (messages)")
    parser.add_argument("--receive-hwm", type=int, default=100_000, help="the source's receive_hwm")
    parser.add_argument("--agents", type=int, default=8, help="router: DEALER agents")
    parser.add_argument("--in-flight", type=int, default=64, help="router: unanswered messages per agent")
    args = parser.parse_args()
    ok = True
    if args.mode in ("sub", "both"):
        ok = run_sub(args) and ok
    if args.mode in ("router", "both"):
        ok = run_router(args) and ok
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()

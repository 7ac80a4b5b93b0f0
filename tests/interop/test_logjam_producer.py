"""The real logjam producer into the real daemon: logjam-tools' Go ``http-forwarder``.

The forwarder (``tests/logjam_forwarder.py``, built from logjam-tools' sources) takes logs
over HTTP and publishes them on its ZeroMQ PUB socket as a logjam device, heartbeats
every 5 s included; the daemon's ``logjam`` source subscribes to it (``connect``) and
lands them in a parquet lake. Every log posted must be in the lake exactly once, under
``logjam.<app>.<env>``, with the forwarder's device id and topic, and no gap, duplicate
or restart counted for the device. Once the SUB has heard a heartbeat (ZeroMQ's slow
joiner) nothing is lost on loopback, so lost must be 0. Three logs in four are posted
compressed (``Content-Encoding`` zlib, snappy, lz4: published as they came, with
compression 1, 2, 3 in the meta), and two more runs have the forwarder compress the rest
itself (``-x zlib``, ``-x snappy``: Go's encoders, used when the result is smaller).

Beyond that: what each ``-x`` option publishes (read with a plain SUB and our codec);
the forwarder restarted on its port (its sequence starts again from 1: one restart
counted, nothing lost); an overrun, the router held back by a full spool while the
forwarder publishes far more than every queue and socket buffer between them can hold
(the PUB drops), counted as exactly the sequence numbers the router never saw; and its
frames relayed unchanged into the source's ROUTER and PULL endpoints (the forwarder
itself only binds a PUB socket: nothing in it can connect to a device).

Skipped, with the reason, when the forwarder cannot be built (no Go, no logjam-tools
tarball in the peers folder, no ``libzmq3-dev``); set
``LOGROUTER_LOGJAM_FORWARDER_BIN`` to an ``http-forwarder`` binary to run it anyway.
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import threading
import time

import pytest
import zmq

from daemon import Daemon
from helpers import read_lake, wait_until
from logjam_forwarder import HEARTBEAT_SECS, Forwarder, ensure_built_with_reason, free_ports
from logrouter.wire import logjam as wire

pytestmark = pytest.mark.timeout(600)  # the first test may build the forwarder (480 s budget)

APP, ENV = "shop", "prod"
DEVICE_ID = 7
N = 200
PADDING = "GET /products/42 HTTP/1.1 " * 8  # compressible, so -x zlib/snappy is used
ENCODINGS = [None, "zlib", "snappy", "lz4"]  # Content-Encoding of log n: ENCODINGS[n % 4]


CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.lj]
type = "logjam"
connect = ["{endpoint}"]

[sinks.lake]
type = "parquet"
inputs = ["lj"]
path = "lake"
roll_secs = 0.5
"""


def metric(daemon: Daemon, name: str, **labels: str) -> float:
    """The sum of a counter's samples whose labels include ``labels`` (as in test_e2e_logjam)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return sum(v for k, v in daemon.metrics().items() if k.startswith(name + "{") and wanted in k)


@pytest.fixture(scope="module")
def forwarder_binary():
    binary, why = ensure_built_with_reason()
    if binary is None:
        pytest.skip(why)
    return binary


@pytest.mark.parametrize("compress", [None, "zlib", "snappy"], ids=["plain", "zlib", "snappy"])
def test_forwarder_logs_into_the_lake_exactly_once(tmp_path, forwarder_binary, compress) -> None:
    with Forwarder(forwarder_binary, device_id=DEVICE_ID, compress=compress, workdir=tmp_path / "fwd") as fwd:
        (tmp_path / "router").mkdir()
        with Daemon(tmp_path / "router", CONFIG.format(endpoint=fwd.pub_endpoint)) as daemon:
            daemon.start()
            # Slow joiner: the SUB has joined once it hears one of the forwarder's own
            # heartbeats (every 5 s); nothing is posted before that.
            wait_until(
                lambda: metric(daemon, "logrouter_source_heartbeats_total") > 0,
                6 * HEARTBEAT_SECS, "the daemon to hear the forwarder's heartbeat",
            )
            posted = {}
            for n in range(N):
                request_id = f"{APP}-{ENV}-{n:032x}"
                started_ms = 1_700_000_000_000 + n * 1000
                body = {"request_id": request_id, "started_ms": started_ms, "n": n, "path": PADDING}
                assert fwd.post_log(APP, ENV, body, encoding=ENCODINGS[n % 4]) == 202
                posted[request_id] = started_ms

            wait_until(
                lambda: metric(daemon, "logrouter_source_messages_total") >= N, 60, "every log posted",
            )
            device = f"{fwd.pub_endpoint}#{DEVICE_ID}"
            assert metric(daemon, "logrouter_logjam_lost_messages_total", device=device) == 0
            assert metric(daemon, "logrouter_logjam_duplicates_total", device=device) == 0
            assert metric(daemon, "logrouter_logjam_restarts_total", device=device) == 0
            assert metric(daemon, "logrouter_logjam_dropped_messages_total") == 0
            assert metric(daemon, "logrouter_source_messages_total") == N
            daemon.stop_gracefully()
        assert fwd.returncode is None, f"the forwarder died:\n{fwd.output()}"

    rows = read_lake(tmp_path / "router" / "lake")
    counts = collections.Counter(row["request_id"] for row in rows)
    assert [rid for rid, c in counts.items() if c != 1] == []
    assert set(counts) == set(posted)
    assert {row["tag"] for row in rows} == {f"logjam.{APP}.{ENV}"}
    assert {row["logjam_device"] for row in rows} == {DEVICE_ID}
    assert {(row["logjam_app"], row["logjam_env"], row["logjam_topic"]) for row in rows} == {
        (APP, ENV, f"logs.{APP}-{ENV}")
    }
    # the source's sequence numbers are the forwarder's: distinct, past the heartbeat(s)
    sequences = [row["logjam_sequence"] for row in rows]
    assert len(set(sequences)) == N and min(sequences) >= 2
    # the event time is the body's started_ms
    assert {row["request_id"]: round(row["time"].timestamp() * 1000) for row in rows} == posted
    assert {row["path"] for row in rows} == {PADDING}


# -- the forwarder's own output ---------------------------------------------------------------


def sub_socket(context: zmq.Context, endpoint: str) -> zmq.Socket:
    """A SUB to everything on ``endpoint``, no high-water mark; connected before the
    forwarder binds, it joins within ZeroMQ's reconnect interval."""
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def joined(fwd: Forwarder, sub: zmq.Socket, timeout: float = 30) -> None:
    """Post probes until ``sub`` hears one (ZeroMQ's slow joiner), then drain what came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fwd.post_log("probe", "test", {"probe": True})
        if sub.poll(100):
            while sub.poll(200):
                sub.recv_multipart()
            return
    raise AssertionError(f"the SUB did not join {fwd.pub_endpoint} within {timeout}s")


def next_message(sub: zmq.Socket, timeout_ms: int = 10_000) -> list[bytes]:
    """The next message that is not a heartbeat."""
    deadline = time.monotonic() + timeout_ms / 1000
    while time.monotonic() < deadline:
        if sub.poll(100):
            frames = sub.recv_multipart()
            if frames[0] != wire.HEARTBEAT:
                return frames
    raise AssertionError("no message from the forwarder")


@pytest.mark.parametrize("compress", [None, "zlib", "snappy", "lz4"])
def test_what_each_compress_option_publishes(tmp_path, forwarder_binary, compress) -> None:
    """``-x zlib``/``snappy`` compress what comes uncompressed (when that is smaller);
    ``-x lz4`` publishes it as it came (its publisher has no LZ4 encoder); a posted
    ``Content-Encoding`` passes through as is. Our codec reads every one of them."""
    http_port, pub_port = free_ports()
    context = zmq.Context()
    sub = sub_socket(context, f"tcp://127.0.0.1:{pub_port}")
    try:
        with Forwarder(forwarder_binary, device_id=DEVICE_ID, compress=compress, ports=(http_port, pub_port),
                       workdir=tmp_path / "fwd") as fwd:
            joined(fwd, sub)
            body = {"request_id": "r1", "path": PADDING}
            fwd.post_log(APP, ENV, body)
            plain = next_message(sub)
            fwd.post_log(APP, ENV, body, encoding="lz4")
            posted_lz4 = next_message(sub)
    finally:
        sub.close()
        context.term()
    expected = {None: wire.NONE, "zlib": wire.ZLIB_COMPRESSION, "snappy": wire.SNAPPY, "lz4": wire.NONE}[compress]
    for frames, compression in ((plain, expected), (posted_lz4, wire.LZ4)):
        assert frames[:2] == [f"{APP}-{ENV}".encode(), f"logs.{APP}-{ENV}".encode()]
        message = wire.decode_message(frames)
        assert (message.meta.compression, message.meta.device) == (compression, DEVICE_ID)
        assert message.body == body
    assert wire.decode_meta(posted_lz4[3]).sequence == wire.decode_meta(plain[3]).sequence + 1


# -- restarts and overruns on the real daemon -----------------------------------------------


SOURCE_FIRST = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"
workers = 1

[spool]
path = "spool"
{spool}
[sources.lj]
type = "logjam"
connect = ["{endpoint}"]
{source}
[sinks.lake]
type = "parquet"
inputs = ["lj"]
path = "lake"
writer_id = "lj"
roll_secs = 0.5
retry_initial_secs = 0.1
retry_max_secs = 0.5
"""


def counts(daemon: Daemon) -> dict[str, float]:
    values = daemon.metrics()

    def total(name: str) -> float:
        return sum(v for k, v in values.items() if k.startswith(name + "{"))
    return {
        "messages": total("logrouter_source_messages_total"),
        "heartbeats": total("logrouter_source_heartbeats_total"),
        "lost": total("logrouter_logjam_lost_messages_total"),
        "duplicates": total("logrouter_logjam_duplicates_total"),
        "restarts": total("logrouter_logjam_restarts_total"),
        "dropped": total("logrouter_logjam_dropped_messages_total"),
        "paused": values.get("logrouter_sources_paused", 0.0),
    }


def test_a_forwarder_restart_is_counted_as_a_restart_not_a_loss(tmp_path, forwarder_binary) -> None:
    """The router subscribes before the forwarder binds, so it hears the first heartbeat
    (sequence 1) of each run: the second run's 1 after the first run's last number is a
    restart; nothing is lost."""
    http_port, pub_port = free_ports()
    endpoint = f"tcp://127.0.0.1:{pub_port}"
    (tmp_path / "router").mkdir()
    n = 50
    with Daemon(tmp_path / "router", SOURCE_FIRST.format(endpoint=endpoint, spool="", source="")) as daemon:
        daemon.start()
        with Forwarder(forwarder_binary, device_id=DEVICE_ID, ports=(http_port, pub_port), workdir=tmp_path / "fwd") as fwd:
            for run in range(2):
                heard = counts(daemon)["heartbeats"]
                wait_until(lambda: counts(daemon)["heartbeats"] > heard, 6 * HEARTBEAT_SECS,
                           f"run {run}'s first heartbeat")
                for i in range(n):
                    fwd.post_log(APP, ENV, {"request_id": f"{run}-{i}", "run": run})
                wait_until(lambda: counts(daemon)["messages"] == (run + 1) * n, 60, f"run {run}'s logs")
                if run == 0:
                    fwd.restart()
            after = counts(daemon)
        daemon.stop_gracefully()
    assert (after["restarts"], after["lost"], after["duplicates"], after["dropped"]) == (1, 0, 0, 0), after
    rows = read_lake(tmp_path / "router" / "lake")
    assert sorted(row["request_id"] for row in rows) == sorted(f"{r}-{i}" for r in range(2) for i in range(n))
    for run in range(2):  # each run numbered from 1, its heartbeat first
        sequences = sorted(row["logjam_sequence"] for row in rows if row["run"] == run)
        assert sequences[0] >= 2 and len(set(sequences)) == n


OVERRUN_BODY_BYTES = 48_000


def held_at_most(body_bytes: int) -> int:
    """Bytes that may sit between the forwarder's PUB and a router that stopped reading:
    both ZeroMQ queues (``-S 20``, ``receive_hwm = 20``), the receiver's chunks in hand (2
    of at most 8 MiB, ``sources/zmq_receiver.py``) and the loopback TCP buffers at their
    largest (``tcp_wmem`` and ``tcp_rmem`` maxima; 64 MiB if /proc cannot say)."""
    try:
        tcp = sum(int(open(f"/proc/sys/net/ipv4/{name}").read().split()[2]) for name in ("tcp_rmem", "tcp_wmem"))
    except (OSError, IndexError, ValueError):
        tcp = 64 << 20
    return 40 * body_bytes + 2 * (8 << 20) + tcp


def test_an_overrun_is_counted_as_exactly_the_messages_lost(tmp_path, forwarder_binary) -> None:
    """The router stops reading (its sink cannot write, the spool fills) while the
    forwarder publishes a quarter more than everything between them can hold
    (``held_at_most``), so its PUB must drop. Once the sink writes again, what the router
    stored, the heartbeats it heard and the numbers it counted lost add up to every
    sequence number the forwarder used: a second SUB, reading without pause, says which
    was the last."""
    http_port, pub_port = free_ports()
    endpoint = f"tcp://127.0.0.1:{pub_port}"
    (tmp_path / "router").mkdir()
    cfg = SOURCE_FIRST.format(endpoint=endpoint, spool="max_bytes = 262144\nsegment_bytes = 131072\n",
                              source="receive_hwm = 20\n")
    context = zmq.Context()
    observer = sub_socket(context, endpoint)
    last = [0]
    stop = threading.Event()

    def observe() -> None:
        while not stop.is_set():
            if observer.poll(100):
                last[0] = wire.decode_meta(observer.recv_multipart()[3]).sequence
    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    padding = os.urandom(OVERRUN_BODY_BYTES // 2).hex()  # no compressor shrinks it
    posts = held_at_most(OVERRUN_BODY_BYTES) * 5 // 4 // OVERRUN_BODY_BYTES
    try:
        with Daemon(tmp_path / "router", cfg) as daemon:
            daemon.start()
            blocker = tmp_path / "router" / "lake" / "_staging" / "lj"
            blocker.parent.mkdir(parents=True)
            blocker.write_text("the sink cannot stage files until this is removed")
            with Forwarder(forwarder_binary, device_id=DEVICE_ID, ports=(http_port, pub_port), workdir=tmp_path / "fwd",
                           extra_args=["-S", "20"]) as fwd:
                wait_until(lambda: counts(daemon)["heartbeats"] > 0, 6 * HEARTBEAT_SECS, "the first heartbeat")
                conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)

                def post(body: dict) -> None:
                    conn.request("POST", f"/logjam/logs/{APP}/{ENV}", body=json.dumps(body),
                                 headers={"Content-Type": "application/json"})
                    response = conn.getresponse()
                    response.read()
                    assert response.status == 202
                for i in range(posts):
                    post({"request_id": f"o-{i}", "p": padding})
                assert counts(daemon)["paused"] == 1
                blocker.unlink()
                tail = 0

                def gap_seen() -> bool:  # until a message after the drops lands: the gap shows
                    nonlocal tail
                    tail += 1
                    post({"request_id": f"t-{tail}"})
                    return counts(daemon)["lost"] > 0
                wait_until(gap_seen, 60, "a message after the overrun")
                wait_until(lambda: counts(daemon)["paused"] == 0, 60, "the router to catch up")
                post({"request_id": "final"})

                def adds_up() -> bool:
                    c = counts(daemon)
                    return last[0] > 0 and c["messages"] + c["heartbeats"] + c["lost"] == last[0]
                wait_until(adds_up, 30, "stored + heartbeats + lost == the last sequence number")
                final = counts(daemon)
            daemon.stop_gracefully()
    finally:
        stop.set()
        watcher.join(5)
        observer.close()
        context.term()
    rows = read_lake(tmp_path / "router" / "lake")
    assert final["messages"] == len(rows) and final["lost"] > 0
    assert (final["duplicates"], final["restarts"], final["dropped"]) == (0, 0, 0), final
    assert len({row["request_id"] for row in rows}) == len(rows)
    assert max(row["logjam_sequence"] for row in rows) <= last[0]


# -- the source as the forwarder's device ----------------------------------------------------


DEVICE = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"
workers = 1

[spool]
path = "spool"

[sources.lj]
type = "logjam"
listen_router = "tcp://127.0.0.1:{router}"
listen_pull = "tcp://127.0.0.1:{pull}"

[sinks.lake]
type = "parquet"
inputs = ["lj"]
path = "lake"
roll_secs = 0.5
"""


def test_the_forwarders_frames_relayed_into_router_and_pull(tmp_path, forwarder_binary) -> None:
    """What the forwarder publishes, relayed frame for frame by a DEALER (with the empty
    first frame of a request, as logjam agents send) and a PUSH: the source stores each
    once and answers every request ``202 Accepted``."""
    router_port, pull_port = free_ports()
    http_port, pub_port = free_ports()
    (tmp_path / "router").mkdir()
    context = zmq.Context()
    sub = sub_socket(context, f"tcp://127.0.0.1:{pub_port}")
    dealer = context.socket(zmq.DEALER)
    push = context.socket(zmq.PUSH)
    for s in (dealer, push):
        s.setsockopt(zmq.LINGER, 0)
    n = 40
    try:
        with Daemon(tmp_path / "router", DEVICE.format(router=router_port, pull=pull_port)) as daemon:
            daemon.start()
            dealer.connect(f"tcp://127.0.0.1:{router_port}")
            push.connect(f"tcp://127.0.0.1:{pull_port}")
            with Forwarder(forwarder_binary, device_id=DEVICE_ID, compress="snappy", ports=(http_port, pub_port),
                           workdir=tmp_path / "fwd") as fwd:
                joined(fwd, sub)
                sequences = {}
                for i in range(n):
                    fwd.post_log(APP, ENV, {"request_id": f"r-{i}", "path": PADDING}, encoding=ENCODINGS[i % 4])
                    frames = next_message(sub)
                    sequences[f"r-{i}"] = wire.decode_meta(frames[3]).sequence
                    if i % 2:
                        push.send_multipart(frames)
                    else:
                        dealer.send_multipart([b""] + frames)
                replies = []
                while len(replies) < n // 2 and dealer.poll(30_000):
                    replies.append(dealer.recv_multipart())
                wait_until(lambda: counts(daemon)["messages"] == n, 60, "every relayed log")
            daemon.stop_gracefully()
    finally:
        for s in (sub, dealer, push):
            s.close()
        context.term()
    assert replies == [[f"{APP}-{ENV}".encode(), wire.ACCEPTED]] * (n // 2)
    rows = read_lake(tmp_path / "router" / "lake")
    assert {row["request_id"]: row["logjam_sequence"] for row in rows} == sequences
    assert {row["logjam_device"] for row in rows} == {DEVICE_ID} and len(rows) == n

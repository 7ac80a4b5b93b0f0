"""The logjam source and sink end to end: the real daemon on loopback, pyzmq peers.

* A device's PUB socket (a pyzmq PUB publishing what logjam-device publishes) read by the
  daemon's SUB: every message in the lake once, an injected gap and a duplicate counted
  on ``/metrics`` under the device; DEALER agents get ``202 Accepted`` from the ROUTER.
* Round trip: router A takes PUSH agents' messages and republishes them with its
  ``logjam`` sink; router B's ``logjam`` source subscribes to A and lands them.
* Ten 30 MiB messages a DEALER sends together: each accepted and landed, although
  together they are more than one spool record holds.

The real logjam producer (logjam-tools' Go http-forwarder) is tested in
``test_logjam_producer.py`` where it can be built (see docs/guides/logjam.md).
"""

from __future__ import annotations

import collections
import re

import pyarrow.compute as pc
import pytest
import zmq

from daemon import Daemon
from helpers import lake_column, wait_until
from logrouter.lake.dataset import lake_dataset
from logrouter.wire import logjam as wire

pytestmark = pytest.mark.timeout(300)

CTX = zmq.Context.instance()


def config(source: str, sinks: str = "", inputs: str = '["lj"]') -> str:
    return f"""
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.lj]
type = "logjam"
{source}

[sinks.lake]
type = "parquet"
inputs = {inputs}
path = "lake"
roll_secs = 0.5
{sinks}
"""


def metric(daemon: Daemon, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return sum(v for k, v in daemon.metrics().items() if k.startswith(name + "{") and wanted in k)


def bound(daemon: Daemon, kind: str) -> str:
    return daemon.wait_for(rf"logjam source lj: {kind} socket bound to (tcp://127\.0\.0\.1:\d+)").group(1)


def test_device_pub_and_dealer_agents_into_the_lake(tmp_path) -> None:
    pub = CTX.socket(zmq.PUB)
    dealer = CTX.socket(zmq.DEALER)
    try:
        pub.bind("tcp://127.0.0.1:*")
        device_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        source = f'connect = ["{device_endpoint}"]\nlisten_router = "tcp://127.0.0.1:*"\n'
        with Daemon(tmp_path, config(source)) as daemon:
            daemon.start()
            seq = 0

            def joined() -> bool:  # ZeroMQ's slow joiner: heartbeats until one is heard
                nonlocal seq
                seq += 1
                pub.send_multipart(wire.encode_heartbeat("tcp://device.example:9606", 7, seq, 0))
                return metric(daemon, "logrouter_source_heartbeats_total") > 0

            wait_until(joined, 30, "the daemon's SUB socket to join")
            compressions = sorted(wire.COMPRESSION_NAMES)
            published = []
            for n in range(600):
                seq += 1
                if n == 300:
                    seq += 10  # ten messages the device "published" and we never see
                m = wire.Meta(compressions[n % 4], 7, 1_700_000_000_000 + n, seq)
                frames = wire.encode_message("shop-app", "prod", "logs.web", {"id": f"pub-{n}"}, m)
                pub.send_multipart(frames)
                published.append(f"pub-{n}")
                if n == 100:
                    pub.send_multipart(frames)  # a duplicate (the same device heard twice)

            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(bound(daemon, "ROUTER"))
            for n in range(50):
                dealer.send_multipart([b"", *wire.encode_message("agent", "prod", "logs", {"id": f"req-{n}"}, wire.Meta())])
            replies = []
            while len(replies) < 50 and dealer.poll(30_000):
                replies.append(dealer.recv_multipart())
            assert replies == [[b"agent-prod", b"202 Accepted"]] * 50

            wait_until(lambda: metric(daemon, "logrouter_source_messages_total") >= 601, 60, "every message")
            device = f"{device_endpoint}#7"
            assert metric(daemon, "logrouter_logjam_lost_messages_total", device=device) == 10
            assert metric(daemon, "logrouter_logjam_duplicates_total", device=device) == 1
            assert metric(daemon, "logrouter_logjam_restarts_total", device=device) == 0
            daemon.stop_gracefully()
        ids = lake_column(tmp_path / "lake", "id")
        doubled = [i for i, c in collections.Counter(ids).items() if c > 1]
        assert not doubled
        assert set(ids) == set(published) | {f"req-{n}" for n in range(50)}
        assert set(lake_column(tmp_path / "lake", "tag")) == {"logjam.shop-app.prod", "logjam.agent.prod"}
    finally:
        pub.close(0)
        dealer.close(0)


def test_round_trip_sink_of_one_router_to_the_source_of_another(tmp_path) -> None:
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    sink = """
[sinks.device]
type = "logjam"
inputs = ["lj"]
bind = "tcp://127.0.0.1:*"
device_number = 42
heartbeat_secs = 0.2
compression = "snappy"
"""
    push = CTX.socket(zmq.PUSH)
    try:
        with Daemon(a_dir, config('listen_pull = "tcp://127.0.0.1:*"\n', sink)) as a:
            a.start()
            line = a.wait_for(r"logjam sink device.*(tcp://127\.0\.0\.1:\d+)")
            a_endpoint = re.search(r"tcp://127\.0\.0\.1:\d+", line.group(0)).group(0)
            with Daemon(b_dir, config(f'connect = ["{a_endpoint}"]\n')) as b:
                b.start()
                # B has joined once it hears A's heartbeats; A only publishes after that.
                wait_until(lambda: metric(b, "logrouter_source_heartbeats_total") > 0, 30, "B to hear A")
                push.setsockopt(zmq.LINGER, 0)
                push.connect(bound(a, "PULL"))
                for n in range(500):
                    body = {"id": f"m-{n}", "started_ms": 1_700_000_000_000 + n}
                    push.send_multipart(wire.encode_message("billing", "staging", "events.paid", body, wire.Meta(wire.LZ4)))
                wait_until(lambda: metric(b, "logrouter_source_messages_total") >= 500, 60, "B to receive all")
                device = f"{a_endpoint}#42"
                assert metric(b, "logrouter_logjam_lost_messages_total", device=device) == 0
                b.stop_gracefully()
            a.stop_gracefully()
        lake = b_dir / "lake"
        ids = lake_column(lake, "id")
        assert sorted(ids) == sorted(f"m-{n}" for n in range(500))
        assert set(lake_column(lake, "tag")) == {"logjam.billing.staging"}
        columns = [lake_column(lake, f"logjam_{name}") for name in ("app", "env", "topic", "device")]
        assert set(zip(*columns)) == {("billing", "staging", "events.paid", 42)}
        assert "logjam_app" not in str(lake_column(lake, "_extra")), "the metadata is not in the body sent"
    finally:
        push.close(0)


def test_large_messages_that_arrive_together_are_each_accepted(tmp_path) -> None:
    # Ten 30 MiB messages (each under max_decompressed_bytes) arrive together: 300 MiB,
    # more than one spool record holds. Each gets 202 and lands; none is refused for
    # the company it arrived in. The body is three 10 MiB fields (a few large strings
    # keep both processes' memory near the bytes), compressed once: the agents' frames
    # are small, and ZeroMQ hands all ten to one read.
    field = 10 << 20
    body = b'{"a":"' + b"a" * field + b'","b":"' + b"b" * field + b'","c":"' + b"c" * field + b'"}'
    compressed = wire.compress_body(body, wire.ZLIB_COMPRESSION)
    del body
    dealer = CTX.socket(zmq.DEALER)
    try:
        with Daemon(tmp_path, config('listen_router = "tcp://127.0.0.1:*"\n')) as daemon:
            daemon.start()
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(bound(daemon, "ROUTER"))
            for n in range(1, 11):
                meta = wire.encode_meta(wire.Meta(wire.ZLIB_COMPRESSION, 5, 1_700_000_000_000, n))
                dealer.send_multipart([b"", b"big-prod", b"logs", compressed, meta])
            replies = []
            while len(replies) < 10 and dealer.poll(60_000):
                replies.append(dealer.recv_multipart())
            assert replies == [[b"big-prod", b"202 Accepted"]] * 10
            daemon.stop_gracefully()
        lake = lake_dataset(str(tmp_path / "lake"))
        shape = lake.to_table(columns={
            "sequence": pc.field("logjam_sequence"),
            **{name: pc.binary_length(pc.field(name)) for name in "abc"},
            **{f"{name}_ends": pc.binary_join_element_wise(
                pc.utf8_slice_codeunits(pc.field(name), 0, 1), pc.utf8_slice_codeunits(pc.field(name), field - 1, field), ""
            ) for name in "abc"},
        }).to_pylist()
        assert sorted(row["sequence"] for row in shape) == list(range(1, 11))
        assert all(row[name] == field and row[f"{name}_ends"] == name * 2 for row in shape for name in "abc"), shape
    finally:
        dealer.close(0)

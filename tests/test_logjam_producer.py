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

A forced gap (the PUB dropping for a slow subscriber) is tested with pyzmq peers in
``tests/test_logjam_source.py``; it is hard to force against the real daemon here.

Skipped, with the reason, when the forwarder cannot be built (no Go, no logjam-tools
tarball in the peers folder, no ``libzmq3-dev``); set
``LOGROUTER_LOGJAM_FORWARDER_BIN`` to an ``http-forwarder`` binary to run it anyway.
"""

from __future__ import annotations

import collections

import pytest

from daemon import Daemon
from helpers import read_lake, wait_until
from logjam_forwarder import HEARTBEAT_SECS, Forwarder, ensure_built_with_reason

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

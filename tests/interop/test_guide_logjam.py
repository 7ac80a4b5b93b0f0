"""The logjam guide (``docs/guides/logjam.md``) run as written: its snippets against
logjam-tools' real ``http-forwarder`` (``tests/logjam_forwarder.py``), the page's own
pyzmq agents, and the real daemon on loopback.

Each test reads its snippets from the page by name (``tests/doc_snippets.py``) and changes
only what a test machine needs changed: ports (loopback, chosen free or by ZeroMQ), host
names and the lake's path. The forwarder's command line is checked against the argv
``Forwarder`` runs; the ``curl`` and the agents run as written (``bash``, ``python -c``).
A test adds to the router's config only a metrics endpoint on loopback. The forwarder
test is skipped, saying why, where the forwarder cannot be built.
"""

from __future__ import annotations

import ast
import collections
import json
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from daemon import Daemon
from doc_snippets import snippet, substituted
from helpers import read_lake, wait_until
from logjam_forwarder import HEARTBEAT_SECS, Forwarder, ensure_built_with_reason, free_ports
from logrouter.wire import logjam as wire

pytestmark = pytest.mark.timeout(600)  # the first test may build the forwarder (480 s budget)

PAGE = "docs/guides/logjam.md"
METRICS = '\n[router]\nmetrics_listen = "tcp:0:interface=127.0.0.1"\n'
RUN_SECS = 60  # bounds on a busy machine; a warm run takes a few seconds


def metric(daemon: Daemon, name: str) -> float:
    """A counter summed over its labels."""
    return sum(v for k, v in daemon.metrics().items() if k == name or k.startswith(name + "{"))


def lake_path(lake: Path) -> dict[str, str]:
    return {'"/var/lib/logrouter/lake"': json.dumps(str(lake))}


def test_a_forwarder_and_the_router_subscribed_to_it(tmp_path):
    """Section "Subscribing to a device or a forwarder": the forwarder started with the
    page's command, logs posted with the page's ``curl``, the page's router config."""
    binary, why = ensure_built_with_reason()
    if binary is None:
        pytest.skip(why)
    command, curl = snippet(PAGE, "http-forwarder").split("\n", 1)
    http_port, pub_port = free_ports()
    argv = shlex.split(substituted(command, {"0.0.0.0": "127.0.0.1", "8080": str(http_port), "9606": str(pub_port)}),
                       comments=True)
    with Forwarder(binary, device_id=7, ports=(http_port, pub_port), workdir=tmp_path / "fwd") as fwd:
        assert argv[0] == "http-forwarder" and argv[1:] == fwd.argv[1:], (argv, fwd.argv)
        router = substituted(snippet(PAGE, "logjam-importer"), {
            '"tcp://forwarder.example:9606"': json.dumps(fwd.pub_endpoint), **lake_path(tmp_path / "lake")})
        with Daemon(tmp_path, router + METRICS) as daemon:
            daemon.start()
            # ZeroMQ's slow joiner: nothing is posted before the router heard a heartbeat
            wait_until(lambda: metric(daemon, "logrouter_source_heartbeats_total") > 0, 6 * HEARTBEAT_SECS,
                       "the router to hear the forwarder's heartbeat")
            for n in range(20):
                posted = substituted(curl, {"http://forwarder.example:8080": fwd.base_url,
                                            '"request_id": "…"': f'"request_id": "r-{n:02d}"'})
                done = subprocess.run(["bash", "-c", posted], capture_output=True, text=True, timeout=RUN_SECS)
                assert done.returncode == 0, done.stderr
            wait_until(lambda: metric(daemon, "logrouter_events_in_total") >= 20, RUN_SECS, "every log posted")
            assert metric(daemon, "logrouter_logjam_lost_messages_total") == 0
            daemon.stop_gracefully()
    rows = read_lake(tmp_path / "lake")
    assert sorted(row["request_id"] for row in rows) == [f"r-{n:02d}" for n in range(20)]
    assert {(row["tag"], row["logjam_app"], row["logjam_env"], row["logjam_topic"], row["logjam_device"])
            for row in rows} == {("logjam.shop.prod", "shop", "prod", "logs.shop-prod", 7)}
    assert {round(row["time"].timestamp() * 1000) for row in rows} == {1_700_000_000_000}  # started_ms


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


def run_agent(name: str, endpoint: str) -> str:
    """The page's agent ``name`` sending to ``endpoint``, in its own process; its output."""
    code = substituted(snippet(PAGE, name), {re.search(r"tcp://router\.example:\d+", snippet(PAGE, name)).group(0): endpoint})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RUN_SECS)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_dealer_and_push_agents_and_an_importer_of_the_device_sink(tmp_path):
    """Sections "Agents sending to logrouter" and "logrouter as a device for importers":
    the page's DEALER agent gets ``202 Accepted``, its PUSH agent's message lands too, and
    a SUB subscribed to the device sink, as an importer is, gets both as device 12,
    snappy-compressed, after the sink's heartbeat."""
    sink_port = free_port()
    router = substituted(snippet(PAGE, "logjam-agents-router"), {
        'listen_router = "tcp://*:9604"': 'listen_router = "tcp://127.0.0.1:*"',
        'listen_pull = "tcp://*:9605"': 'listen_pull = "tcp://127.0.0.1:*"',
        **lake_path(tmp_path / "lake"),
    }) + "\n" + substituted(snippet(PAGE, "logjam-device-sink"), {'"tcp://*:9606"': f'"tcp://127.0.0.1:{sink_port}"'})
    context = zmq.Context()
    importer = context.socket(zmq.SUB)
    importer.setsockopt(zmq.LINGER, 0)
    importer.setsockopt(zmq.SUBSCRIBE, b"")
    importer.connect(f"tcp://127.0.0.1:{sink_port}")
    try:
        with Daemon(tmp_path, router + METRICS) as daemon:
            daemon.start()
            assert importer.poll(30_000), "no heartbeat from the device sink in 30 s (it sends one every 5 s)"
            heartbeat = wire.decode_message(importer.recv_multipart())
            assert isinstance(heartbeat, wire.Heartbeat) and heartbeat.meta.device == 12
            endpoints = {kind: daemon.wait_for(rf"logjam source agents: {kind} socket bound to (tcp://127\.0\.0\.1:\d+)").group(1)
                         for kind in ("ROUTER", "PULL")}
            reply = run_agent("logjam-dealer-agent", endpoints["ROUTER"])
            assert ast.literal_eval(reply.strip()) == [b"shop-prod", b"202 Accepted"]
            assert run_agent("logjam-push-agent", endpoints["PULL"]) == ""
            published = []
            while len(published) < 2 and importer.poll(RUN_SECS * 1000):
                frames = importer.recv_multipart()
                message = wire.decode_message(frames)
                if isinstance(message, wire.LogjamMessage):
                    published.append(message)
            assert len(published) == 2
            assert {(m.app, m.env, m.topic, m.meta.device, m.meta.compression) for m in published} == {
                ("shop", "prod", "logs.shop-prod", 12, wire.SNAPPY)}
            daemon.stop_gracefully()
    finally:
        importer.close(0)
        context.term()
    assert sorted(m.body["action"] for m in published) == ["Cart#show", "Home#index"]
    rows = read_lake(tmp_path / "lake")
    assert collections.Counter((row["tag"], row["action"]) for row in rows) == {
        ("logjam.shop.prod", "Home#index"): 1, ("logjam.shop.prod", "Cart#show"): 1}

"""``make run`` accepts every shipper: the shipped etc/logrouter.toml listens on loopback on
each shipper's usual port (the table of docs/first-run.md), serves /metrics and /health on
loopback, and one event sent with a client of each of the five protocols lands in the lake,
an Iceberg table read back with pyiceberg.

The real daemon runs the shipped config with one change only: each listening port is
replaced by "any free port" (``tcp:0``, ZeroMQ's ``*``) and the clients read the ports the
daemon logs. Running on the fixed ports instead would make the test depend on the
machine: a second run of the suite, a helper's test run or a local Prometheus (9090) or
Fluentd (24224) would make it fail or, if it skipped when a port is taken, silently not
run. The substitution is checked to touch the port numbers and nothing else, and the
first test pins those numbers to the documented ones.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import pylogbeat
import pytest
import zmq
from fluent import sender

from courier_client import CourierClient
from daemon import REPO, Daemon
from helpers import scrape, wait_until
from shipped_config import PORTS, any_free_port
from lake_sinks import table
from logrouter.config.load import load_file
from logrouter.wire import logjam as logjam_wire

SHIPPED = REPO / "etc" / "logrouter.toml"
FIRST_RUN = REPO / "docs" / "first-run.md"

# Every port the shipped config listens on, and what on: the table in docs/first-run.md says the same.
TCP_PORT = re.compile(r'"tcp:(\d+):interface=127\.0\.0\.1"')
ZMQ_PORT = re.compile(r'"tcp://127\.0\.0\.1:(\d+)"')


def test_the_shipped_config_listens_on_each_shippers_port_on_loopback_only():
    text = SHIPPED.read_text()
    listening = [line for line in text.splitlines() if re.match(r"^(listen\w*|controller_listen|metrics_listen) = ", line)]
    ports = [int(p) for line in listening for p in TCP_PORT.findall(line) + ZMQ_PORT.findall(line)]
    assert len(ports) == len(listening), listening  # each on loopback, in one of the two forms
    assert sorted(ports) == sorted(PORTS)
    config = load_file(str(SHIPPED))
    assert sorted(config.sources) == ["beats", "courier", "forward", "logjam", "pravega"]
    assert sorted(config.sinks["lake"].inputs) == sorted(config.sources)
    assert [(name, c.type) for name, c in config.sources.items()] == [
        ("forward", "fluent_forward"), ("beats", "lumberjack"), ("courier", "log_courier"),
        ("logjam", "logjam"), ("pravega", "pravega")]
    documented = FIRST_RUN.read_text()
    for port in PORTS:
        assert re.search(rf"^\|[^|\n]*\|\s*`?{port}`?\s*\|", documented, re.M), f"{port} is not in the table of {FIRST_RUN.name}"


@pytest.mark.timeout(300)
def test_one_event_from_each_protocol_lands_in_the_lake(tmp_path):
    config = any_free_port(SHIPPED.read_text())
    (tmp_path / "var").mkdir()  # as `make run` does
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        metrics = daemon.wait_for(r"metrics listening on (\S+) port (\d+)")
        assert metrics.group(1) == "127.0.0.1"
        base = f"http://127.0.0.1:{metrics.group(2)}"

        # Fluentd forward: PyPI fluent-logger.
        forward = sender.FluentSender("test", host="127.0.0.1", port=daemon.port("forward"), timeout=10)
        assert forward.emit("hello", {"via": "forward"}), forward.last_error
        forward.close()
        # Beats (lumberjack v2): PyPI pylogbeat, which waits for the ack.
        with pylogbeat.PyLogBeatClient("127.0.0.1", daemon.port("beats"), timeout=20) as beats:
            beats.send([{"message": "hi", "via": "beats", "@metadata": {"beat": "filebeat"}}])
        # Log Courier: a client speaking as the Go shipper does; True once acknowledged.
        assert CourierClient().run(daemon.port("courier"), iter([(b"n" * 16, [{"message": "hi", "via": "courier"}])]))
        # logjam: a DEALER agent, answered 202 once the message is durable.
        endpoint = daemon.wait_for(r"logjam source logjam: ROUTER socket bound to (tcp://127\.0\.0\.1:\d+)").group(1)
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(endpoint)
            dealer.send_multipart([b"", *logjam_wire.encode_message("shop", "prod", "logs", {"via": "logjam"}, logjam_wire.Meta())])
            assert dealer.poll(30_000), "no reply from the logjam ROUTER"
            assert dealer.recv_multipart() == [b"shop-prod", b"202 Accepted"]
        finally:
            dealer.close(0)
        # Pravega: the official client (PyPI pravega), in its own process, flushed = acknowledged.
        controller = daemon.wait_for(r"pravega source pravega controller listening on port (\d+)").group(1)
        writer = subprocess.run(
            [sys.executable, str(REPO / "tests" / "pravega_writer.py"), "--controller", f"tcp://127.0.0.1:{controller}",
             "--scope", "app", "--stream", "logs", "--segments", "1", "--count", "1"],
            capture_output=True, text=True, timeout=120,
        )
        assert writer.returncode == 0 and "flushed 1" in writer.stdout, writer.stderr

        def stored() -> dict[str, float]:
            page = scrape(int(metrics.group(2)))
            return {k: v for k, v in page.items() if k.startswith("logrouter_source_events_total{")}

        wait_until(lambda: len(stored()) == 5 and all(v == 1 for v in stored().values()), 30, "one event stored per source")
        with urllib.request.urlopen(f"{base}/health", timeout=10) as response:
            assert response.status == 200 and json.loads(response.read())["status"] == "ok"
        daemon.stop_gracefully()  # commits every open file: no need to wait for roll_secs

    # The table the shipped config names, read with pyiceberg through its SQLite catalog.
    sink = load_file(str(SHIPPED)).sinks["lake"]
    assert sink.type == "iceberg" and sink.options["warehouse"] == "var/warehouse" and sink.options["table"] == "logs.events"
    events = table(tmp_path / "var" / "warehouse")
    assert (tmp_path / "var" / "warehouse" / "catalog.db").is_file()
    rows = {row["tag"]: row for row in events.scan().to_arrow().to_pylist()}
    assert sorted(rows) == ["app.logs", "beats", "log_courier", "logjam.shop.prod", "test.hello"], sorted(rows)
    assert events.snapshots() and all(s.summary["logrouter.writer"] for s in events.snapshots())
    vias = {tag: row.get("via") for tag, row in rows.items() if tag != "app.logs"}
    assert vias == {"test.hello": "forward", "beats": "beats", "log_courier": "courier", "logjam.shop.prod": "logjam"}
    assert rows["app.logs"]["writer"] == "w" and rows["app.logs"]["seq"] == 0  # what pravega_writer.py writes

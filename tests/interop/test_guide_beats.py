"""The Filebeat guide (``docs/guides/beats.md``) run as written: its snippets against the
real Filebeat 7.17.29 and the real daemon on loopback.

Each test reads its snippets from the page by name (``tests/doc_snippets.py``), changes
only what a test machine needs changed (the router's port and interface, the lake's and
the log's paths, the certificate files, which are ``fixtures.pki``'s), runs them, and
reads the lake back: every line once. A test adds to the router's config only a metrics
endpoint on loopback (to see what it stored and what it recognised as resent), and to
Filebeat's only where it keeps its data and logs. Skipped, saying why, where Filebeat
cannot be built (``tests/filebeat.py`` builds it once per machine).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
from pathlib import Path

import pytest
import yaml

import filebeat as filebeat_harness
from ack_gate import AckGate
from daemon import Daemon
from doc_snippets import snippet, substituted, toml_tables
from helpers import read_lake, wait_until
from logrouter.wire import lumberjack as lj
from logrouter.wire.errors import DecodeError

PAGE = "docs/guides/beats.md"
LOOPBACK = "tcp:0:interface=127.0.0.1"
METRICS = '\n[router]\nmetrics_listen = "tcp:0:interface=127.0.0.1"\n'
SHIP_SECS = 60  # bounds on a busy machine; a warm run takes a few seconds


@pytest.fixture(scope="module")
def filebeat_bin() -> Path:
    path = filebeat_harness.ensure_built()
    if path is None:
        pytest.skip(filebeat_harness.build_reason())
    return path


def line(n: int) -> str:
    return f"guide line {n:05d} {'y' * 30}"


def write_log(folder: Path, count: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    log_file = folder / "app.log"
    log_file.write_text("".join(f"{line(n)}\n" for n in range(count)))
    return log_file


def router_config(lake: Path, source: str | None = None) -> str:
    """The page's router config on loopback into ``lake``; ``source``, if given, replaces
    its ``[sources.beats]`` table (the TLS snippet gives only that table)."""
    text = substituted(snippet(PAGE, "beats-router"), {
        'listen = "tcp:5044"': f'listen = "{LOOPBACK}"',
        '"/var/lib/logrouter/lake"': json.dumps(str(lake)),
    })
    if source is not None:
        tables = toml_tables(text)
        tables["sources.beats"] = source + "\n"
        text = "".join(tables.values())
    return text + METRICS


def filebeat_config(log_dir: Path, port: int | None = None, output: dict | None = None, **more: object) -> dict:
    """The page's Filebeat config reading ``log_dir``, sending to ``port`` on loopback, or
    to ``output`` (another snippet's ``output.logstash``, which replaces the page's);
    ``more`` adds top-level settings (another snippet's ``processors``)."""
    config = yaml.safe_load(substituted(snippet(PAGE, "filebeat"), {
        '"/var/log/app/*.log"': json.dumps(str(log_dir / "*.log")),
        '"router.example:5044"': f'"127.0.0.1:{port}"',
    }))
    if output is not None:
        config["output.logstash"] = output
    return {**config, **more}


def stored(daemon: Daemon) -> tuple[float, float]:
    """Events the router stored, and events it recognised as resent and did not store."""
    values = daemon.metrics()
    return values.get("logrouter_events_in_total", 0.0), values.get("logrouter_duplicate_events_total", 0.0)


def connections(daemon: Daemon) -> float:
    """Connections the router's ``beats`` source took (summed over its workers)."""
    return sum(value for key, value in daemon.metrics().items()
               if key.startswith("logrouter_source_connections_total{") and 'source="beats"' in key)


def assert_each_line_once(rows: list[dict], count: int) -> None:
    messages = [row["message"] for row in rows]
    assert len(messages) == count and sorted(messages) == [line(n) for n in range(count)], (
        f"{len(messages)} rows for {count} lines, {len(set(messages))} distinct")


def ship_file(beat: filebeat_harness.Filebeat, log_file: Path, *daemons: Daemon) -> None:
    """Run ``beat`` until its registry has the whole of ``log_file`` acknowledged, then stop
    it and the routers (a graceful stop commits the lake)."""
    size = log_file.stat().st_size
    try:
        beat.start()
        wait_until(lambda: beat.acked_offset(log_file) >= size, SHIP_SECS, "Filebeat's registry to have every line acknowledged")
    except BaseException:
        print(beat.output())
        raise
    finally:
        beat.stop()
    for daemon in daemons:
        daemon.stop_gracefully()


def test_filebeat_to_the_router(filebeat_bin, tmp_path):
    """Sections "logrouter" and "Filebeat"."""
    log_file = write_log(tmp_path / "logs", 3000)
    with Daemon(tmp_path, router_config(tmp_path / "lake")) as daemon:
        daemon.start()
        config = filebeat_config(log_file.parent, daemon.port("beats"))
        with filebeat_harness.Filebeat.from_config(filebeat_bin, tmp_path / "filebeat", config) as beat:
            ship_file(beat, log_file, daemon)
    rows = read_lake(tmp_path / "lake")
    assert_each_line_once(rows, 3000)
    assert {row["tag"] for row in rows} == {"beats.filebeat"}
    extra = json.loads(rows[0]["_extra"])
    assert "@metadata" not in extra and extra["log"]["file"]["path"] == str(log_file)  # keep_metadata = false


def test_filebeat_to_several_routers(filebeat_bin, tmp_path):
    """Section "Several routers": two routers, one lake each."""
    log_file = write_log(tmp_path / "logs", 6000)
    with contextlib.ExitStack() as stack:
        routers = []
        for name in ("router-1", "router-2"):
            (tmp_path / name).mkdir()
            routers.append(stack.enter_context(Daemon(tmp_path / name, router_config(tmp_path / name / "lake"))).start())
        hosts = {f"router-{n}.example:5044": f"127.0.0.1:{router.port('beats')}" for n, router in enumerate(routers, 1)}
        output = yaml.safe_load(substituted(snippet(PAGE, "filebeat-loadbalance"), hosts))["output.logstash"]
        config = filebeat_config(log_file.parent, output=output)
        beat = stack.enter_context(filebeat_harness.Filebeat.from_config(filebeat_bin, tmp_path / "filebeat", config))
        ship_file(beat, log_file)
        for router in routers:  # Filebeat sent batches to each
            assert connections(router) >= 1, router.output
            router.stop_gracefully()
    rows = read_lake(tmp_path / "router-1" / "lake") + read_lake(tmp_path / "router-2" / "lake")
    assert_each_line_once(rows, 6000)


def test_filebeat_over_tls_with_a_client_certificate(filebeat_bin, tmp_path, pki):
    """Section "With TLS and client certificates"."""
    log_file = write_log(tmp_path / "logs", 3000)
    source = substituted(snippet(PAGE, "beats-router-tls"), {
        "ssl:5044:": "ssl:0:",
        "/etc/logrouter/server.key": str(pki.server_key),
        "/etc/logrouter/server.pem": f"{pki.server_cert}:interface=127.0.0.1",
        "/etc/logrouter/ca.pem": str(pki.ca),
    })
    with Daemon(tmp_path, router_config(tmp_path / "lake", source)) as daemon:
        daemon.start()
        output = yaml.safe_load(substituted(snippet(PAGE, "filebeat-tls"), {
            '"router.example:5044"': f'"127.0.0.1:{daemon.port("beats")}"',
            "/etc/filebeat/ca.pem": str(pki.ca),
            "/etc/filebeat/client.pem": str(pki.client_cert),
            "/etc/filebeat/client.key": str(pki.client_key),
        }))["output.logstash"]
        config = filebeat_config(log_file.parent, output=output)
        with filebeat_harness.Filebeat.from_config(filebeat_bin, tmp_path / "filebeat", config) as beat:
            ship_file(beat, log_file, daemon)
    assert_each_line_once(read_lake(tmp_path / "lake"), 3000)


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


def send_lines(port: int, count: int) -> None:
    """``count`` lines to Filebeat's tcp input, once it listens."""
    conn: list[socket.socket] = []

    def connected() -> bool:
        with contextlib.suppress(OSError):
            conn.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        return bool(conn)

    wait_until(connected, SHIP_SECS, "Filebeat's tcp input to listen")
    with conn[0] as sock:
        sock.sendall("".join(f"{line(n)}\n" for n in range(count)).encode())


def lost_ack(gate: AckGate) -> bool:
    """The gate threw away an ack of stored events (not only ``ACK 0`` keepalives)."""
    try:
        return any(ack.seq for ack in lj.AckDecoder().feed(gate.dropped))
    except DecodeError as e:
        return any(ack.seq for ack in e.messages)


def test_add_id_makes_a_resent_tcp_event_stored_once(filebeat_bin, tmp_path):
    """Section "Exactly once", ``add_id``: events of the ``tcp`` input carry no line fields;
    the router recognises a resent one by its ``@metadata._id``."""
    count = 2000
    tcp_port = free_port()
    with contextlib.ExitStack() as stack:
        gate = stack.enter_context(AckGate())
        daemon = stack.enter_context(Daemon(tmp_path, router_config(tmp_path / "lake")))
        daemon.start()
        gate.target = daemon.port("beats")
        gate.hold()  # the router stores and acks; Filebeat does not hear it
        config = yaml.safe_load(substituted(snippet(PAGE, "filebeat-add-id"), {'"localhost:9000"': f'"127.0.0.1:{tcp_port}"'}))
        config["output.logstash"] = filebeat_config(tmp_path, gate.port)["output.logstash"]
        beat = stack.enter_context(filebeat_harness.Filebeat.from_config(filebeat_bin, tmp_path / "filebeat", config))
        try:
            beat.start()
            send_lines(tcp_port, count)
            wait_until(lambda: lost_ack(gate), SHIP_SECS, "an ack of stored events thrown away")
            gate.cut()  # Filebeat resends what it has no ack for, on a new connection
            gate.release()
            wait_until(lambda: stored(daemon)[0] >= count and stored(daemon)[1] > 0, SHIP_SECS,
                       "every line stored and the resent ones recognised")
        except BaseException:
            print(beat.output())
            print(daemon.output[-6000:])
            raise
        beat.stop()
        daemon.stop_gracefully()
    assert_each_line_once(read_lake(tmp_path / "lake"), count)


def test_fingerprint_makes_a_line_read_again_stored_once(filebeat_bin, tmp_path):
    """Section "Exactly once", ``fingerprint``: Filebeat reads the whole file a second time
    (its registry lost, as after a restart before the registry caught up); every line of
    the second reading is recognised."""
    count = 3000
    log_file = write_log(tmp_path / "logs", count)
    with Daemon(tmp_path, router_config(tmp_path / "lake")) as daemon:
        daemon.start()
        config = filebeat_config(log_file.parent, daemon.port("beats"), **yaml.safe_load(snippet(PAGE, "filebeat-fingerprint")))
        for reading in (1, 2):
            with filebeat_harness.Filebeat.from_config(filebeat_bin, tmp_path / "filebeat", config) as beat:
                ship_file(beat, log_file)
            events, resent = stored(daemon)
            assert events == count and resent >= count * (reading - 1), (reading, events, resent)
            shutil.rmtree(tmp_path / "filebeat" / "data" / "registry")  # data/meta.json, its agent.id, stays
        daemon.stop_gracefully()
    assert_each_line_once(read_lake(tmp_path / "lake"), count)

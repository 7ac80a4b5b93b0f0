"""The real Log Courier shipper (2.12.0, built from its sources by
``tests/log_courier_shipper.py``) against the real daemon: every line in the lake once.

Plain TCP, TLS with a server certificate, TLS with a client certificate (and refused
without one), several files followed at once, the shipper's own ``-config-test`` on the
configs the tests and ``docs/protocols/log_courier.md`` give, a ``kill -9`` of the router
mid-stream, reloads while it sends, and what ``lc-admin`` reports while a full spool holds
it back. Where the shipper itself sends events a second time under a new nonce (its
connection broke just as it queued a new payload: ``tests/log_courier_log.py``), exactly
those land twice; every other line lands once.

Skipped, saying why, where the shipper cannot be built (no Go, no tarball beside the
checkout: ``LOGROUTER_PEERS_DIR``, ``LOGROUTER_LOG_COURIER_BIN``).
"""

from __future__ import annotations

import collections
import random
import re
import signal
import socket
import time
from pathlib import Path

import pytest

from daemon import Daemon
from helpers import read_lake, wait_until
from log_courier_shipper import LC_ADMIN, Shipper, ensure_built_with_reason
from repo_paths import DOCS

pytestmark = pytest.mark.timeout(600)  # the first test may build the shipper (480 s budget)

DOC = DOCS / "protocols" / "log_courier.md"


def config(listen: str = "tcp:0:interface=127.0.0.1", *, spool: str = "", sink: str = "", **source: object) -> str:
    extra = "".join(f"{key} = {value!r}\n".replace("'", '"') for key, value in source.items())
    return f"""
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"
{spool}
[sources.courier]
type = "log_courier"
listen = "{listen}"
tag = "courier.${{type:-test}}"
{extra}
[sinks.lake]
type = "parquet"
inputs = ["courier"]
path = "lake"
roll_secs = 0.5
{sink}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tls_listen(pki) -> str:
    return f"ssl:0:interface=127.0.0.1:privateKey={pki.server_key}:certKey={pki.server_cert}"


def assert_once(lake: Path, lines: list[str], sent_again: int = 0) -> list[dict]:
    """Every line in the lake; each once but for the extra copies the shipper sent."""
    rows = read_lake(lake)
    counts = collections.Counter(row["message"] for row in rows)
    missing = set(lines) - set(counts)
    assert not missing, f"{len(missing)} lines missing, e.g. {sorted(missing)[:3]}"
    assert set(counts) == set(lines)
    extra = sum(c - 1 for c in counts.values())
    assert extra == sent_again, f"{extra} extra copies in the lake, the shipper sent {sent_again} again"
    return rows


def wait_acknowledged(shipper: Shipper, count: int, timeout: float) -> None:
    """Until the shipper has ``count`` events acknowledged, besides the copies it sent
    again (those are acknowledged too); on a timeout, say what its log says."""
    deadline = time.monotonic() + timeout
    while True:
        log = shipper.log()
        if log.acknowledged >= count + log.sent_again:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"after {timeout}s the shipper has {log.acknowledged} of {count} events acknowledged "
                f"({log.sent_again} sent again, {log.connections} connections, failures {log.failures[-5:]}); "
                f"its log's tail:\n{shipper.output()[-4000:]}"
            )
        time.sleep(0.1)  # poll interval; the bound is the deadline


def metric(daemon: Daemon, name: str) -> float:
    return sum(v for k, v in daemon.metrics().items() if k == name or k.startswith(name + "{"))


@pytest.fixture(scope="module")
def shipper_binary():
    binary, reason = ensure_built_with_reason()
    if binary is None:
        pytest.skip(f"the Log Courier shipper is not available: {reason}")
    return binary


@pytest.fixture(scope="module")
def lc_admin(shipper_binary):
    binary, reason = LC_ADMIN.ensure_built_with_reason()
    if binary is None:
        pytest.skip(f"lc-admin is not available: {reason}")
    return binary


# -- transports -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["tcp", "tls", "tls-client-cert"])
def test_every_line_lands_once(tmp_path, pki, shipper_binary, mode):
    source: dict = {}
    options: dict = {}
    listen = "tcp:0:interface=127.0.0.1"
    if mode != "tcp":
        listen = tls_listen(pki)
        options = dict(transport="tls", ca=pki.ca)
    if mode == "tls-client-cert":
        source = {"ssl_client_authentication": "required", "ca_file": str(pki.ca)}
        options.update(certificate=pki.client_cert, key=pki.client_key)
    lines = [f"line {i}" for i in range(2000)]
    with Daemon(tmp_path, config(listen, **source)) as daemon:
        daemon.start()
        with Shipper(shipper_binary, daemon.port("courier"), workdir=tmp_path / "shipper", **options) as shipper:
            shipper.write_lines(lines)
            shipper.close_stdin()
            assert shipper.wait(120) == 0, shipper.output()
            log = shipper.log()
        daemon.stop_gracefully()
    assert log.connections == 1 and not log.failures, log.failures
    # each payload acknowledged whole, once durable: no partial ACKN steps (Log Carver's differ)
    assert log.partial_steps() == []
    rows = assert_once(tmp_path / "lake", lines)
    assert {row["tag"] for row in rows} == {"courier.stdin"}
    assert {row["host"] for row in rows} == {"logrouter-test"}


def test_without_the_required_client_certificate_it_is_refused(tmp_path, pki, shipper_binary):
    source = {"ssl_client_authentication": "required", "ca_file": str(pki.ca)}
    with Daemon(tmp_path, config(tls_listen(pki), **source)) as daemon:
        daemon.start()
        with Shipper(shipper_binary, daemon.port("courier"), workdir=tmp_path / "shipper", transport="tls", ca=pki.ca) as shipper:
            shipper.write_lines(["never stored"])
            wait_until(lambda: metric(daemon, "logrouter_source_tls_errors_total") >= 1, 60, "refused handshakes")
            assert shipper.log().acknowledged == 0
        assert metric(daemon, "logrouter_events_in_total") == 0
        daemon.stop_gracefully()


# -- the shipper's own view --------------------------------------------------------------------


def doc_example() -> str:
    """The shipper config docs/protocols/log_courier.md gives (its one ```yaml block)."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/protocols/log_courier.md should hold one yaml block"
    return blocks[0]


def test_config_test_accepts_the_configs_the_tests_and_the_docs_give(tmp_path, pki, shipper_binary):
    shippers = [
        Shipper(shipper_binary, 5043, workdir=tmp_path / "stdin"),
        Shipper(shipper_binary, 5043, workdir=tmp_path / "tls", transport="tls", ca=pki.ca,
                certificate=pki.client_cert, key=pki.client_key),
        Shipper(shipper_binary, 5043, workdir=tmp_path / "files", admin="tcp:127.0.0.1:1234",
                files=[{"paths": [str(tmp_path / "*.log")], "fields": {"type": "app"}}]),
    ]
    for shipper in shippers:
        done = shipper.config_test()
        assert done.returncode == 0 and "Configuration OK" in done.stdout, (shipper.config, done.stdout, done.stderr)
    example = doc_example()
    for placeholder, path in (("/etc/log-courier/ca.pem", pki.ca), ("/etc/log-courier/client.pem", pki.client_cert),
                              ("/etc/log-courier/client.key", pki.client_key)):
        assert placeholder in example
        example = example.replace(placeholder, str(path))
    documented = Shipper(shipper_binary, 5043, workdir=tmp_path / "doc")
    documented.config_path = tmp_path / "doc" / "log-courier.yaml"
    documented.config_path.write_text(example)
    done = documented.config_test()
    assert done.returncode == 0 and "Configuration OK" in done.stdout, (example, done.stdout, done.stderr)
    documented.config_path.write_text(example.replace("ssl ca:", "ssl cax:"))  # it does check
    assert documented.config_test().returncode != 0


def test_several_files_followed_at_once(tmp_path, shipper_binary, lc_admin):
    logs = tmp_path / "logs"
    logs.mkdir()
    files = {logs / f"app{k}.log": [f"app{k} line {i}" for i in range(1500)] for k in range(3)}
    files[logs / "db.log"] = [f"db line {i}" for i in range(800)]
    for path, lines in files.items():
        path.write_text("".join(line + "\n" for line in lines[:-300]))
    file_sets = [
        {"paths": [str(logs / "app*.log")], "fields": {"type": "app"}},
        {"paths": [str(logs / "db.log")], "fields": {"type": "db"}},
    ]
    everything = [line for lines in files.values() for line in lines]
    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        with Shipper(shipper_binary, daemon.port("courier"), workdir=tmp_path / "shipper", files=file_sets,
                     admin=f"tcp:127.0.0.1:{free_port()}", extra_general={"prospect interval": 1}) as shipper:
            wait_until(lambda: shipper.log().acknowledged >= len(everything) - 1200, 60, "the files' first lines")
            for path, lines in files.items():  # the files grow while followed
                with path.open("a") as f:
                    f.write("".join(line + "\n" for line in lines[-300:]))
            wait_acknowledged(shipper, len(everything), 60)
            sizes = {str(path): str(path.stat().st_size) for path in files}

            def harvested() -> dict[str, str]:  # path -> offset read, as lc-admin reports it
                entries = shipper.status()["prospector"]["files"].values()
                return {entry["path"]: entry["harvester"]["current_offset"] for entry in entries}
            # lc-admin's numbers are a snapshot the harvesters refresh on their own time
            wait_until(lambda: harvested() == sizes, 30, "lc-admin to report every file read to its end")
            assert shipper.status()["publisher"]["status"]["publishedLines"] == str(len(everything))
            log = shipper.log()
        daemon.stop_gracefully()
    assert log.connections == 1 and not log.failures
    rows = assert_once(tmp_path / "lake", everything)
    paths = {row["message"]: (row["path"], row["tag"]) for row in rows}
    for path, lines in files.items():
        tag = "courier.db" if path.name == "db.log" else "courier.app"
        assert {paths[line] for line in lines} == {(str(path), tag)}


def test_held_back_by_a_full_spool_the_shipper_waits_connected(tmp_path, shipper_binary, lc_admin):
    """The spool fills (its sink cannot write) while the shipper has payloads in flight:
    the router stops reading and keeps every payload it knows of alive with ACKN 0, also
    the next one when it stopped just after a whole payload. The shipper's network
    timeout (3 s here) never fires; lc-admin shows its endpoint active, payloads pending,
    no error. Once the sink can write, everything lands once."""
    logs = tmp_path / "logs"
    logs.mkdir()
    # Lines zlib cannot shrink much: the spool stores payloads compressed as they came.
    lines = [f"line {i} " + random.Random(i).randbytes(75).hex() for i in range(8000)]
    for k in range(2):
        (logs / f"app{k}.log").write_text("".join(line + "\n" for line in lines[k::2]))
    cfg = config(
        spool="max_bytes = 262144\nsegment_bytes = 131072\n",
        sink='writer_id = "lc"\nretry_initial_secs = 0.1\nretry_max_secs = 0.5\n',
        keepalive_secs=1,
    ).replace("[router]\n", "[router]\nworkers = 1\n")
    with Daemon(tmp_path, cfg) as daemon:
        daemon.start()
        blocker = tmp_path / "lake" / "_staging" / "lc"
        blocker.parent.mkdir(parents=True)
        blocker.write_text("the sink cannot stage files until this is removed")
        with Shipper(shipper_binary, daemon.port("courier"), workdir=tmp_path / "shipper", timeout=3,
                     files=[{"paths": [str(logs / "*.log")]}], admin=f"tcp:127.0.0.1:{free_port()}") as shipper:
            wait_until(lambda: daemon.metrics().get("logrouter_sources_paused") == 1, 60, "the sources to pause")

            def kept_alive_past_two_timeouts() -> bool:
                log = shipper.log()
                assert not log.failures, f"the shipper gave up on the router: {log.failures}"
                zeros = log.zeros()
                return bool(zeros) and zeros[-1].at - zeros[0].at >= 7
            wait_until(kept_alive_past_two_timeouts, 60, "ACKN 0 keepalives over more than two network timeouts")
            held = shipper.status()["publisher"]
            held_log = shipper.log()
            blocker.unlink()
            wait_acknowledged(shipper, len(lines), 60)

            def published() -> tuple[str, str]:  # lc-admin's snapshot lags the ACKNs a little
                status = shipper.status()["publisher"]["status"]
                return status["publishedLines"], status["pendingPayloads"]
            wait_until(lambda: published() == (str(len(lines)), "0"), 30, "lc-admin to report every line published")
        daemon.stop_gracefully()
    assert held_log.failures == [] and held_log.connections == 1, held_log.failures
    endpoint = next(iter(held["endpoints"].values()))
    assert endpoint["status"] == "active" and endpoint["last_error"] == "n/a", held
    assert int(held["status"]["pendingPayloads"]) > 0
    assert int(held["status"]["publishedLines"]) < len(lines)
    assert_once(tmp_path / "lake", lines)


# -- the router goes away or changes ------------------------------------------------------------


def test_a_kill_9_of_the_router_mid_stream(tmp_path, shipper_binary):
    lines = [f"line {i}" for i in range(20000)]
    port = free_port()  # the restarted router must listen where the shipper reconnects
    cfg = config(f"tcp:{port}:interface=127.0.0.1")
    with Daemon(tmp_path, cfg) as daemon:
        daemon.start()
        with Shipper(shipper_binary, port, workdir=tmp_path / "shipper") as shipper:
            shipper.write_lines(lines[:10000])
            wait_until(lambda: daemon.metrics().get("logrouter_events_in_total", 0) > 2000, 60, "events in")
            daemon.kill()
            with Daemon(tmp_path, cfg) as again:
                again.start()
                shipper.write_lines(lines[10000:])
                # stdin stays open until all is acknowledged: after EOF a broken connection
                # would end 2.12.0 with events unsent (docs/protocols/log_courier.md)
                wait_acknowledged(shipper, len(lines), 120)
                shipper.close_stdin()
                assert shipper.wait(60) == 0, shipper.output()
                again.stop_gracefully()
            log = shipper.log()
    assert log.connections >= 2
    # Every payload once (its nonce is the router's idempotency key); the events the
    # shipper sent again under a new nonce land twice (tests/log_courier_log.py).
    assert_once(tmp_path / "lake", lines, log.sent_again)


def test_reloads_while_the_shipper_sends(tmp_path, shipper_binary):
    """SIGHUP with a changed sink (the source and its connection are kept), then with a
    changed source (it stops gracefully and starts again on its port: the shipper
    reconnects and resends what was not acknowledged, stored once by its nonce)."""
    lines = [f"line {i}" for i in range(30000)]
    port = free_port()
    listen = f"tcp:{port}:interface=127.0.0.1"
    with Daemon(tmp_path, config(listen)) as daemon:
        daemon.start()
        with Shipper(shipper_binary, port, workdir=tmp_path / "shipper") as shipper:
            shipper.write_lines(lines[:10000])
            wait_until(lambda: metric(daemon, "logrouter_events_in_total") > 2000, 60, "events in")
            daemon.config.write_text(config(listen).replace("roll_secs = 0.5", "roll_secs = 0.7"))
            daemon.process.send_signal(signal.SIGHUP)
            daemon.wait_for(r"config reloaded: .*sinks started: lake", 60)
            shipper.write_lines(lines[10000:20000])
            wait_until(lambda: metric(daemon, "logrouter_events_in_total") > 12000, 60, "events in")
            kept = shipper.log().connections
            daemon.config.write_text(config(listen, keepalive_secs=4).replace("roll_secs = 0.5", "roll_secs = 0.7"))
            daemon.process.send_signal(signal.SIGHUP)
            daemon.wait_for(r"config reloaded: .*sources started: courier", 60)
            shipper.write_lines(lines[20000:])
            wait_acknowledged(shipper, len(lines), 120)
            shipper.close_stdin()
            assert shipper.wait(60) == 0, shipper.output()
            log = shipper.log()
        daemon.stop_gracefully()
    assert kept == 1, "the first reload kept the source's connection"
    assert log.connections >= 2, "the changed source closed its connections"
    assert_once(tmp_path / "lake", lines, log.sent_again)

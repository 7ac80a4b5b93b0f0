"""The Pravega guide (``docs/guides/pravega.md``) run as written: its writer with the
official client (PyPI ``pravega``, module ``pravega_client``) against the real daemon on
loopback, plain and over TLS.

Each test reads its snippets from the page by name (``tests/doc_snippets.py``) and changes
only ports (loopback), host names (the test certificate names ``localhost``), the lake's
path and the certificate files (``fixtures.pki``'s). The writer runs as written in its own
process (the client's blocking calls hold the GIL: ``tests/pravega_writer.py``), and every
event it wrote is in the lake once. A test adds to the router's config only a metrics
endpoint on loopback.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemon import Daemon
from doc_snippets import snippet, substituted, toml_tables
from helpers import read_lake

pytestmark = pytest.mark.timeout(300)

PAGE = "docs/guides/pravega.md"
LOOPBACK = "tcp:0:interface=127.0.0.1"
METRICS = '\n[router]\nmetrics_listen = "tcp:0:interface=127.0.0.1"\n'
WRITE_SECS = 120  # bounds on a busy machine; a warm run takes a few seconds
PLAIN_MANAGER = 'manager = pravega_client.StreamManager("tcp://router.example:9090")'


def router_config(lake: Path, source: str | None = None) -> str:
    """The page's router config on loopback into ``lake``; ``source``, if given, replaces
    its ``[sources.pv]`` table (the TLS snippet gives only that table)."""
    text = substituted(snippet(PAGE, "pravega-router"), {
        'listen = "tcp:12345"': f'listen = "{LOOPBACK}"',
        'controller_listen = "tcp:9090"': f'controller_listen = "{LOOPBACK}"',
        '"/var/lib/logrouter/lake"': json.dumps(str(lake)),
    })
    if source is not None:
        tables = toml_tables(text)
        tables["sources.pv"] = source + "\n"
        text = "".join(tables.values())
    return text + METRICS


def controller_port(daemon: Daemon) -> int:
    return int(daemon.wait_for(r"pravega source pv controller listening on port (\d+)").group(1))


def write(code: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    """Run the writer ``code`` in its own process until it has flushed."""
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=WRITE_SECS)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the writer did not finish in {WRITE_SECS}s: {e.stdout!r} {e.stderr!r}") from None
    assert done.returncode == 0, done.stdout + done.stderr


def assert_each_event_once(lake: Path) -> None:
    rows = read_lake(lake)
    counts = collections.Counter(row["seq"] for row in rows)
    assert sorted(counts) == list(range(1000)) and set(counts.values()) == {1}, (
        f"{len(rows)} rows, {len(counts)} distinct")
    assert {(row["tag"], row["msg"]) for row in rows} == {("sc.st", "hello")}


def test_the_writer_to_the_router(tmp_path):
    """Sections "logrouter" and "The application"."""
    with Daemon(tmp_path, router_config(tmp_path / "lake")) as daemon:
        daemon.start()
        code = substituted(snippet(PAGE, "pravega-writer"),
                           {"tcp://router.example:9090": f"tcp://127.0.0.1:{controller_port(daemon)}"})
        write(code, tmp_path)
        assert daemon.metrics().get("logrouter_events_in_total") == 1000
        daemon.stop_gracefully()
    assert_each_event_once(tmp_path / "lake")


def test_the_writer_over_tls(tmp_path, pki):
    """Section "With TLS": the writer's ``StreamManager`` made as the TLS snippet says,
    trusting the test CA through ``$pravega_client_tls_cert_path``."""
    key, cert = f"privateKey={pki.server_key}", f"certKey={pki.server_cert}:interface=127.0.0.1"
    source = substituted(snippet(PAGE, "pravega-router-tls"), {
        "ssl:12345:": "ssl:0:",
        "ssl:9090:": "ssl:0:",
        "privateKey=/etc/logrouter/server.key": key,
        "certKey=/etc/logrouter/server.pem": cert,
        'advertise_host = "router.example"': 'advertise_host = "localhost"',
    })
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.pem").write_bytes(pki.ca.read_bytes())
    with Daemon(tmp_path, router_config(tmp_path / "lake", source)) as daemon:
        daemon.start()
        manager = next(line for line in snippet(PAGE, "pravega-client-tls").splitlines() if line.startswith("manager = "))
        manager = substituted(manager, {"tls://router.example:9090": f"tls://localhost:{controller_port(daemon)}"})
        code = substituted(snippet(PAGE, "pravega-writer"), {PLAIN_MANAGER: manager})
        write(code, tmp_path, dict(os.environ, pravega_client_tls_cert_path=str(certs)))
        assert daemon.metrics().get("logrouter_events_in_total") == 1000
        daemon.stop_gracefully()
    assert_each_event_once(tmp_path / "lake")

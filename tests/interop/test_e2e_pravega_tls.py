"""The pravega source over TLS end to end with the official client (PyPI ``pravega``): the
real daemon on loopback with both the segment store (``listen = "ssl:…"``) and the gRPC
controller (``controller_listen = "ssl:…"``) on the test PKI's server certificate, and
writers of the real client in their own processes (its blocking calls hold the GIL; see
``pravega_writer.py``, whose plaintext writer this file does not use: the writer here is
``TLS_WRITER``, run with ``python -c``).

What the client (0.3.8) needs for TLS, found by trying:

- ``StreamManager("tls://localhost:PORT", auth_enabled=False, tls_enabled=True,
  disable_cert_verification=False)``: the scheme and ``tls_enabled`` must agree.
- **A host name, not an IP address**, both in the controller URI and in the segment store
  address the controller hands out (hence ``advertise_host = "localhost"``). Its TLS
  stacks (tonic 0.5 on rustls 0.19 for gRPC; tokio-rustls 0.22 in
  ``pravega-wire-protocol``'s connection factory for the segment store) take the server
  name as a DNS name only: with ``tls://127.0.0.1:…`` the controller connection is closed
  before any ClientHello and ``create_scope`` keeps retrying (it had not returned after
  60 s); with the segment store
  advertised as ``127.0.0.1`` the client panics ("get domain name: InvalidDNSNameError")
  and ``write_event`` fails. That holds with ``disable_cert_verification=True`` too, as the
  name is needed for SNI. The test certificate names ``localhost`` (and 127.0.0.1).
- Trusted certificates come from every file in the directory named by the environment
  variable ``pravega_client_tls_cert_path`` (default ``./certs``, relative to the working
  directory); the directory must exist even when verification is disabled (else the
  constructor panics "should be valid path"). With the test CA there, the client verifies
  the server certificate and its name: nothing else is needed.
- A client that does not trust the CA never gets through: the handshake fails and the
  client keeps retrying (no error after 20 s), so that test bounds the writer with a
  timeout and checks that nothing reached the controller.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from daemon import Daemon
from helpers import lake_column

pytestmark = pytest.mark.timeout(300)

# A writer of the official client over TLS: argv = controller URI, disable verification
# ("1"/"0"), first seq, count, name, in-flight events. The trusted certificates come from
# $pravega_client_tls_cert_path.
TLS_WRITER = r"""
import json, sys
import pravega_client
uri, no_verify, first, count, name, inflight = sys.argv[1:7]
first, count, inflight = int(first), int(count), int(inflight)
manager = pravega_client.StreamManager(uri, False, True, no_verify == "1")
print("manager", flush=True)
manager.create_scope("sc")
manager.create_stream("sc", "st", 3)
print("stream", flush=True)
writer = manager.create_writer("sc", "st", inflight)
for n in range(first, first + count):
    key = "k%d" % (n % 20)
    writer.write_event(json.dumps({"seq": n, "key": key, "writer": name}), key)
writer.flush()
print("flushed %d" % count, flush=True)
"""


def config(listen: str) -> str:
    return f"""
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.pv]
type = "pravega"
listen = "{listen}"
controller_listen = "{listen}"
advertise_host = "localhost"

[sinks.lake]
type = "parquet"
inputs = ["pv"]
path = "lake"
roll_secs = 0.5
"""


def tls_listen(pki) -> str:
    return f"ssl:0:interface=127.0.0.1:privateKey={pki.server_key}:certKey={pki.server_cert}"


def controller_uri(daemon: Daemon) -> str:
    port = daemon.wait_for(r"pravega source pv controller listening on port (\d+)").group(1)
    return f"tls://localhost:{port}"


def trust_dir(tmp_path: Path, name: str, *certs: Path) -> Path:
    """A directory for ``pravega_client_tls_cert_path`` holding ``certs``."""
    directory = tmp_path / name
    directory.mkdir()
    for cert in certs:
        (directory / cert.name).write_bytes(cert.read_bytes())
    return directory


class TlsWriter:
    """One ``TLS_WRITER`` process; its stdout lines are collected by a thread."""

    def __init__(self, uri: str, certs: Path, *, first: int = 0, count: int = 100, name: str = "w",
                 inflight: int = 100, no_verify: bool = False) -> None:
        argv = [sys.executable, "-c", TLS_WRITER, uri, "1" if no_verify else "0", str(first), str(count), name, str(inflight)]
        env = dict(os.environ, pravega_client_tls_cert_path=str(certs))
        self.process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def wait(self, timeout: float = 120) -> None:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("writer did not finish:\n" + "".join(self.lines[-30:]))
        assert code == 0, f"writer exited {code}:\n" + "".join(self.lines[-30:])
        assert any(line.startswith("flushed ") for line in self.lines)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def assert_exactly_once(lake: Path, wanted: set[int]) -> None:
    seqs = lake_column(lake, "seq")
    doubled = sorted(s for s, c in collections.Counter(seqs).items() if c > 1)
    assert not doubled, f"{len(doubled)} events landed more than once, e.g. {doubled[:10]}"
    missing = sorted(wanted - set(seqs))
    assert not missing, f"{len(missing)} events missing, e.g. {missing[:10]}"
    assert len(seqs) == len(wanted)


def test_two_verifying_writers_over_tls_land_exactly_once(tmp_path, pki) -> None:
    certs = trust_dir(tmp_path, "certs", pki.ca)
    with Daemon(tmp_path, config(tls_listen(pki))) as daemon:
        daemon.start()
        uri = controller_uri(daemon)
        first = TlsWriter(uri, certs, first=0, count=1500, name="a", inflight=200)
        second = TlsWriter(uri, certs, first=1500, count=500, name="b", inflight=0)  # one event at a time
        try:
            first.wait()
            second.wait()
        finally:
            first.kill()
            second.kill()
        metrics = daemon.metrics()
        daemon.stop_gracefully()
    assert metrics["logrouter_events_in_total"] == 2000
    lake = tmp_path / "lake"
    assert_exactly_once(lake, set(range(2000)))
    assert set(lake_column(lake, "tag")) == {"sc.st"}
    assert set(lake_column(lake, "writer")) == {"a", "b"}


def test_a_client_that_does_not_trust_the_ca_gets_nothing_through(tmp_path, pki) -> None:
    untrusting = trust_dir(tmp_path, "rogue", pki.rogue_ca)
    with Daemon(tmp_path, config(tls_listen(pki))) as daemon:
        daemon.start()
        writer = TlsWriter(controller_uri(daemon), untrusting, count=10)
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                writer.process.wait(8)  # the client retries the failed handshake without end
        finally:
            writer.kill()
        assert "created scope" not in daemon.output
        assert not any(line.startswith("stream") for line in writer.lines), writer.lines
        metrics = daemon.metrics()
        daemon.stop_gracefully()
    assert metrics.get("logrouter_events_in_total", 0) == 0


def test_disabled_certificate_verification_still_encrypts_and_delivers(tmp_path, pki) -> None:
    # The trust directory holds only a CA that did not sign the server's certificate: with
    # verification disabled the client connects anyway (over TLS: the listeners take nothing else).
    untrusting = trust_dir(tmp_path, "rogue", pki.rogue_ca)
    with Daemon(tmp_path, config(tls_listen(pki))) as daemon:
        daemon.start()
        writer = TlsWriter(controller_uri(daemon), untrusting, count=300, no_verify=True)
        try:
            writer.wait()
        finally:
            writer.kill()
        daemon.stop_gracefully()
    assert_exactly_once(tmp_path / "lake", set(range(300)))

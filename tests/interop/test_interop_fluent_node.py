"""Interop: npm forward clients written by others against the real daemon, on loopback.

- ``@fluent-org/logger`` (fluent-logger-forward-node): TLS with a client certificate from
  a throwaway CA, shared key + user auth, ``ack``, CompressedPackedForward (gzip),
  PackedForward, Forward and Message modes; a wrong shared key, a wrong password and a
  client certificate from another CA are refused with a log line naming peer and reason.
- ``fluent-logger`` (fluent-logger-node, the older client): Message mode with
  ``requireAckResponse`` over TLS with a shared key and user, CompressedPackedForward
  (whose ``size`` option is a byte count, not an event count: kept, warned about once),
  and a wrong shared key.

The Node scripts live in ``tests/interop/``; events are read back from the lake after a
graceful stop. Skipped (with the reason) only when node or the npm module is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from daemon import REPO, Daemon
from logrouter.lake.dataset import lake_dataset

INTEROP = REPO / "tests" / "interop"
NODE = shutil.which("node") or ("/usr/bin/node" if Path("/usr/bin/node").exists() else None)
T0 = 1_700_000_000
PEER = r"127\.0\.0\.1:\d+"


def require(module: str) -> None:
    if NODE is None:
        reason = "node not found (install Node.js) - npm interop test skipped"
        print(reason)
        pytest.skip(reason)
    if not (INTEROP / "node_modules" / module / "package.json").exists():
        reason = f"npm module {module} is not installed in tests/interop/node_modules (make test installs it)"
        print(reason)
        pytest.skip(reason)


def run_node(script: str, settings: dict, timeout: float = 60) -> tuple[int, dict, str]:
    """Run a client script to completion (bounded); its exit status, JSON result and stderr."""
    env = dict(os.environ, NODE_PATH=str(INTEROP / "node_modules"))
    process = subprocess.run(
        [NODE, str(INTEROP / script), json.dumps({"timeoutMs": 30000, **settings})],
        cwd=INTEROP,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = process.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        result = {"unparsed": process.stdout}
    return process.returncode, result, process.stderr


def rows_by_tag(path: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in lake_dataset(str(path)).to_table().to_pylist():
        out.setdefault(row["tag"], []).append(row)
    return out


def secure_config(pki) -> str:
    return f"""
[spool]
path = "spool"

[sources.secure]
type = "fluent_forward"
listen = '{pki.ssl_endpoint()}'
verify_client = true
ca_file = '{pki.ca}'
shared_key = "interop-key"
self_hostname = "router.test"
users = [{{ username = "alice", password = "alice-pw" }}]

[sinks.lake]
type = "parquet"
inputs = ["secure"]
path = "lake"
roll_secs = 3600
"""


def test_fluent_org_logger_tls_handshake_ack_and_refusals(tmp_path, pki):
    require("@fluent-org/logger")
    with Daemon(tmp_path, secure_config(pki)) as daemon:
        daemon.start()
        port = daemon.port("secure")
        base = {
            "port": port,
            "tagPrefix": "interop",
            "t0": T0,
            "ack": True,
            "tls": {"ca": str(pki.ca), "cert": str(pki.client_cert), "key": str(pki.client_key)},
            "security": {
                "clientHostname": "node-client.test",
                "sharedKey": "interop-key",
                "username": "alice",
                "password": "alice-pw",
            },
        }
        for mode, label, count in (
            ("CompressedPackedForward", "gzip", 200),
            ("PackedForward", "packed", 20),
            ("Forward", "forward", 20),
            ("Message", "message", 5),
        ):
            status, result, stderr = run_node("fluent_org_client.js", {**base, "eventMode": mode, "label": label, "count": count})
            assert (status, result) == (0, {"ok": True, "sent": count}), f"{mode}: {result} {stderr}\n{daemon.output}"

        # A wrong shared key: failure PONG, the client gives up, the router logs why.
        status, result, _ = run_node(
            "fluent_org_client.js", {**base, "label": "refused", "security": {**base["security"], "sharedKey": "wrong"}}
        )
        assert status == 2 and "shared_key mismatch" in result["error"], result
        daemon.wait_for(
            rf"fluent_forward {PEER}: handshake failed: shared_key mismatch \(client hostname 'node-client\.test'\); closing connection"
        )

        status, result, _ = run_node(
            "fluent_org_client.js", {**base, "label": "refused", "security": {**base["security"], "password": "guess"}}
        )
        assert status == 2 and "username/password mismatch" in result["error"], result
        daemon.wait_for(rf"fluent_forward {PEER}: handshake failed: username/password mismatch \(client hostname 'node-client\.test', username 'alice'\)")

        # A client certificate signed by another CA: the TLS handshake is refused.
        rogue = {**base["tls"], "cert": str(pki.rogue_client_cert), "key": str(pki.rogue_client_key)}
        status, result, _ = run_node("fluent_org_client.js", {**base, "label": "refused", "tls": rogue})
        assert status == 2 and not result["ok"], result
        daemon.wait_for(
            rf"fluent_forward {PEER}: TLS handshake failed: client certificate rejected: unable to get local issuer "
            r"certificate \(certificate O=logrouter tests/CN=rogue-client\); connection closed"
        )
        daemon.stop_gracefully()

    rows = rows_by_tag(tmp_path / "lake")
    assert sorted(rows) == ["interop.forward", "interop.gzip", "interop.message", "interop.packed"]
    for tag, count in (("interop.gzip", 200), ("interop.packed", 20), ("interop.forward", 20), ("interop.message", 5)):
        got = sorted(rows[tag], key=lambda r: r["seq"])
        assert [r["seq"] for r in got] == list(range(count)), tag
        assert got[0]["msg"] == "fluent-org 0" and got[0]["client"] == "@fluent-org/logger"
        assert got[1]["time"].timestamp() == pytest.approx(T0 + 1.123456)  # EventTime nanos (µs in Parquet)


def old_client_config(pki) -> str:
    return f"""
[spool]
path = "spool"

[sources.plain]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"
shared_key = "old-key"
self_hostname = "router.test"

[sources.tls]
type = "fluent_forward"
listen = '{pki.ssl_endpoint()}'
shared_key = "old-key"
self_hostname = "router.test"
users = [{{ username = "bob", password = "bob-pw" }}]

[sinks.lake]
type = "parquet"
inputs = ["plain", "tls"]
path = "lake"
roll_secs = 3600
"""


def test_fluent_logger_old_client(tmp_path, pki):
    require("fluent-logger")
    with Daemon(tmp_path, old_client_config(pki)) as daemon:
        daemon.start()
        plain, tls_port = daemon.port("plain"), daemon.port("tls")
        security = {"clientHostname": "old-client.test", "sharedKey": "old-key"}

        # Message mode, requireAckResponse, TLS (server certificate checked against the CA), user auth.
        status, result, stderr = run_node(
            "fluent_logger_client.js",
            {
                "port": tls_port, "tagPrefix": "old", "label": "message", "count": 30, "t0": T0, "ack": True,
                "tls": {"ca": str(pki.ca)},
                "security": {**security, "username": "bob", "password": "bob-pw"},
            },
        )
        assert (status, result) == (0, {"ok": True, "sent": 30}), f"{result} {stderr}\n{daemon.output}"

        # CompressedPackedForward with acks, shared key without users (the client sends a nil username).
        status, result, stderr = run_node(
            "fluent_logger_client.js",
            {"port": plain, "tagPrefix": "old", "label": "gzip", "count": 50, "t0": T0, "ack": True,
             "eventMode": "CompressedPackedForward", "security": security},
        )
        assert (status, result) == (0, {"ok": True, "sent": 50}), f"{result} {stderr}\n{daemon.output}"
        # This client puts the blob's byte length in "size": a hint only, every event is kept.
        daemon.wait_for(rf"fluent_forward {PEER}: option size=\d+ but the message holds 50 entries \(tag old\.gzip\)")

        status, result, _ = run_node(
            "fluent_logger_client.js",
            {"port": plain, "tagPrefix": "old", "label": "refused", "count": 1, "ack": True,
             "security": {**security, "sharedKey": "nope"}},
        )
        assert status == 2 and "shared_key mismatch" in result["error"], result
        daemon.wait_for(rf"fluent_forward {PEER}: handshake failed: shared_key mismatch \(client hostname 'old-client\.test'\)")
        daemon.stop_gracefully()

    rows = rows_by_tag(tmp_path / "lake")
    assert sorted(rows) == ["old.gzip", "old.message"]
    assert sorted(r["seq"] for r in rows["old.message"]) == list(range(30))
    assert sorted(r["seq"] for r in rows["old.gzip"]) == list(range(50))
    first = min(rows["old.message"], key=lambda r: r["seq"])
    assert first["msg"] == "fluent-logger 0" and first["time"].timestamp() == pytest.approx(T0 + 0.987654)

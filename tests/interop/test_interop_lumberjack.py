"""Interop: the real daemon's lumberjack source against real Beats-protocol clients on loopback.

Clients: PyPI ``pylogbeat`` (v2, one compressed window per ``send``, sequence numbers that
keep counting across windows), PyPI ``python-logstash-async`` with its ``BeatsTransport``
(pylogbeat underneath, windows of 25), npm ``lumberjack-client`` (v2, pipelined windows it
never waits for) and npm ``lumberjack-protocol`` (v1 over TLS, one ``W`` then ``D`` frames).
Each test starts ``twistd -n logrouter`` with a lumberjack source and a parquet sink, waits
for the clients' acks (an ack means durable), stops the daemon with SIGTERM and reads the
lake back. TLS material is generated per test (``fixtures.pki``); no key is committed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pylogbeat
import pytest

from daemon import REPO, Daemon
from helpers import recv_exactly
from fixtures.pki import make_pki
from logrouter.lake.dataset import lake_dataset
from logrouter.wire import lumberjack as lj

INTEROP = REPO / "tests" / "interop"
PEER = r"127\.0\.0\.1:\d+"
STAMP = "2024-01-02T03:04:05.678Z"
STAMP_SECONDS = 1704164645.678


def config(listen: str = "tcp:0:interface=127.0.0.1", **source: object) -> str:
    source = {"tag": "beats.${@metadata.beat:-none}", **source}
    extra = "".join(f"{key} = {json.dumps(value)}\n" for key, value in source.items())
    return f"""
[spool]
path = "spool"

[sources.beats]
type = "lumberjack"
listen = {json.dumps(listen)}
{extra}
[sinks.lake]
type = "parquet"
inputs = ["beats"]
path = "lake"
roll_secs = 3600
"""


def read_lake(path: Path) -> list[dict]:
    rows = lake_dataset(str(path)).to_table().to_pylist()
    for row in rows:
        row["_extra"] = json.loads(row["_extra"]) if row.get("_extra") else {}
    return rows


def node_or_skip() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the npm interop clients cannot run")
    for package in ("lumberjack-client", "lumberjack-protocol"):
        if not (INTEROP / "node_modules" / package).is_dir():
            pytest.skip(f"npm package {package} is not installed in tests/interop/node_modules (run npm ci there)")
    return node


def run_node(script: str, *args: object, timeout: float = 60) -> tuple[int, dict]:
    result = subprocess.run(
        [node_or_skip(), script, *map(str, args)],
        cwd=INTEROP,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = result.stdout.strip().splitlines()
    assert lines, f"{script} printed nothing (exit {result.returncode}):\n{result.stderr}"
    return result.returncode, json.loads(lines[-1])


def read_ack(sock: socket.socket) -> lj.Ack:
    (ack,) = lj.AckDecoder().feed(recv_exactly(sock, 6))
    return ack


# -- Python clients --------------------------------------------------------------------------


def test_pylogbeat_windows_land_in_the_lake(tmp_path):
    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        port = daemon.port("beats")
        windows = [
            [{"@timestamp": STAMP, "@metadata": {"beat": "filebeat"}, "message": f"w1 {i}", "n": i} for i in range(10)],
            [{"@metadata": {"beat": "metricbeat"}, "message": f"w2 {i}", "n": 10 + i, "ok": i % 2 == 0} for i in range(2048)],
            ['{"message": "a JSON text sent as a string", "n": 9999}'],
        ]
        # One connection, three windows: pylogbeat's sequence numbers keep counting
        # (1..10, 11..2058, 2059) and it waits until an ack equals the last one sent.
        with pylogbeat.PyLogBeatClient("127.0.0.1", port, timeout=20) as client:
            for window in windows:
                client.send(window)
        daemon.stop_gracefully()

    rows = read_lake(tmp_path / "lake")
    by_tag: dict[str, list[dict]] = {}
    for row in rows:
        by_tag.setdefault(row["tag"], []).append(row)
    assert {tag: len(r) for tag, r in by_tag.items()} == {"beats.filebeat": 10, "beats.metricbeat": 2048, "beats.none": 1}
    first = sorted(by_tag["beats.filebeat"], key=lambda r: r["n"])
    assert [r["message"] for r in first] == [f"w1 {i}" for i in range(10)]
    assert first[0]["time"].timestamp() == pytest.approx(STAMP_SECONDS)
    assert first[0]["@timestamp"] == STAMP  # the original field is kept
    assert first[0]["_extra"]["@metadata"] == {"beat": "filebeat"}  # @metadata is kept (an object: _extra)
    assert str(first[0]["dt"]) == "2024-01-02" and int(first[0]["hour"]) == 3
    second = sorted(by_tag["beats.metricbeat"], key=lambda r: r["n"])
    assert [r["n"] for r in second] == list(range(10, 2058))
    assert [r["ok"] for r in second[:4]] == [True, False, True, False]
    assert by_tag["beats.none"][0]["message"] == "a JSON text sent as a string"


def test_logstash_async_beats_transport(tmp_path):
    from logstash_async.handler import AsynchronousLogstashHandler

    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        port = daemon.port("beats")
        handler = AsynchronousLogstashHandler(
            "127.0.0.1", port, database_path=None, transport="logstash_async.transport.BeatsTransport"
        )
        logger = logging.getLogger("logrouter.interop.beats")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        try:
            for i in range(60):
                logger.info("hello %d", i, extra={"request_id": f"r{i}"})
        finally:
            logger.removeHandler(handler)
            handler.close()  # flushes: windows of 25, 25 and 10 on one connection, each acked
        daemon.stop_gracefully()

    rows = sorted(read_lake(tmp_path / "lake"), key=lambda r: int(r["message"].split()[1]))
    assert [r["message"] for r in rows] == [f"hello {i}" for i in range(60)]
    assert {r["tag"] for r in rows} == {"beats.none"}
    first = rows[0]
    assert (first["level"], first["type"], first["@version"]) == ("INFO", "python-logstash", "1")
    assert first["_extra"]["extra"]["request_id"] == "r0"  # a nested object: kept whole in _extra
    # python-logstash-async stamps @timestamp itself (RFC 3339, milliseconds, Z): it is the event time.
    assert first["time"].isoformat(timespec="milliseconds").replace("+00:00", "Z") == first["@timestamp"]


# -- Node clients ----------------------------------------------------------------------------


def test_node_lumberjack_client_v2(tmp_path):
    node_or_skip()
    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        port = daemon.port("beats")
        status, result = run_node("lumberjack_client_v2.js", "127.0.0.1", port, 300, 20)
        assert status == 0, result
        assert [a for a in result["acks"] if a] == [300] + [1] * 20
        daemon.stop_gracefully()

    rows = sorted(read_lake(tmp_path / "lake"), key=lambda r: r["n"])
    assert [r["n"] for r in rows] == list(range(320))
    assert {r["tag"] for r in rows} == {"beats.nodebeat"}
    assert rows[0]["message"] == "queued 0" and rows[300]["message"] == "single 0"
    assert rows[0]["time"].timestamp() == pytest.approx(STAMP_SECONDS)
    assert rows[0]["_extra"]["nested"] == {"ok": True, "list": [1, "two"]}


def test_node_lumberjack_protocol_v1_over_tls(tmp_path):
    node_or_skip()
    pki = make_pki(tmp_path / "pki")
    with Daemon(tmp_path, config(pki.ssl_endpoint(), tag="forwarder")) as daemon:
        daemon.start()
        port = daemon.port("beats")
        # A window of 50 announced once, 120 events streamed after it: the sequence keeps
        # counting past the window and every ack carries the highest seq stored so far.
        status, result = run_node("lumberjack_protocol_v1.js", "127.0.0.1", port, pki.ca, 120, 50)
        assert status == 0, result
        assert result["acks"][-1] == 120 and result["acks"] == sorted(result["acks"])
        daemon.stop_gracefully()

    rows = read_lake(tmp_path / "lake")
    assert {r["tag"] for r in rows} == {"forwarder"}
    rows.sort(key=lambda r: int(r["offset"]))
    assert [r["line"] for r in rows] == [f"line {i}" for i in range(120)]
    assert rows[0]["file"] == "/var/log/app.log" and rows[0]["ünï"] == "cödé"


# -- TLS with client certificates ----------------------------------------------------------------


def test_client_certificates_required(tmp_path):
    pki = make_pki(tmp_path / "pki")
    source = {"ssl_client_authentication": "required", "ca_file": str(pki.ca)}
    with Daemon(tmp_path, config(pki.ssl_endpoint(), **source)) as daemon:
        daemon.start()
        port = daemon.port("beats")
        tls = dict(ssl_enable=True, ssl_verify=True, ca_certs=str(pki.ca), timeout=20)
        with pylogbeat.PyLogBeatClient("127.0.0.1", port, certfile=str(pki.client_cert), keyfile=str(pki.client_key), **tls) as client:
            client.send([{"message": "with a certificate", "@metadata": {"beat": "mtls"}}])

        for cert, key, reason in (
            (None, None, "client certificate required but none was sent"),
            (pki.rogue_client_cert, pki.rogue_client_key, r"client certificate rejected: unable to get local issuer certificate \(certificate O=logrouter tests/CN=rogue-client\)"),
        ):
            kwargs = {"certfile": str(cert), "keyfile": str(key)} if cert else {}
            client = pylogbeat.PyLogBeatClient("127.0.0.1", port, **tls, **kwargs)
            with pytest.raises((OSError, pylogbeat.ConnectionException)):
                try:
                    client.send([{"message": "refused"}])
                finally:
                    client.close()
            daemon.wait_for(rf"lumberjack {PEER}: TLS handshake failed: {reason}.*; connection closed", timeout=20)

        if shutil.which("node") and (INTEROP / "node_modules" / "lumberjack-protocol").is_dir():
            status, result = run_node(
                "lumberjack_protocol_v1.js", "127.0.0.1", port, pki.ca, 3, 10, pki.client_cert, pki.client_key
            )
            assert status == 0, result
        else:
            print("node or lumberjack-protocol missing: the Node v1 client-certificate check was skipped")
        daemon.stop_gracefully()

    messages = sorted(r.get("message") or r.get("line") for r in read_lake(tmp_path / "lake"))
    expected = ["with a certificate"]
    if shutil.which("node") and (INTEROP / "node_modules" / "lumberjack-protocol").is_dir():
        expected += ["line 0", "line 1", "line 2"]
    assert messages == sorted(expected)


def test_client_certificates_optional(tmp_path):
    pki = make_pki(tmp_path / "pki")
    source = {"ssl_client_authentication": "optional", "ca_file": str(pki.ca)}
    with Daemon(tmp_path, config(pki.ssl_endpoint(), **source)) as daemon:
        daemon.start()
        port = daemon.port("beats")
        tls = dict(ssl_enable=True, ssl_verify=True, ca_certs=str(pki.ca), timeout=20)
        with pylogbeat.PyLogBeatClient("127.0.0.1", port, **tls) as client:
            client.send([{"message": "no certificate"}])
        with pylogbeat.PyLogBeatClient("127.0.0.1", port, certfile=str(pki.client_cert), keyfile=str(pki.client_key), **tls) as client:
            client.send([{"message": "good certificate"}])
        client = pylogbeat.PyLogBeatClient(
            "127.0.0.1", port, certfile=str(pki.expired_client_cert), keyfile=str(pki.expired_client_key), **tls
        )
        with pytest.raises((OSError, pylogbeat.ConnectionException)):
            try:
                client.send([{"message": "expired certificate"}])
            finally:
                client.close()
        daemon.wait_for(rf"lumberjack {PEER}: TLS handshake failed: client certificate rejected: certificate has expired", timeout=20)
        daemon.stop_gracefully()
    assert sorted(r["message"] for r in read_lake(tmp_path / "lake")) == ["good certificate", "no certificate"]


# -- raw protocol against the daemon -------------------------------------------------------------


def test_partial_acks_and_bad_input_on_the_real_daemon(tmp_path):
    with Daemon(tmp_path, config(max_decompressed_bytes=1 << 20)) as daemon:
        daemon.start()
        port = daemon.port("beats")
        with socket.create_connection(("127.0.0.1", port), timeout=20) as good:
            frames = [lj.encode_json(i + 1, {"message": f"raw {i}"}) for i in range(4)]
            good.sendall(lj.encode_window(4) + frames[0] + frames[1])
            assert read_ack(good) == lj.Ack(2, 2)  # a partial ack: the first two are durable
            with socket.create_connection(("127.0.0.1", port), timeout=20) as bad:
                bad.sendall(lj.encode_window(20_000))
                try:
                    assert bad.recv(100) == b""  # closed by the server
                except ConnectionResetError:
                    pass
            daemon.wait_for(rf"lumberjack {PEER}: window size 20000 exceeds max_window_size 10000; closing connection")
            with socket.create_connection(("127.0.0.1", port), timeout=20) as bomb:
                blob = lj.encode_compressed(lj.encode_json(1, b'"' + b" " * (3 << 20) + b'"'), 9)
                bomb.sendall(lj.encode_window(1) + blob)
                try:
                    assert bomb.recv(100) == b""
                except ConnectionResetError:
                    pass
            daemon.wait_for(rf"lumberjack {PEER}: compressed frame inflates to more than max_decompressed_bytes 1048576")
            # The good connection carries on.
            good.sendall(frames[2] + frames[3] + lj.encode_window(0))
            assert read_ack(good) == lj.Ack(2, 4)
            assert read_ack(good) == lj.Ack(2, 0)  # an empty window is answered with ACK 0
        daemon.stop_gracefully()
    rows = read_lake(tmp_path / "lake")
    assert sorted(r["message"] for r in rows) == [f"raw {i}" for i in range(4)]


def test_bad_config_names_the_key(tmp_path):
    from daemon import TWISTD

    path = tmp_path / "bad.toml"
    path.write_text(config(max_window_size=0, ssl_client_authentication="required"))
    result = subprocess.run(
        [str(TWISTD), "--nodaemon", "--pidfile=", "logrouter", "--config", str(path)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert result.returncode == 1
    assert "sources.beats.max_window_size: must be greater than 0, got 0" in result.stderr

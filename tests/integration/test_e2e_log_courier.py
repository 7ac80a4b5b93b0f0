"""The log_courier source end to end with a client built on the codec
(``tests/courier_client.py``): the real daemon on loopback, plain and TLS with a client
certificate, and a kill -9 while the client keeps sending; every event lands in the lake
exactly once. The real Log Courier shipper against the daemon is
``tests/interop/test_e2e_log_courier_shipper.py``."""

from __future__ import annotations

import collections
import signal
import ssl
import threading

from courier_client import CourierClient
from daemon import Daemon
from helpers import lake_column

EVENTS_PER_PAYLOAD = 50


def config(listen: str = "tcp:0:interface=127.0.0.1", **source: str) -> str:
    extra = "".join(f'{key} = "{value}"\n' for key, value in source.items())
    return f"""
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

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
"""


def payloads(first: int, count: int):
    for p in range(first, first + count):
        nonce = p.to_bytes(16, "big")
        yield nonce, [{"message": f"{p}-{i}", "@timestamp": "2024-05-06T07:08:09.123456Z"} for i in range(EVENTS_PER_PAYLOAD)]


def expected(count: int) -> set[str]:
    return {f"{p}-{i}" for p in range(count) for i in range(EVENTS_PER_PAYLOAD)}


def assert_exactly_once(lake, wanted: set[str]) -> None:
    messages = lake_column(lake, "message")
    doubled = [m for m, c in collections.Counter(messages).items() if c > 1]
    assert not doubled, f"{len(doubled)} events landed more than once, e.g. {doubled[:5]}"
    assert set(messages) == wanted, f"missing {len(wanted - set(messages))}"


def test_payloads_are_acked_and_land_once(tmp_path):
    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        client = CourierClient()
        assert client.run(daemon.port("courier"), payloads(0, 40))
        client.run(daemon.port("courier"), payloads(0, 3))  # resent nonces: acked, not stored again
        metrics = daemon.metrics()
        assert metrics['logrouter_duplicates_total'] == 3
        daemon.stop_gracefully()
    assert_exactly_once(tmp_path / "lake", expected(40))
    assert set(lake_column(tmp_path / "lake", "tag")) == {"courier.test"}


def test_tls_with_a_client_certificate(tmp_path, pki):
    listen = f"ssl:0:interface=127.0.0.1:privateKey={pki.server_key}:certKey={pki.server_cert}"
    with Daemon(tmp_path, config(listen, ssl_client_authentication="required", ca_file=str(pki.ca))) as daemon:
        daemon.start()
        context = ssl.create_default_context(cafile=str(pki.ca))
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
        assert CourierClient().run(daemon.port("courier"), payloads(0, 10), context)
        anonymous = ssl.create_default_context(cafile=str(pki.ca))
        assert not CourierClient().run(daemon.port("courier"), payloads(10, 1), anonymous)
        daemon.stop_gracefully()
    assert_exactly_once(tmp_path / "lake", expected(10))


def test_a_kill_9_while_the_client_keeps_sending_loses_and_doubles_nothing(tmp_path):
    client = CourierClient()
    total = 0
    for cycle in range(3):
        with Daemon(tmp_path, config()) as daemon:
            daemon.start()
            port = daemon.port("courier")
            killer = threading.Timer(0.3 + 0.2 * cycle, daemon.process.send_signal, (signal.SIGKILL,))
            killer.start()
            client.run(port, payloads(total, 400))
            killer.join()
            daemon.process.wait(30)
            total = max(int.from_bytes(n, "big") for n in client.sent_once) + 1
    with Daemon(tmp_path, config()) as daemon:
        daemon.start()
        assert client.run(daemon.port("courier"), iter(()))  # the unacked rest, resent
        daemon.stop_gracefully()
    assert not client.unacked
    print(f"{len(client.acked)} payloads acked, {client.resent} resent after kills")
    assert_exactly_once(tmp_path / "lake", expected(total))

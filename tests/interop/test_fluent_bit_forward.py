"""The real Fluent Bit (1.8.15, built by ``tests/fluent_bit.py``) shipping to the real
daemon on loopback with exactly the configurations of ``docs/guides/fluent-bit.md``.

The page's snippets are read from it (``guide()``): the base logrouter config (a forward
source and the lake), the base Fluent Bit config (``tail`` with filesystem storage →
``forward`` with ``Require_ack_response``), and per variant ("With TLS", "With a shared
key and users") a ``[sources.forward]`` that replaces the base one and an ``[OUTPUT]``
that replaces the base one. What a test changes is where things are (the host, the port
and the file paths, each replaced where the page has it, so a page that drops one of them
fails here), Fluent Bit's log level and its grace period at a stop, and the lake's roll
interval.

Every line of the followed file must land in the lake exactly once: also when a proxy
swallows the ack of a stored chunk, and across two ``kill -9`` of the router. Fluent Bit's
``chunk`` id is a hash of the chunk's records, so its retry of a chunk the router had
stored carries the same id and is stored once.

Skipped, saying why, where Fluent Bit cannot be built (``tests/fluent_bit.py``).
"""

from __future__ import annotations

import collections
import re
import socket
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from daemon import Daemon
from fluent_bit import VERSION, FluentBit, ensure_built_with_reason, free_port
from helpers import lake_column, wait_until
from repo_paths import DOCS
from logrouter.lake.dataset import lake_dataset

pytestmark = pytest.mark.timeout(900)  # the first test may build Fluent Bit (600 s budget)

GUIDE = DOCS / "guides" / "fluent-bit.md"
BLOCK = re.compile(r"^```(toml|ini)\n(.*?)^```", re.M | re.S)
VARIANTS = {"plain": None, "tls": "With TLS", "shared-key": "With a shared key and users"}
HEADER = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"
"""


def guide() -> dict[str, dict[str, str]]:
    """The page's snippets: ``{section title: {"toml": text, "ini": text}}``."""
    sections: dict[str, dict[str, str]] = {}
    for part in re.split(r"^## ", GUIDE.read_text(encoding="utf-8"), flags=re.M)[1:]:
        title = part.split("\n", 1)[0].strip()
        for lang, text in BLOCK.findall(part):
            assert lang not in sections.setdefault(title, {}), f"two {lang} blocks under {title!r}"
            sections[title][lang] = text
    return sections


def replace(text: str, old: str, new: str) -> str:
    assert old in text, f"the guide's snippet no longer has {old!r}:\n{text}"
    return text.replace(old, new)


def split_table(toml: str, table: str) -> tuple[str, str]:
    """``toml`` cut before ``[table]``: what comes before it and the rest."""
    head, _, tail = replace(toml, f"[{table}]", "\0").partition("\0")
    return head, f"[{table}]" + tail


def router_config(variant: str, port: int, pki) -> str:
    snippets = guide()
    source, sink = split_table(snippets["logrouter"]["toml"], "sinks.lake")
    if VARIANTS[variant]:
        source = snippets[VARIANTS[variant]]["toml"]
    if "ssl:24224" in source:
        source = replace(source, "ssl:24224:privateKey=/etc/logrouter/server.key:certKey=/etc/logrouter/server.pem",
                         pki.ssl_endpoint(port))
        source = replace(source, "/etc/logrouter/ca.pem", str(pki.ca))
    else:
        source = replace(source, '"tcp:24224"', f'"tcp:{port}:interface=127.0.0.1"')
    sink = replace(sink, '"/var/lib/logrouter/lake"', '"lake"') + "roll_secs = 0.5\n"
    return HEADER + source + "\n" + sink


def fluent_bit_config(variant: str, port: int, workdir: Path, pki) -> str:
    snippets = guide()
    base = snippets["Fluent Bit"]["ini"]
    service_and_input, output = split_table(base, "OUTPUT")
    if VARIANTS[variant]:
        output = snippets[VARIANTS[variant]]["ini"]
    output = replace(output, "router.example", "127.0.0.1")
    output = replace(output, "24224", str(port))
    for placeholder, path in (("/etc/fluent-bit/ca.pem", pki.ca), ("/etc/fluent-bit/client.pem", pki.client_cert),
                              ("/etc/fluent-bit/client.key", pki.client_key)):
        if "tls " in output:
            output = replace(output, placeholder, str(path))
    service_and_input = replace(service_and_input, "/var/lib/fluent-bit/storage", str(workdir / "storage"))
    service_and_input = replace(service_and_input, "/var/log/app/*.log", str(workdir / "logs" / "*.log"))
    # Fluent Bit's own log: what the tests wait on and print on a failure
    service_and_input = replace(service_and_input, "[SERVICE]\n", "[SERVICE]\n    Log_Level info\n    Grace 2\n")
    return service_and_input + output


def write_lines(workdir: Path, lines: list[str]) -> None:
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "app.log", "a") as f:
        f.writelines(line + "\n" for line in lines)


def metric(daemon: Daemon, name: str) -> float:
    return sum(v for k, v in daemon.metrics().items() if k == name or k.startswith(name + "{"))


def lake_lines(lake: Path) -> list[str]:
    """The ``log`` column of the lake; empty while no file has one."""
    if not lake.exists() or not any(lake.rglob("*.parquet")):
        return []
    table = lake_dataset(str(lake)).to_table()
    return table.column("log").to_pylist() if "log" in table.column_names else []


def wait_for_lake(lake: Path, lines: list[str], timeout: float, log: Callable[[], str]) -> None:
    """Until the lake holds every one of ``lines`` (read every half second: each read
    opens every file)."""
    wanted = set(lines)
    deadline = time.monotonic() + timeout
    while not wanted.issubset(lake_lines(lake)):
        if time.monotonic() > deadline:
            missing = wanted.difference(lake_lines(lake))
            raise AssertionError(f"{len(missing)} lines not in the lake after {timeout}s; Fluent Bit's log:\n{log()[-4000:]}")
        time.sleep(0.5)  # poll interval; the bound is the deadline


def assert_exactly_once(lake: Path, lines: list[str]) -> None:
    counts = collections.Counter(lake_column(lake, "log"))
    missing = [line for line in lines if line not in counts]
    assert not missing, f"{len(missing)} lines missing from the lake, e.g. {missing[:3]}"
    assert set(counts) == set(lines), f"lines the file never had: {sorted(set(counts) - set(lines))[:3]}"
    doubled = {line: n for line, n in counts.items() if n > 1}
    assert not doubled, f"{len(doubled)} lines landed more than once, e.g. {list(doubled.items())[:3]}"


@pytest.fixture(scope="module")
def fluent_bit():
    binary, reason = ensure_built_with_reason()
    if binary is None:
        pytest.skip(f"Fluent Bit {VERSION} is not available: {reason}")
    return binary


def test_the_guide_has_the_snippets_the_tests_run():
    snippets = guide()
    assert set(snippets["logrouter"]) == {"toml"} and set(snippets["Fluent Bit"]) == {"ini"}
    for title in filter(None, VARIANTS.values()):
        assert set(snippets[title]) == {"toml", "ini"}, title
    assert "Require_ack_response  On" in snippets["Fluent Bit"]["ini"]
    assert "storage.type          filesystem" in snippets["Fluent Bit"]["ini"]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_line_lands_once(tmp_path, pki, fluent_bit, variant):
    port = free_port()
    lines = [f"{variant} line {i:05d}" for i in range(3000)]
    write_lines(tmp_path / "fb", lines)
    with Daemon(tmp_path, router_config(variant, port, pki)) as daemon:
        daemon.start()
        with FluentBit(fluent_bit, tmp_path / "fb", fluent_bit_config(variant, port, tmp_path / "fb", pki)) as shipper:
            shipper.start()
            wait_until(lambda: metric(daemon, "logrouter_events_in_total") >= len(lines), 120,
                       f"{len(lines)} events in; Fluent Bit's log:\n{shipper.output[-4000:]}")
            shipper.stop()
        daemon.stop_gracefully()
    assert "[error]" not in shipper.output, shipper.output
    assert_exactly_once(tmp_path / "lake", lines)
    assert set(lake_column(tmp_path / "lake", "tag")) == {"app"}


def test_a_wrong_shared_key_is_refused(tmp_path, pki, fluent_bit):
    port = free_port()
    write_lines(tmp_path / "fb", ["never stored"])
    fb_config = fluent_bit_config("shared-key", port, tmp_path / "fb", pki)
    fb_config = replace(fb_config, "Shared_Key            a-long-shared-secret", "Shared_Key            another-secret")
    with Daemon(tmp_path, router_config("shared-key", port, pki)) as daemon:
        daemon.start()
        with FluentBit(fluent_bit, tmp_path / "fb", fb_config) as shipper:
            shipper.start()
            shipper.wait_for(r"failed authorization: shared_key mismatch", 60)
            wait_until(lambda: metric(daemon, "logrouter_source_auth_failures_total") >= 1, 30, "a counted refusal")
            shipper.stop()
        assert metric(daemon, "logrouter_events_in_total") == 0
        daemon.stop_gracefully()


def test_a_kill_9_of_the_router_loses_and_doubles_nothing(tmp_path, pki, fluent_bit):
    """Two kills while Fluent Bit ships 4 batches of 2,000 lines: each lands once the
    router has stored some, just after a new batch was written (where in Fluent Bit's
    flush the kill falls is not chosen: a chunk may be in flight, stored but not acked, or
    not yet sent), and more lines are written while the router is down."""
    port = free_port()
    workdir = tmp_path / "fb"
    config = router_config("plain", port, pki)
    batches = [[f"batch {b} line {i:05d}" for i in range(2000)] for b in range(4)]
    written: list[str] = []
    duplicates = 0
    with FluentBit(fluent_bit, workdir, fluent_bit_config("plain", port, workdir, pki)) as shipper:
        for cycle in range(2):
            with Daemon(tmp_path, config) as daemon:
                daemon.start()
                if cycle == 0:
                    write_lines(workdir, batches[0])
                    written += batches[0]
                    shipper.start()
                target = len(written) // 2 if cycle == 0 else 1
                wait_until(lambda: metric(daemon, "logrouter_events_in_total") >= target, 120,
                           f"{target} events in; Fluent Bit's log:\n{shipper.output[-4000:]}")
                write_lines(workdir, batches[cycle + 1])
                written += batches[cycle + 1]
                daemon.kill()
            # the router is down: lines written now make Fluent Bit flush and fail for sure;
            # it keeps what it read in its filesystem storage and retries
            down = [f"down {cycle} line {i:05d}" for i in range(100)]
            write_lines(workdir, down)
            written += down
            failures = shipper.output.count("failed to flush chunk")
            wait_until(lambda: shipper.output.count("failed to flush chunk") > failures, 60,
                       f"a failed flush; Fluent Bit's log:\n{shipper.output[-4000:]}")
        with Daemon(tmp_path, config) as daemon:
            daemon.start()
            write_lines(workdir, batches[3])
            written += batches[3]
            wait_for_lake(tmp_path / "lake", written, 240, lambda: shipper.output)
            duplicates = metric(daemon, "logrouter_duplicates_total")
            shipper.stop()
            daemon.stop_gracefully()
    print(f"{len(written)} lines; {duplicates:.0f} chunks resent after the last kill were stored once")
    assert_exactly_once(tmp_path / "lake", written)


class AckDropper:
    """A loopback TCP proxy between Fluent Bit and the router that, on its first
    connection, swallows the router's first answer (the ack of a stored chunk) and cuts
    both sides; later connections pass through. Fluent Bit must then send that chunk again
    under the same id, which the router acks without storing it twice."""

    def __init__(self, router_port: int) -> None:
        self.router_port = router_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.dropped = threading.Event()
        self.connections = 0
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._closed = False
        self._spawn(self._accept)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.router_port))
            self._sockets += [client, upstream]
            self.connections += 1
            first = self.connections == 1
            self._spawn(self._pump, client, upstream, False)
            self._spawn(self._pump, upstream, client, first)

    def _pump(self, src: socket.socket, dst: socket.socket, drop_first_answer: bool) -> None:
        try:
            while data := src.recv(65536):
                if drop_first_answer:
                    self.dropped.set()
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Shut every socket down first: a close from another thread does not wake a
        thread blocked in its accept() or recv()."""
        self._closed = True
        for s in (self.listener, *self._sockets):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for thread in self._threads:
            thread.join(10)
            assert not thread.is_alive(), "a proxy thread did not stop"


def test_a_chunk_whose_ack_is_lost_is_sent_again_and_stored_once(tmp_path, pki, fluent_bit):
    router_port = free_port()
    lines = [f"ack lost line {i:05d}" for i in range(2000)]
    write_lines(tmp_path / "fb", lines)
    with Daemon(tmp_path, router_config("plain", router_port, pki)) as daemon:
        daemon.start()
        proxy = AckDropper(router_port)
        try:
            config = fluent_bit_config("plain", proxy.port, tmp_path / "fb", pki)
            with FluentBit(fluent_bit, tmp_path / "fb", config) as shipper:
                shipper.start()
                assert proxy.dropped.wait(120), shipper.output[-4000:]
                wait_until(lambda: metric(daemon, "logrouter_duplicates_total") >= 1, 120,
                           f"the chunk sent again; Fluent Bit's log:\n{shipper.output[-4000:]}")
                shipper.stop()
        finally:
            proxy.close()
        assert metric(daemon, "logrouter_events_in_total") == len(lines)
        daemon.stop_gracefully()
    assert proxy.connections >= 2
    assert_exactly_once(tmp_path / "lake", lines)

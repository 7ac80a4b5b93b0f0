"""Small things many tests need: exact socket reads, bounded waits, metrics, the lake."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path
from typing import Callable

from logrouter.lake.dataset import lake_dataset


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes, or fewer if the peer closed first."""
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            break
        data += part
    return data


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` (a metric, a file) until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def spin(reactor, d, timeout: float = 30):
    """Iterate the global reactor until ``d`` fires (for code that runs real threads); its result."""
    result: list = []
    d.addBoth(result.append)
    deadline = reactor.seconds() + timeout
    while not result and reactor.seconds() < deadline:
        reactor.iterate(0.01)
    assert result, "Deferred did not fire in time"
    if hasattr(result[0], "raiseException"):
        result[0].raiseException()
    return result[0]


def scrape(port: int) -> dict[str, float]:
    """The daemon's /metrics as ``{'name{labels}': value}``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values


def read_lake(path: Path | str) -> list[dict]:
    """Every row of a lake, schema unified over all its files."""
    return lake_dataset(str(path)).to_table().to_pylist()


def lake_column(path: Path | str, column: str) -> list:
    return lake_dataset(str(path)).to_table(columns=[column]).column(column).to_pylist()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")

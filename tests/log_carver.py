"""Log Carver, Log Courier's own receiver, for comparing what it acknowledges with us.

Log Carver (``log-carver``, built by ``log_courier_shipper.LOG_CARVER`` from the same
Log Courier tarball as the shipper) receives the Courier protocol and publishes onward.
``Carver`` runs it on loopback with one ``tcp`` receiver and the ``test`` network
transport, which acknowledges every payload it is given (after ``delay`` seconds; half of
the time in two steps, its own "split acknowledgement") and keeps nothing. What it
acknowledged, and when, is read from the shipper's debug log (``tests/log_courier_log.py``).

Knobs: ``max_pending_payloads`` (the receiver's, default 10 as the shipper's) and
``max_queue_size`` (``general``, bytes of received events not yet taken by its pipeline;
in 2.12.0 a ``general`` key, though its docs list it under the receiver). Exceeding
either stops reading that connection, acknowledges what it holds and closes it; the
payload that did not fit is dropped and the shipper sends it again after reconnecting.

``compare()`` runs one shipper config against Log Carver and against ``logrouter``, a
plain run and then a full pipeline, and sums up what the shipper was acknowledged and
how; ``python tests/log_carver.py`` prints that (``docs/protocols/log_courier.md`` records
the result), ``tests/interop/test_log_carver.py`` (only with ``LOGROUTER_LOG_CARVER=1``, about a
minute) asserts it.

Full pipeline: Log Carver with a receiver ``max pending payloads`` of 2 and a 6 s output
delay (the shipper has up to 10 payloads in flight); logrouter with a parquet sink that
cannot write (its staging path is a file) and a 256 kB spool, for the same 6 s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from log_courier_log import ShipperLog

LISTENING = "] Listening"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CarverFailed(RuntimeError):
    pass


class Carver:
    """One ``log-carver`` on 127.0.0.1 with a ``tcp`` Courier receiver; a context manager."""

    def __init__(
        self,
        binary: Path | str,
        *,
        workdir: Path | str | None = None,
        delay: int = 0,
        max_pending_payloads: int = 10,
        max_queue_size: int | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        self.binary = Path(binary)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="log-carver-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        general: dict = {"log level": "debug", "log stdout": True, "persist directory": str(self.workdir)}
        if max_queue_size is not None:
            general["max queue size"] = max_queue_size
        self.config = {
            "general": general,
            "receivers": [{
                "transport": "tcp",
                "listen": [f"127.0.0.1:{self.port}"],
                "max pending payloads": max_pending_payloads,
            }],
            # The test transport acknowledges what it is given after `delay` s and keeps nothing.
            "network": {"transport": "test", "servers": ["test"], "min delay": delay, "max delay": delay},
        }
        self.config_path = self.workdir / "log-carver.json"
        self.config_path.write_text(json.dumps(self.config, indent=2) + "\n")
        self.output_path = self.workdir / "output.log"
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self._output_file = None

    def start(self) -> "Carver":
        self._output_file = open(self.output_path, "wb")
        self.proc = subprocess.Popen(
            [str(self.binary), "-config", str(self.config_path)], stdin=subprocess.DEVNULL,
            stdout=self._output_file, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout
        while LISTENING not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise CarverFailed(f"log-carver did not listen on {self.port}:\n{self.output()[-3000:]}")
            time.sleep(0.05)  # poll interval; the bound is the deadline
        return self

    def stop(self, grace: float = 10.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                try:  # its own session: the group is only what it started
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=grace)
        if self._output_file is not None:
            self._output_file.close()
            self._output_file = None
        return proc.returncode

    def output(self) -> str:
        try:
            return self.output_path.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> "Carver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._own_workdir and exc[0] is None:
            shutil.rmtree(self.workdir, ignore_errors=True)


# -- the comparison -----------------------------------------------------------------------


LINES = 12000  # plain runs: 12 payloads of 1024 events and one of 288
FULL_LINES = 4000  # full pipeline runs: 4 payloads, 2 more than Log Carver takes at once
HOLD_SECS = 6.0

ROUTER_CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"
workers = 1

[spool]
path = "spool"
{spool}
[sources.courier]
type = "log_courier"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["courier"]
path = "lake"
writer_id = "lc"
roll_secs = 0.5
retry_initial_secs = 0.1
retry_max_secs = 0.5
"""


@dataclass
class Run:
    """One shipper run against one receiver, as the shipper's log tells it."""

    receiver: str
    scenario: str
    seconds: float  # from the first payload sent to the last ACKN
    payloads: int
    acks: int
    partial_steps: int  # ACKNs of part of a payload, above 0
    zeros: int  # ACKN 0: a payload kept alive, nothing of it done yet
    repeats: int  # the same partial count again (Log Carver's 5 s repeat)
    connections: int
    failures: list[str]
    acknowledged: int

    @classmethod
    def of(cls, receiver: str, scenario: str, log: ShipperLog) -> "Run":
        seconds = log.acks[-1].at if log.acks else 0.0
        return cls(receiver, scenario, round(seconds, 1), len(log.payloads), len(log.acks), len(log.partial_steps()),
                   len(log.zeros()), len(log.repeats()), log.connections, log.failures, log.acknowledged)


def _ship(shipper_bin: Path, port: int, workdir: Path, lines: list[str], during=None, timeout: float = 120) -> ShipperLog:
    """Ship ``lines`` to ``port`` until all are acknowledged (at most ``timeout`` s);
    ``during(shipper)`` runs while it sends. The shipper's log."""
    from log_courier_shipper import Shipper  # its module builds the shipper binaries

    with Shipper(shipper_bin, port, workdir=workdir, timeout=15) as shipper:
        started = time.monotonic()
        shipper.write_lines(lines)
        if during is not None:
            during(shipper)
        deadline = started + timeout
        while shipper.log().acknowledged < len(lines) and time.monotonic() < deadline:
            time.sleep(0.1)  # poll interval; the bound is the deadline
        shipper.close_stdin()
        shipper.wait(30)
        return shipper.log()


def compare(shipper_bin: Path, carver_bin: Path, workdir: Path) -> list[Run]:
    """The same shipper config against Log Carver and logrouter, plain and held back."""
    from daemon import Daemon

    # 100 hex digits of noise a line: payloads of about 60 kB on the wire, so a router
    # held back has the rest of the shipper's payloads waiting in the socket
    lines = {scenario: [f"line {i} {os.urandom(50).hex()}" for i in range(count)]
             for scenario, count in (("plain", LINES), ("full", FULL_LINES))}
    runs = []
    for scenario, carver_options in (("plain", {}), ("full", {"max_pending_payloads": 2, "delay": int(HOLD_SECS)})):
        folder = workdir / f"carver-{scenario}"
        with Carver(carver_bin, workdir=folder, **carver_options) as carver:
            log = _ship(shipper_bin, carver.port, folder / "shipper", lines[scenario])
        runs.append(Run.of("Log Carver 2.12.0", scenario, log))
    for scenario in ("plain", "full"):
        folder = workdir / f"router-{scenario}"
        folder.mkdir(parents=True)
        spool = "max_bytes = 262144\nsegment_bytes = 131072\n" if scenario == "full" else ""
        with Daemon(folder, ROUTER_CONFIG.format(spool=spool)) as daemon:
            daemon.start()
            during = None
            if scenario == "full":
                blocker = folder / "lake" / "_staging" / "lc"
                blocker.parent.mkdir(parents=True)
                blocker.write_text("the sink cannot stage files until this is removed")

                def during(shipper, blocker=blocker):
                    time.sleep(HOLD_SECS)  # the hold itself is what is measured
                    blocker.unlink()
            log = _ship(shipper_bin, daemon.port("courier"), folder / "shipper", lines[scenario], during)
            daemon.stop()
        runs.append(Run.of("logrouter", scenario, log))
    return runs


def main() -> int:
    from log_courier_shipper import LOG_CARVER, SHIPPER

    binaries = []
    for program in (SHIPPER, LOG_CARVER):
        path, why = program.ensure_built_with_reason()
        print(why)
        if path is None:
            return 1
        binaries.append(path)
    with tempfile.TemporaryDirectory(prefix="log-carver-compare-") as work:
        runs = compare(binaries[0], binaries[1], Path(work))
    print(f"plain: {LINES} lines, full: {FULL_LINES}; shipper spool size 1024, max pending payloads 10, timeout 15 s")
    columns = ("receiver", "scenario", "seconds", "payloads", "acks", "partial_steps", "zeros", "repeats",
               "connections", "acknowledged")
    print(" | ".join(columns))
    for run in runs:
        print(" | ".join(str(getattr(run, c)) for c in columns) + (f"  failures: {run.failures}" if run.failures else ""))
    return 0


if __name__ == "__main__":  # python tests/log_carver.py
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main())

"""The real Log Courier shipper (Go, github.com/driskell/log-courier 2.12.0) for tests.

``ensure_built()`` builds the ``log-courier`` binary once per machine from the Log Courier
tarball in the peers folder (``log-courier-2c9d7dbd.tar.gz``: the repository at commit
2c9d7dbd, whose module the Go module proxy here refuses; its dependencies come from the
proxy), caches it outside the checkout (``<cache>/log-courier/<tarball>-<hash>/``) and
returns its path; it returns None when it cannot be had (no tarball, no Go, the build
fails), with the reason in ``build_reason()`` so a test can ``pytest.skip(build_reason())``.
The building, caching, locking and failure memory is ``tests/go_binary.py``'s ``GoBinary``
(``SHIPPER``), which says where the peers folder and the cache are.

Knobs (environment):

- ``LOGROUTER_LOG_COURIER_BIN``: a prebuilt ``log-courier`` to use instead of building.
- ``LOGROUTER_PEERS_DIR``: the folder holding the tarball (default
  ``<checkout>/../shared/peers``).
- ``LOGROUTER_LOG_COURIER_BUILD_TIMEOUT``: seconds for the whole build (default 480,
  under the 600 s pytest-timeout of the first test that asks for it).

When its connection breaks just as it hands a new payload to it, 2.12.0 sends that
payload's events twice, under two nonces; ``Shipper.log()`` (``tests/log_courier_log.py``)
reads from the shipper's debug log what it sent, what was acknowledged and how many events
it sent again so (``sent_again``).

``Shipper`` runs the binary as ``log-courier -config <file> -stdin``: it reads lines
from its standard input and ships each as one event (``message`` = the line) to one
server, over ``tcp`` or ``tls``. At stdin EOF it drops what is still in its spool (it
does not flush: write lines more than ``spool_timeout`` before closing stdin) and waits
until the server has acknowledged every event it sent; then its pipeline stops (it logs ``FINISHED``), but
2.12.0 does not exit by itself: its main loop keeps waiting for a signal (nothing calls
its ``App.Stop``). ``Shipper.wait`` therefore sends SIGTERM once ``FINISHED`` is logged,
on which the shipper exits 0. Beware: after stdin EOF, a connection that fails (a router
killed or reloaded) ends the shipper too, with ``FINISHED`` and exit 0, and what was not
acknowledged is never sent; tests that break connections close stdin only once
``Shipper.log().acknowledged`` has every line.

With ``files`` (a list of file sets, each ``{"paths": [...], ...}``) it follows files
instead, each from its beginning (``-from-beginning``), and runs until stopped; only then
does it serve its admin REST API (``admin``: a listen address such as
``tcp:127.0.0.1:1234``; 2.12.0 skips the API with ``-stdin``), which ``status()`` asks
with ``lc-admin -connect <address> -quiet status`` (``LC_ADMIN``, built from the same
tarball) and returns parsed (``parse_status``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable

from go_binary import GoBinary, PeerTarball
from log_courier_log import ShipperLog

# Logged once stdin is at EOF and every event is acknowledged (the publisher holds its
# shutdown until then) and the whole pipeline has stopped; also on a failed start-up,
# after which the shipper exits 1 by itself.
FINISHED = "Services shutting down"

TARBALL = PeerTarball("log-courier-2c9d7dbd.tar.gz", module_dir="log-courier", package=".")

SHIPPER = GoBinary(
    name="Log Courier shipper",
    tarball=TARBALL,
    binary="log-courier",
    bin_env="LOGROUTER_LOG_COURIER_BIN",
    timeout_env="LOGROUTER_LOG_COURIER_BUILD_TIMEOUT",
    default_timeout=480.0,
    cgo=False,
)

# Built from the same tarball: the shipper's admin client (``lc-admin -connect <address>
# -quiet status`` prints the shipper's REST API status) and Log Carver, Log Courier's own
# receiver (see ``tests/log_carver.py``).
LC_ADMIN = GoBinary(
    name="Log Courier lc-admin",
    tarball=PeerTarball(TARBALL.file_name, module_dir=TARBALL.module_dir, package="./lc-admin"),
    binary="lc-admin",
    bin_env="LOGROUTER_LC_ADMIN_BIN",
    timeout_env="LOGROUTER_LOG_COURIER_BUILD_TIMEOUT",
    default_timeout=480.0,
    cgo=False,
)

LOG_CARVER = GoBinary(
    name="Log Carver",
    tarball=PeerTarball(TARBALL.file_name, module_dir=TARBALL.module_dir, package="./log-carver"),
    binary="log-carver",
    bin_env="LOGROUTER_LOG_CARVER_BIN",
    timeout_env="LOGROUTER_LOG_COURIER_BUILD_TIMEOUT",
    default_timeout=480.0,
    cgo=False,
)


def build_reason() -> str:
    """Why the last ``ensure_built()`` returned what it did (a path or a failure)."""
    return SHIPPER.build_reason()


def ensure_built() -> Path | None:
    """The path of the ``log-courier`` binary, built once and cached; None if unavailable."""
    return SHIPPER.ensure_built()


def ensure_built_with_reason() -> tuple[Path | None, str]:
    return SHIPPER.ensure_built_with_reason()


def parse_status(text: str) -> dict:
    """``lc-admin -quiet status`` output (YAML-like ``key: value`` lines, nested by
    two-space indentation) as nested dicts of strings."""
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    for line in text.splitlines():
        text_ = line.strip()
        if not text_.endswith(":") and ": " not in text_:
            continue
        indent = len(line) - len(line.lstrip(" "))
        # A key may hold colons itself (an endpoint "127.0.0.1:5043"): a nested map's key
        # is the whole line but its last colon, a value follows the first ": ".
        key, _, value = (text_[:-1], "", "") if text_.endswith(":") else text_.partition(": ")
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value.strip():
            parent[key] = value.strip()
        else:
            parent[key] = child = {}
            stack.append((indent, child))
    return root


class Shipper:
    """One ``log-courier -stdin`` process shipping to one server; a context manager.

    >>> with Shipper(binary, port) as shipper:
    ...     shipper.write_lines(["a", "b"])
    ...     shipper.close_stdin()
    ...     assert shipper.wait(30) == 0
    """

    def __init__(
        self,
        binary: Path | str,
        port: int,
        host: str = "127.0.0.1",
        *,
        transport: str = "tcp",
        ca: Path | str | None = None,
        certificate: Path | str | None = None,
        key: Path | str | None = None,
        workdir: Path | str | None = None,
        fields: dict | None = None,
        spool_size: int = 1024,
        spool_timeout: str = "100ms",
        max_pending_payloads: int = 10,
        timeout: int = 15,
        reconnect_backoff: str | int = 0,
        reconnect_backoff_max: str | int = "1s",
        log_level: str = "debug",
        extra_general: dict | None = None,
        extra_network: dict | None = None,
        files: list[dict] | None = None,
        admin: str | None = None,
    ) -> None:
        if log_level not in ("debug", "info", "notice"):  # FINISHED is a notice
            raise ValueError(f"log_level must be debug, info or notice for wait(), not {log_level!r}")
        if transport not in ("tcp", "tls"):
            raise ValueError(f"transport must be tcp or tls, not {transport!r}")
        if transport == "tls" and ca is None:
            raise ValueError("tls needs a CA file (ssl ca)")
        if (certificate is None) != (key is None):
            raise ValueError("a client certificate needs its key and the other way round")
        self.binary = Path(binary)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="log-courier-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "persist").mkdir(exist_ok=True)
        network: dict = {
            "transport": transport,
            "servers": [f"{host}:{port}"],
            "method": "failover",
            "max pending payloads": max_pending_payloads,
            "timeout": timeout,
            "reconnect backoff": reconnect_backoff,
            "reconnect backoff max": reconnect_backoff_max,
            "failure backoff max": reconnect_backoff_max,
        }
        if transport == "tls":
            network["ssl ca"] = str(ca)
            if certificate is not None:
                network["ssl certificate"] = str(certificate)
                network["ssl key"] = str(key)
        network.update(extra_network or {})
        general: dict = {
            "persist directory": str(self.workdir / "persist"),
            "log level": log_level,
            "log stdout": True,
            "host": "logrouter-test",
            "spool size": spool_size,
            "spool timeout": spool_timeout,
        }
        general.update(extra_general or {})
        self.config = {
            "general": general,
            "network": network,
            "stdin": {"fields": dict(fields or {"type": "stdin"})},
        }
        if files is not None:
            self.config["files"] = files
        self.admin = admin
        if admin is not None:
            self.config["admin"] = {"enabled": True, "listen address": admin}
        # JSON (extension .json); the shipper takes YAML for .yaml/.yml as well.
        self.config_path = self.workdir / "log-courier.json"
        self.config_path.write_text(json.dumps(self.config, indent=2) + "\n")
        self.output_path = self.workdir / "output.log"
        # Without files: lines from stdin. With files: the files, each from its beginning
        # (without -from-beginning a file found at the first start is shipped from its end).
        mode = "-stdin" if files is None else "-from-beginning"
        self.argv = [str(self.binary), "-config", str(self.config_path), mode]
        self.proc: subprocess.Popen | None = None
        self._output_file = None

    # -- lifecycle -------------------------------------------------------------------

    def config_test(self, timeout: float = 30) -> subprocess.CompletedProcess:
        """``log-courier -config <file> -config-test``: exit 0 and 'Configuration OK' if valid."""
        return subprocess.run(
            [str(self.binary), "-config", str(self.config_path), "-config-test"],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )

    def start(self) -> "Shipper":
        if self.proc is not None:
            raise RuntimeError("already started")
        self._output_file = open(self.output_path, "wb")
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=self._output_file,
            stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True,
        )
        return self

    def write_lines(self, lines: Iterable[str]) -> None:
        assert self.proc is not None and self.proc.stdin is not None, "not started"
        data = "".join(line + "\n" for line in lines).encode()
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def wait(self, timeout: float, grace: float = 10.0) -> int | None:
        """Wait up to ``timeout`` s until the shipper has shipped everything and ended;
        its exit code, or None if it is still at work.

        It ends when it exits by itself or, as 2.12.0 does after stdin EOF, when it has
        logged ``FINISHED``: it is then sent SIGTERM and given ``grace`` s to exit."""
        proc = self.proc
        assert proc is not None, "not started"
        deadline = time.monotonic() + timeout
        marker = FINISHED.encode()
        read, tail = 0, b""  # tail: the last bytes read, for a marker split between two reads
        while True:
            code = proc.poll()
            if code is not None:
                return code
            new = self._output_from(read)
            read += len(new)
            if marker in tail + new:
                try:
                    proc.send_signal(signal.SIGTERM)
                    return proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    return None
            tail = (tail + new)[-len(marker):]
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)  # poll interval; the bound is the deadline

    def stop(self, grace: float = 5.0) -> int | None:
        """Stop the process if it still runs: SIGTERM (a clean shutdown, which waits for
        what is unacknowledged), after ``grace / 5`` s a second SIGTERM (2.12.0: "send again
        to force immediate shutdown"), then SIGKILL."""
        proc = self.proc
        if proc is None:
            return None
        self.close_stdin()
        for sig, wait in ((signal.SIGTERM, grace / 5), (signal.SIGTERM, grace)):
            if proc.poll() is not None:
                break
            try:
                proc.send_signal(sig)
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                break
        if proc.poll() is None:
            try:  # its own session (start_new_session): the group is only what it started
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=grace)
        if self._output_file is not None:
            self._output_file.close()
            self._output_file = None
        return proc.returncode

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def output(self) -> str:
        """Everything the shipper printed so far (its log goes to stdout with `log stdout`)."""
        try:
            return self.output_path.read_text(errors="replace")
        except OSError:
            return ""

    def log(self) -> ShipperLog:
        """What its debug log says so far: payloads, ACKNs, reconnects, events sent again."""
        return ShipperLog.parse(self.output())

    def status(self, timeout: float = 30) -> dict:
        """Its admin API's full status, by ``lc-admin -quiet status`` (needs ``admin``)."""
        if self.admin is None:
            raise RuntimeError("the admin API is off: give Shipper(admin=...)")
        lc_admin, why = LC_ADMIN.ensure_built_with_reason()
        if lc_admin is None:
            raise RuntimeError(why)
        done = subprocess.run(
            [str(lc_admin), "-connect", self.admin, "-quiet", "status"],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            raise RuntimeError(f"lc-admin exited {done.returncode}: {done.stdout}{done.stderr}")
        return parse_status(done.stdout)

    def _output_from(self, offset: int) -> bytes:
        try:
            with open(self.output_path, "rb") as f:
                f.seek(offset)
                return f.read()
        except OSError:
            return b""

    def __enter__(self) -> "Shipper":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._own_workdir and exc[0] is None:
            shutil.rmtree(self.workdir, ignore_errors=True)


if __name__ == "__main__":  # python tests/log_courier_shipper.py: build (or say why not)
    raise SystemExit(SHIPPER.main())

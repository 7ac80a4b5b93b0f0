"""The real Log Courier shipper (Go, github.com/driskell/log-courier 2.12.x) for tests.

``ensure_built()`` builds the ``log-courier`` binary once with the Go toolchain and the
Go module proxy, caches it under ``tests/.cache/log-courier/<version>/`` (ignored by
git) and returns its path; it returns None when it cannot be had (no Go, the proxy
refuses or times out, the build fails), with the reason in ``build_reason()`` so a test
can ``pytest.skip(build_reason())``. Everything Go writes (module cache, build cache,
GOPATH) goes under ``tests/.cache/go/``; a rerun with the binary cached costs a stat.
The building, caching and locking is ``tests/go_binary.py``'s ``GoBinary`` (``SHIPPER``).

Knobs (environment):

- ``LOGROUTER_LOG_COURIER_BIN``: a prebuilt ``log-courier`` to use instead of building.
- ``LOGROUTER_LOG_COURIER_VERSION``: what to ask the proxy for (default: the commit
  ``2c9d7dbd`` of 2.12.0; its v2 tags have no /v2 module path, so a commit or a full
  pseudo-version is needed).
- ``LOGROUTER_LOG_COURIER_BUILD_TIMEOUT``: seconds for the whole build (default 480,
  under the 600 s pytest-timeout of the first test that asks for it).

A failed build is remembered for ``FAILURE_TTL`` seconds in ``FAILED`` beside where the
binary would be, so a test run does not ask the proxy again for every session; delete
the file (or the whole ``tests/.cache``) to retry at once.

``Shipper`` runs the binary as ``log-courier -config <file> -stdin``: it reads lines
from its standard input and ships each as one event (``message`` = the line) to one
server, over ``tcp`` or ``tls``. At stdin EOF it flushes its spool, waits until the
server has acknowledged every event, and exits 0 by itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

from go_binary import CACHE_DIR, FAILURE_TTL, GO_DIR, TESTS_DIR, GoBinary  # noqa: F401 (re-exported)

MODULE = "github.com/driskell/log-courier"
DEFAULT_VERSION = "2c9d7dbd"  # commit of Log Courier 2.12.0 (docs/Protocol.md snapshot)

SHIPPER = GoBinary(
    name="Log Courier shipper",
    module=MODULE,
    binary="log-courier",
    default_version=DEFAULT_VERSION,
    bin_env="LOGROUTER_LOG_COURIER_BIN",
    version_env="LOGROUTER_LOG_COURIER_VERSION",
    timeout_env="LOGROUTER_LOG_COURIER_BUILD_TIMEOUT",
    default_timeout=480.0,
    cgo=False,
)
VERSION = SHIPPER.version
BUILD_TIMEOUT = SHIPPER.build_timeout
BUILD_DIR = SHIPPER.build_dir
BINARY = SHIPPER.binary
FAILED = SHIPPER.failed


def go_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for every go command: caches inside the repo, no toolchain download."""
    return SHIPPER.go_env(extra)


def build_reason() -> str:
    """Why the last ``ensure_built()`` returned what it did (a path or a failure)."""
    return SHIPPER.build_reason()


def ensure_built() -> Path | None:
    """The path of the ``log-courier`` binary, built once and cached; None if unavailable."""
    return SHIPPER.ensure_built()


def ensure_built_with_reason() -> tuple[Path | None, str]:
    return SHIPPER.ensure_built_with_reason()


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
    ) -> None:
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
        # JSON (extension .json); the shipper takes YAML for .yaml/.yml as well.
        self.config_path = self.workdir / "log-courier.json"
        self.config_path.write_text(json.dumps(self.config, indent=2) + "\n")
        self.output_path = self.workdir / "output.log"
        self.argv = [str(self.binary), "-config", str(self.config_path), "-stdin"]
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

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s for the process to exit by itself; its exit code or None."""
        assert self.proc is not None, "not started"
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 5.0) -> int | None:
        """Stop the process if it still runs: SIGTERM (a clean shutdown), then SIGKILL."""
        proc = self.proc
        if proc is None:
            return None
        self.close_stdin()
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                try:  # its own session (start_new_session): the group is only what it started
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=grace)
            except ProcessLookupError:
                pass
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

    def __enter__(self) -> "Shipper":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._own_workdir and exc[0] is None:
            shutil.rmtree(self.workdir, ignore_errors=True)


if __name__ == "__main__":  # python tests/log_courier_shipper.py: build (or say why not)
    raise SystemExit(SHIPPER.main())

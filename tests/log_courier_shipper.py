"""The real Log Courier shipper (Go, github.com/driskell/log-courier 2.12.x) for tests.

``ensure_built()`` builds the ``log-courier`` binary once with the Go toolchain and the
Go module proxy, caches it under ``tests/.cache/log-courier/<version>/`` (ignored by
git) and returns its path; it returns None when it cannot be had (no Go, the proxy
refuses or times out, the build fails), with the reason in ``build_reason()`` so a test
can ``pytest.skip(build_reason())``. Everything Go writes (module cache, build cache,
GOPATH) goes under ``tests/.cache/go/``; a rerun with the binary cached costs a stat.

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

import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable

MODULE = "github.com/driskell/log-courier"
DEFAULT_VERSION = "2c9d7dbd"  # commit of Log Courier 2.12.0 (docs/Protocol.md snapshot)
VERSION = os.environ.get("LOGROUTER_LOG_COURIER_VERSION", DEFAULT_VERSION)
BUILD_TIMEOUT = float(os.environ.get("LOGROUTER_LOG_COURIER_BUILD_TIMEOUT", "480"))
FAILURE_TTL = 3600.0

TESTS_DIR = Path(__file__).resolve().parent
CACHE_DIR = TESTS_DIR / ".cache"
GO_DIR = CACHE_DIR / "go"
BUILD_DIR = CACHE_DIR / "log-courier" / VERSION.replace("/", "_")
BINARY = BUILD_DIR / "log-courier"
FAILED = BUILD_DIR / "FAILED"

_result: tuple[Path | None, str] | None = None


def go_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for every go command: caches inside the repo, no toolchain download."""
    env = dict(os.environ)
    env.update(
        GOPATH=str(GO_DIR / "path"),
        GOMODCACHE=str(GO_DIR / "mod"),
        GOCACHE=str(GO_DIR / "build"),
        # -modcacherw: the module cache stays deletable with a plain rm -rf tests/.cache
        GOFLAGS="-mod=mod -modcacherw -buildvcs=false",
        GOTOOLCHAIN="local",
        GO111MODULE="on",
        CGO_ENABLED="0",
        GOTELEMETRY="off",
    )
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    if extra:
        env.update(extra)
    return env


def build_reason() -> str:
    """Why the last ``ensure_built()`` returned what it did (a path or a failure)."""
    return ensure_built_with_reason()[1]


def ensure_built() -> Path | None:
    """The path of the ``log-courier`` binary, built once and cached; None if unavailable."""
    return ensure_built_with_reason()[0]


def ensure_built_with_reason() -> tuple[Path | None, str]:
    global _result
    if _result is None:
        _result = _ensure_built()
    return _result


def _ensure_built() -> tuple[Path | None, str]:
    override = os.environ.get("LOGROUTER_LOG_COURIER_BIN")
    if override:
        path = Path(override)
        if path.is_file() and os.access(path, os.X_OK):
            return path, f"prebuilt binary from LOGROUTER_LOG_COURIER_BIN: {path}"
        return None, f"LOGROUTER_LOG_COURIER_BIN={override} is not an executable file"
    if BINARY.is_file():
        return BINARY, f"cached build {BINARY}"
    go = shutil.which("go")
    if go is None:
        return None, "Log Courier shipper unavailable: no Go toolchain on PATH"
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with open(BUILD_DIR / ".lock", "w") as lock:  # one builder at a time (parallel runs)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if BINARY.is_file():
            return BINARY, f"cached build {BINARY}"
        remembered = _remembered_failure()
        if remembered:
            return None, remembered
        started = time.monotonic()
        ok, detail = _build(go)
        took = time.monotonic() - started
        if ok:
            FAILED.unlink(missing_ok=True)
            return BINARY, f"built {MODULE}@{VERSION} in {took:.1f}s: {detail}"
        reason = f"Log Courier shipper unavailable: building {MODULE}@{VERSION} failed after {took:.1f}s: {detail}"
        FAILED.write_text(json.dumps({"at": time.time(), "reason": reason}))
        return None, reason


def _remembered_failure() -> str | None:
    try:
        record = json.loads(FAILED.read_text())
    except (OSError, ValueError):
        return None
    age = time.time() - float(record.get("at", 0))
    if 0 <= age < FAILURE_TTL:
        return f"{record.get('reason')} (remembered from {age:.0f}s ago; delete {FAILED} to retry)"
    return None


def _build(go: str) -> tuple[bool, str]:
    """go get + go build in a throwaway module; (ok, detail)."""
    deadline = time.monotonic() + BUILD_TIMEOUT
    env = go_env()
    with tempfile.TemporaryDirectory(prefix="build-", dir=BUILD_DIR) as work:
        workdir = Path(work)
        (workdir / "go.mod").write_text("module logrouter.test/lcbuild\n\ngo 1.21\n")
        steps = [
            # Resolves the commit to its pseudo-version through the proxy and fetches
            # the module with its dependencies (a dependency's replace directives do
            # not apply here, which is why this is not `go install mod@version`).
            [go, "get", f"{MODULE}@{VERSION}"],
            [go, "build", "-trimpath", "-o", str(workdir / "log-courier"), MODULE],
        ]
        for argv in steps:
            left = deadline - time.monotonic()
            if left <= 0:
                return False, f"timed out (budget {BUILD_TIMEOUT:.0f}s) before `{' '.join(argv[1:3])}`"
            try:
                proc = subprocess.run(
                    argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                    capture_output=True, text=True, timeout=left,
                )
            except subprocess.TimeoutExpired:
                return False, f"`go {' '.join(argv[1:3])}` timed out (budget {BUILD_TIMEOUT:.0f}s)"
            if proc.returncode != 0:
                tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
                return False, f"`go {' '.join(argv[1:3])}` exited {proc.returncode}: {tail}"
        resolved = ""
        try:
            out = subprocess.run(
                [go, "list", "-m", MODULE], cwd=workdir, env=env, capture_output=True,
                text=True, timeout=max(5.0, deadline - time.monotonic()),
            )
            resolved = out.stdout.strip()
        except subprocess.TimeoutExpired:
            pass
        os.replace(workdir / "log-courier", BINARY)
    if resolved:
        (BUILD_DIR / "MODULE").write_text(resolved + "\n")
    return True, resolved or MODULE


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
    t0 = time.monotonic()
    path, why = ensure_built_with_reason()
    print(f"{why} [{time.monotonic() - t0:.2f}s]")
    raise SystemExit(0 if path else 1)

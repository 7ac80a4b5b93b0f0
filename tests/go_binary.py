"""A Go program built for the tests from the Go module proxy, once, and cached.

``GoBinary`` is the generic part of the harnesses of real Go peers
(``tests/log_courier_shipper.py``, ``tests/logjam_forwarder.py``) and of the Go load
generators of ``bench/beats_load.py``:

- ``ensure_built_with_reason()`` builds the program once with the Go toolchain and the
  module proxy (``go get module@version`` then ``go build package`` in a throwaway module),
  caches the binary under ``tests/.cache/<cache_name>/<version>/`` (ignored by git) and
  returns ``(path, why)``; the path is None when it cannot be had (no Go, a precondition
  such as a missing C library, the proxy refuses or times out, the build fails) and
  ``why`` says why, so a test can ``pytest.skip(why)``. The answer is kept for the rest of
  the process; a rerun with the binary cached costs a stat.
- Everything Go writes (module cache, build cache, GOPATH) goes under ``tests/.cache/go/``,
  shared by all programs; ``go_env()`` is the environment of every go command.
- One builder at a time: a lock file beside the binary (parallel test runs wait for the
  first one's build and then use it).
- A failed build is remembered for ``FAILURE_TTL`` seconds in ``FAILED`` beside where the
  binary would be, so a test run does not ask the proxy again for every session; delete
  the file (or the whole ``tests/.cache``) to retry at once. A failed precondition alone
  is not remembered: it is cheap to check again, and fixing it (installing a package)
  should work on the next run.

A program of our own (``main_source``: a directory of ``package main`` Go files, e.g.
``bench/lumber_send/``) is built the same way against a library from the proxy: its
``*.go`` files are copied into the throwaway module, ``go get module@version`` fetches the
library, and ``go build .`` builds them. Its cache folder is
``tests/.cache/<cache_name>/<version>-<hash>/``, the hash (12 hex digits) taken over the
files' names and contents, so an edit of the source builds anew (older folders stay until
``tests/.cache`` is deleted).

Knobs (environment), their names given per program: ``bin_env`` (a prebuilt binary to use
instead of building), ``version_env`` (what to ask the proxy for), ``timeout_env``
(seconds for the whole build).

The precondition (``precondition()`` returning a reason string or None) is checked after
``go get``, before ``go build``: where the proxy refuses the module the reason is the
proxy's answer (with the precondition's failure added), where it serves it the reason is
the precondition's.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

FAILURE_TTL = 3600.0

TESTS_DIR = Path(__file__).resolve().parent
CACHE_DIR = TESTS_DIR / ".cache"
GO_DIR = CACHE_DIR / "go"


def go_env(extra: dict[str, str] | None = None, *, cgo: bool = False) -> dict[str, str]:
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
        CGO_ENABLED="1" if cgo else "0",
        GOTELEMETRY="off",
    )
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    if extra:
        env.update(extra)
    return env


class GoBinary:
    """One Go program: where it comes from, how it is built, where it is cached.

    ``name`` is what the skip reasons call it ("Log Courier shipper"); ``module`` is what
    ``go get`` fetches at ``version``; ``package`` (default: the module) is what ``go
    build`` builds into ``binary``. Version and build timeout are read from their
    environment variables when the object is made (module import time).

    With ``main_source`` (a directory) the program is not a package of the module but the
    ``*.go`` files of that directory, built against ``module@version`` (``package`` is
    then not used); their hash, taken when the object is made, is part of the cache
    folder's name.
    """

    def __init__(
        self,
        *,
        name: str,
        module: str,
        binary: str,
        default_version: str,
        bin_env: str,
        version_env: str,
        timeout_env: str,
        package: str | None = None,
        default_timeout: float = 480.0,
        cgo: bool = False,
        precondition: Callable[[], str | None] | None = None,
        cache_name: str | None = None,
        failure_ttl: float = FAILURE_TTL,
        main_source: Path | None = None,
    ) -> None:
        self.name = name
        self.module = module
        self.package = package or module
        self.binary_name = binary
        self.bin_env = bin_env
        self.version = os.environ.get(version_env, default_version)
        self.build_timeout = float(os.environ.get(timeout_env, str(default_timeout)))
        self.cgo = cgo
        self.precondition = precondition
        self.failure_ttl = failure_ttl
        self.main_source = Path(main_source).resolve() if main_source is not None else None
        self.source_problem: str | None = None  # main_source unusable: why
        folder = self.version.replace("/", "_")
        if self.main_source is not None:
            folder += "-" + self._source_hash()
        self.build_dir = CACHE_DIR / (cache_name or binary) / folder
        self.binary = self.build_dir / binary
        self.failed = self.build_dir / "FAILED"
        self._result: tuple[Path | None, str] | None = None

    # -- what callers use ------------------------------------------------------------

    def go_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return go_env(extra, cgo=self.cgo)

    def ensure_built(self) -> Path | None:
        """The path of the binary, built once and cached; None if unavailable."""
        return self.ensure_built_with_reason()[0]

    def build_reason(self) -> str:
        """Why ``ensure_built()`` returned what it did (a path or a failure)."""
        return self.ensure_built_with_reason()[1]

    def ensure_built_with_reason(self) -> tuple[Path | None, str]:
        if self._result is None:
            self._result = self._ensure_built()
        return self._result

    # -- building --------------------------------------------------------------------

    def _source_files(self) -> list[Path]:
        assert self.main_source is not None
        return sorted(self.main_source.glob("*.go"))

    def _source_hash(self) -> str:
        """12 hex digits of a hash over the names and contents of main_source's *.go files."""
        digest = hashlib.sha256()
        try:
            files = self._source_files()
            for path in files:
                data = path.read_bytes()
                digest.update(f"{path.name}\0{len(data)}\0".encode())
                digest.update(data)
        except OSError as e:
            self.source_problem = f"cannot read {self.main_source}: {e}"
            return "unreadable"
        if not files:
            self.source_problem = f"no *.go files in {self.main_source}"
            return "empty"
        return digest.hexdigest()[:12]

    @property
    def _what(self) -> str:
        spec = f"{self.module}@{self.version}"
        if self.main_source is not None:
            return f"{self.main_source} (with {spec})"
        return spec if self.package == self.module else f"{self.package} ({spec})"

    def _ensure_built(self) -> tuple[Path | None, str]:
        override = os.environ.get(self.bin_env)
        if override:
            path = Path(override)
            if path.is_file() and os.access(path, os.X_OK):
                return path, f"prebuilt binary from {self.bin_env}: {path}"
            return None, f"{self.bin_env}={override} is not an executable file"
        if self.source_problem:
            return None, f"{self.name} unavailable: {self.source_problem}"
        if self.binary.is_file():
            return self.binary, f"cached build {self.binary}"
        go = shutil.which("go")
        if go is None:
            return None, f"{self.name} unavailable: no Go toolchain on PATH"
        self.build_dir.mkdir(parents=True, exist_ok=True)
        with open(self.build_dir / ".lock", "w") as lock:  # one builder at a time (parallel runs)
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.binary.is_file():
                return self.binary, f"cached build {self.binary}"
            remembered = self._remembered_failure()
            if remembered:
                return None, remembered
            started = time.monotonic()
            ok, detail, remember = self._build(go)
            took = time.monotonic() - started
            if ok:
                self.failed.unlink(missing_ok=True)
                return self.binary, f"built {self._what} in {took:.1f}s: {detail}"
            if not remember:  # only the precondition failed: say so, check again next time
                return None, f"{self.name} unavailable: {detail} (fetched {self._what} in {took:.1f}s)"
            reason = f"{self.name} unavailable: building {self._what} failed after {took:.1f}s: {detail}"
            self.failed.write_text(json.dumps({"at": time.time(), "reason": reason}))
            return None, reason

    def _remembered_failure(self) -> str | None:
        try:
            record = json.loads(self.failed.read_text())
        except (OSError, ValueError):
            return None
        age = time.time() - float(record.get("at", 0))
        if 0 <= age < self.failure_ttl:
            return f"{record.get('reason')} (remembered from {age:.0f}s ago; delete {self.failed} to retry)"
        return None

    def _check_precondition(self) -> str | None:
        if self.precondition is None:
            return None
        try:
            return self.precondition()
        except Exception as e:  # a broken check is a reason too, not a crash of the session
            return f"precondition check failed: {e!r}"

    def _build(self, go: str) -> tuple[bool, str, bool]:
        """go get + go build in a throwaway module; (ok, detail, remember the failure)."""
        deadline = time.monotonic() + self.build_timeout
        budget = f"budget {self.build_timeout:.0f}s"
        env = self.go_env()
        with tempfile.TemporaryDirectory(prefix="build-", dir=self.build_dir) as work:
            workdir = Path(work)
            (workdir / "go.mod").write_text("module logrouter.test/gobuild\n\ngo 1.21\n")
            output = workdir / self.binary_name
            target = self.package
            if self.main_source is not None:
                for path in self._source_files():
                    shutil.copyfile(path, workdir / path.name)
                target = "."
            steps = [
                # Resolves a commit (or `latest`) to its version through the proxy and
                # fetches the module with its dependencies (a dependency's replace
                # directives do not apply here, which is why this is not `go install
                # mod@version`).
                [go, "get", f"{self.module}@{self.version}"],
                [go, "build", "-trimpath", "-o", str(output), target],
            ]
            for argv in steps:
                if argv[1] == "build":
                    unmet = self._check_precondition()
                    if unmet:
                        return False, unmet, False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False, f"timed out ({budget}) before `{' '.join(argv[1:3])}`", True
                try:
                    proc = subprocess.run(
                        argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=left,
                    )
                except subprocess.TimeoutExpired:
                    return False, f"`go {' '.join(argv[1:3])}` timed out ({budget})", True
                if proc.returncode != 0:
                    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
                    detail = f"`go {' '.join(argv[1:3])}` exited {proc.returncode}: {tail}"
                    if argv[1] == "get":
                        unmet = self._check_precondition()
                        if unmet:
                            detail += f"; besides, {unmet}"
                    return False, detail, True
            resolved = ""
            try:
                out = subprocess.run(
                    [go, "list", "-m", self.module], cwd=workdir, env=env, capture_output=True,
                    text=True, timeout=max(5.0, deadline - time.monotonic()),
                )
                resolved = out.stdout.strip()
            except subprocess.TimeoutExpired:
                pass
            os.replace(output, self.binary)
        if resolved:
            (self.build_dir / "MODULE").write_text(resolved + "\n")
        return True, resolved or self.module, False

    def main(self) -> int:
        """``python tests/<harness>.py``: build (or say why not); the exit code."""
        t0 = time.monotonic()
        path, why = self.ensure_built_with_reason()
        print(f"{why} [{time.monotonic() - t0:.2f}s]")
        return 0 if path else 1

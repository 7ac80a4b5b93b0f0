"""A Go program built for the tests, once per machine, and cached outside the checkout.

``GoBinary`` is the generic part of the harnesses of real Go peers
(``tests/log_courier_shipper.py``, ``tests/logjam_forwarder.py``) and of the Go load
generators of ``bench/beats_load.py``. A program comes from one of two places:

- a tarball of its repository in the peers folder (``PeerTarball``: Log Courier and
  logjam-tools, whose modules the module proxy here refuses): unpacked into a throwaway
  folder, ``go build package`` in the module folder inside it, the dependencies from the
  proxy. The peers folder is ``<checkout>/../shared/peers`` unless ``LOGROUTER_PEERS_DIR``
  names another; where the tarball is not there the program is unavailable, saying so.
  The cache folder is ``<cache_name>/<tarball file name>-<hash>/``, the hash (12 hex
  digits) taken over the tarball's bytes, so another snapshot builds anew.
- the module proxy (``module`` at ``version``: ``go get module@version`` then ``go build
  package`` in a throwaway module). The cache folder is ``<cache_name>/<version>/``. A
  program of our own (``main_source``: a directory of ``package main`` Go files, e.g.
  ``bench/lumber_send/``) is built the same way against a library from the proxy: its
  ``*.go`` files are copied into the throwaway module and ``go build .`` builds them; its
  cache folder is ``<cache_name>/<version>-<hash>/``, the hash taken over the files' names
  and contents, so an edit of the source builds anew. A package of a module that needs its
  own ``go.mod`` (its ``replace`` directives: Filebeat in ``github.com/elastic/beats/v7``)
  is built ``in_module``: ``go mod download -json module@version`` fetches the exact version
  (a proxy that refuses the module's version list still serves it), then ``go build
  package`` runs in the downloaded (read-only) module folder with a writable copy of its
  ``go.mod``/``go.sum`` as ``-modfile``.

The cache is outside the checkout, so that every clone and worktree on the machine (CI's
fresh clone included) reuses one build: ``CACHE_DIR`` is ``$LOGROUTER_TEST_CACHE`` if set,
else ``$XDG_CACHE_HOME/logrouter-tests`` (``~/.cache/logrouter-tests``). Older folders stay
until deleted by hand.

- ``ensure_built_with_reason()`` returns ``(path, why)``; the path is None when the program
  cannot be had (no Go, no tarball, a precondition such as a missing C library, the proxy
  refuses or times out, the build fails) and ``why`` says why, so a test can
  ``pytest.skip(why)``. The answer is kept for the rest of the process; a rerun with the
  binary cached costs a stat.
- Everything Go writes (module cache, build cache, GOPATH) goes under ``GO_DIR`` (``go/``
  in the cache), shared by all programs; ``go_env()`` is the environment of every go
  command.
- One builder at a time: a lock file beside the binary (parallel test runs, or two
  clones, wait for the first one's build and then use it).
- A failed build is remembered for ``FAILURE_TTL`` seconds in ``FAILED`` beside where the
  binary would be, so a test run does not ask the proxy again for every session; delete
  the file to retry at once. A failed precondition alone is not remembered: it is cheap to
  check again, and fixing it (installing a package) should work on the next run.

Knobs (environment), their names given per program: ``bin_env`` (a prebuilt binary to use
instead of building), ``version_env`` (proxy programs: what to ask the proxy for),
``timeout_env`` (seconds for the whole build).

The precondition (``precondition()`` returning a reason string or None) is checked before
``go build`` (after ``go get`` for a proxy program: where the proxy refuses the module the
reason is the proxy's answer, with the precondition's failure added).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

FAILURE_TTL = 3600.0
CACHE_ENV = "LOGROUTER_TEST_CACHE"
PEERS_ENV = "LOGROUTER_PEERS_DIR"

TESTS_DIR = Path(__file__).resolve().parent
CHECKOUT_DIR = TESTS_DIR.parent


def cache_root(environ: dict[str, str] | None = None) -> Path:
    """Where built programs and Go's caches live: outside the checkout, one per machine
    (user): ``$LOGROUTER_TEST_CACHE``, else ``$XDG_CACHE_HOME/logrouter-tests``, else
    ``~/.cache/logrouter-tests``."""
    environ = os.environ if environ is None else environ
    override = environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser().resolve()
    xdg = environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"  # the XDG spec ignores a relative one
    return base / "logrouter-tests"


def peers_dir(environ: dict[str, str] | None = None) -> Path:
    """Where the peers' source tarballs are: ``$LOGROUTER_PEERS_DIR``, else the first
    ``shared/peers`` beside the checkout or beside one of its parent folders (a clone made
    one level deeper, as CI's fresh clone may be, still finds them); else
    ``<checkout>/../shared/peers`` (absent: the tests say so and skip)."""
    environ = os.environ if environ is None else environ
    override = environ.get(PEERS_ENV)
    if override:
        return Path(override).expanduser().resolve()
    for parent in CHECKOUT_DIR.parents:
        candidate = parent / "shared" / "peers"
        if candidate.is_dir():
            return candidate
    return CHECKOUT_DIR.parent / "shared" / "peers"


CACHE_DIR = cache_root()
GO_DIR = CACHE_DIR / "go"


def go_env(extra: dict[str, str] | None = None, *, cgo: bool = False) -> dict[str, str]:
    """The environment for every go command: Go's caches in ``GO_DIR``, no toolchain download."""
    env = dict(os.environ)
    env.update(
        GOPATH=str(GO_DIR / "path"),
        GOMODCACHE=str(GO_DIR / "mod"),
        GOCACHE=str(GO_DIR / "build"),
        # -modcacherw: the module cache stays deletable with a plain rm -rf.
        # -buildvcs=false: sources unpacked from a tarball have no .git of their own.
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


@dataclass(frozen=True)
class PeerTarball:
    """A snapshot of a Go repository in the peers folder: the tarball's file name, the
    folder inside it that holds the ``go.mod``, and the package to build there."""

    file_name: str
    module_dir: str
    package: str = "."


def _sha12(data_files: list[tuple[str, bytes]]) -> str:
    digest = hashlib.sha256()
    for name, data in data_files:
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:12]


class GoBinary:
    """One Go program: where it comes from, how it is built, where it is cached.

    ``name`` is what the skip reasons call it ("Log Courier shipper"); ``binary`` is the
    file name of the program built.

    From a tarball: ``tarball`` (a ``PeerTarball``), found in ``peers_dir()`` and hashed
    when the object is made (module import time). From the proxy: ``module`` is what
    ``go get`` fetches at ``version`` (``default_version``, or ``version_env`` when set);
    ``package`` (default: the module) is what ``go build`` builds; with ``main_source`` (a
    directory) the program is that directory's ``*.go`` files built against
    ``module@version``, their hash part of the cache folder's name.
    """

    def __init__(
        self,
        *,
        name: str,
        binary: str,
        bin_env: str,
        timeout_env: str,
        module: str | None = None,
        default_version: str | None = None,
        version_env: str | None = None,
        package: str | None = None,
        tarball: PeerTarball | None = None,
        default_timeout: float = 480.0,
        cgo: bool = False,
        precondition: Callable[[], str | None] | None = None,
        cache_name: str | None = None,
        failure_ttl: float = FAILURE_TTL,
        main_source: Path | None = None,
        cache_dir: Path | None = None,
        peers: Path | None = None,
        in_module: bool = False,
    ) -> None:
        if (tarball is None) == (module is None):
            raise ValueError("a GoBinary comes from a tarball or from a module, one of them")
        self.name = name
        self.binary_name = binary
        self.bin_env = bin_env
        self.build_timeout = float(os.environ.get(timeout_env, str(default_timeout)))
        self.cgo = cgo
        self.precondition = precondition
        self.failure_ttl = failure_ttl
        self.source_problem: str | None = None  # the source is unusable: why
        self.tarball = tarball
        self.module = module
        self.package = package or module
        self.main_source = Path(main_source).resolve() if main_source is not None else None
        self.in_module = in_module
        if tarball is not None:
            self.tarball_path: Path | None = (peers or peers_dir()) / tarball.file_name
            self.version = None
            folder = f"{tarball.file_name}-{self._tarball_hash()}"
        else:
            self.tarball_path = None
            if default_version is None:
                raise ValueError("a module needs its default_version")
            self.version = os.environ.get(version_env, default_version) if version_env else default_version
            folder = self.version.replace("/", "_")
            if self.main_source is not None:
                folder += "-" + self._source_hash()
        self.build_dir = (cache_dir or CACHE_DIR) / (cache_name or binary) / folder
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

    # -- where the source is ---------------------------------------------------------

    def _tarball_hash(self) -> str:
        assert self.tarball_path is not None
        try:
            data = self.tarball_path.read_bytes()
        except FileNotFoundError:
            self.source_problem = (
                f"no {self.tarball_path.name} in {self.tarball_path.parent} (the peers folder "
                f"beside the checkout; {PEERS_ENV} names another, {self.bin_env} a prebuilt binary)"
            )
            return "missing"
        except OSError as e:
            self.source_problem = f"cannot read {self.tarball_path}: {e}"
            return "unreadable"
        return _sha12([(self.tarball_path.name, data)])

    def _source_files(self) -> list[Path]:
        assert self.main_source is not None
        return sorted(self.main_source.glob("*.go"))

    def _source_hash(self) -> str:
        """12 hex digits of a hash over the names and contents of main_source's *.go files."""
        try:
            files = [(path.name, path.read_bytes()) for path in self._source_files()]
        except OSError as e:
            self.source_problem = f"cannot read {self.main_source}: {e}"
            return "unreadable"
        if not files:
            self.source_problem = f"no *.go files in {self.main_source}"
            return "empty"
        return _sha12(files)

    @property
    def _what(self) -> str:
        if self.tarball is not None:
            package = "" if self.tarball.package == "." else f" {self.tarball.package}"
            return f"{self.tarball_path}{package}"
        spec = f"{self.module}@{self.version}"
        if self.main_source is not None:
            return f"{self.main_source} (with {spec})"
        return spec if self.package == self.module else f"{self.package} ({spec})"

    # -- building --------------------------------------------------------------------

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
                return None, f"{self.name} unavailable: {detail} (prepared {self._what} in {took:.1f}s)"
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
        """Build in a throwaway folder beside the binary; (ok, detail, remember the failure)."""
        deadline = time.monotonic() + self.build_timeout
        with tempfile.TemporaryDirectory(prefix="build-", dir=self.build_dir) as work:
            workdir = Path(work)
            output = workdir / self.binary_name
            if self.tarball is not None:
                ok, detail, remember = self._build_from_tarball(go, workdir, output, deadline)
            elif self.in_module:
                ok, detail, remember = self._build_in_module(go, workdir, output, deadline)
            else:
                ok, detail, remember = self._build_from_proxy(go, workdir, output, deadline)
            if not ok:
                return ok, detail, remember
            os.replace(output, self.binary)
        if detail:  # the module path and version built
            (self.build_dir / "MODULE").write_text(detail + "\n")
        return True, detail or self._what, False

    def _build_from_tarball(self, go: str, workdir: Path, output: Path, deadline: float) -> tuple[bool, str, bool]:
        assert self.tarball is not None and self.tarball_path is not None
        try:
            with tarfile.open(self.tarball_path) as archive:
                archive.extractall(workdir / "src", filter="data")
        except (OSError, tarfile.TarError) as e:
            return False, f"cannot unpack {self.tarball_path}: {e}", True
        module_dir = workdir / "src" / self.tarball.module_dir
        if not (module_dir / "go.mod").is_file():
            return False, f"no {self.tarball.module_dir}/go.mod in {self.tarball_path.name}", True
        unmet = self._check_precondition()
        if unmet:
            return False, unmet, False
        argv = [go, "build", "-trimpath", "-o", str(output), self.tarball.package]
        ok, detail = self._run(argv, module_dir, deadline)
        if not ok:
            return False, detail, True
        lines = (module_dir / "go.mod").read_text().splitlines()
        module = next((line.split()[1] for line in lines if line.startswith("module ")), "a module")
        return True, f"{module} from {self.tarball.file_name}", False

    def _build_from_proxy(self, go: str, workdir: Path, output: Path, deadline: float) -> tuple[bool, str, bool]:
        """go get + go build in a throwaway module."""
        (workdir / "go.mod").write_text("module logrouter.test/gobuild\n\ngo 1.21\n")
        target = self.package
        if self.main_source is not None:
            for path in self._source_files():
                shutil.copyfile(path, workdir / path.name)
            target = "."
        # Resolves a commit (or `latest`) to its version through the proxy and fetches the
        # module with its dependencies (a dependency's replace directives do not apply
        # here, which is why this is not `go install mod@version`).
        ok, detail = self._run([go, "get", f"{self.module}@{self.version}"], workdir, deadline)
        unmet = self._check_precondition()
        if not ok:
            return False, detail + (f"; besides, {unmet}" if unmet else ""), True
        if unmet:
            return False, unmet, False
        ok, detail = self._run([go, "build", "-trimpath", "-o", str(output), target], workdir, deadline)
        if not ok:
            return False, detail, True
        resolved = ""
        try:
            out = subprocess.run(
                [go, "list", "-m", self.module], cwd=workdir, env=self.go_env(), capture_output=True,
                text=True, timeout=max(5.0, deadline - time.monotonic()),
            )
            resolved = out.stdout.strip()
        except subprocess.TimeoutExpired:
            pass
        return True, resolved, False

    def _build_in_module(self, go: str, workdir: Path, output: Path, deadline: float) -> tuple[bool, str, bool]:
        """go mod download the exact version, then go build inside it (its go.mod applies)."""
        spec = f"{self.module}@{self.version}"
        ok, detail = self._run([go, "mod", "download", "-json", spec], workdir, deadline, keep_stdout=True)
        if not ok:
            return False, detail, True
        try:
            module_dir = Path(json.loads(detail)["Dir"])
        except (ValueError, KeyError, TypeError):
            return False, f"`go mod download` did not say where {spec} is: {detail[:200]!r}", True
        unmet = self._check_precondition()
        if unmet:
            return False, unmet, False
        # The module cache is read-only; -mod=mod may add to go.sum, so a copy is the modfile.
        for name, copy in (("go.mod", "module.mod"), ("go.sum", "module.sum")):
            if (module_dir / name).is_file():
                shutil.copyfile(module_dir / name, workdir / copy)
        argv = [go, "build", "-trimpath", f"-modfile={workdir / 'module.mod'}", "-o", str(output), self.package]
        ok, detail = self._run(argv, module_dir, deadline)
        if not ok:
            return False, detail, True
        return True, spec, False

    def _run(self, argv: list[str], cwd: Path, deadline: float, keep_stdout: bool = False) -> tuple[bool, str]:
        """One go command within what is left of the build's budget; (ok, what went wrong)."""
        step = f"go {' '.join(argv[1:3])}"
        budget = f"budget {self.build_timeout:.0f}s"
        left = deadline - time.monotonic()
        if left <= 0:
            return False, f"timed out ({budget}) before `{step}`"
        try:
            proc = subprocess.run(
                argv, cwd=cwd, env=self.go_env(), stdin=subprocess.DEVNULL,
                capture_output=True, text=True, timeout=left,
            )
        except subprocess.TimeoutExpired:
            return False, f"`{step}` timed out ({budget})"
        if proc.returncode != 0:
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
            return False, f"`{step}` exited {proc.returncode}: {tail}"
        return True, proc.stdout if keep_stdout else ""

    def main(self) -> int:
        """``python tests/<harness>.py``: build (or say why not); the exit code."""
        t0 = time.monotonic()
        path, why = self.ensure_built_with_reason()
        print(f"{why} [{time.monotonic() - t0:.2f}s]")
        return 0 if path else 1

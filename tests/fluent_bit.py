"""The real Fluent Bit (1.8.15, C) for tests and benchmarks: built once per machine from
the npm package ``fluent-bit@0.0.3``, which carries its source, and cached outside the
checkout.

``ensure_built_with_reason()`` returns ``(path, why)``: the path of the ``fluent-bit``
binary, or None with the reason (no npm, no cmake or C compiler, a missing library, the
registry refuses, the build fails) so that a test can ``pytest.skip(why)``. The answer is
kept for the rest of the process; with the binary cached it costs a stat.

How it is built: ``npm pack fluent-bit@0.0.3`` fetches the package's tarball from the npm
registry (npm's own cache keeps it); its ``package/src/fluent-bit/`` is Fluent Bit's source
tree. Its bundled ``lib/onigmo`` is missing from the package, and 1.8.15 has no option to
use a system regex library, so ``cmake/onigmo.cmake`` is replaced by ``ONIG_SHIM``: the
``libonigmo`` target links Debian's Oniguruma (``libonig-dev``), whose API the code uses
(``onig_new``, ``onig_search``, ``ONIG_SYNTAX_RUBY``: the same as Onigmo's), through an
``onigmo.h`` that includes ``oniguruma.h``. ``CMAKE_ARGS`` turn off what the tests and
benchmarks do not use (LuaJIT, the HTTP server, AWS, the stream processor, SQLite, every
plugin but the inputs ``tail``, ``dummy``, ``forward``, ``storage_backlog`` and the outputs
``forward``, ``file``, ``stdout``, ``null``), and build release code (``-O2``). TLS is
OpenSSL's (``libssl-dev``), which 1.8 prefers when found. Debian packages needed:
``cmake flex bison libssl-dev libonig-dev`` and a C/C++ compiler.

The cache folder is ``<cache>/fluent-bit/npm-fluent-bit-0.0.3-<hash>/`` (``<cache>`` as in
``tests/go_binary.py``), the hash (12 hex digits) taken over the build recipe (``CMAKE_ARGS``
and ``ONIG_SHIM``), so a changed recipe builds anew. One builder at a time (a lock file);
a failed build is remembered in ``FAILED`` for an hour (delete it to retry at once), a
missing tool or library is not (it is cheap to check again).

Knobs (environment):

- ``LOGROUTER_FLUENT_BIT_BIN``: a prebuilt ``fluent-bit`` to use instead of building.
- ``LOGROUTER_FLUENT_BIT_BUILD_TIMEOUT``: seconds for the whole build (default 600).
- ``LOGROUTER_FLUENT_BIT_JOBS``: parallel compile jobs (default: the number of CPUs).

``FluentBit`` runs the binary with a classic-mode config file, its log read line by line
by a thread so that a test waits on a line (with a time bound), and stops it (SIGTERM,
then SIGKILL at the bound). Run as a script (``python tests/fluent_bit.py``) to build;
``--check`` only says what is missing to build (``make test`` runs it).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from go_binary import FAILURE_TTL, cache_root  # noqa: E402
from process_log import ProcessLog  # noqa: E402

NPM_PACKAGE = "fluent-bit"
NPM_VERSION = "0.0.3"
VERSION = "1.8.15"  # the Fluent Bit inside that package
BIN_ENV = "LOGROUTER_FLUENT_BIT_BIN"
TIMEOUT_ENV = "LOGROUTER_FLUENT_BIT_BUILD_TIMEOUT"
JOBS_ENV = "LOGROUTER_FLUENT_BIT_JOBS"
DEFAULT_TIMEOUT = 600.0
SOURCE_DIR = "package/src/fluent-bit/"

#: The plugins kept; every other ``FLB_IN_*``/``FLB_OUT_*``/``FLB_FILTER_*`` option is off.
PLUGINS = ("FLB_IN_TAIL", "FLB_IN_DUMMY", "FLB_IN_FORWARD", "FLB_IN_STORAGE_BACKLOG", "FLB_IN_EMITTER",
           "FLB_OUT_FORWARD", "FLB_OUT_FILE", "FLB_OUT_STDOUT", "FLB_OUT_NULL")
CMAKE_ARGS = (
    "-DFLB_RELEASE=On", "-DFLB_DEBUG=Off", "-DFLB_EXAMPLES=Off", "-DFLB_SHARED_LIB=Off",
    "-DFLB_LUAJIT=Off", "-DFLB_FILTER_LUA=Off", "-DFLB_BACKTRACE=Off", "-DFLB_AWS=Off", "-DFLB_SIGNV4=Off",
    "-DFLB_STREAM_PROCESSOR=Off", "-DFLB_SQLDB=Off", "-DFLB_PROXY_GO=Off", "-DFLB_CUSTOM_CALYPTIA=Off",
    "-DFLB_HTTP_SERVER=Off", "-DFLB_TESTS_RUNTIME=Off", "-DFLB_TESTS_INTERNAL=Off", "-DFLB_TLS=On",
)
ONIG_SHIM = """\
# logrouter tests: the package's lib/onigmo is empty; link the system's Oniguruma instead.
find_path(ONIG_INCLUDE_DIR oniguruma.h REQUIRED)
find_library(ONIG_LIBRARY onig REQUIRED)
file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/onig-shim/onigmo.h" "#include <oniguruma.h>\\n")
add_library(libonigmo INTERFACE IMPORTED GLOBAL)
set_target_properties(libonigmo PROPERTIES INTERFACE_LINK_LIBRARIES "${ONIG_LIBRARY}")
include_directories("${CMAKE_CURRENT_BINARY_DIR}/onig-shim" "${ONIG_INCLUDE_DIR}")
"""
#: Headers of the libraries the build needs -> the Debian package that has them.
HEADERS = {"oniguruma.h": "libonig-dev", "openssl/ssl.h": "libssl-dev"}
TOOLS = {"npm": "npm", "cmake": "cmake", "make": "make", "cc": "gcc", "c++": "g++", "flex": "flex", "bison": "bison"}

BUILD_DIR = cache_root() / "fluent-bit" / (
    f"npm-{NPM_PACKAGE}-{NPM_VERSION}-"
    + hashlib.sha256(("\0".join(CMAKE_ARGS + PLUGINS) + ONIG_SHIM).encode()).hexdigest()[:12]
)
BINARY = BUILD_DIR / "fluent-bit"
FAILED = BUILD_DIR / "FAILED"

_result: tuple[Path | None, str] | None = None


def ensure_built_with_reason() -> tuple[Path | None, str]:
    global _result
    if _result is None:
        _result = _ensure_built()
    return _result


def ensure_built() -> Path | None:
    return ensure_built_with_reason()[0]


def missing_prerequisites() -> str | None:
    """What is missing to build, naming the Debian packages; None when nothing is."""
    tools = [package for tool, package in TOOLS.items() if shutil.which(tool) is None]
    headers = [package for header, package in HEADERS.items()
               if not any((Path(d) / header).is_file() for d in ("/usr/include", "/usr/local/include"))]
    if not tools and not headers:
        return None
    return "missing to build it: " + " ".join(sorted(set(tools + headers))) + " (Debian package names)"


def _ensure_built() -> tuple[Path | None, str]:
    override = os.environ.get(BIN_ENV)
    if override:
        path = Path(override)
        if path.is_file() and os.access(path, os.X_OK):
            return path, f"prebuilt binary from {BIN_ENV}: {path}"
        return None, f"{BIN_ENV}={override} is not an executable file"
    if BINARY.is_file():
        return BINARY, f"cached build {BINARY}"
    unmet = missing_prerequisites()
    if unmet:
        return None, f"Fluent Bit {VERSION} unavailable: {unmet}; or set {BIN_ENV}"
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with open(BUILD_DIR / ".lock", "w") as lock:  # one builder at a time (parallel runs, clones)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if BINARY.is_file():
            return BINARY, f"cached build {BINARY}"
        remembered = _remembered_failure()
        if remembered:
            return None, remembered
        started = time.monotonic()
        ok, detail = _build(started + float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT)))
        took = time.monotonic() - started
        if ok:
            FAILED.unlink(missing_ok=True)
            return BINARY, f"built Fluent Bit {VERSION} from npm {NPM_PACKAGE}@{NPM_VERSION} in {took:.0f}s"
        reason = f"Fluent Bit {VERSION} unavailable: building it from npm {NPM_PACKAGE}@{NPM_VERSION} failed after {took:.0f}s: {detail}"
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


def _run(argv: list[str], cwd: Path, deadline: float, what: str) -> str | None:
    """One step within what is left of the budget; what went wrong, or None."""
    left = deadline - time.monotonic()
    if left <= 0:
        return f"out of time before {what}"
    try:
        proc = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired:
        return f"{what} timed out ({TIMEOUT_ENV} sets the budget)"
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr.strip() or proc.stdout.strip()).splitlines()[-8:])
        return f"{what} exited {proc.returncode}: {tail}"
    return None


def _build(deadline: float) -> tuple[bool, str]:
    """npm pack, unpack the source, cmake, make; the binary moved into the cache."""
    with tempfile.TemporaryDirectory(prefix="build-", dir=BUILD_DIR) as work:
        workdir = Path(work)
        problem = _run(["npm", "pack", "--silent", f"{NPM_PACKAGE}@{NPM_VERSION}"], workdir, deadline, "npm pack")
        if problem:
            return False, problem
        tarballs = list(workdir.glob("*.tgz"))
        if len(tarballs) != 1:
            return False, f"npm pack left {len(tarballs)} tarballs"
        source = workdir / "src"
        try:
            with tarfile.open(tarballs[0]) as archive:
                members = [m for m in archive.getmembers() if m.name.startswith(SOURCE_DIR)]
                archive.extractall(source, members=members, filter="data")
        except (OSError, tarfile.TarError) as e:
            return False, f"cannot unpack {tarballs[0].name}: {e}"
        tree = source / SOURCE_DIR
        if not (tree / "CMakeLists.txt").is_file():
            return False, f"no {SOURCE_DIR}CMakeLists.txt in {tarballs[0].name}"
        (tree / "cmake" / "onigmo.cmake").write_text(ONIG_SHIM)
        build = workdir / "build"
        build.mkdir()
        plugin_options = sorted(set(re.findall(r"option\((FLB_(?:IN|OUT|FILTER)_[A-Z0-9_]+)", (tree / "CMakeLists.txt").read_text())))
        plugins = [f"-D{name}={'On' if name in PLUGINS else 'Off'}" for name in plugin_options]
        problem = _run(["cmake", str(tree), *CMAKE_ARGS, *plugins], build, deadline, "cmake")
        if problem:
            return False, problem
        jobs = os.environ.get(JOBS_ENV) or str(os.cpu_count() or 2)
        problem = _run(["cmake", "--build", ".", "--target", "fluent-bit-bin", "--", f"-j{jobs}"], build, deadline, "make")
        if problem:
            return False, problem
        built = build / "bin" / "fluent-bit"
        if not built.is_file():
            return False, "the build made no bin/fluent-bit"
        os.replace(built, BINARY)
    return True, ""


def free_port() -> int:
    """A loopback port free now (Fluent Bit and a restarted router are given fixed ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float, fluent_bit: "FluentBit") -> None:
    """Until Fluent Bit accepts connections on ``port`` (its ``forward`` input)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            pass
        if fluent_bit.process is None or fluent_bit.process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"Fluent Bit does not listen on port {port}:\n{fluent_bit.output[-4000:]}")
        time.sleep(0.05)  # poll interval; the bound is the deadline


class FluentBit(ProcessLog):
    """``fluent-bit -c <workdir>/fluent-bit.conf``, its log read by a thread."""

    LOG_NAME = "Fluent Bit"
    LOG_TAIL = 6000

    def __init__(self, binary: Path, workdir: Path, config_text: str) -> None:
        self.binary = Path(binary)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config = self.workdir / "fluent-bit.conf"
        self.config.write_text(config_text)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.process: subprocess.Popen | None = None

    def start(self) -> "FluentBit":
        self.process = subprocess.Popen(
            [str(self.binary), "-c", str(self.config)], cwd=self.workdir, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        )
        self.follow_output()
        return self

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM (Fluent Bit flushes what it holds within its ``Grace``), SIGKILL at the bound."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(30)

    def __enter__(self) -> "FluentBit":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


def check() -> int:
    """``--check`` (``make test``): say, without building, when the tests will skip."""
    if os.environ.get(BIN_ENV) or BINARY.is_file():
        return 0
    unmet = missing_prerequisites()
    if unmet:
        print(f"NOTE: Fluent Bit {VERSION} cannot be built, its tests will be skipped: {unmet}")
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(check())
    t0 = time.monotonic()
    path, why = ensure_built_with_reason()
    print(f"{why} [{time.monotonic() - t0:.1f}s]")
    sys.exit(0 if path else 1)

"""A real HDFS for the tests: a MiniDFSCluster (NameNode + DataNode in one JVM) on loopback.

The launcher (``tests/minicluster/``: a Maven pom and one Java class) is built once with
Maven from Maven Central's ``org.apache.hadoop:hadoop-client-minicluster`` and its runtime
jars; the jars and the built class are cached outside the checkout, in
``~/.cache/logrouter-tests/minicluster/`` (``go_binary.cache_root()``: every clone and
worktree on the machine shares one build), and rebuilt only when the pom or the
launcher change.

``MiniHdfs`` starts the JVM, waits for its ``READY <port>`` line (with a deadline, no
sleeps), and drives it over stdin: ``restart_namenode()``, ``stop_namenode()``,
``start_namenode()`` and ``stop()``. End of stdin stops the JVM too, so it never outlives
the test process.

hdfs-native starts native threads (a tokio runtime) in the process that makes a client,
and a later ``fork`` in that process (pyspark launches its JVM with a ``preexec_fn``)
can then hang in the child. So tests never use hdfs-native in the pytest process: they
call ``in_child(function, …)``, which runs a top-level function in a fresh interpreter
(multiprocessing "spawn") and returns its result. ``cluster_or_skip`` skips, printing why, only when ``java``/``mvn`` are
missing or Maven cannot fetch the artifacts; any other failure fails the test.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import multiprocessing
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from go_binary import cache_root

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "minicluster"
CACHE = cache_root() / "minicluster"
LIB = CACHE / "lib"
JAR = CACHE / "target" / "minicluster-1.jar"
STAMP = CACHE / "built.sha256"
MAIN_CLASS = "logrouter.test.MiniHdfs"

#: What the launcher is built against (the pom's ``hadoop.version``).
HADOOP_VERSION = re.search(r"<hadoop.version>([^<]+)<", (SOURCE / "pom.xml").read_text()).group(1)

BUILD_TIMEOUT = 900  # a first fetch downloads ~100 MB
START_TIMEOUT = 120

JAVA_OPTS = [
    "-Xmx768m",
    "-XX:+UseSerialGC",
    "-Djava.net.preferIPv4Stack=true",
    # Hadoop 3.4 on Java 17: reflective access it needs
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
]

_FETCH_FAILURE = re.compile(r"Could not (resolve|transfer|find artifact)|UnknownHost|Connection refused|timed out|Network is unreachable")


class Unavailable(Exception):
    """No HDFS can be started here, for a reason a test should skip with."""


def _digest() -> str:
    digest = hashlib.sha256()
    for path in sorted([SOURCE / "pom.xml", *SOURCE.rglob("*.java")]):
        digest.update(path.relative_to(SOURCE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def build() -> str:
    """The launcher's class path, built (and fetched) once; raises Unavailable."""
    if shutil.which("java") is None:
        raise Unavailable("java is not installed (needed for the MiniDFSCluster)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time, across processes
        digest = _digest()
        if not (STAMP.exists() and STAMP.read_text() == digest and JAR.exists()):
            mvn = shutil.which("mvn")
            if mvn is None:
                raise Unavailable("mvn is not installed (needed to fetch hadoop-client-minicluster)")
            shutil.rmtree(LIB, ignore_errors=True)
            try:
                done = subprocess.run(
                    [mvn, "-q", "-B", "-f", str(SOURCE / "pom.xml"), "package", "dependency:copy-dependencies",
                     f"-DoutputDirectory={LIB}", f"-Dminicluster.build={CACHE / 'target'}"],
                    capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                )
            except subprocess.TimeoutExpired as error:
                raise Unavailable(f"mvn did not finish within {BUILD_TIMEOUT}s fetching hadoop-client-minicluster") from error
            if done.returncode != 0:
                output = (done.stdout + done.stderr)[-3000:]
                if _FETCH_FAILURE.search(output):
                    raise Unavailable(f"Maven could not fetch hadoop-client-minicluster {HADOOP_VERSION}: {output[-600:]}")
                raise RuntimeError(f"building the MiniDFSCluster launcher failed:\n{output}")
            STAMP.write_text(digest)
    return os.pathsep.join([str(JAR), str(LIB / "*")])


class MiniHdfs:
    """One MiniDFSCluster JVM; ``url(path)`` names a path in it."""

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.port = 0
        self.process: subprocess.Popen | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.log_path = self.base / "minicluster.log"

    def start(self, classpath: str | None = None) -> "MiniHdfs":
        classpath = classpath or build()
        self.base.mkdir(parents=True, exist_ok=True)
        java = shutil.which("java")
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed by stop()
        self.process = subprocess.Popen(
            [java, *JAVA_OPTS, "-cp", classpath, MAIN_CLASS, str(self.base / "dfs")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=self.base,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        try:
            line = self._expect("READY ", START_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        self.port = int(line.split()[1])
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"MiniDFSCluster: no {prefix!r} within {timeout}s; see {self.log_path}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"MiniDFSCluster ended before {prefix!r}:\n{self._tail()}")
            if line.startswith("ERROR"):
                raise RuntimeError(f"MiniDFSCluster: {line}\n{self._tail()}")
            if line.startswith(prefix):
                return line

    def _tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])
        except OSError:
            return ""

    def command(self, command: str, timeout: float = 120) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        self._expect(f"OK {command}", timeout)

    def stop_namenode(self) -> None:
        self.command("nn-stop")

    def start_namenode(self) -> None:
        self.command("nn-start")

    def restart_namenode(self) -> None:
        self.command("nn-restart")

    @property
    def authority(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/") -> str:
        return f"hdfs://{self.authority}/{path.lstrip('/')}"

    def stop(self, timeout: float = 60) -> None:
        process = self.process
        if process is None:
            return
        self.process = None
        try:
            if process.poll() is None:
                try:
                    process.stdin.write("stop\n")
                    process.stdin.close()
                except (BrokenPipeError, OSError, ValueError):
                    pass
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(30)
        finally:
            self._log.close()


def cluster_or_skip(base: Path):
    """A started ``MiniHdfs`` under ``base``; ``pytest.skip`` with the reason if none can run."""
    import pytest  # noqa: PLC0415

    if importlib.util.find_spec("hdfs_native") is None:  # not imported here: see in_child
        pytest.skip("hdfs-native is not installed (pip install 'logrouter[hdfs]')")
    try:
        classpath = build()
    except Unavailable as reason:
        pytest.skip(str(reason))
    return MiniHdfs(base).start(classpath)


def in_child(function, *args, timeout: float = 300):
    """``function(*args)`` in a fresh interpreter (see the module docstring); its result."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply_async(function, args).get(timeout)

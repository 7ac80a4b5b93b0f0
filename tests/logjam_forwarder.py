"""The real logjam producer for tests: logjam-tools' Go ``http-forwarder``.

The http-forwarder (``github.com/skaes/logjam-tools/go/http-forwarder``) takes logjam
data over HTTP and publishes it as a logjam device does, on a ZeroMQ PUB socket:

- ``POST /logjam/logs/{app}/{env}`` (``Content-Type: application/json``; an optional
  ``Content-Encoding`` of ``zlib``/``snappy``/``lz4`` says the body is compressed so)
  publishes the body as is, as ``<app>-<env>`` / ``logs.<app>-<env>`` / body / meta with
  the device id, its sequence number and the compression; ``POST
  /logjam/events/{app}/{env}`` publishes a JSON object (re-encoded) under
  ``events.<app>-<env>``; both answer ``202``. ``GET /alive.txt`` answers ``200 ALIVE``.
- ``-x zlib``/``-x snappy`` (``compress``) compress what was posted uncompressed when
  that comes out smaller; ``-x lz4`` is accepted but publishes uncompressed (its publisher
  compresses with zlib and snappy only). A posted ``Content-Encoding`` passes through.
- Every message and every heartbeat (``heartbeat`` / ``tcp://<fqdn>:<pub port>`` / ``{}``,
  every 5 s: ``publisher.HeartbeatInterval``) takes the next sequence number from 1.
- ``-b`` is the PUB socket's address only: the HTTP server listens on ``:<-p port>``,
  every interface. A PUB port it cannot bind is ignored by the program (it serves HTTP
  and publishes nowhere), an HTTP port it cannot bind is logged and it keeps running; so
  ``Forwarder`` checks in ``/proc`` that the process itself listens on both ports.

It links libzmq through cgo (``github.com/pebbe/zmq4``), so the build needs Debian's
``libzmq3-dev`` (checked with ``pkg-config --exists libzmq`` before the build;
``.ci/run`` installs it when it can) and a C compiler; the binary needs ``libzmq5``.

``ensure_built_with_reason()`` builds it once per machine with ``GoBinary``
(``tests/go_binary.py``) from the logjam-tools tarball in the peers folder
(``logjam-tools-go-994b6f5.tar.gz``: the ``go/`` folder of logjam-tools at 994b6f5, 0.21.4,
whose module the Go module proxy here refuses; its dependencies come from the proxy) into
the cache outside the checkout (``<cache>/http-forwarder/<tarball>-<hash>/``). Knobs
(environment):

- ``LOGROUTER_LOGJAM_FORWARDER_BIN``: a prebuilt ``http-forwarder`` to use instead.
- ``LOGROUTER_PEERS_DIR``: the folder holding the tarball (default
  ``<checkout>/../shared/peers``).
- ``LOGROUTER_LOGJAM_FORWARDER_BUILD_TIMEOUT``: seconds for the whole build (default 480).

``Forwarder`` runs it on loopback with free ports (``-b 127.0.0.1 -p <http> -P <pub> -d
<device id>``), or the ``ports`` given (``free_ports()`` chooses a pair, so a subscriber
can be set up before the forwarder binds), waits until it serves, posts logs and events
with urllib, and stops it (SIGTERM, then SIGKILL after a bound) when the ``with`` block
ends; ``restart()`` stops it and starts a new process on the same ports.
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
import urllib.error
import urllib.request
from pathlib import Path

from go_binary import GoBinary, PeerTarball

from logrouter.wire import logjam

TARBALL = PeerTarball("logjam-tools-go-994b6f5.tar.gz", module_dir="logjam-tools-go/go", package="./http-forwarder")
HEARTBEAT_SECS = 5.0  # publisher.HeartbeatInterval: one heartbeat every 50 ticks of 100 ms
# Content-Encoding names -> meta compression ids (logjam-tools' ParseCompressionMethodName)
ENCODINGS = {"zlib": logjam.ZLIB_COMPRESSION, "snappy": logjam.SNAPPY, "lz4": logjam.LZ4}
LIBZMQ_MISSING = "libzmq3-dev not installed (apt-get install libzmq3-dev)"


def libzmq_dev() -> str | None:
    """None when cgo can find libzmq (``pkg-config --exists libzmq``), else why not."""
    if shutil.which("pkg-config") is None:
        return f"{LIBZMQ_MISSING}; pkg-config not found either (apt-get install pkg-config)"
    try:
        found = subprocess.run(
            ["pkg-config", "--exists", "libzmq"], stdin=subprocess.DEVNULL,
            capture_output=True, timeout=30,
        ).returncode == 0
    except subprocess.TimeoutExpired:
        return f"{LIBZMQ_MISSING}: pkg-config --exists libzmq timed out"
    return None if found else LIBZMQ_MISSING


FORWARDER = GoBinary(
    name="logjam http-forwarder",
    tarball=TARBALL,
    binary="http-forwarder",
    bin_env="LOGROUTER_LOGJAM_FORWARDER_BIN",
    timeout_env="LOGROUTER_LOGJAM_FORWARDER_BUILD_TIMEOUT",
    default_timeout=480.0,
    cgo=True,
    precondition=libzmq_dev,
)


def ensure_built() -> Path | None:
    """The path of the ``http-forwarder`` binary, built once and cached; None if unavailable."""
    return FORWARDER.ensure_built()


def ensure_built_with_reason() -> tuple[Path | None, str]:
    return FORWARDER.ensure_built_with_reason()


def build_reason() -> str:
    return FORWARDER.build_reason()


def free_ports() -> tuple[int, int]:
    """An HTTP port free on every interface (the program listens on ``:port``) and a
    different PUB port free on 127.0.0.1, both held until both are chosen."""
    http = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    pub = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        http.bind(("", 0))
        pub.bind(("127.0.0.1", 0))
        return http.getsockname()[1], pub.getsockname()[1]
    finally:
        http.close()
        pub.close()


def _listening_ports(pid: int) -> set[int] | None:
    """TCP ports process ``pid`` listens on (from /proc); None where /proc cannot say."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    next(f)
                    for line in f:
                        fields = line.split()
                        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
            except FileNotFoundError:
                continue
        return ports
    except OSError:
        return None


class ForwarderFailed(RuntimeError):
    pass


class Forwarder:
    """One ``http-forwarder`` on loopback; a context manager.

    >>> with Forwarder(binary, device_id=7) as fwd:
    ...     fwd.post_log("shop", "prod", {"request_id": "r1"})
    ...     # a SUB connected to fwd.pub_endpoint gets it (once it has joined)
    """

    def __init__(
        self,
        binary: Path | str,
        *,
        device_id: int = 1,
        compress: str | None = None,
        workdir: Path | str | None = None,
        start_timeout: float = 30.0,
        stop_grace: float = 15.0,
        attempts: int = 3,
        extra_args: list[str] | None = None,
        ports: tuple[int, int] | None = None,
    ) -> None:
        if compress not in (None, "zlib", "snappy", "lz4"):
            raise ValueError(f"compress must be zlib, snappy or lz4, not {compress!r}")
        self.binary = Path(binary)
        self.device_id = device_id
        self.compress = compress
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self.attempts = attempts
        self.extra_args = list(extra_args or [])
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="http-forwarder-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.output_path = self.workdir / "output.log"
        self.ports = ports  # (HTTP, PUB) to use, every start; None = free ones, new each attempt
        self.http_port = 0
        self.pub_port = 0
        self.argv: list[str] = []
        self.proc: subprocess.Popen | None = None
        self._output_file = None

    @property
    def pub_endpoint(self) -> str:
        """Where a SUB connects: ``tcp://127.0.0.1:<pub port>``."""
        return f"tcp://127.0.0.1:{self.pub_port}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> "Forwarder":
        """Start it and wait (at most ``start_timeout`` s per attempt) until it serves on
        both ports; new ports and another attempt when one of them was taken meanwhile."""
        if self.proc is not None:
            raise RuntimeError("already started")
        problems = []
        for _ in range(1 if self.ports else self.attempts):
            self.http_port, self.pub_port = self.ports or free_ports()
            self.argv = [
                str(self.binary), "-b", "127.0.0.1", "-p", str(self.http_port),
                "-P", str(self.pub_port), "-d", str(self.device_id), *self.extra_args,
            ]
            if self.compress:
                self.argv += ["-x", self.compress]
            self._output_file = open(self.output_path, "wb")  # this attempt's output only
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=self._output_file,
                stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True,
            )
            problem = self._wait_ready()
            if problem is None:
                return self
            problems.append(problem)
            self.stop()
            self.proc = None
        raise ForwarderFailed(
            f"http-forwarder did not come up in {len(problems)} attempt(s): {'; '.join(problems)}\n"
            f"{self.output()[-4000:]}"
        )

    def _wait_ready(self) -> str | None:
        """None once it listens on both ports and answers /alive.txt, else why not."""
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        last = "not polled yet"
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                return f"exited {code} on ports {self.http_port}/{self.pub_port}"
            if "Cannot listen and serve" in self.output():
                return f"HTTP port {self.http_port} taken"
            ports = _listening_ports(self.proc.pid)
            if ports is not None and self.http_port in ports and self.pub_port not in ports:
                # the PUB socket is bound before the HTTP server starts: it failed
                return f"PUB port {self.pub_port} taken"
            if ports is None or self.http_port in ports:
                try:
                    with urllib.request.urlopen(f"{self.base_url}/alive.txt", timeout=2) as response:
                        if response.status == 200 and response.read().strip() == b"ALIVE":
                            return None
                        last = f"/alive.txt answered {response.status}"
                except (OSError, urllib.error.URLError) as e:
                    last = f"/alive.txt: {e}"
            else:
                last = f"not listening on {self.http_port} yet"
            time.sleep(0.05)  # poll interval; the bound is the deadline
        return f"not serving after {self.start_timeout:.0f}s ({last})"

    def restart(self) -> "Forwarder":
        """Stop it and start it again on the same ports: a new process, whose sequence
        numbers start again from 1 (a device restart, as a subscriber sees it)."""
        self.stop()
        self.proc = None
        self.ports = (self.http_port, self.pub_port)
        return self.start()

    def stop(self) -> int | None:
        """SIGTERM (it shuts its web server down, at most 5 s, and its publisher, at most
        3 s), then SIGKILL after ``stop_grace`` s; its exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=self.stop_grace)
            except subprocess.TimeoutExpired:
                try:  # its own session (start_new_session): the group is only what it started
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=self.stop_grace)
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
        """Everything it logged so far (stdout and stderr)."""
        try:
            return self.output_path.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> "Forwarder":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._own_workdir and exc[0] is None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- HTTP --------------------------------------------------------------------------

    def _post(self, path: str, data: bytes, headers: dict[str, str], timeout: float) -> int:
        request = urllib.request.Request(
            f"{self.base_url}{path}", data=data, method="POST",
            headers={"Content-Type": "application/json", **headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, text = response.status, response.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        if status != 202:
            raise ForwarderFailed(f"POST {path} answered {status}: {text!r}")
        return status

    def post_log(self, app: str, env: str, body: dict, *, encoding: str | None = None, timeout: float = 10) -> int:
        """``POST /logjam/logs/{app}/{env}``: published as is under ``logs.<app>-<env>``.
        With ``encoding`` (``zlib``, ``snappy`` or ``lz4``) the body goes compressed so, in
        the format of logjam's meta compression ids (``wire.logjam.compress_body``), with
        ``Content-Encoding: <encoding>``; the forwarder publishes it as it came, with that
        compression in its meta. Raises unless 202."""
        data = json.dumps(body).encode()
        headers = {}
        if encoding is not None:
            data = logjam.compress_body(data, ENCODINGS[encoding])
            headers["Content-Encoding"] = encoding
        return self._post(f"/logjam/logs/{app}/{env}", data, headers, timeout)

    def post_event(self, app: str, env: str, body: dict, *, timeout: float = 10) -> int:
        """``POST /logjam/events/{app}/{env}``: published under ``events.<app>-<env>``
        (its ``app`` and ``env`` keys removed). Raises unless 202."""
        return self._post(f"/logjam/events/{app}/{env}", json.dumps(body).encode(), {}, timeout)


if __name__ == "__main__":  # python tests/logjam_forwarder.py: build (or say why not)
    raise SystemExit(FORWARDER.main())

"""The real Log Courier shipper against a tiny in-test Courier receiver.

Proves the build (``log_courier_shipper.ensure_built``) and the config that
``Shipper`` writes: N lines on the shipper's stdin arrive as N events whose
``message`` is the line, the shipper's HELO is the protocol's vector, it sends EVNT
exactly when the VERS flags allow it, and once all is acknowledged it has finished
(2.12.0 then waits for SIGTERM, which ``Shipper.wait`` sends; see
``docs/protocols/log_courier.md``).
The end-to-end test against ``logrouter``'s own courier source supersedes this one;
the fake receiver here is checked on its own against the protocol's test vectors
(``docs/protocols/log_courier.md`` section 10), so the file tests something even where
the shipper cannot be built (it is then skipped with the reason).
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
import time
import zlib

import pytest

from log_courier_log import ShipperLog
from log_courier_shipper import FINISHED, Shipper, ensure_built_with_reason, parse_status

HELO_2_12_0 = bytes.fromhex(
    "48454c4f00000020" "00000000000000020000000c00000000" "4c434f52000000000000000000000000"
)
JDAT_HI = bytes.fromhex(
    "4a4441540000002c" "000102030405060708090a0b0c0d0e0f"
    "785e63606010a856ca4d2d2e4e4c4f55b252cac854aa0500315f0581"
)
EVNT_HI = bytes.fromhex(
    "45564e54ffffffff000102030405060708090a0b0c0d0e0f785e63606010a856ca4d2d2e4e4c4f55b252cac854aa0500315f0581"
)
ACKN_HI_1 = bytes.fromhex("41434b4e00000014000102030405060708090a0b0c0d0e0f00000001")


class FakeCourierReceiver:
    """A bounded Courier protocol server on 127.0.0.1, one thread, for tests only.

    Answers HELO with a 32-byte VERS (EVNT bit if ``evnt``), inflates JDAT and EVNT
    payloads, records every event and which message kind carried it, ACKNs each payload
    whole, and answers PING with PONG. Stops by itself after ``lifetime`` seconds.
    """

    def __init__(self, evnt: bool = False, tls: ssl.SSLContext | None = None, lifetime: float = 60.0):
        self.evnt = evnt
        self.tls = tls
        self.lifetime = lifetime
        self.events: list[dict] = []
        self.kinds: list[str] = []  # "JDAT"/"EVNT" per payload
        self.helos: list[bytes] = []
        self.errors: list[str] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="fake-courier", daemon=True)

    def __enter__(self) -> "FakeCourierReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def messages(self) -> list[str]:
        with self._lock:
            return [event.get("message") for event in self.events]

    # -- server loop -----------------------------------------------------------------

    def _serve(self) -> None:
        deadline = time.monotonic() + self.lifetime
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            self.connections += 1
            try:
                conn.settimeout(0.2)
                if self.tls is not None:
                    conn.settimeout(5)
                    conn = self.tls.wrap_socket(conn, server_side=True)
                    conn.settimeout(0.2)
                self._session(conn, deadline)
            except Exception as e:  # recorded for the test's message, never raised here
                self.errors.append(f"{type(e).__name__}: {e}")
            finally:
                conn.close()

    def _session(self, conn: socket.socket, deadline: float) -> None:
        buf = bytearray()

        def need(n: int) -> bytes | None:
            while len(buf) < n:
                if self._stop.is_set() or time.monotonic() > deadline:
                    return None
                try:
                    part = conn.recv(65536)
                except (socket.timeout, ssl.SSLWantReadError):
                    continue
                if not part:
                    return None
                buf.extend(part)
            out = bytes(buf[:n])
            del buf[:n]
            return out

        while True:
            header = need(8)
            if header is None:
                return
            kind, length = header[:4], struct.unpack(">I", header[4:])[0]
            if kind == b"HELO":
                body = need(length)
                if body is None:
                    return
                self.helos.append(body)
                flags = b"\x01\x00\x00\x00" if self.evnt else b"\x00\x00\x00\x00"
                vers = flags + struct.pack(">III", 2, 12, 0) + b"LCVR" + bytes(12)
                conn.sendall(b"VERS" + struct.pack(">I", len(vers)) + vers)
            elif kind == b"PING":
                conn.sendall(b"PONG\x00\x00\x00\x00")
            elif kind == b"JDAT":
                body = need(length)
                if body is None:
                    return
                self._payload(conn, "JDAT", body[:16], zlib.decompress(body[16:]))
            elif kind == b"EVNT":
                nonce = need(16)
                if nonce is None:
                    return
                inflater = zlib.decompressobj()
                out = bytearray()
                while not inflater.eof:
                    if not buf:
                        more = need(1)
                        if more is None:
                            return
                        buf[:0] = more
                    chunk = bytes(buf)
                    buf.clear()
                    out += inflater.decompress(chunk)
                buf[:0] = inflater.unused_data
                self._payload(conn, "EVNT", nonce, bytes(out))
            else:
                self.errors.append(f"unexpected message {kind!r}")
                return

    def _payload(self, conn: socket.socket, kind: str, nonce: bytes, data: bytes) -> None:
        events = []
        pos = 0
        while pos < len(data):
            (size,) = struct.unpack(">I", data[pos:pos + 4])
            events.append(json.loads(data[pos + 4:pos + 4 + size]))
            pos += 4 + size
        with self._lock:
            self.events.extend(events)
            self.kinds.append(kind)
        conn.sendall(b"ACKN" + struct.pack(">I", 20) + nonce + struct.pack(">I", len(events)))


def _client_exchange(port: int, frames: list[bytes], expect: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        got = b""
        for frame in frames:
            sock.sendall(frame)
        while len(got) < expect:
            part = sock.recv(expect - len(got))
            if not part:
                break
            got += part
        return got


# -- the fake receiver itself, against the protocol's test vectors ----------------------


@pytest.mark.parametrize("evnt", [False, True])
def test_fake_receiver_answers_the_protocol_vectors(evnt):
    payload = EVNT_HI if evnt else JDAT_HI
    with FakeCourierReceiver(evnt=evnt, lifetime=10) as receiver:
        got = _client_exchange(receiver.port, [HELO_2_12_0, payload, b"PING\x00\x00\x00\x00"], 40 + 28 + 8)
    assert got[:8] == b"VERS\x00\x00\x00\x20"
    assert got[8] == (1 if evnt else 0)
    assert got[40:68] == ACKN_HI_1
    assert got[68:] == b"PONG\x00\x00\x00\x00"
    assert receiver.messages() == ["hi"]
    assert receiver.kinds == ["EVNT" if evnt else "JDAT"]
    assert receiver.errors == []


def test_shipper_config_tcp_and_tls(tmp_path):
    tcp = Shipper("/nonexistent/log-courier", 5043, workdir=tmp_path / "tcp")
    written = json.loads(tcp.config_path.read_text())
    assert written["network"]["transport"] == "tcp"
    assert written["network"]["servers"] == ["127.0.0.1:5043"]
    assert "ssl ca" not in written["network"]
    assert written["general"]["persist directory"] == str(tmp_path / "tcp" / "persist")
    assert tcp.argv[1:] == ["-config", str(tcp.config_path), "-stdin"]
    tls = Shipper(
        "/nonexistent/log-courier", 5043, transport="tls", ca="/ca.pem",
        certificate="/c.pem", key="/k.pem", workdir=tmp_path / "tls",
    )
    network = json.loads(tls.config_path.read_text())["network"]
    assert (network["transport"], network["ssl ca"], network["ssl certificate"], network["ssl key"]) == (
        "tls", "/ca.pem", "/c.pem", "/k.pem",
    )
    with pytest.raises(ValueError):
        Shipper("/x", 1, transport="tls", workdir=tmp_path / "bad")
    with pytest.raises(ValueError):
        Shipper("/x", 1, transport="tls", ca="/ca.pem", certificate="/c.pem", workdir=tmp_path / "bad2")


# -- the real shipper ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def log_courier_bin(request):
    """Build (first use) or find the cached ``log-courier``; skip with the reason if unavailable."""
    started = time.monotonic()
    path, reason = ensure_built_with_reason()
    took = time.monotonic() - started
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    line = f"log-courier shipper: {reason} [ensure_built took {took:.2f}s]"
    if reporter is not None:
        reporter.write_line(line)
    else:
        print(line)
    if path is None:
        pytest.skip(reason)
    return path


def _ship(binary, receiver, lines, tmp_path, **kwargs):
    with Shipper(binary, receiver.port, workdir=tmp_path / "shipper", **kwargs) as shipper:
        shipper.write_lines(lines)
        shipper.close_stdin()
        code = shipper.wait(60)
        output = shipper.output()
    return code, output


@pytest.mark.parametrize("evnt", [False, True], ids=["vers-flags-0", "vers-evnt"])
def test_real_shipper_delivers_stdin_lines(log_courier_bin, tmp_path, evnt):
    lines = [f"line {i} \u00e9 {'x' * (i % 7)}" for i in range(25)]
    with FakeCourierReceiver(evnt=evnt, lifetime=90) as receiver:
        code, output = _ship(log_courier_bin, receiver, lines, tmp_path)
    assert code == 0, f"shipper did not exit 0 by itself after stdin EOF ({code}):\n{output}"
    assert receiver.errors == [], output
    assert sorted(receiver.messages()) == sorted(lines), output
    # the whole 32-byte HELO body is the vector's: flags 0, version 2.12.0, LCOR, zeros
    assert len(receiver.helos) >= 1 and receiver.helos[0] == HELO_2_12_0[8:]
    # the shipper streams (EVNT) exactly when the VERS flags say the server can take it
    assert set(receiver.kinds) == ({"EVNT"} if evnt else {"JDAT"})


def test_real_shipper_over_tls_with_client_certificate(log_courier_bin, tmp_path, pki):
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
    context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    context.verify_mode = ssl.CERT_REQUIRED
    lines = [f"tls line {i}" for i in range(5)]
    with FakeCourierReceiver(tls=context, lifetime=90) as receiver:
        code, output = _ship(
            log_courier_bin, receiver, lines, tmp_path, transport="tls", ca=pki.ca,
            certificate=pki.client_cert, key=pki.client_key,
        )
    assert code == 0, output
    assert sorted(receiver.messages()) == sorted(lines), output


def test_shipper_process_lifecycle_with_a_stand_in(tmp_path):
    """start/write/close/wait/output/stop, with shell scripts in place of the binary."""
    stand_in = tmp_path / "stand-in"
    stand_in.write_text('#!/bin/sh\necho "args: $*"\nwc -l\n')
    stand_in.chmod(0o755)
    with Shipper(stand_in, 5043, workdir=tmp_path / "run") as shipper:
        shipper.write_lines(["a", "b", "c"])
        shipper.close_stdin()
        assert shipper.wait(10) == 0
        out = shipper.output()
    assert "-config" in out and "-stdin" in out and out.split()[-1] == "3"

    # 2.12.0 after stdin EOF: everything acknowledged, the pipeline stopped, the process
    # waits for a signal; wait() sends SIGTERM on FINISHED and returns the exit code.
    finished = tmp_path / "finished"
    finished.write_text(
        "#!/bin/sh\ntrap 'echo Exiting; exit 0' TERM\ncat >/dev/null\n"
        f"echo '2026/01/01 00:00:00.000000 {FINISHED}'\nwhile :; do sleep 0.1; done\n"
    )
    finished.chmod(0o755)
    with Shipper(finished, 5043, workdir=tmp_path / "finished-run") as shipper:
        shipper.write_lines(["a"])
        assert shipper.wait(0.3) is None  # stdin still open: at work
        shipper.close_stdin()
        assert shipper.wait(10) == 0
        assert shipper.output().splitlines()[-1] == "Exiting"

    hung = tmp_path / "hung"
    hung.write_text("#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 1; done\n")
    hung.chmod(0o755)
    started = time.monotonic()
    with Shipper(hung, 5043, workdir=tmp_path / "hung-run") as shipper:
        shipper.close_stdin()
        assert shipper.wait(0.5) is None
        proc = shipper.proc
    assert proc.returncode is not None and time.monotonic() - started < 15


def test_the_log_says_which_events_went_out_again_under_a_new_nonce():
    """2.12.0's log (abridged from real runs). A new payload whose queueing failed on a
    broken connection is sent again under a new nonce, from the main loop ("Holding …")
    or from tryQueueHeld (no line of its own); a failed resend keeps its nonce; a failed
    ping is no payload."""
    text = (
        "2026/11/27 00:32:52.117221 [E 127.0.0.1:51963] Sending payload 62f65ad8 with 1024 events\n"
        "2026/11/27 00:32:52.129644 [T 127.0.0.1:36660 > 127.0.0.1:51963] Sending EVNT payload with nonce"
        " 62f65ad8 and 1024 events\n"
        "2026/11/27 00:32:52.129650 [T 127.0.0.1:36660 < 127.0.0.1:51963] Received acknowledgement for nonce"
        " 0badc0de with sequence 10\n"
        "2026/11/27 00:32:52.129671 [P 127.0.0.1:51963] Forcing endpoint failure: invalid connection state\n"
        "2026/11/27 00:32:52.129690 [P 127.0.0.1:51963] 5 payloads pulled back for resend (5 total now held for resend)\n"
        "2026/11/27 00:32:52.129700 Holding 1024 new events until an endpoint is ready\n"
        "2026/11/27 00:32:53.000000 [T 127.0.0.1:36661 - 127.0.0.1:51963] Connected\n"
        "2026/11/27 00:32:53.100000 [E 127.0.0.1:51963] Resending payload 62f65ad8 with 1024 events\n"
        "2026/11/27 00:32:53.100100 [P 127.0.0.1:51963] Forcing endpoint failure: invalid connection state\n"
        "2026/11/27 00:32:54.000000 [T 127.0.0.1:36662 - 127.0.0.1:51963] Connected\n"
        "2026/11/27 00:32:54.100000 [E 127.0.0.1:51963] Sending payload 9efd3234 with 700 events\n"
        "2026/11/27 00:32:54.100100 [P 127.0.0.1:51963] Forcing endpoint failure: invalid connection state\n"
        "2026/11/27 00:32:55.000000 [P 127.0.0.1:51963] Sending ping and starting pending timeout\n"
        "2026/11/27 00:32:55.000100 [P 127.0.0.1:51963] Forcing endpoint failure: invalid connection state\n"
        "2026/11/27 00:33:10.000000 [P 127.0.0.1:51963] Forcing endpoint failure: server did not respond within network timeout\n"
    )
    log = ShipperLog.parse(text)
    assert log.sent_again == 1024 + 700
    assert log.connections == 2 and len(log.failures) == 5
    assert ShipperLog.parse("2026/11/27 00:32:52.117221 Log Courier v2.12.0 starting up\n").sent_again == 0


def test_the_log_says_what_was_acknowledged_also_across_a_resend_of_the_rest():
    """After a partial ACKN the shipper resends only the rest, its sequence from 1."""
    text = (
        "2026/11/27 01:00:00.000000 [E s:1] Sending payload aa with 1000 events\n"
        "2026/11/27 01:00:00.500000 [T c < s:1] Received acknowledgement for nonce aa with sequence 0\n"
        "2026/11/27 01:00:01.000000 [T c < s:1] Received acknowledgement for nonce aa with sequence 400\n"
        "2026/11/27 01:00:02.000000 [E s:1] Resending payload aa with 600 events\n"
        "2026/11/27 01:00:03.000000 [T c < s:1] Received acknowledgement for nonce aa with sequence 600\n"
        "2026/11/27 01:00:03.000000 [T c < s:1] Received acknowledgement for nonce aa with sequence 600\n"
        "2026/11/27 01:00:04.000000 [E s:1] Sending payload bb with 10 events\n"
        "2026/11/27 01:00:04.100000 [T c < s:1] Received acknowledgement for nonce bb with sequence 4\n"
    )
    log = ShipperLog.parse(text)
    assert log.acknowledged == 1000 + 4
    assert [(a.nonce, a.sequence, a.size) for a in log.partial_steps()] == [("aa", 400, 1000), ("bb", 4, 10)]
    assert [a.at for a in log.zeros()] == [0.5]
    assert [(a.nonce, a.sequence) for a in log.repeats()] == [("aa", 600)]


def test_lc_admin_status_is_parsed_into_nested_dicts():
    text = (
        "\nname: Log Courier\npublisher:\n  endpoints:\n    127.0.0.1:46531:\n      last_error: n/a\n"
        "      pendingPayloads: 5\n      status: active\n  status:\n    pendingPayloads: 5\n"
        "    publishedLines: 3072\nversion: 2.12.0\n\n"
    )
    status = parse_status(text)
    assert status["name"] == "Log Courier" and status["version"] == "2.12.0"
    assert status["publisher"]["endpoints"]["127.0.0.1:46531"] == {
        "last_error": "n/a", "pendingPayloads": "5", "status": "active",
    }
    assert status["publisher"]["status"] == {"pendingPayloads": "5", "publishedLines": "3072"}

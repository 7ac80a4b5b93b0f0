"""The HTTP endpoint (``[router] metrics_listen``): loopback by default, who may reload,
no answer to web pages, the health document, and the supervisor's pages with a stuck
worker (fake workers on a ``task.Clock``, requests over ``StringTransport``)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from twisted.internet import defer, task
from twisted.internet.testing import StringTransport

from logrouter.config.load import ConfigError, load_string, warnings
from logrouter.health import router_health
from logrouter.http_endpoint import site
from logrouter.metrics import render_samples
from logrouter.reload_queue import APPLIED, ReloadResult
from logrouter.workers.http import WORKER_ANSWER_SECS, SupervisorPages
from logrouter.workers.supervisor import RESTART_SECS, WorkerProcess
from repo_paths import REPO

TOKEN = "s3cret-token-0123456789"


def http(pages, raw: bytes) -> tuple[int, dict[str, str], str]:
    """Send one raw request to the endpoint's site; (status, headers, body) of the answer."""
    protocol = site(pages).buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(raw)
    head, _, body = transport.value().partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body.decode()


def request(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class FakePages:
    """Pages whose answers a test sets; counts the reloads it was asked for."""

    def __init__(self, router: dict | None = None, health: dict | None = None) -> None:
        self.router = {"reload_token": TOKEN, "reload_token_file": ""} if router is None else router
        self.document = health or {"status": "ok", "problems": []}
        self.reloads = 0

    def metrics(self):
        return defer.succeed("logrouter_events_in_total 3\n")

    def health(self):
        return defer.succeed(self.document)

    def worker_metrics(self, index):
        return defer.succeed(None)

    def reload(self):
        self.reloads += 1
        return defer.succeed(ReloadResult(APPLIED, "nothing changed"))

    def router_options(self):
        return self.router


# -- the config: loopback by default, the token -------------------------------------------


def test_an_endpoint_without_interface_listens_on_loopback() -> None:
    for given, effective in (
        ("tcp:9880", "tcp:9880:interface=127.0.0.1"),
        ("tcp:0", "tcp:0:interface=127.0.0.1"),
        ("tcp:port=9880:backlog=5", "tcp:port=9880:backlog=5:interface=127.0.0.1"),
        ("tcp6:9880", r"tcp6:9880:interface=\:\:1"),
        ("tcp:9880:interface=10.1.2.3", "tcp:9880:interface=10.1.2.3"),
        ("tcp:9880:interface=0.0.0.0", "tcp:9880:interface=0.0.0.0"),
        ("unix:/run/logrouter/metrics.sock", "unix:/run/logrouter/metrics.sock"),
    ):
        config = load_string(f'[router]\nmetrics_listen = "{given}"\n'.replace("\\", "\\\\"))
        assert config.router["metrics_listen"] == effective, given


def test_every_interface_is_warned_about(tmp_path) -> None:
    for listen in ("tcp:9880:interface=0.0.0.0", r"tcp6:port=9880:interface=\\:\\:"):
        said = warnings(load_string(f'[router]\nmetrics_listen = "{listen}"\n'))
        assert any(w.startswith("router.metrics_listen:") and "every interface" in w for w in said), said
    for listen in ("tcp:9880", "tcp:9880:interface=127.0.0.1", "tcp:9880:interface=10.1.2.3"):
        assert not any("metrics_listen" in w for w in warnings(load_string(f'[router]\nmetrics_listen = "{listen}"\n')))
    (tmp_path / "open.toml").write_text('[router]\nmetrics_listen = "tcp:9880:interface=0.0.0.0"\n')
    result = subprocess.run(
        [sys.executable, "-m", "logrouter", "check-config", "open.toml"], capture_output=True, text=True, cwd=tmp_path,
        timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "warning: router.metrics_listen: 'tcp:9880:interface=0.0.0.0' listens on every interface" in result.stderr


def test_the_token_options_are_checked(tmp_path) -> None:
    def errors(text: str) -> list[str]:
        with pytest.raises(ConfigError) as info:
            load_string(text)
        return info.value.errors

    assert errors('[router]\nreload_token = "short"\n')[0].startswith("router.reload_token: a token must have at least 16")
    assert errors('[router]\nreload_token = "has a space in it, long enough"\n')[0].startswith("router.reload_token: a token must be printable")
    missing = tmp_path / "missing"
    assert errors(f'[router]\nreload_token_file = "{missing}"\n')[0].startswith(f"router.reload_token_file: cannot read '{missing}'")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert errors(f'[router]\nreload_token = "{TOKEN}"\nreload_token_file = "{token_file}"\n') == [
        "router.reload_token_file: set reload_token or reload_token_file, not both"
    ]
    assert load_string(f'[router]\nreload_token_file = "{token_file}"\n').router["reload_token_file"] == str(token_file)


# -- who may ask ---------------------------------------------------------------------------


def test_reload_without_a_configured_token_is_refused_and_says_how_to_enable_it() -> None:
    pages = FakePages(router={"reload_token": "", "reload_token_file": ""})
    status, _, body = http(pages, request("POST", "/reload", f"Authorization: Bearer {TOKEN}"))
    assert status == 403 and pages.reloads == 0
    assert "reload over HTTP is off" in body and "reload_token_file" in body and "SIGHUP" in body


def test_reload_needs_the_bearer_token() -> None:
    pages = FakePages()
    for headers in ((), ("Authorization: Bearer wrong-token-0123456789",), (f"Authorization: Basic {TOKEN}",)):
        status, _, body = http(pages, request("POST", "/reload", *headers))
        assert status == 403 and "Authorization: Bearer" in body, (headers, body)
    assert pages.reloads == 0
    status, _, body = http(pages, request("POST", "/reload", f"Authorization: Bearer {TOKEN}"))
    assert (status, body, pages.reloads) == (200, "nothing changed\n", 1)
    status, _, _ = http(pages, request("POST", "/reload", f"authorization: bearer {TOKEN}"))
    assert status == 200 and pages.reloads == 2


def test_the_token_file_is_read_at_each_request(tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    pages = FakePages(router={"reload_token": "", "reload_token_file": str(token_file)})
    assert http(pages, request("POST", "/reload", f"Authorization: Bearer {TOKEN}"))[0] == 200
    token_file.write_text("a-new-token-0123456789\n")
    assert http(pages, request("POST", "/reload", f"Authorization: Bearer {TOKEN}"))[0] == 403
    assert http(pages, request("POST", "/reload", "Authorization: Bearer a-new-token-0123456789"))[0] == 200
    token_file.unlink()
    status, _, body = http(pages, request("POST", "/reload", "Authorization: Bearer a-new-token-0123456789"))
    assert status == 403 and "cannot read" in body
    assert pages.reloads == 2


def test_reload_takes_no_body() -> None:
    pages = FakePages()
    status, _, body = http(pages, request("POST", "/reload", f"Authorization: Bearer {TOKEN}",
                                          "Content-Type: application/x-www-form-urlencoded", body=b"a=1"))
    assert status == 403 and "takes no body" in body and pages.reloads == 0


def test_requests_from_web_pages_are_refused_and_no_cors_header_is_sent() -> None:
    pages = FakePages()
    for method, path in (("POST", "/reload"), ("GET", "/metrics"), ("GET", "/health")):
        for header in ("Origin: http://evil.example", "Origin: null", "Sec-Fetch-Site: cross-site", "Sec-Fetch-Site: same-origin"):
            status, headers, body = http(pages, request(method, path, f"Authorization: Bearer {TOKEN}", header))
            assert status == 403 and "web pages" in body, (method, path, header)
            assert not any(k.startswith("access-control-") for k in headers)
    assert pages.reloads == 0
    status, headers, _ = http(pages, request("OPTIONS", "/reload", "Origin: http://evil.example",
                                             "Access-Control-Request-Method: POST"))
    assert status >= 400 and not any(k.startswith("access-control-") for k in headers)
    # typed into a browser's address bar: answered
    status, headers, body = http(pages, request("GET", "/metrics", "Sec-Fetch-Site: none"))
    assert status == 200 and body == "logrouter_events_in_total 3\n"
    assert not any(k.startswith("access-control-") for k in headers)


def test_health_is_json_200_or_503() -> None:
    status, headers, body = http(FakePages(), request("GET", "/health"))
    assert status == 200 and headers["content-type"] == "application/json" and json.loads(body)["status"] == "ok"
    failing = {"status": "failing", "problems": ["sink lake: failing"]}
    status, _, body = http(FakePages(health=failing), request("GET", "/health"))
    assert status == 503 and json.loads(body) == failing


# -- one router's health -------------------------------------------------------------------


def fake_router(**changes) -> SimpleNamespace:
    sink = SimpleNamespace(cursor=100, failing=False)
    router = SimpleNamespace(
        sources={"forward": object()}, sinks={"lake": sink}, feeds={"lake": SimpleNamespace(started=True, live=True)},
        spool=SimpleNamespace(end=150), paused=False, spool_failing=False, stopping=False, stop_requested=False,
        left_out=[], backlog_bytes=lambda: 50,
    )
    for key, value in changes.items():
        setattr(router, key, value)
    return router


def test_one_routers_health() -> None:
    document = router_health(fake_router())
    assert document == {
        "status": "ok", "problems": [], "spool": {"state": "ok", "backlog_bytes": 50},
        "sources": {"forward": {"state": "listening"}}, "sinks": {"lake": {"state": "live", "lag_bytes": 50}},
    }
    catching_up = router_health(fake_router(feeds={"lake": SimpleNamespace(started=True, live=False)}, paused=True))
    assert catching_up["status"] == "ok" and catching_up["sinks"]["lake"]["state"] == "catching up"
    assert catching_up["spool"]["state"] == "full"  # backpressure, as designed: not a problem


def test_one_routers_problems() -> None:
    failing = router_health(fake_router(sinks={"lake": SimpleNamespace(cursor=100, failing=True)}))
    assert failing["status"] == "failing" and failing["problems"] == ["sink lake: failing (retried; 50 bytes wait in the spool)"]
    left_out = router_health(fake_router(left_out=["sources.beats", "sinks.copy"]))
    assert left_out["sources"]["beats"] == {"state": "left out"} and left_out["sinks"]["copy"] == {"state": "left out"}
    assert [p.split(":")[0] for p in left_out["problems"]] == ["sink copy", "source beats"]
    spool = router_health(fake_router(spool_failing=True))
    assert spool["spool"]["state"] == "failing" and spool["problems"][0].startswith("spool: writes fail")
    assert router_health(fake_router(stopping=True))["problems"] == ["stopping"]
    assert router_health(None)["status"] == "failing"


# -- the supervisor's pages: fake workers on a clock ----------------------------------------


class FakeChannel:
    """A worker's channel: a responsive worker answers at once, a stuck one never."""

    def __init__(self, worker: WorkerProcess, pages: dict) -> None:
        self.worker = worker
        self.pages = pages
        self.stuck = False

    def send(self, message: dict, fds=()) -> bool:
        if not self.stuck:
            op = message["op"]
            reply = {"text": self.pages[self.worker.index]} if op == "metrics" else {"health": self.pages["health"]}
            # the answer comes in a later turn of the reactor, as over the real channel
            self.worker.supervisor.reactor.callLater(0, self.worker._message, {"op": op, "id": message["id"], **reply}, [])
        return True


def worker_page(index: int, events: int) -> str:
    return render_samples(iter([
        ("logrouter_events_in_total", "counter", {}, events),
        ("logrouter_source_connections", "gauge", {"source": "forward"}, index + 1),
    ]))


def make_supervisor(count: int = 2):
    clock = task.Clock()
    supervisor = SimpleNamespace(
        reactor=clock, ids=itertools.count(1), accepting=count, compaction=None, stopping=False,
        listeners={"forward": SimpleNamespace(name="forward", sock=object(), passed=3, dropped=0)},
        config=SimpleNamespace(router={"reload_token": TOKEN, "reload_token_file": ""}), reply_limit=lambda: 60.0,
    )
    answers = {0: worker_page(0, 10), 1: worker_page(1, 20), "health": router_health(fake_router())}
    supervisor.workers = []
    for index in range(count):
        worker = WorkerProcess(supervisor, index)
        worker.ready, worker.ended = True, defer.Deferred()
        worker.channel = FakeChannel(worker, answers)
        supervisor.workers.append(worker)
    return supervisor, clock, answers


def fired(d: defer.Deferred, clock: task.Clock) -> list:
    """What ``d`` fired with once the answers already sent came in (empty if it did not fire)."""
    result: list = []
    d.addBoth(result.append)
    clock.advance(0)
    return result


def values(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and line[0] != "#"}


def test_a_stuck_worker_costs_a_scrape_half_a_second_and_is_marked_down() -> None:
    supervisor, clock, _ = make_supervisor()
    pages = SupervisorPages(supervisor)
    page = values(fired(pages.metrics(), clock)[0])
    assert page["logrouter_events_in_total"] == 30 and page["logrouter_source_connections{source=\"forward\"}"] == 3
    assert page['logrouter_worker_up{worker="1"}'] == 1 and page['logrouter_worker_running{worker="1"}'] == 1

    supervisor.workers[1].channel.stuck = True
    answer = fired(pages.metrics(), clock)
    assert answer == []  # waits for worker 1, but not for long
    clock.advance(WORKER_ANSWER_SECS)
    page = values(answer[0])
    assert page['logrouter_worker_up{worker="1"}'] == 0 and page['logrouter_worker_running{worker="1"}'] == 1
    assert page['logrouter_worker_up{worker="0"}'] == 1
    # its counters stay at its last page's (a sum never goes backwards); its gauges are left out
    assert page["logrouter_events_in_total"] == 30
    assert page['logrouter_source_connections{source="forward"}'] == 1
    assert supervisor.workers[1].requests == {}

    supervisor.workers[1].channel.stuck = False
    page = values(fired(pages.metrics(), clock)[0])
    assert page['logrouter_worker_up{worker="1"}'] == 1 and page['logrouter_source_connections{source="forward"}'] == 3


def test_a_stuck_workers_own_page_is_not_found_after_the_deadline() -> None:
    supervisor, clock, _ = make_supervisor()
    pages = SupervisorPages(supervisor)
    assert fired(pages.worker_metrics(0), clock)[0] == worker_page(0, 10)
    supervisor.workers[0].channel.stuck = True
    answer = fired(pages.worker_metrics(0), clock)
    clock.advance(WORKER_ANSWER_SECS)
    assert answer == [None]
    assert fired(pages.worker_metrics(7), clock) == [None]


def test_health_names_a_stuck_a_stopped_and_a_crash_looping_worker() -> None:
    supervisor, clock, answers = make_supervisor(count=3)
    answers[2] = worker_page(2, 0)
    pages = SupervisorPages(supervisor)
    document = fired(pages.health(), clock)[0]
    assert document["status"] == "ok" and document["problems"] == []
    assert [w["state"] for w in document["workers"]] == ["running"] * 3
    assert document["workers"][0]["sinks"] == {"lake": {"state": "live", "lag_bytes": 50}}
    assert document["listeners"] == {"forward": {"state": "listening"}}

    supervisor.workers[1].channel.stuck = True
    stopped = supervisor.workers[2]
    stopped.ready, stopped.ended, stopped.channel = False, None, None
    stopped.restarts, stopped.pause = 3, RESTART_SECS[0] * 4
    answer = fired(pages.health(), clock)
    clock.advance(WORKER_ANSWER_SECS)
    document = answer[0]
    assert document["status"] == "failing"
    assert [w["state"] for w in document["workers"]] == ["running", "not answering", "exited"]
    assert document["workers"][2]["crash_looping"] is True
    assert [p.split(":")[0] for p in document["problems"]] == ["worker 1", "worker 2", "worker 2"]
    assert "did not answer within 0.5 s" in document["problems"][0]
    assert "crash-looping (3 restarts" in document["problems"][2]

    # a worker's own problem is the supervisor's, named with the worker
    supervisor.workers[1].channel.stuck = False
    answers["health"] = router_health(fake_router(sinks={"lake": SimpleNamespace(cursor=100, failing=True)}))
    document = fired(pages.health(), clock)[0]
    assert "worker 0: sink lake: failing (retried; 50 bytes wait in the spool)" in document["problems"]


def test_the_supervisor_endpoint_answers_503_with_a_stuck_worker() -> None:
    supervisor, clock, _ = make_supervisor()
    supervisor.workers[0].channel.stuck = True
    protocol = site(SupervisorPages(supervisor)).buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(request("GET", "/health"))
    assert transport.value() == b""
    clock.advance(WORKER_ANSWER_SECS)
    assert transport.value().startswith(b"HTTP/1.1 503 ")
    assert b"worker 0: did not answer" in transport.value()

"""Reloads one at a time (issue 27, items 6 and 10): ``ReloadQueue``, the single process's
``RouterService.reload`` on it, and the HTTP status of each outcome.

A fake router whose ``reconfigure`` returns a Deferred the test fires stands in for a
reload that takes a while; config files are real files in ``tmp_path``."""

from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet import defer, task
from twisted.internet.testing import StringTransport

from logrouter.config.load import load_string
from logrouter.http_endpoint import site
from logrouter.reload import ReloadPlan
from logrouter.reload_queue import APPLIED, FAILED, PARTLY, REFUSED, ReloadQueue, ReloadResult
from logrouter.service import RouterService


def test_requests_while_one_runs_wait_and_share_one_more_run() -> None:
    runs: list[defer.Deferred] = []

    def run() -> defer.Deferred:
        runs.append(defer.Deferred())
        return runs[-1]

    queue = ReloadQueue(run)
    first = queue.request()
    assert len(runs) == 1 and queue.running
    waiting = [queue.request() for _ in range(3)]
    assert len(runs) == 1  # nothing runs beside the first
    runs[0].callback(ReloadResult(APPLIED, "one"))
    assert first.result == ReloadResult(APPLIED, "one")
    assert len(runs) == 2 and not any(d.called for d in waiting)  # the three share the second run
    runs[1].callback(ReloadResult(REFUSED, "two"))
    assert [d.result for d in waiting] == [ReloadResult(REFUSED, "two")] * 3
    assert not queue.running
    queue.request()
    assert len(runs) == 3


def test_a_run_that_raises_is_a_failed_reload_and_the_queue_goes_on() -> None:
    calls = []

    def run() -> defer.Deferred:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return defer.succeed(ReloadResult(APPLIED, "fine"))

    queue = ReloadQueue(run)
    assert queue.request().result == ReloadResult(FAILED, "reload failed: boom")
    assert queue.request().result.ok


@pytest.mark.parametrize("outcome, status", [(APPLIED, 200), (REFUSED, 409), (PARTLY, 500), (FAILED, 500)])
def test_only_an_applied_reload_answers_200(outcome: str, status: int) -> None:
    token = "a-reload-token-0123456789"

    class Pages:
        def reload(self) -> defer.Deferred:
            return defer.succeed(ReloadResult(outcome, "what happened"))

        def router_options(self) -> dict:
            return {"reload_token": token, "reload_token_file": ""}

    protocol = site(Pages()).buildProtocol(None)  # type: ignore[arg-type]
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(
        f"POST /reload HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Length: 0\r\n\r\n".encode()
    )
    head, _, body = transport.value().partition(b"\r\n\r\n")
    assert int(head.split()[1]) == status
    assert body == b"what happened\n"


def test_a_result_crosses_the_channel() -> None:
    for outcome in (APPLIED, PARTLY, REFUSED, FAILED):
        result = ReloadResult(outcome, "text")
        assert ReloadResult.from_message(result.message()) == result
    assert ReloadResult.from_message({"ok": True, "text": "?"}).outcome == FAILED  # not an answer we know


# -- one process ----------------------------------------------------------------------------

CONFIG = """
[spool]
path = "{spool}"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"
{more}
[sinks.out]
type = "blackhole"
inputs = ["forward"]
"""


def write(path: Path, more: str = "") -> None:
    path.write_text(CONFIG.format(spool=path.parent / "spool", more=more))


def source(name: str) -> str:
    return f'[sources.{name}]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n'


class SlowRouter:
    """``reconfigure`` records the config and returns a Deferred the test fires."""

    def __init__(self, config) -> None:
        self.config = config
        self.calls: list[tuple[object, defer.Deferred]] = []

    def reconfigure(self, new) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.calls.append((new, d))
        return d

    def finish(self, index: int, failed: tuple[str, ...] = ()) -> None:
        new, d = self.calls[index]
        self.config = new
        plan = ReloadPlan(effective=new, start_sources=list(new.sources), failed=list(failed))
        d.callback(plan)


def service(tmp_path: Path) -> tuple[RouterService, SlowRouter, Path]:
    path = tmp_path / "logrouter.toml"
    write(path)
    config = load_string(path.read_text())
    svc = RouterService(config, reactor=task.Clock(), config_path=str(path))
    svc.router = SlowRouter(config)  # type: ignore[assignment]
    svc.running = True  # as after startService
    return svc, svc.router, path  # type: ignore[return-value]


def test_a_reload_asked_while_one_runs_waits_and_reads_the_file_again(tmp_path: Path) -> None:
    """Two quick SIGHUPs: the second is not refused, and the file as it is after the
    first one finished is what ends up applied."""
    svc, router, path = service(tmp_path)
    write(path, source("first"))
    first = svc.reload()
    write(path, source("second"))
    second, third = svc.reload(), svc.reload()
    assert len(router.calls) == 1 and "first" in router.calls[0][0].sources
    write(path, source("third"))
    router.finish(0)
    assert first.result.outcome == APPLIED
    assert len(router.calls) == 2  # one run for both waiting
    assert "third" in router.calls[1][0].sources and "second" not in router.calls[1][0].sources
    router.finish(1)
    assert second.result == third.result and second.result.outcome == APPLIED
    assert "third" in svc.config.sources


def test_a_reload_that_left_a_component_out_is_not_applied(tmp_path: Path) -> None:
    svc, router, path = service(tmp_path)
    write(path, source("busy"))
    result = svc.reload()
    router.finish(0, failed=("sources.busy",))
    assert result.result.outcome == PARTLY and result.result.status == 500
    assert "could not start (left out, retried by the next reload): sources.busy" in result.result.text


def test_a_refused_file_changes_nothing(tmp_path: Path) -> None:
    svc, router, path = service(tmp_path)
    path.write_text(path.read_text() + "\n[sinks.bad]\ntype = \"nope\"\n")
    result = svc.reload().result
    assert result.outcome == REFUSED and result.status == 409 and "sinks.bad" in result.text
    assert router.calls == []


def test_a_reload_waiting_when_the_service_stops_does_not_run(tmp_path: Path) -> None:
    svc, router, path = service(tmp_path)
    first, waiting = svc.reload(), svc.reload()
    svc.running = False  # stopService: the router's stop waits for the reload under way
    router.finish(0)
    assert first.result.outcome == APPLIED
    assert waiting.result.outcome == FAILED and len(router.calls) == 1

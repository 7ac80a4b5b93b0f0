"""The twistd service: a graceful stop is bounded by ``shutdown_timeout_secs``."""

from __future__ import annotations

from twisted.internet import defer, task

from logrouter.config.load import load_string
from logrouter.service import RouterService


class StuckRouter:
    def stop(self) -> defer.Deferred:
        return defer.Deferred()  # a sink that never finishes committing


def make_service(timeout: float) -> tuple[RouterService, task.Clock]:
    config = load_string(f"[router]\nshutdown_timeout_secs = {timeout}\n")
    clock = task.Clock()
    service = RouterService(config, reactor=clock)
    service.router = StuckRouter()  # type: ignore[assignment]
    service.running = True
    return service, clock


def test_stop_gives_up_after_shutdown_timeout_secs():
    service, clock = make_service(5)
    stopped = service.stopService()
    clock.advance(4.9)
    assert not stopped.called
    clock.advance(0.1)
    assert stopped.called and stopped.result is None


def test_zero_means_no_limit():
    service, clock = make_service(0)
    stopped = service.stopService()
    clock.advance(10_000)
    assert not stopped.called

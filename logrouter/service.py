"""The Twisted service that runs a router: start on startService, graceful stop on stopService."""

from __future__ import annotations

import os
import sys
from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger

from logrouter.config.load import Config
from logrouter.router import Router


class RouterService(service.Service):
    log = Logger(namespace="logrouter")
    name = "logrouter"

    def __init__(self, config: Config, reactor: Any = None) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor
        self.config = config
        self.router: Router | None = None
        self._started: defer.Deferred | None = None

    def startService(self) -> None:
        super().startService()
        self.router = Router(self.config, self.reactor)
        self._started = self.router.start()
        self._started.addCallbacks(self._running, self._failed)

    def _running(self, _: Any) -> None:
        self.log.info("logrouter running")

    def _failed(self, failure: Any) -> None:
        self.log.critical("logrouter could not start: {error}", error=failure.getErrorMessage())
        # twistd has no exit status of its own for a failed start; a supervisor needs one.
        self.reactor.addSystemEventTrigger("after", "shutdown", _exit_failed)
        self.reactor.stop()

    def stopService(self) -> defer.Deferred:
        super().stopService()
        if self.router is None:
            return defer.succeed(None)
        self.log.info("logrouter stopping: draining sources, committing sinks")
        return self.router.stop()


def _exit_failed() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)

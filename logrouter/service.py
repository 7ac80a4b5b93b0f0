"""The Twisted service that runs a router: start on startService, graceful stop on stopService."""

from __future__ import annotations

import os
import sys
from typing import Any

from twisted.application import service
from twisted.internet import defer, error
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
        self.compaction: Any = None  # a CompactionService when [compaction] enabled = true
        self._started: defer.Deferred | None = None

    def startService(self) -> None:
        super().startService()
        self._quiet_repeated_stops()
        self.router = Router(self.config, self.reactor)
        self._started = self.router.start()
        self._started.addCallbacks(self._running, self._failed)

    def _quiet_repeated_stops(self) -> None:
        """A second SIGTERM or SIGINT while the first stop drains (``make`` forwards one on
        Ctrl-C, 10-50 ms after the terminal's) makes the reactor's signal handler call
        ``stop`` again, which raises ``ReactorNotRunning`` and logs a critical traceback.
        The stop under way goes on; say so in one line instead."""
        reactor = self.reactor
        stop = reactor.stop

        def stop_once() -> None:
            try:
                stop()
            except error.ReactorNotRunning:
                self.log.info("already stopping: the stop under way goes on")

        reactor.stop = stop_once

    def _running(self, _: Any) -> None:
        self.log.info("logrouter running")
        if self.config.compaction.get("enabled"):
            from logrouter.compaction.options import lake_urls
            from logrouter.compaction.scheduler import CompactionService

            self.compaction = CompactionService(
                self.config.compaction, lake_urls(self.config.compaction, self.config.sinks), self.reactor
            )
            self.router.compaction = self.compaction  # type: ignore[union-attr]  # read by metrics
            self.compaction.startService()

    def _failed(self, failure: Any) -> None:
        self.log.critical("logrouter could not start: {error}", error=failure.getErrorMessage())
        # twistd has no exit status of its own for a failed start; a supervisor needs one.
        self.reactor.addSystemEventTrigger("after", "shutdown", _exit_failed)
        self.reactor.stop()

    def stopService(self) -> defer.Deferred:
        super().stopService()
        if self.router is None:
            return defer.succeed(None)
        # a running compaction job is killed (its swap is crash-safe) while the router drains
        compaction = self.compaction.stopService() if self.compaction is not None else None
        self.log.info("logrouter stopping: draining sources, committing sinks")
        limit = self.config.router["shutdown_timeout_secs"]
        stopping = self.router.stop()
        if limit:
            stopping.addTimeout(limit, self.reactor)
            stopping.addErrback(self._stop_timed_out, limit)
        if compaction is not None:
            stopping.addBoth(lambda result: compaction.addBoth(lambda _: result))
        return stopping


    def _stop_timed_out(self, failure: Any, limit: float) -> None:
        failure.trap(defer.CancelledError, defer.TimeoutError)
        # Everything acknowledged is in the spool; what no sink committed is replayed next start.
        self.log.warn(
            "graceful stop did not finish within shutdown_timeout_secs ({limit}s); stopping anyway: "
            "uncommitted work is replayed from the spool at the next start",
            limit=limit,
        )


def _exit_failed() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)

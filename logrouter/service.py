"""The Twisted service that runs a router: start on startService, graceful stop on stopService."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.application import service
from twisted.internet import defer, error
from twisted.logger import Logger

from logrouter.config.load import Config
from logrouter.failures import exit_failed
from logrouter.reload_queue import ReloadQueue

if TYPE_CHECKING:
    from logrouter.router import Router


class RouterService(service.Service):
    log = Logger(namespace="logrouter")
    name = "logrouter"
    RUNNING = "logrouter running"  # what scripts and tests wait for

    def __init__(self, config: Config, reactor: Any = None, config_path: str | None = None) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor
        self.config = config
        self.config_path = config_path  # re-read on SIGHUP and POST /reload; None = no reload
        self.reloads = ReloadQueue(self._reload_once)
        self._spool_lock: int | None = None  # fd holding <spool>/lock while the process runs
        self.router: Router | None = None
        self.compaction: Any = None  # a CompactionService when [compaction] enabled = true
        self.collector: Any = None  # gc_tuning.PeriodicCollector, in a daemon
        self._started: defer.Deferred | None = None

    def startService(self) -> None:
        super().startService()
        from logrouter.config.load import warnings

        for warning in warnings(self.config):
            self.log.warn("config: {warning}", warning=warning)
        quiet_repeated_stops(self.reactor, self.log)
        from logrouter.native import describe

        self.log.info("forward entries into lake columns: {path}", path=describe())
        if self.config_path is not None and self._spool_lock is None:  # a real process, not a test's
            from logrouter.spool.lock import SpoolInUse, lock_spool

            try:
                self._spool_lock = lock_spool(self.config.spool["path"])
            except (SpoolInUse, OSError) as e:
                fail_start(self.reactor, self.log, str(e))
                return
        self.router = self.build_router()
        self.router.reload_hook = self.reload  # POST /reload on the metrics endpoint
        self._install_sighup()
        self._started = self.router.start()
        self._started.addCallbacks(self._running, self._failed)

    def build_router(self) -> Router:
        # imported here: the supervisor of [router] workers imports this module for its
        # helpers below and runs no router (msgspec, msgpack and the rest stay out of it)
        from logrouter.router import Router

        return Router(self.config, self.reactor)

    def _install_sighup(self) -> None:
        install_sighup(self.reactor, self.reload if self.config_path is not None else None)

    def reload(self) -> defer.Deferred:
        """Re-read the config file and apply the difference to the running graph; fires
        with a ``ReloadResult`` (``logrouter.reload_queue``): what changed, or why not.

        A config with errors is refused: the errors are logged and the running graph is
        untouched. Reloads run one at a time: one asked while another runs waits for it,
        then reads the file again (several waiting share that one run).
        """
        from logrouter.reload_queue import REFUSED, ReloadResult

        if self.config_path is None or self.router is None:
            return defer.succeed(ReloadResult(REFUSED, "reload is not available (no config file)"))
        if self.reloads.running:
            self.log.info("reload asked while another runs: it waits for the reload under way, then reads the config again")
        return self.reloads.request()

    def read_config(self) -> Config:
        """The config a reload applies: the file, read again (``ConfigError`` if it has errors)."""
        from logrouter.config.load import load_string, read_text

        text = read_text(self.config_path)  # type: ignore[arg-type]
        self.log.info("reloading the config from {path}", path=self.config_path)  # (what a later edit changes is not)
        return load_string(text, self.config_path)  # type: ignore[arg-type]

    def _reload_once(self) -> defer.Deferred:
        from logrouter.config.load import ConfigError
        from logrouter.reload_queue import APPLIED, FAILED, PARTLY, REFUSED, ReloadResult

        if self.router is None or not self.running:
            return defer.succeed(ReloadResult(FAILED, "the router is not running (stopping)"))
        try:
            new = self.read_config()
        except ConfigError as e:
            for problem in e.errors:
                self.log.error("reload refused: {error}", error=problem)
            return defer.succeed(ReloadResult(REFUSED, "refused, the running config is unchanged:\n" + "\n".join(e.errors)))
        d = self.router.reconfigure(new)

        def applied(plan: Any) -> ReloadResult:
            self.config = self.router.config  # type: ignore[union-attr]
            summary = plan.summary()
            if plan.failed:
                self.log.error("config reloaded in part: {summary}", summary=summary)
                return ReloadResult(PARTLY, summary)
            self.log.info("config reloaded: {summary}", summary=summary)
            return ReloadResult(APPLIED, summary)

        def failed(failure: Any) -> ReloadResult:
            self.log.error("reload failed: {error}", error=failure.getErrorMessage())
            return ReloadResult(FAILED, f"reload failed: {failure.getErrorMessage()}")

        return d.addCallbacks(applied, failed)

    def _running(self, _: Any) -> None:
        if not self.running:
            return  # a stop came while the router started: start nothing it would not stop
        if self.config_path is not None:  # a daemon's process, not a test's
            from logrouter import gc_tuning

            self.collector = gc_tuning.tune(self.reactor)
        self.log.info(self.RUNNING)
        self.compaction = start_compaction(self.config, self.reactor)
        if self.compaction is not None:
            self.router.compaction = self.compaction  # type: ignore[union-attr]  # read by metrics

    def _failed(self, failure: Any) -> None:
        fail_start(self.reactor, self.log, failure.getErrorMessage())

    def stopService(self) -> defer.Deferred:
        super().stopService()
        if self.router is None:
            self._stop_collector()
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
        # The drain may take a while (shutdown_timeout_secs): collect until it is done.
        stopping.addBoth(self._stop_collector)
        return stopping

    def _stop_collector(self, result: Any = None) -> Any:
        if self.collector is not None:
            self.collector.stop()
            self.collector = None
        return result


    def _stop_timed_out(self, failure: Any, limit: float) -> None:
        failure.trap(defer.CancelledError, defer.TimeoutError)
        # Everything acknowledged is in the spool; what no sink committed is replayed next start.
        self.log.warn(
            "graceful stop did not finish within shutdown_timeout_secs ({limit}s); stopping anyway: "
            "uncommitted work is replayed from the spool at the next start",
            limit=limit,
        )


def start_compaction(config: Config, reactor: Any) -> Any:
    """The running CompactionService when ``[compaction] enabled``, else None."""
    if not config.compaction.get("enabled"):
        return None
    from logrouter.compaction.iceberg import iceberg_tables
    from logrouter.compaction.options import lake_urls
    from logrouter.compaction.scheduler import CompactionService

    compaction = CompactionService(
        config.compaction, lake_urls(config.compaction, config.sinks), reactor,
        iceberg_tables=iceberg_tables(config.compaction, config.sinks),
    )
    compaction.startService()
    return compaction


def quiet_repeated_stops(reactor: Any, log: Logger) -> None:
    """A second SIGTERM or SIGINT while the first stop drains (``make`` forwards one on
    Ctrl-C, 10-50 ms after the terminal's) makes the reactor's signal handler call
    ``stop`` again, which raises ``ReactorNotRunning`` and logs a critical traceback.
    The stop under way goes on; say so in one line instead."""
    stop = reactor.stop

    def stop_once() -> None:
        try:
            stop()
        except error.ReactorNotRunning:
            log.info("already stopping: the stop under way goes on")

    reactor.stop = stop_once


def install_sighup(reactor: Any, reload: Any) -> None:
    """SIGHUP calls ``reload`` on the reactor (the reactor handles SIGTERM/SIGINT only)."""
    import signal
    import threading

    if reload is None or threading.current_thread() is not threading.main_thread():
        return
    if not hasattr(reactor, "callFromThread"):
        return
    signal.signal(signal.SIGHUP, lambda number, frame: reactor.callFromThread(reload))


def fail_start(reactor: Any, log: Logger, why: str) -> None:
    """Say why the process cannot start, stop it, and have it exit with status 1 (twistd
    has no exit status of its own for a failed start; systemd and scripts need one).

    twistd calls ``startService`` before ``reactor.run()``, so a failure found on the
    way (a port taken, a spool locked or unwritable) comes before the reactor runs:
    ``reactor.stop()`` then raises ``ReactorNotRunning`` and the process would go on
    running, serving nothing. The stop is therefore made once the reactor runs (at once
    if it already does)."""
    log.critical("logrouter could not start: {error}", error=why)
    reactor.addSystemEventTrigger("after", "shutdown", exit_failed)
    reactor.callWhenRunning(lambda: reactor.stop())

"""The supervisor of ``[router] workers = N``: listeners, worker processes, one metrics page.

It binds the socket of every shared source (``plan.shared_sources``), starts the workers
and, once every worker's router runs, listens (``listener.py``: no client's connect
completes before a worker can read it) and passes each accepted connection to worker
``plan.worker_for(peer IP, N)`` over that worker's channel. TLS is done in the worker.

A start that fails (an address that cannot be bound or listened on, a worker that exits
before it runs or does not run within ``START_TIMEOUT_SECS``) stops the workers started
and exits with status 1, saying why (``service.fail_start``).

A worker that exits is started again (its spool is recovered like after any crash) after
a pause that doubles up to 30 s; meanwhile the connections that would go to it are held
unread, up to ``passing.HELD_PER_WORKER`` (more are closed, their clients retry), and
passed to it once it runs again, so it is the worker whose dedupe window knows their
resends. A worker that does not read its channel has at most a window of connections in
flight to it, the rest held or closed likewise, so it never holds up the others
(``passing.py``).

A graceful stop reads what connections already delivered: the listeners pass on what
their backlog holds (a close would reset it, data and all), then close; each worker is
asked to stop over its channel, behind the connections passed to it (a SIGTERM could
overtake them), so it adopts and drains them. Only connections held for a worker that
is down when the stop comes are closed unread.

It also runs what must run once: compaction, and the HTTP endpoint (its pages, built
from the workers' answers, are in ``http.py``), whose ``POST /reload`` (like SIGHUP)
reloads the config: checked here, applied by every worker (``reloads.py``). Workers start
from the config text the supervisor runs, sent over their channel, never from the file.
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
import sys
from typing import Any

from twisted.application import service
from twisted.internet import defer, protocol
from twisted.logger import Logger, LogLevel

from logrouter import http_endpoint, tls
from logrouter.config.endpoints import listen_address
from logrouter.config.load import Config, read_text, warnings
from logrouter.open_files import soft_limit
from logrouter.service import fail_start, install_sighup, quiet_repeated_stops, start_compaction
from logrouter.sources.stream_limits import normal_ip
from logrouter.workers import plan
from logrouter.workers.channel import Channel, channel_pair
from logrouter.workers.http import SupervisorPages
from logrouter.workers.listener import Listener
from logrouter.workers.passing import WINDOW, WorkerConnections, window_for
from logrouter.workers.reloads import SupervisorReloads

RESTART_SECS = (1.0, 30.0)
STEADY_SECS = 60.0  # a worker up this long has its restart pause start again from the first
START_TIMEOUT_SECS = 300.0
KILL_MARGIN_SECS = 15.0  # past shutdown_timeout_secs, a worker still running is killed


@functools.lru_cache(maxsize=256)
def _logger(namespace: str) -> Logger:
    return Logger(namespace=namespace)


_LEVELS = {level.name: level for level in (LogLevel.debug, LogLevel.info, LogLevel.warn, LogLevel.error, LogLevel.critical)}




class WorkerProcess(protocol.ProcessProtocol):
    """One worker: its process, its channel, its requests in flight, its restarts."""

    def __init__(self, supervisor: "SupervisorService", index: int, cpu: int | None = None, window: int = WINDOW) -> None:
        self.supervisor = supervisor
        self.index = index
        self.log = Logger(namespace=f"logrouter.worker-{index}")
        self.cpu = cpu  # the one CPU it runs on (pin_workers), None: not bound
        self.config_text = ""  # the config it was last sent (at its start or by a reload)
        self.channel: Channel | None = None
        self.ready = False
        self.started: defer.Deferred = defer.Deferred()  # fires once (first start only)
        self.ended: defer.Deferred | None = None
        self.requests: dict[int, defer.Deferred] = {}
        self.connections = WorkerConnections(self, window)  # passed, held, closed
        self.restarts = 0
        self.pause = 0.0
        self.up_since = 0.0
        self._partial = {1: b"", 2: b""}

    def spawn(self) -> None:
        supervisor = self.supervisor
        ours, theirs = channel_pair()
        args = [
            # -c, not -m: the classes keep their module's name in the log namespaces
            sys.executable, "-c", "from logrouter.workers.worker import main; main()",
            "--config", supervisor.config_path, "--index", str(self.index), "--count", str(supervisor.accepting),
            "--channel-fd", "3", "--parent", str(os.getpid()),
        ]
        if self.cpu is not None:
            args += ["--cpu", str(self.cpu)]
        self.ready = False
        self.ended = defer.Deferred()
        self._partial = {1: b"", 2: b""}
        self.connections.started()
        try:
            supervisor.reactor.spawnProcess(self, sys.executable, args, env=dict(os.environ),
                                            childFDs={0: 0, 1: "r", 2: "r", 3: theirs.fileno()})
        finally:
            theirs.close()
        self.channel = Channel(supervisor.reactor, ours, self._message, self._channel_closed)
        self.config_text = supervisor.config_text
        if not self.channel.send(supervisor.reloads.start_message()):
            self.log.error("worker {index}: its config could not be sent (it exits for want of one)", index=self.index)

    def _channel_closed(self) -> None:
        self.ready = False  # it died (its exit not seen yet) or is going: nothing more for it

    def _message(self, message: dict, fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        if message.get("op") == "taken":
            self.connections.took(message.get("count"))
            return
        if message.get("op") == "ready":
            self.ready = True
            self.up_since = self.supervisor.reactor.seconds()
            if not self.started.called:
                self.started.callback(self.index)
            elif self.restarts:
                self.log.info("worker {index} is running again", index=self.index)
            self.supervisor.worker_ready(self)
            self.supervisor.reloads.worker_ready(self)
            return
        if message.get("op") == "stopping":
            # It stops on its own (a signal sent to it, not to us): what comes for it from
            # now on is held for its next start; the answer tells it that nothing more
            # follows the connections already passed.
            self.ready = False
            if self.channel is not None:
                self.channel.send({"op": "stopping"})
            return
        waiting = self.requests.pop(message.get("id"), None)  # type: ignore[arg-type]
        if waiting is not None:
            waiting.callback(message)

    def request(self, message: dict, timeout: float | None = None) -> defer.Deferred:
        """Send a request; fires with the reply, or None if there is none within ``timeout``
        seconds (default: the supervisor's ``reply_limit()``)."""
        if not self.ready or self.channel is None:
            return defer.succeed(None)
        ident = next(self.supervisor.ids)
        d: defer.Deferred = defer.Deferred()
        if not self.channel.send({**message, "id": ident}):
            return defer.succeed(None)
        self.requests[ident] = d
        d.addTimeout(self.supervisor.reply_limit() if timeout is None else timeout, self.supervisor.reactor)
        d.addErrback(lambda failure: failure.trap(defer.TimeoutError, defer.CancelledError) and None)
        d.addBoth(lambda result: (self.requests.pop(ident, None), result)[1])
        return d

    def stop(self) -> None:
        """Ask it to stop gracefully, over the channel: after the connections passed to it,
        which it then adopts before it stops. By SIGTERM if the channel cannot take it."""
        if self.channel is None or not self.channel.send({"op": "stop"}):
            self.terminate("TERM")
    def crash_looping(self, now: float) -> bool:
        """It exited again soon after a start (its restart pause grew past the first) and
        has not run for ``STEADY_SECS`` since."""
        return self.pause > RESTART_SECS[0] and (not self.ready or now - self.up_since < STEADY_SECS)

    def terminate(self, signal_name: str = "TERM") -> None:
        if self.transport is not None and self.transport.pid is not None:
            try:
                self.transport.signalProcess(signal_name)
            except (OSError, Exception):  # ProcessExitedAlready
                pass

    # -- ProcessProtocol --------------------------------------------------------------

    def childDataReceived(self, fd: int, data: bytes) -> None:
        lines = (self._partial.get(fd, b"") + data).split(b"\n")
        self._partial[fd] = lines.pop()
        for line in lines:
            self._relay(line.decode("utf-8", "replace"))

    def _relay(self, line: str) -> None:
        # A worker writes "[namespace#level] text": logged here under that namespace and
        # level, the text marked with the worker (not a second namespace in front of the
        # first). Anything else (a traceback's later lines) under the worker's own.
        head, separator, text = line.partition("] ")
        if separator and head.startswith("["):
            namespace, _, level_name = head[1:].rpartition("#")
            level = _LEVELS.get(level_name)
            if namespace and level is not None:
                _logger(namespace).emit(level, "worker {worker}: {text}", worker=self.index, text=text)
                return
        self.log.emit(LogLevel.info, "{line}", line=line)

    def processEnded(self, reason: Any) -> None:
        for fd, rest in self._partial.items():
            if rest:
                self._relay(rest.decode("utf-8", "replace"))
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        self.ready = False
        for waiting in list(self.requests.values()):
            waiting.callback(None)
        self.requests.clear()
        code = getattr(reason.value, "exitCode", None)
        signal_number = getattr(reason.value, "signal", None)
        how = f"exit status {code}" if code is not None else f"signal {signal_number}"
        ended, self.ended = self.ended, None
        self.supervisor.worker_ended(self, how)  # first: the last one to end may end the process
        if ended is not None:
            ended.callback(None)


class SupervisorService(service.Service):
    log = Logger(namespace="logrouter")
    name = "logrouter"

    def __init__(self, config: Config, reactor: Any = None, config_path: str = "", config_text: str | None = None) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor
        self.config = config
        self.config_path = config_path
        # the text of ``config``: what every worker starts from (tap.py hands over the text it read)
        if config_text is None:
            config_text = read_text(config_path) if config_path else ""
        self.config_text = config_text
        self.reloads = SupervisorReloads(self, lambda name, source_type, listen: Listener(self, name, source_type, listen))
        self.accepting, self.why = plan.workers(config)  # the workers connections go to
        self.window = window_for(soft_limit(), self.accepting)  # connections in flight per worker
        self.count = plan.processes(config)  # with those that only drain a spool left behind
        self.cpus = plan.allowed_cpus()  # the supervisor's own, before any worker is bound
        self.listeners: dict[str, Listener] = {}
        self.addresses: dict[str, tuple[str, int]] = {}
        self.workers: list[WorkerProcess] = []
        self.compaction: Any = None
        self.metrics_port: Any = None
        self.stopping = False
        self.ids = itertools.count(1)

    # -- start ------------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        for warning in warnings(self.config):
            self.log.warn("config: {warning}", warning=warning)
        quiet_repeated_stops(self.reactor, self.log)
        d = defer.maybeDeferred(self._start)
        d.addErrback(self._failed)

    @defer.inlineCallbacks
    def _start(self) -> Any:
        # Bound first, listening only once the workers run (listener.py): a taken address
        # fails the start before any worker is spawned.
        for name in plan.shared_sources(self.config):
            component = self.config.sources[name]
            listener = Listener(self, name, component.cls.TYPE, component.options["listen"])
            self.addresses[name] = _naming(listener, listener.bind)
            self.listeners[name] = listener
        if self.why:
            self.log.info("workers = auto: {count} workers ({why})", count=self.accepting, why=self.why)
        if self.count > self.accepting:
            self.log.warn(
                "{extra} worker spool(s) left by a router run with more workers: started to drain them "
                "(they take no connections)", extra=self.count - self.accepting,
            )
        self.workers = [WorkerProcess(self, index, plan.worker_cpu(self.config, index, self.cpus), self.window)
                        for index in range(self.count)]
        if any(w.cpu is not None for w in self.workers):
            self.log.info("pin_workers: {pairs}", pairs=", ".join(f"worker {w.index} on CPU {w.cpu}" for w in self.workers))
        for worker in self.workers:
            worker.spawn()
        starting = defer.gatherResults([w.started for w in self.workers], consumeErrors=True)
        starting.addTimeout(START_TIMEOUT_SECS, self.reactor)
        starting.addErrback(self._late)
        yield starting
        if self.stopping:
            return
        for listener in self.listeners.values():
            _naming(listener, listener.start)
            self.announce(listener)
        listen = self.config.router["metrics_listen"]
        if listen:
            site = http_endpoint.site(SupervisorPages(self))
            self.metrics_port = yield tls.listening_endpoint(self.reactor, listen).listen(site)
            address = self.metrics_port.getHost()
            self.log.info("metrics listening on {host} port {port}", host=address.host, port=address.port)
        install_sighup(self.reactor, self.reload)
        self.compaction = start_compaction(self.config, self.reactor)
        self.log.info("logrouter running ({count} workers)", count=self.count)

    def _late(self, failure: Any) -> None:
        failure.trap(defer.TimeoutError)
        late = ", ".join(str(w.index) for w in self.workers if not w.ready)
        raise RuntimeError(f"worker(s) {late} not running after {START_TIMEOUT_SECS:g}s")

    def _failed(self, failure: Any) -> None:
        if self.stopping:
            return  # a stop during the start: nothing failed
        if failure.check(defer.FirstError):
            failure = failure.value.subFailure
        fail_start(self.reactor, self.log, failure.getErrorMessage())

    # -- connections ------------------------------------------------------------------

    def accepted(self, listener: Listener, host: str, connection: socket.socket) -> None:
        """A connection ``listener`` accepted (ours now): passed to its worker; held unread
        while that worker is not running (restarting, or dead and not reaped yet) or has
        its window full, to be passed once it runs or takes; closed if its channel is
        full, the holding is full or a stop has begun (``passing.py``)."""
        worker = self.workers[plan.worker_for(normal_ip(host), self.accepting)]
        worker.connections.offer(listener, connection, self.stopping)

    def worker_ready(self, worker: WorkerProcess) -> None:
        worker.connections.flush()

    # -- workers ending ---------------------------------------------------------------

    def worker_ended(self, worker: WorkerProcess, how: str) -> None:
        if self.stopping:
            self.log.info("worker {index} stopped ({how})", index=worker.index, how=how)
            return
        if not worker.started.called:
            worker.started.errback(RuntimeError(f"worker {worker.index} exited before it ran ({how})"))
            return
        now = self.reactor.seconds()
        if now - worker.up_since > STEADY_SECS:
            worker.pause = 0.0
        first, longest = RESTART_SECS
        worker.pause = min(longest, worker.pause * 2 or first)
        worker.restarts += 1
        self.log.error(
            "worker {index} exited ({how}); starting it again in {pause:.0f}s (its spool is recovered; "
            "its clients' new connections wait for it meanwhile)",
            index=worker.index, how=how, pause=worker.pause,
        )
        self.reactor.callLater(worker.pause, self._restart, worker)

    def _restart(self, worker: WorkerProcess) -> None:
        if not self.stopping and worker.ended is None:
            worker.spawn()

    # -- stop -------------------------------------------------------------------------

    def stopService(self) -> defer.Deferred:
        super().stopService()
        self.stopping = True
        self.log.info("logrouter stopping: no new connections; stopping {count} workers", count=len(self.workers))
        for listener in self.listeners.values():
            listener.take_backlog()  # passed on, not reset by the close
            listener.close()
        for worker in self.workers:
            closed = worker.connections.close_held()
            if closed:
                self.log.warn("closed {count} connection(s) held unread for worker {index}, which could not take them",
                              count=closed, index=worker.index)
        compaction = self.compaction.stopService() if self.compaction is not None else defer.succeed(None)
        ends = []
        for worker in self.workers:
            if worker.ended is not None:
                ends.append(worker.ended)
                worker.stop()
        waiting = defer.DeferredList(ends, consumeErrors=True)
        limit = self.config.router["shutdown_timeout_secs"]
        if limit:
            killer = self.reactor.callLater(limit + KILL_MARGIN_SECS, self._kill_all)
            waiting.addBoth(lambda result: (killer.cancel() if killer.active() else None, result)[1])
        metrics_port, self.metrics_port = self.metrics_port, None
        if metrics_port is not None:
            waiting.addBoth(lambda result: defer.maybeDeferred(metrics_port.stopListening).addBoth(lambda _: result))
        return waiting.addBoth(lambda result: compaction.addBoth(lambda _: None))

    def _kill_all(self) -> None:
        for worker in self.workers:
            if worker.ended is not None:
                self.log.warn("worker {index} did not stop in time: killed", index=worker.index)
                worker.terminate("KILL")

    # -- reload -----------------------------------------------------------------------

    def reload(self) -> defer.Deferred:
        """Reload the config (SIGHUP, ``POST /reload``): see ``reloads.py``; fires with the
        ``ReloadResult``."""
        return self.reloads.request()

    def announce(self, listener: "Listener") -> None:
        host, port = listener.address
        self.log.info(
            "{type} source {name} listening on {host} port {port} (connections go to {workers} workers)",
            type=listener.type, name=listener.name, host=host, port=port, workers=self.accepting,
        )

    def reply_limit(self) -> float:
        return max(60.0, float(self.config.router["shutdown_timeout_secs"] or 0))


def _naming(listener: Listener, step: Any) -> Any:
    """``step()`` (bind or listen); an ``OSError`` becomes the start's failure, naming
    the source and its address."""
    try:
        return step()
    except OSError as e:
        raise RuntimeError(f"sources.{listener.name}.listen: cannot listen on {listener.listen!r}: "
                           f"{e.strerror or e}") from None

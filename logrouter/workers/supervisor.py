"""The supervisor of ``[router] workers = N``: listeners, worker processes, one metrics page.

It binds the listening socket of every shared source (``plan.shared_sources``), starts
the workers and, once every worker's router runs, accepts connections and passes each
one to worker ``plan.worker_for(peer IP, N)`` over that worker's channel. TLS is done in
the worker. A worker that exits is started again (its spool is recovered like after any
crash) after a pause that doubles up to 30 s; meanwhile the connections that would go
to it are closed, so their clients retry and meet it, and its dedupe window, once it is
back. A graceful stop stops accepting, sends SIGTERM to every worker and waits for them.

It also runs what must run once: compaction, and the HTTP endpoint (its pages, built
from the workers' answers, are in ``http.py``), whose ``POST /reload`` (like SIGHUP) has
every worker re-read the config file.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import itertools
import json
import os
import socket
import sys
from typing import Any

from twisted.application import service
from twisted.internet import defer, endpoints, protocol
from twisted.internet.interfaces import IReadDescriptor
from twisted.logger import Logger, LogLevel
from zope.interface import implementer

from logrouter.config.endpoints import listen_address
from logrouter.config.load import Config, ConfigError, load_file, warnings
from logrouter import http_endpoint
from logrouter.service import _exit_failed, install_sighup, quiet_repeated_stops, start_compaction
from logrouter.sources.stream import normal_ip
from logrouter.workers import plan
from logrouter.workers.channel import Channel, channel_pair
from logrouter.workers.http import SupervisorPages

ACCEPTS_PER_TURN = 64
RESTART_SECS = (1.0, 30.0)
STEADY_SECS = 60.0  # a worker up this long has its restart pause start again from the first
START_TIMEOUT_SECS = 300.0
KILL_MARGIN_SECS = 15.0  # past shutdown_timeout_secs, a worker still running is killed


@functools.lru_cache(maxsize=256)
def _logger(namespace: str) -> Logger:
    return Logger(namespace=namespace)


_LEVELS = {level.name: level for level in (LogLevel.debug, LogLevel.info, LogLevel.warn, LogLevel.error, LogLevel.critical)}


@implementer(IReadDescriptor)
class Listener:
    """A shared source's listening socket: accepts and hands each connection to a worker."""

    log = Logger(namespace="logrouter.source")

    def __init__(self, supervisor: "SupervisorService", name: str, source_type: str, listen: str) -> None:
        self.supervisor = supervisor
        self.name = name
        self.type = source_type
        self.listen = listen
        self.sock: socket.socket | None = None
        self.address: tuple[str, int] = ("", 0)
        self.passed = 0
        self.dropped = 0

    def bind(self) -> tuple[str, int]:
        _, port, interface = listen_address(self.listen)  # type: ignore[misc]
        kind = endpoints._parseServer(self.listen, None)[0]
        family = socket.AF_INET6 if kind == "TCP6" or ":" in interface else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((interface or ("::" if family == socket.AF_INET6 else ""), port))
            sock.listen(1024)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sock = sock
        self.address = sock.getsockname()[:2]
        return self.address

    def start(self) -> None:
        self.supervisor.reactor.addReader(self)

    def close(self) -> None:
        if self.sock is not None:
            self.supervisor.reactor.removeReader(self)
            self.sock.close()
            self.sock = None

    # IReadDescriptor
    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def doRead(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                connection, address = self.sock.accept()  # type: ignore[union-attr]
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.log.warn("source {name}: cannot accept ({error})", name=self.name, error=e.strerror)
                return
            try:
                if self.supervisor.pass_connection(self.name, address[0], connection):
                    self.passed += 1
                else:
                    self.dropped += 1
            finally:
                connection.close()

    def connectionLost(self, reason: Any) -> None:
        self.close()

    def logPrefix(self) -> str:
        return f"listener-{self.name}"


_ROUTER_KEPT = ("workers", "metrics_listen", "pin_workers")  # supervisor settings, until a restart


def _kept_until_restart(old: Config, new: Config) -> list[str]:
    """What a reload cannot change in the supervisor (it keeps the running values)."""
    kept = [f"router.{key}" for key in _ROUTER_KEPT if new.router[key] != old.router[key]]
    if new.spool != old.spool:
        kept.append("[spool]")
    if new.compaction != old.compaction:
        kept.append("[compaction]")
    return kept


class WorkerProcess(protocol.ProcessProtocol):
    """One worker: its process, its channel, its requests in flight, its restarts."""

    def __init__(self, supervisor: "SupervisorService", index: int, cpu: int | None = None) -> None:
        self.supervisor = supervisor
        self.index = index
        self.log = Logger(namespace=f"logrouter.worker-{index}")
        self.cpu = cpu  # the one CPU it runs on (pin_workers), None: not bound
        self.channel: Channel | None = None
        self.ready = False
        self.started: defer.Deferred = defer.Deferred()  # fires once (first start only)
        self.ended: defer.Deferred | None = None
        self.requests: dict[int, defer.Deferred] = {}
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
            "--channel-fd", "3", "--parent", str(os.getpid()), "--shared", json.dumps(supervisor.addresses),
        ]
        if self.cpu is not None:
            args += ["--cpu", str(self.cpu)]
        self.ready = False
        self.ended = defer.Deferred()
        self._partial = {1: b"", 2: b""}
        try:
            supervisor.reactor.spawnProcess(self, sys.executable, args, env=dict(os.environ),
                                            childFDs={0: 0, 1: "r", 2: "r", 3: theirs.fileno()})
        finally:
            theirs.close()
        self.channel = Channel(supervisor.reactor, ours, self._message, lambda: None)

    def _message(self, message: dict, fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        if message.get("op") == "ready":
            self.ready = True
            self.up_since = self.supervisor.reactor.seconds()
            if not self.started.called:
                self.started.callback(self.index)
            elif self.restarts:
                self.log.info("worker {index} is running again", index=self.index)
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
        if ended is not None:
            ended.callback(None)
        self.supervisor.worker_ended(self, how)


class SupervisorService(service.Service):
    log = Logger(namespace="logrouter")
    name = "logrouter"

    def __init__(self, config: Config, reactor: Any = None, config_path: str = "") -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor
        self.config = config
        self.config_path = config_path
        self.accepting, self.why = plan.workers(config)  # the workers connections go to
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
        for name in plan.shared_sources(self.config):
            component = self.config.sources[name]
            listener = Listener(self, name, component.cls.TYPE, component.options["listen"])
            self.addresses[name] = listener.bind()
            self.listeners[name] = listener
        if self.why:
            self.log.info("workers = auto: {count} workers ({why})", count=self.accepting, why=self.why)
        if self.count > self.accepting:
            self.log.warn(
                "{extra} worker spool(s) left by a router run with more workers: started to drain them "
                "(they take no connections)", extra=self.count - self.accepting,
            )
        self.workers = [WorkerProcess(self, index, plan.worker_cpu(self.config, index, self.cpus))
                        for index in range(self.count)]
        if any(w.cpu is not None for w in self.workers):
            self.log.info("pin_workers: {pairs}", pairs=", ".join(f"worker {w.index} on CPU {w.cpu}" for w in self.workers))
        for worker in self.workers:
            worker.spawn()
        starting = defer.gatherResults([w.started for w in self.workers], consumeErrors=True)
        starting.addTimeout(START_TIMEOUT_SECS, self.reactor)
        yield starting
        if self.stopping:
            return
        for listener in self.listeners.values():
            listener.start()
            self._announce(listener)
        listen = self.config.router["metrics_listen"]
        if listen:
            site = http_endpoint.site(SupervisorPages(self))
            self.metrics_port = yield endpoints.serverFromString(self.reactor, listen).listen(site)
            address = self.metrics_port.getHost()
            self.log.info("metrics listening on {host} port {port}", host=address.host, port=address.port)
        install_sighup(self.reactor, self.reload)
        self.compaction = start_compaction(self.config, self.reactor)
        self.log.info("logrouter running ({count} workers)", count=self.count)

    def _failed(self, failure: Any) -> None:
        if self.stopping:
            return
        self.log.critical("logrouter could not start: {error}", error=failure.getErrorMessage())
        self.reactor.addSystemEventTrigger("after", "shutdown", _exit_failed)
        self.reactor.stop()

    # -- connections ------------------------------------------------------------------

    def pass_connection(self, source: str, host: str, connection: socket.socket) -> bool:
        worker = self.workers[plan.worker_for(normal_ip(host), self.accepting)]
        if not worker.ready or worker.channel is None:
            return False
        return worker.channel.send({"op": "connection", "source": source}, [connection.fileno()])

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
            "its clients' connections are closed meanwhile and they reconnect)",
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
            listener.close()
        compaction = self.compaction.stopService() if self.compaction is not None else defer.succeed(None)
        ends = []
        for worker in self.workers:
            if worker.ended is not None:
                ends.append(worker.ended)
                worker.terminate("TERM")
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
        """Check the config file, listen for new or moved TCP/TLS sources, have every
        worker apply the file, then close what no source uses any more; fires with
        ``(ok, text)``.

        ``workers``, ``metrics_listen``, ``pin_workers``, ``[spool]`` and ``[compaction]`` keep their
        running values until a restart (the answer says so), as in one process."""
        self.log.info("reloading the config from {path}", path=self.config_path)
        try:
            new = load_file(self.config_path)
        except ConfigError as e:
            for error in e.errors:
                self.log.error("reload refused: {error}", error=error)
            return defer.succeed((False, "refused, the running config is unchanged:\n" + "\n".join(e.errors)))
        kept = _kept_until_restart(self.config, new)
        new = dataclasses.replace(
            new, router={**new.router, **{key: self.config.router[key] for key in _ROUTER_KEPT}},
            spool=self.config.spool, compaction=self.config.compaction,
        )
        try:
            opened, closing = self._listeners_for(new)
        except OSError as e:
            self.log.error("reload refused: {error}", error=e)
            return defer.succeed((False, f"refused, the running config is unchanged: {e}"))
        addresses = {name: address for name, address in self.addresses.items() if name not in closing}
        addresses.update({name: listener.address for name, listener in opened.items()})
        asks = [w.request({"op": "reload", "shared": addresses}) for w in self.workers]

        def combine(replies: list) -> tuple[bool, str]:
            self.config = new
            for name in closing:
                self.listeners.pop(name).close()
            self.addresses = addresses
            for name, listener in opened.items():
                self.listeners[name] = listener
                listener.start()
                self._announce(listener)
            lines, ok = [], True
            for worker, reply in zip(self.workers, replies):
                if reply is None:
                    ok = False
                    lines.append(f"worker {worker.index}: no answer (not running, or still reloading)")
                else:
                    ok = ok and bool(reply.get("ok"))
                    lines.append(f"worker {worker.index}: {reply.get('text')}")
            if kept:
                lines.append(f"needs a restart to change (kept as running): {', '.join(kept)}")
            return ok, "\n".join(lines)

        return defer.gatherResults(asks).addCallback(combine)

    def _listeners_for(self, new: Config) -> tuple[dict[str, "Listener"], set[str]]:
        """Bind the shared sources ``new`` adds or moves to another address (all or none:
        an address that cannot be bound raises ``OSError`` with the source named), and
        the names of the listeners to close once the workers applied ``new``."""
        wanted = {name: new.sources[name] for name in plan.shared_sources(new)}
        closing = {name for name in self.listeners if name not in wanted}
        opened: dict[str, Listener] = {}
        try:
            for name, component in wanted.items():
                listen = component.options["listen"]
                current = self.listeners.get(name)
                if current is not None and listen_address(current.listen) == listen_address(listen):
                    current.listen, current.type = listen, component.cls.TYPE  # same socket, maybe new TLS options
                    continue
                listener = Listener(self, name, component.cls.TYPE, listen)
                try:
                    listener.bind()
                except OSError as e:
                    raise OSError(e.errno, f"sources.{name}.listen: cannot listen on {listen!r}: {e.strerror or e}") from None
                opened[name] = listener
                if current is not None:
                    closing.add(name)
        except OSError:
            for listener in opened.values():
                listener.close()
            raise
        return opened, closing

    def _announce(self, listener: "Listener") -> None:
        host, port = listener.address
        self.log.info(
            "{type} source {name} listening on {host} port {port} (connections go to {workers} workers)",
            type=listener.type, name=listener.name, host=host, port=port, workers=self.accepting,
        )

    def reply_limit(self) -> float:
        return max(60.0, float(self.config.router["shutdown_timeout_secs"] or 0))



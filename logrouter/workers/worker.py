"""A worker process: one whole router, started by the supervisor, talking over its channel.

``python -c "from logrouter.workers.worker import main; main()" --config PATH --index I --count N --channel-fd FD
--parent PID`` (the supervisor builds the command line). The worker never reads the
config file: the supervisor's first message on the channel (``start``) carries the text
of the config the supervisor runs, its running ``[spool]`` table and the addresses it
listens on, and each ``reload`` request carries them again. The worker runs what
``plan.worker_config`` derives from them, so a worker started again after a crash runs
what the others run, whatever the file on disk holds by then. Reloads run one at a time
(``logrouter.reload_queue``): one sent while another runs waits, and applies the last
config sent. Connections of shared sources come over the channel; everything else (its
spool, its sinks, worker 0's unshared sources) is the worker's own.

The kernel kills a worker whose supervisor dies (``PR_SET_PDEATHSIG``): a supervisor
killed with ``kill -9`` cannot leave workers behind on the spool directories a restarted
supervisor's new workers open. Everything acknowledged is in the spool by then.
Log lines go to stdout as ``[namespace#level] text``; the supervisor logs them under the
same namespace and level, the text prefixed with ``worker <index>: ``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from typing import Any

from logrouter.arrow_memory import prepare_arrow
from logrouter.twisted_without_openssl import import_twisted

import_twisted()  # before anything imports the reactor or endpoints: no pyOpenSSL without TLS
prepare_arrow()  # before anything imports pyarrow: Arrow reads its pool's name on its first allocation

from twisted.internet import defer  # noqa: E402
from twisted.logger import FileLogObserver, Logger, formatEvent, globalLogBeginner

from logrouter.config.load import Config, ConfigError, load_string
from logrouter.failures import EXIT_FAILURE
from logrouter.parent_death import die_with_parent
from logrouter.service import RouterService
from logrouter.workers.channel import MAX_FDS, MAX_MESSAGE, Channel, PassedConnections
from logrouter.workers.plan import worker_config

STOPPING_ANSWER_SECS = 5.0
TAKEN_RETRY_SECS = 0.1  # a "taken" report the channel refused (its buffer full) is sent again
START_MESSAGE_SECS = 60.0  # the supervisor sends it right after the fork


def bind_to_cpu(cpu: int) -> None:
    """Run on ``cpu`` only. Called before the router starts a thread: the spool's, the
    sinks' and the reactor's thread pool inherit it, so the GIL is only ever handed over
    within one core (across cores it cost ~20% more CPU per event, measured).

    The binding is per thread, and importing pyarrow may already have started one
    (jemalloc's background thread, which starts more of its own later): every thread of
    the process is bound, not only this one."""
    try:
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError) as e:  # not Linux, or the CPU went away
        print(f"[logrouter.worker#warn] cannot run on CPU {cpu} only ({e}); running unbound", flush=True)
        return
    bound: set[int] = set()
    for _ in range(10):  # again while threads not bound yet started new ones
        try:
            threads = {int(tid) for tid in os.listdir("/proc/self/task")} - bound
        except OSError:
            return
        if not threads:
            return
        for tid in threads:
            try:
                os.sched_setaffinity(tid, {cpu})
            except OSError:
                pass  # a thread that ended meanwhile
        bound |= threads


class WorkerService(RouterService):
    """The router of one worker, and its end of the channel."""

    log = Logger(namespace="logrouter.worker")
    RUNNING = "worker running"  # the supervisor says "logrouter running" once all are

    def __init__(self, config: Any, reactor: Any, config_path: str, index: int, count: int,
                 passed: PassedConnections, channel_socket: socket.socket) -> None:
        super().__init__(config, reactor, config_path)
        self.index = index
        self.count = count
        self.passed = passed
        self.stop_begun = False
        self.stop_asked = False  # by the supervisor, behind the connections it passed us
        self.stopping_answered: defer.Deferred | None = None
        self.wanted: dict | None = None  # the last reload request: what the next reload applies
        self.connections_read = 0  # connection messages read from the channel since the start
        self.connections_reported = 0  # the last count the supervisor was sent ("taken")
        self.report_retry: Any = None
        self.channel = Channel(reactor, channel_socket, self._message, self._supervisor_gone, self._report_taken)

    def build_router(self) -> Any:
        from logrouter.router import Router

        return Router(self.config, self.reactor, worker=self.index, passed=self.passed)

    def _install_sighup(self) -> None:
        pass  # the supervisor asks for reloads over the channel; SIGHUP goes to it

    def _running(self, result: Any) -> None:
        super()._running(result)
        if self.running:  # not if a stop came during the start
            self.channel.send({"op": "ready"})

    def _message(self, message: dict, fds: list[int]) -> None:
        op = message.get("op")
        if op == "connection":
            self.connections_read += 1
            self.passed.adopt(str(message.get("source")), fds)
            return
        if op == "stop":
            self.stop_asked = True
            if not self.stop_begun:
                self.reactor.stop()
            return
        if op == "stopping":  # the supervisor's answer: it passes us nothing more
            if self.stopping_answered is not None and not self.stopping_answered.called:
                self.stopping_answered.callback(None)
            return
        for fd in fds:
            os.close(fd)  # only connections come with descriptors
        if op == "metrics":
            from logrouter.metrics import render

            text = render(self.router) if self.router is not None else ""
            self.channel.send({"op": "metrics", "id": message.get("id"), "text": text})
        elif op == "health":
            from logrouter.health import router_health

            self.channel.send({"op": "health", "id": message.get("id"), "health": router_health(self.router)})
        elif op == "reload":
            self.wanted = message  # applied by the next reload to start, not before
            self.reload().addCallback(
                lambda result: self.channel.send({"op": "reloaded", "id": message.get("id"), **result.message()})
            )

    def _report_taken(self) -> None:
        """Tell the supervisor how many connections it passed have been read (it keeps a
        bounded number in flight to each worker). The count is a total: if the channel
        refuses it, it is sent again shortly (the supervisor may be waiting for it to
        pass more) or with the next turn's, whichever comes first."""
        if self.report_retry is not None and self.report_retry.active():
            self.report_retry.cancel()
        self.report_retry = None
        if self.connections_read == self.connections_reported or self.channel.closed:
            return
        if self.channel.send({"op": "taken", "count": self.connections_read}):
            self.connections_reported = self.connections_read
        else:
            self.report_retry = self.reactor.callLater(TAKEN_RETRY_SECS, self._report_taken)

    def stopService(self) -> Any:
        """Adopt every connection passed to this worker before its router stops, so its
        sources read what their clients sent, like any connection's.

        The supervisor's stop request comes behind the connections it passed. A stop of
        our own (a SIGTERM sent to this process, a failed start) may overtake some: the
        supervisor is told, holds what comes for this worker from then on, and answers;
        what the channel holds up to the answer is adopted (the wait is bounded)."""
        self.stop_begun = True
        self.running = False  # a start finishing meanwhile must not report ready any more
        if self.stop_asked or self.channel.closed:
            self.channel.drain()
            return super().stopService()
        self.stopping_answered = answered = defer.Deferred()
        self.channel.send({"op": "stopping"})
        answered.addTimeout(STOPPING_ANSWER_SECS, self.reactor)
        answered.addErrback(lambda failure: failure.trap(defer.TimeoutError))
        return answered.addCallback(lambda _: (self.channel.drain(), super(WorkerService, self).stopService())[1])

    def read_config(self) -> Config:
        """The config the supervisor sent last, and from here on its listeners' addresses."""
        self.log.info("reloading the config the supervisor runs")
        config, shared = derive(self.wanted or {}, self.index, self.count)
        self.passed.addresses = shared
        return config

    def _supervisor_gone(self) -> None:
        if self.stopping_answered is not None and not self.stopping_answered.called:
            self.stopping_answered.callback(None)  # nothing more can come
        if self.running:
            self.log.warn("the supervisor's channel closed: stopping")
            self.reactor.stop()


def _line(event: dict) -> str | None:
    text = formatEvent(event)
    if "log_failure" in event:
        text = f"{text}\n{event['log_failure'].getTraceback()}"
    level = event.get("log_level")
    return f"[{event.get('log_namespace', '-')}#{getattr(level, 'name', 'info')}] {text}\n"


def derive(message: dict, index: int, count: int) -> tuple[Config, dict[str, tuple[str, int]]]:
    """The config worker ``index`` runs from a ``start`` or ``reload`` message, and the
    addresses the supervisor listens on for the shared sources (``ConfigError`` if the
    text has errors, or the message is not one)."""
    text, spool, shared = message.get("config"), message.get("spool"), message.get("shared")
    if not isinstance(text, str) or not isinstance(spool, dict) or not isinstance(shared, dict):
        raise ConfigError(["the supervisor's message has no config"])
    config = load_string(text)
    config.spool = dict(spool)  # what a reload cannot change: the running one
    addresses = {name: (host, int(port)) for name, (host, port) in shared.items()}
    return worker_config(config, index, count, set(addresses)), addresses


def first_message(channel_socket: socket.socket) -> dict:
    """The supervisor's ``start`` message, read before the reactor runs."""
    channel_socket.settimeout(START_MESSAGE_SECS)
    try:
        data, fds, _, _ = socket.recv_fds(channel_socket, MAX_MESSAGE, MAX_FDS)
    except OSError as e:
        raise ConfigError([f"no start message from the supervisor ({e})"]) from None
    for fd in fds:
        os.close(fd)
    try:
        message = json.loads(data)
    except ValueError:
        message = None
    if not isinstance(message, dict) or message.get("op") != "start":
        raise ConfigError(["the supervisor's first message is not a start message"])
    return message


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="logrouter worker")
    parser.add_argument("--config", required=True, help="the supervisor's config file (for the logs: never read)")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--cpu", type=int, help="the CPU to run on (pin_workers)")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    if args.cpu is not None:
        bind_to_cpu(args.cpu)
    globalLogBeginner.beginLoggingTo([FileLogObserver(sys.stdout, _line)], redirectStandardIO=False)

    from twisted.internet import reactor

    channel_socket = socket.socket(fileno=args.channel_fd)
    try:
        config, shared = derive(first_message(channel_socket), args.index, args.count)
    except ConfigError as e:
        for error in e.errors:
            print(f"[logrouter.worker#error] config: {error}", flush=True)
        raise SystemExit(EXIT_FAILURE)
    passed = PassedConnections(reactor, shared)
    service = WorkerService(config, reactor, args.config, args.index, args.count, passed, channel_socket)
    # Ctrl-C reaches the whole process group; the supervisor turns it into the SIGTERM
    # that stops each worker, so a worker does not stop early by itself (and look crashed).
    reactor.callWhenRunning(signal.signal, signal.SIGINT, signal.SIG_IGN)
    reactor.callWhenRunning(service.startService)
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.run()


if __name__ == "__main__":
    main()

"""A worker process: one whole router, started by the supervisor, talking over its channel.

``python -c "from logrouter.workers.worker import main; main()" --config PATH --index I --count N --channel-fd FD
--parent PID --shared JSON`` (the supervisor builds the command line). The worker reads
the config file itself and runs what ``plan.worker_config`` derives from it (also on each
reload). Connections of shared sources come over the channel; everything else (its
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

from twisted.logger import FileLogObserver, Logger, formatEvent, globalLogBeginner

from logrouter.config.load import ConfigError, load_file
from logrouter.service import RouterService
from logrouter.workers.channel import Channel, PassedConnections
from logrouter.workers.plan import worker_config


def die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when the supervisor dies, and exit at once
    if that already happened (between the fork and now)."""
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: a dead supervisor's closed channel stops the worker instead
    if os.getppid() != parent:
        os._exit(1)


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
        self.config_transform = lambda loaded: worker_config(loaded, index, count, set(passed.addresses))
        self.passed = passed
        self.channel = Channel(reactor, channel_socket, self._message, self._supervisor_gone)

    def build_router(self) -> Any:
        from logrouter.router import Router

        return Router(self.config, self.reactor, worker=self.index, passed=self.passed)

    def _install_sighup(self) -> None:
        pass  # the supervisor asks for reloads over the channel; SIGHUP goes to it

    def _running(self, result: Any) -> None:
        super()._running(result)
        self.channel.send({"op": "ready"})

    def _message(self, message: dict, fds: list[int]) -> None:
        op = message.get("op")
        if op == "connection":
            self.passed.adopt(str(message.get("source")), fds)
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
            shared = message.get("shared")
            if isinstance(shared, dict):  # the supervisor's listeners for the new config
                self.passed.addresses = {name: (host, int(port)) for name, (host, port) in shared.items()}
            self.reload().addCallback(
                lambda result: self.channel.send({"op": "reloaded", "id": message.get("id"), "ok": result[0], "text": result[1]})
            )

    def _supervisor_gone(self) -> None:
        if self.running:
            self.log.warn("the supervisor's channel closed: stopping")
            self.reactor.stop()


def _line(event: dict) -> str | None:
    text = formatEvent(event)
    if "log_failure" in event:
        text = f"{text}\n{event['log_failure'].getTraceback()}"
    level = event.get("log_level")
    return f"[{event.get('log_namespace', '-')}#{getattr(level, 'name', 'info')}] {text}\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="logrouter worker")
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--shared", default="{}", help="JSON: {source: [host, port]} the supervisor accepts for")
    parser.add_argument("--cpu", type=int, help="the CPU to run on (pin_workers)")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    if args.cpu is not None:
        bind_to_cpu(args.cpu)
    globalLogBeginner.beginLoggingTo([FileLogObserver(sys.stdout, _line)], redirectStandardIO=False)

    from twisted.internet import reactor

    shared = {name: (host, int(port)) for name, (host, port) in json.loads(args.shared).items()}
    try:
        config = worker_config(load_file(args.config), args.index, args.count, set(shared))
    except ConfigError as e:
        for error in e.errors:
            print(f"[logrouter.worker#error] config: {error}", flush=True)
        raise SystemExit(1)
    passed = PassedConnections(reactor, shared)
    channel_socket = socket.socket(fileno=args.channel_fd)
    service = WorkerService(config, reactor, args.config, args.index, args.count, passed, channel_socket)
    # Ctrl-C reaches the whole process group; the supervisor turns it into the SIGTERM
    # that stops each worker, so a worker does not stop early by itself (and look crashed).
    reactor.callWhenRunning(signal.signal, signal.SIGINT, signal.SIG_IGN)
    reactor.callWhenRunning(service.startService)
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.run()


if __name__ == "__main__":
    main()

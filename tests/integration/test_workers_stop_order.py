"""The supervisor and a worker hand connections over without losing one to a stop or a
restart: real sockets, the reactor faked (``MemoryReactorClock``), each reactor turn
made by calling the reader the real reactor would call.

- At a graceful stop the supervisor accepts what the kernel's backlog holds and passes
  it on before the listening socket closes (a close resets those connections, with what
  their clients wrote), and asks each worker to stop over the channel, behind them.
- A connection for a worker that is not running (restarting) is held unread and passed
  once the worker runs again, not closed.
- A worker adopts the connections waiting in its channel before its router stops, also
  when its stop did not come from the supervisor (a SIGTERM can overtake them).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock

from logrouter.config.load import load_string
from logrouter.workers.channel import Channel, PassedConnections, channel_pair
from logrouter.workers.plan import worker_for
from logrouter.workers.supervisor import Listener, SupervisorService, WorkerProcess
from logrouter.workers.worker import WorkerService

CONFIG = """
[router]
workers = 2
pin_workers = false

[spool]
path = "{spool}"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.out]
type = "blackhole"
inputs = ["forward"]
"""


def config(tmp_path: Path):
    return load_string(CONFIG.format(spool=tmp_path / "spool"))


def local_address_for(worker: int) -> str:
    return next(f"127.0.0.{n}" for n in range(2, 250) if worker_for(f"127.0.0.{n}", 2) == worker)


def messages(end: socket.socket) -> list[tuple[dict, list[int]]]:
    """Every message waiting at the worker's end of a channel."""
    end.setblocking(False)
    found = []
    for _ in range(100):
        try:
            data, fds, _, _ = socket.recv_fds(end, 1 << 16, 8)
        except BlockingIOError:
            break
        found.append((json.loads(data), fds))
    return found


class Rig:
    """A supervisor with one listener and two workers whose far channel ends we hold."""

    def __init__(self, tmp_path: Path) -> None:
        self.reactor = MemoryReactorClock()
        self.supervisor = SupervisorService(config(tmp_path), reactor=self.reactor)
        self.listener = Listener(self.supervisor, "forward", "fluent_forward", "tcp:0:interface=127.0.0.1")
        self.supervisor.addresses["forward"] = self.listener.bind()
        self.supervisor.listeners["forward"] = self.listener
        self.ends: list[socket.socket] = []
        for index in range(2):
            worker = WorkerProcess(self.supervisor, index)
            ours, theirs = channel_pair()
            closed = getattr(worker, "_channel_closed", lambda: None)
            worker.channel = Channel(self.reactor, ours, worker._message, closed)
            worker.ready = True
            worker.started.callback(index)
            worker.ended = defer.Deferred()
            self.supervisor.workers.append(worker)
            self.ends.append(theirs)
        self.clients: list[socket.socket] = []

    def connect(self, worker: int, data: bytes) -> None:
        client = socket.create_connection(self.listener.address, timeout=10,
                                          source_address=(local_address_for(worker), 0))
        client.sendall(data)
        self.clients.append(client)

    def close(self) -> None:
        for worker in self.supervisor.workers:
            if worker.ended is not None and not worker.ended.called:
                worker.ended.callback(None)
            if worker.channel is not None:
                worker.channel.close()
        for sock in self.ends + self.clients:
            sock.close()
        self.listener.close()


def test_a_stop_passes_the_backlog_on_and_asks_each_worker_to_stop_behind_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        rig.listener.start()
        # Completed by the kernel, not accepted yet: the supervisor had no turn since.
        rig.connect(0, b"sent before the stop, to worker 0")
        rig.connect(1, b"sent before the stop, to worker 1")
        rig.supervisor.stopService()
        for worker in (0, 1):
            got = messages(rig.ends[worker])
            assert [message["op"] for message, _ in got] == ["connection", "stop"], got
            (fd,) = got[0][1]
            with socket.socket(fileno=fd) as passed:
                assert passed.recv(100) == f"sent before the stop, to worker {worker}".encode()
        assert rig.listener.sock is None  # closed once emptied
        assert rig.listener.passed == 2 and rig.listener.dropped == 0
    finally:
        rig.close()


def test_a_connection_for_a_restarting_worker_is_held_and_passed_once_it_runs(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        rig.listener.start()
        restarting = rig.supervisor.workers[1]
        restarting.ready = False
        rig.connect(1, b"sent while worker 1 restarts")
        rig.listener.doRead()  # the reactor's turn: accepted
        assert messages(rig.ends[1]) == []
        assert rig.listener.dropped == 0, "closed, with what its client had sent"
        restarting._message({"op": "ready"}, [])
        ((message, (fd,)),) = messages(rig.ends[1])
        assert message == {"op": "connection", "source": "forward"}
        with socket.socket(fileno=fd) as passed:
            assert passed.recv(100) == b"sent while worker 1 restarts"
        assert rig.listener.passed == 1
    finally:
        rig.close()


def test_a_connection_for_a_worker_whose_channel_broke_is_held(tmp_path: Path) -> None:
    """The worker died and its exit is not seen yet: ``ready`` is stale, the send fails."""
    rig = Rig(tmp_path)
    try:
        rig.listener.start()
        rig.ends[1].close()
        rig.connect(1, b"sent as worker 1 died")
        rig.listener.doRead()
        worker = rig.supervisor.workers[1]
        assert not worker.ready and len(worker.connections.held) == 1 and rig.listener.dropped == 0
    finally:
        rig.close()


class StubRouter:
    """What the worker's router does at a stop that matters here: its sources stop
    taking passed connections."""

    def __init__(self, passed: PassedConnections) -> None:
        self.passed = passed

    def stop(self) -> defer.Deferred:
        self.passed.release("forward")
        return defer.succeed(None)


def worker_rig(tmp_path: Path) -> tuple[WorkerService, PassedConnections, socket.socket, MemoryReactorClock]:
    reactor = MemoryReactorClock()
    passed = PassedConnections(reactor, {"forward": ("127.0.0.1", 24224)})
    passed.take("forward", object)
    supervisor_end, worker_end = channel_pair()
    service = WorkerService(config(tmp_path), reactor, None, 1, 2, passed, worker_end)
    service.router = StubRouter(passed)
    service.running = True
    return service, passed, supervisor_end, reactor


def send_connection(supervisor_end: socket.socket) -> socket.socket:
    ours, theirs = socket.socketpair()
    socket.send_fds(supervisor_end, [b'{"op":"connection","source":"forward"}'], [theirs.fileno()])
    theirs.close()
    return ours


def test_the_supervisors_stop_comes_behind_the_connections_it_passed(tmp_path: Path) -> None:
    service, passed, supervisor_end, reactor = worker_rig(tmp_path)
    reactor.running = True
    keep = [send_connection(supervisor_end)]
    supervisor_end.send(b'{"op":"stop"}')
    service.channel.doRead()  # the reactor's turn: adopted, then the stop asked
    assert reactor.hasStopped
    done = service.stopService()
    assert done.called
    assert passed.adopted == 1 and passed.refused == 0
    for sock in keep + [supervisor_end]:
        sock.close()
    service.channel.close()


def test_a_worker_stopping_by_itself_adopts_what_was_passed_until_the_supervisor_answers(tmp_path: Path) -> None:
    service, passed, supervisor_end, reactor = worker_rig(tmp_path)
    keep = [send_connection(supervisor_end)]  # waiting in the channel when the SIGTERM came
    done = service.stopService()
    assert not done.called, "the router stopped before the supervisor answered"
    assert [message["op"] for message, _ in messages(supervisor_end)] == ["stopping"]
    keep.append(send_connection(supervisor_end))  # passed before the supervisor read that
    supervisor_end.send(b'{"op":"stopping"}')  # the answer: nothing more follows
    service.channel.doRead()
    assert done.called
    assert passed.adopted == 2 and passed.refused == 0
    for sock in keep + [supervisor_end]:
        sock.close()
    service.channel.close()

"""``logrouter.workers.passing``: at most a window of connections in flight to a worker,
the rest held or closed (counted, logged once per episode), the worker's ``taken``
reports that free the window; the supervisor routing through it, so a worker that does
not read its channel costs no other worker a connection; the worker's side of the
report; ``logrouter.open_files``. Fakes for the channel, the worker, the listener and the
connections; the worker's side on a real channel pair, as a worker has."""

from __future__ import annotations

import itertools
import json

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import formatEvent, globalLogPublisher

from logrouter import open_files
from logrouter.config.load import load_string
from logrouter.workers import passing
from logrouter.workers.passing import (
    CHANNEL_FULL, NOT_READING, NOT_RUNNING, STOPPING, WorkerConnections, window_for,
)
from logrouter.workers.plan import worker_for
from logrouter.workers.supervisor import SupervisorService, WorkerProcess

_fds = itertools.count(1000)


class FakeChannel:
    """Takes every message (records it) unless told to refuse; never reads."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict, list[int]]] = []
        self.refuse = False

    def send(self, message: dict, fds=()) -> bool:
        if self.refuse:
            return False
        self.sent.append((message, list(fds)))
        return True

    def connections(self) -> list[int]:
        return [fds[0] for message, fds in self.sent if message.get("op") == "connection"]


class FakeWorker:
    def __init__(self, index: int = 1) -> None:
        self.index = index
        self.ready = True
        self.channel: FakeChannel | None = FakeChannel()


class FakeListener:
    name = "forward"

    def __init__(self) -> None:
        self.passed = 0
        self.dropped = 0


class FakeConnection:
    def __init__(self) -> None:
        self.fd = next(_fds)
        self.closed = False

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def logged():
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    yield lambda: [formatEvent(e) for e in events if e.get("log_namespace", "").startswith("logrouter.workers.passing")]
    globalLogPublisher.removeObserver(events.append)


def offered(queue: WorkerConnections, listener: FakeListener, count: int, stopping: bool = False) -> list[FakeConnection]:
    connections = [FakeConnection() for _ in range(count)]
    for connection in connections:
        queue.offer(listener, connection, stopping)
    return connections


def test_at_most_a_window_in_flight_then_held_then_closed(logged) -> None:
    worker, listener = FakeWorker(), FakeListener()
    queue = WorkerConnections(worker, window=4, hold=3)
    connections = offered(queue, listener, 10)
    assert worker.channel.connections() == [c.fd for c in connections[:4]]
    assert all(c.closed for c in connections[:4])  # the worker has its own copy
    assert [c for _, c in queue.held] == connections[4:7] and not any(c.closed for c in connections[4:7])
    assert all(c.closed for c in connections[7:])
    assert queue.in_flight == 4 and listener.passed == 4 and listener.dropped == 3
    assert queue.dropped == {NOT_RUNNING: 0, NOT_READING: 3, CHANNEL_FULL: 0, STOPPING: 0}
    (line,) = logged()  # once for the episode, not per connection
    assert line.startswith("worker 1 does not read its channel") and "4 connection(s) passed" in line


def test_what_the_worker_takes_frees_the_window_for_what_is_held_first(logged) -> None:
    worker, listener = FakeWorker(), FakeListener()
    queue = WorkerConnections(worker, window=4, hold=3)
    connections = offered(queue, listener, 10)
    queue.took(2)
    assert worker.channel.connections() == [c.fd for c in connections[:6]]
    assert [c for _, c in queue.held] == connections[6:7] and queue.in_flight == 4
    later = offered(queue, listener, 1)  # behind what is held, not ahead of it
    assert [c for _, c in queue.held] == [connections[6], later[0]]
    queue.took(6)
    assert worker.channel.connections() == [c.fd for c in connections[:7] + later]
    assert not queue.held and queue.in_flight == 2
    assert logged()[-1] == "worker 1 takes connections again (3 closed meanwhile)"
    offered(queue, listener, 2)
    assert queue.in_flight == 4 and listener.passed == 10 and listener.dropped == 3
    assert len(logged()) == 2
    offered(queue, listener, 4)  # a new episode, logged anew
    assert len(logged()) == 3 and queue.dropped[NOT_READING] == 4


def test_a_report_that_makes_no_sense_is_ignored() -> None:
    worker, listener = FakeWorker(), FakeListener()
    queue = WorkerConnections(worker, window=4, hold=0)
    offered(queue, listener, 4)
    for count in (True, 5, -1, "4", 4.0, None, [4]):
        queue.took(count)
        assert queue.taken == 0
    queue.took(3)
    queue.took(1)  # older than the last: a total never goes back
    assert queue.taken == 3


def test_a_worker_not_running_has_its_connections_held_and_passed_once_it_runs(logged) -> None:
    worker, listener = FakeWorker(), FakeListener()
    worker.ready = False
    queue = WorkerConnections(worker, window=4, hold=2)
    connections = offered(queue, listener, 3)
    assert worker.channel.sent == [] and len(queue.held) == 2 and connections[2].closed
    assert queue.dropped[NOT_RUNNING] == 1
    assert logged()[0].startswith("worker 1 is not running")
    queue.started()  # a new process, a new channel
    worker.ready = True
    queue.flush()
    assert worker.channel.connections() == [c.fd for c in connections[:2]]
    assert logged()[-1] == "worker 1 takes connections again (1 closed meanwhile)"


def test_a_new_process_has_nothing_in_flight() -> None:
    worker, listener = FakeWorker(), FakeListener()
    queue = WorkerConnections(worker, window=2, hold=0)
    offered(queue, listener, 2)
    assert queue.waiting_for() == NOT_READING
    queue.started()
    assert queue.waiting_for() is None and queue.in_flight == 0


def test_a_channel_that_refuses_with_room_in_the_window_closes_the_connection(logged) -> None:
    worker, listener = FakeWorker(), FakeListener()
    worker.channel.refuse = True
    queue = WorkerConnections(worker, window=4, hold=4)
    (connection,) = offered(queue, listener, 1)
    assert connection.closed and not queue.held and queue.dropped[CHANNEL_FULL] == 1
    assert logged()[0].startswith("worker 1: its channel takes no more messages")
    worker.channel.refuse = False
    offered(queue, listener, 1)
    assert logged()[-1] == "worker 1 takes connections again (1 closed meanwhile)"


def test_nothing_is_held_once_the_supervisor_stops_and_what_is_held_is_closed(logged) -> None:
    worker, listener = FakeWorker(), FakeListener()
    queue = WorkerConnections(worker, window=1, hold=4)
    first, held = offered(queue, listener, 2)
    (late,) = offered(queue, listener, 1, stopping=True)
    assert late.closed and queue.dropped[STOPPING] == 1
    assert queue.close_held() == 1 and held.closed and not queue.held
    assert queue.dropped[STOPPING] == 2 and listener.dropped == 2
    assert logged() == []  # the supervisor says what it closes at a stop


def test_samples() -> None:
    worker, listener = FakeWorker(), FakeListener()
    queue = WorkerConnections(worker, window=2, hold=1)
    offered(queue, listener, 4)
    samples = {(name, tuple(labels.items())): value for name, _, labels, value in queue.samples()}
    assert samples[("logrouter_worker_connections_in_flight", (("worker", "1"),))] == 2
    assert samples[("logrouter_worker_held_connections", (("worker", "1"),))] == 1
    key = ("logrouter_worker_connections_dropped_total", (("worker", "1"), ("reason", "not_reading")))
    assert samples[key] == 1
    assert samples[key[0], (("worker", "1"), ("reason", "not_running"))] == 0


def test_the_window_leaves_half_the_open_files_limit_when_every_worker_is_full() -> None:
    assert window_for(1024, 2) == 256
    assert window_for(1024, 8) == 64
    assert window_for(1 << 20, 64) == passing.WINDOW
    assert window_for(None, 4) == passing.WINDOW
    assert window_for(8, 16) == 1
    assert window_for(1024, 0) == 256


# -- through the supervisor ----------------------------------------------------------------

CONFIG = """
[router]
workers = 2
pin_workers = false

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.out]
type = "blackhole"
inputs = ["forward"]
"""


def address_for(worker: int) -> str:
    return next(f"127.0.0.{n}" for n in range(2, 250) if worker_for(f"127.0.0.{n}", 2) == worker)


def supervisor_rig() -> tuple[SupervisorService, FakeListener]:
    supervisor = SupervisorService(load_string(CONFIG), reactor=MemoryReactorClock())
    for index in range(2):
        worker = WorkerProcess(supervisor, index, window=8)
        worker.channel = FakeChannel()  # type: ignore[assignment]
        worker.ready = True
        supervisor.workers.append(worker)
    return supervisor, FakeListener()


def test_a_worker_that_does_not_read_costs_the_other_no_connection() -> None:
    supervisor, listener = supervisor_rig()
    healthy, stuck = supervisor.workers
    for n in range(1000):
        supervisor.accepted(listener, address_for(1), FakeConnection())
        if n % 10 == 0:
            supervisor.accepted(listener, address_for(0), FakeConnection())
            # worker 0 reads its channel: it reports every connection it has read
            healthy._message({"op": "taken", "count": len(healthy.channel.connections())}, [])
    assert len(healthy.channel.connections()) == 100 and healthy.connections.in_flight == 0
    assert len(stuck.channel.connections()) == 8 and len(stuck.connections.held) == passing.HELD_PER_WORKER
    assert stuck.connections.dropped[NOT_READING] == 1000 - 8 - passing.HELD_PER_WORKER
    stuck._message({"op": "taken", "count": 8}, [])  # it reads again
    assert len(stuck.channel.connections()) == 16


def test_the_supervisors_window_comes_from_the_open_files_limit(monkeypatch) -> None:
    monkeypatch.setattr("logrouter.workers.supervisor.soft_limit", lambda: 1024)
    supervisor = SupervisorService(load_string(CONFIG), reactor=MemoryReactorClock())
    assert supervisor.window == 256


# -- the worker's side ----------------------------------------------------------------------


def test_the_worker_reports_what_it_read_once_per_turn_and_again_if_refused(tmp_path) -> None:
    from test_workers_stop_order import messages, send_connection, worker_rig

    service, passed, supervisor_end, reactor = worker_rig(tmp_path)
    keep = [send_connection(supervisor_end) for _ in range(3)]
    supervisor_end.send(b'{"op":"stopping"}')
    service.channel.doRead()
    got = [message for message, _ in messages(supervisor_end)]
    assert got[-1] == {"op": "taken", "count": 3} and [m["op"] for m in got].count("taken") == 1
    supervisor_end.send(b'{"op":"stopping"}')
    service.channel.doRead()  # a turn without a connection: nothing new to report
    assert [m["op"] for m, _ in messages(supervisor_end)] == []
    keep.append(send_connection(supervisor_end))
    real_send = service.channel.send
    service.channel.send = lambda message, fds=(): False  # the supervisor's side is full
    service.channel.doRead()
    service.channel.send = real_send
    assert messages(supervisor_end) == []
    reactor.advance(1)
    assert [m for m, _ in messages(supervisor_end)] == [{"op": "taken", "count": 4}]
    assert passed.adopted == 4
    for sock in keep + [supervisor_end]:
        sock.close()
    service.channel.close()


def test_a_channel_calls_after_read_once_per_turn_that_read() -> None:
    from logrouter.workers.channel import Channel, channel_pair

    reactor = MemoryReactorClock()
    ours, theirs = channel_pair()
    turns: list[int] = []
    seen: list[dict] = []
    channel = Channel(reactor, theirs, lambda m, f: seen.append(m), lambda: None, lambda: turns.append(len(seen)))
    try:
        channel.doRead()
        assert turns == []
        for i in range(3):
            ours.send(json.dumps({"op": "n", "i": i}).encode())
        channel.doRead()
        assert turns == [3]
    finally:
        ours.close()
        channel.close()


# -- the open files limit -------------------------------------------------------------------


class FakeLimits:
    RLIMIT_NOFILE = 7
    RLIM_INFINITY = -1

    def __init__(self, soft: int, hard: int, refuse: bool = False) -> None:
        self.limits = (soft, hard)
        self.refuse = refuse

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == self.RLIMIT_NOFILE
        return self.limits

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        assert which == self.RLIMIT_NOFILE
        if self.refuse:
            raise ValueError("not allowed")
        self.limits = limits


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    limits = FakeLimits(1024, 524288)
    assert open_files.raise_to_hard(limits) == (1024, 524288)
    assert limits.limits == (524288, 524288)
    assert open_files.soft_limit(limits) == 524288
    assert open_files.raise_to_hard(limits) == (524288, 524288)  # nothing to raise


def test_an_open_files_limit_that_cannot_be_raised_is_left() -> None:
    unlimited = FakeLimits(1024, FakeLimits.RLIM_INFINITY)
    assert open_files.raise_to_hard(unlimited) == (1024, 1024) and unlimited.limits == (1024, -1)
    refused = FakeLimits(1024, 4096, refuse=True)
    assert open_files.raise_to_hard(refused) == (1024, 1024)
    assert open_files.raise_to_hard(None) is None and open_files.soft_limit(None) is None
    assert open_files.soft_limit(FakeLimits(-1, -1)) is None

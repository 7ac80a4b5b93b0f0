"""The connections the supervisor passes to one worker: at most a window of them in
flight, the rest held or closed, each closed one counted and each episode logged once.

A connection passed over a worker's channel (its descriptor, ``SCM_RIGHTS``) is in
flight until the worker reads the message that carries it, and Linux caps the
descriptors a user has in flight at its ``RLIMIT_NOFILE`` (unless the sender has
``CAP_SYS_RESOURCE``): past the cap every send with a descriptor fails
(``ETOOMANYREFS``), to every worker. The channel's buffer is no bound on one worker's
share (its 8 MiB hold ~10,000 connection messages; ~550 where ``net.core.wmem_max`` is
left at its default), so without a bound of its own a worker that stops reading its
channel (SIGSTOP, a blocked reactor) would stop the connections of every other worker
too.

The bound is a count. After each turn in which it read its channel, the worker says how
many connection messages it has read since it started (``{"op": "taken", "count": n}``:
a total, so a report lost to a full channel is made good by the next one), and at most
``window`` connections sent and not yet taken are in flight. A count of connections
rather than the bytes queued in the channel (``SIOCOUTQ``): the kernel caps descriptors,
and the queued bytes also hold requests and depend on the kernel's overhead per message.

Beyond the window a connection is held unread, as for a worker that is not running (at
most ``HELD_PER_WORKER``), and passed once the worker takes what it has; beyond that it
is closed (its client reconnects), counted by reason, and logged once per episode: an
episode ends when nothing is held any more and a connection is passed again.
"""

from __future__ import annotations

import socket
from collections import deque
from typing import Any, Iterator

from twisted.logger import Logger

WINDOW = 256
HELD_PER_WORKER = 256  # connections kept unread for a worker that is restarting or not reading

NOT_RUNNING = "not_running"  # restarting, or exited and not seen yet
NOT_READING = "not_reading"  # its window is full: it does not read its channel
CHANNEL_FULL = "channel_full"  # the channel refused the message with room in the window
STOPPING = "stopping"  # held, or with nowhere to go, when the supervisor stops
REASONS = (NOT_RUNNING, NOT_READING, CHANNEL_FULL, STOPPING)

_EPISODE = {
    NOT_RUNNING: "worker {index} is not running and {held} connection(s) are held for it: "
                 "closing its new connections until it runs again",
    NOT_READING: "worker {index} does not read its channel (stopped, or its reactor blocked): "
                 "{in_flight} connection(s) passed to it are not taken yet and {held} more are held; "
                 "closing its new connections until it reads again (the other workers go on)",
    CHANNEL_FULL: "worker {index}: its channel takes no more messages now: "
                  "closing its new connections until one is passed again",
}


def window_for(open_files: int | None, workers: int) -> int:
    """At most ``WINDOW``, and, with the window of every worker full at once, no more than
    half the open files limit in flight (the kernel's cap is per user: the rest is left
    to the user's other processes)."""
    if open_files is None:
        return WINDOW
    return max(1, min(WINDOW, open_files // (2 * max(1, workers))))


class WorkerConnections:
    """What goes to one worker; ``worker`` has its ``index``, ``ready`` and ``channel``."""

    log = Logger(namespace="logrouter.workers")

    def __init__(self, worker: Any, window: int = WINDOW, hold: int = HELD_PER_WORKER) -> None:
        self.worker = worker
        self.window = window
        self.hold = hold
        self.sent = 0  # connection messages sent on its channel since it started
        self.taken = 0  # of those, read by the worker (its last count)
        self.held: deque[tuple[Any, socket.socket]] = deque()
        self.dropped = dict.fromkeys(REASONS, 0)
        self.episode: int | None = None  # while closing: how many were closed before it began

    @property
    def in_flight(self) -> int:
        return self.sent - self.taken

    def waiting_for(self) -> str | None:
        """Why a connection cannot be passed now but can be later; None if it can be now."""
        if not self.worker.ready or self.worker.channel is None:
            return NOT_RUNNING
        if self.in_flight >= self.window:
            return NOT_READING
        return None

    def offer(self, listener: Any, connection: socket.socket, stopping: bool = False) -> None:
        """A connection ``listener`` accepted for this worker (ours now): passed, held
        (not once ``stopping``: nothing would pass it on) or closed."""
        self.flush()  # what is held goes first
        if not self.held and self._pass(listener, connection):
            return
        reason = self.waiting_for()
        if reason is not None and stopping:
            reason = STOPPING
        elif reason is not None and len(self.held) < self.hold:
            self.held.append((listener, connection))
            return
        self._drop(listener, connection, reason or CHANNEL_FULL)

    def flush(self) -> None:
        """Pass what is held, oldest first, as far as the worker can take it now (it runs
        again, or it took some)."""
        while self.held:
            listener, connection = self.held.popleft()
            if self._pass(listener, connection):
                continue
            if self.waiting_for() is not None:
                self.held.appendleft((listener, connection))  # passed once it runs or takes again
                return
            self._drop(listener, connection, CHANNEL_FULL)

    def took(self, count: Any) -> None:
        """The worker's report: ``count`` connection messages read since it started."""
        if type(count) is int and self.taken < count <= self.sent:
            self.taken = count
            self.flush()

    def started(self) -> None:
        """A new process on a new channel: nothing is in flight to it."""
        self.sent = self.taken = 0

    def close_held(self) -> int:
        """Close what is held (the supervisor stops); how many."""
        count = len(self.held)
        while self.held:
            listener, connection = self.held.popleft()
            connection.close()
            listener.dropped += 1
            self.dropped[STOPPING] += 1
        return count

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], int]]:
        labels = {"worker": str(self.worker.index)}
        yield "logrouter_worker_held_connections", "gauge", labels, len(self.held)
        yield "logrouter_worker_connections_in_flight", "gauge", labels, self.in_flight
        for reason, count in self.dropped.items():
            yield "logrouter_worker_connections_dropped_total", "counter", {**labels, "reason": reason}, count

    def _pass(self, listener: Any, connection: socket.socket) -> bool:
        if self.waiting_for() is not None:
            return False
        if not self.worker.channel.send({"op": "connection", "source": listener.name}, [connection.fileno()]):
            return False
        connection.close()  # the worker has its own copy of the descriptor
        listener.passed += 1
        self.sent += 1
        if self.episode is not None and not self.held:
            closed = sum(self.dropped.values()) - self.episode
            self.episode = None
            self.log.info("worker {index} takes connections again ({closed} closed meanwhile)",
                          index=self.worker.index, closed=closed)
        return True

    def _drop(self, listener: Any, connection: socket.socket, reason: str) -> None:
        connection.close()
        listener.dropped += 1
        if self.episode is None and reason in _EPISODE:
            self.episode = sum(self.dropped.values())
            self.log.warn(_EPISODE[reason], index=self.worker.index, in_flight=self.in_flight, held=len(self.held))
        self.dropped[reason] += 1

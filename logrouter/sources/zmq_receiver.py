"""One thread that owns a source's ZeroMQ sockets and hands what they receive to the reactor.

Why a thread of pyzmq and not txzmq on the reactor: txzmq reads every message a socket
holds in one reactor turn (its ``doRead`` loops until the socket is empty), has no way to
stop reading for backpressure, and decodes on the reactor thread. Here the thread
receives, decompresses and parses (zlib, snappy and lz4 release the GIL), and the reactor
gets ready-made chunks of at most ``max_chunk_messages`` messages / ``max_chunk_bytes``
bytes: the work one reactor turn does per chunk is bounded, whatever a sender sends.

What this module owns, and nothing more (no logjam knowledge: ``decode`` is given):

* **Sockets.** ``SocketSpec`` says ``sub`` (connect, with subscriptions), ``router`` or
  ``pull`` (bind). One SUB socket per endpoint, so every message is known to come from
  one configured endpoint (one socket connected to several cannot tell them apart). ZeroMQ
  sockets are not thread-safe: only this thread touches them; the reactor talks to it
  through a command queue and a wake-up socketpair in the same ``zmq.Poller``.
* **Hand-off.** ``deliver(chunk)`` runs on the reactor (``callFromThread``, one call for
  the chunks handed over before the reactor got to them); a chunk is a list of
  ``Received``. ``finish(chunk)``, if given, runs in the thread on each chunk first (work
  done once a chunk rather than once a message). At most ``in_flight`` chunks are handed
  over and not yet ``done()``: while the reactor is behind, the thread stops receiving, so
  the backlog stays in ZeroMQ's queues (bounded by ``receive_hwm``), never in this
  process's memory. Every GIL release the thread makes while the reactor wants the GIL
  may cost it a switch interval: it makes few (frames are received without ``getsockopt``,
  a wake-up of the thread only when it waits for a free chunk).
* **Backpressure.** ``pause()`` / ``resume()``: paused, no socket is read. A PUB sender
  then drops what does not fit our queues (seen as sequence gaps by the source), a PUSH
  or DEALER sender blocks or queues on its side.
* **Replies and reconnects.** ``send(index, frames)`` (a ROUTER reply), ``reconnect(index)``
  (a SUB socket's endpoint disconnected and connected again) are queued commands.
* **Stop.** ``stop()`` sends the queued replies, closes the sockets (ROUTER with
  ``linger_secs`` so its replies leave) and fires once the thread has ended and the
  bound ports are released. ZeroMQ closes a socket in its own I/O thread, after
  ``close()`` returned: the receiver has a context of its own (unless one is given) and
  terminates it, which waits for that, so a source started again at once (a reload) can
  bind the same port.
"""

from __future__ import annotations

import collections
import socket as stdsocket
import threading
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from logrouter.lazy_import import lazy
from logrouter.serial import clean_failure
from logrouter.wire.errors import detached

zmq = lazy("zmq")  # loaded when a receiver starts: the config check imports this module everywhere

SUB = "sub"
ROUTER = "router"
PULL = "pull"

#: how long the thread sleeps in poll when nothing happens; only bounds how late it sees
#: a command if a wake-up byte were ever lost (they are not: the socketpair is local)
_POLL_MS = 1000


@dataclass(frozen=True)
class SocketSpec:
    """One socket: ``kind`` (``sub`` connects, ``router``/``pull`` bind) and its endpoint."""

    kind: str
    endpoint: str
    subscriptions: tuple[bytes, ...] = (b"",)


class Received(NamedTuple):
    """One message: the index of its socket, the ROUTER routing id (else None), and what
    ``decode(kind, frames)`` returned for the rest of its frames (an exception it raised
    is returned in its place)."""

    socket: int
    identity: Optional[bytes]
    decoded: Any
    size: int


def receive_message(sock: zmq.Socket) -> Optional[list[bytes]]:
    """The frames of the next message on ``sock``, or None when it holds none now.

    Not ``recv_multipart``: it asks for ``RCVMORE`` with ``getsockopt`` after each frame,
    which makes an enum of the option every time (over a microsecond a frame, more than
    receiving it); a ``Frame`` says ``more`` itself.
    """
    try:
        frame = sock.recv(zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return None
    frames = [frame.bytes]
    while frame.more:
        # The rest of a message arrives with its first frame (ZeroMQ delivers whole messages).
        frame = sock.recv(zmq.NOBLOCK, copy=False)
        frames.append(frame.bytes)
    return frames


class ZmqReceiver:
    log = Logger(namespace="logrouter.source.zmq")

    def __init__(
        self,
        reactor: Any,
        specs: list[SocketSpec],
        decode: Callable[[str, list[bytes]], Any],
        deliver: Callable[[list[Received]], None],
        *,
        name: str = "zmq",
        max_chunk_messages: int = 512,
        max_chunk_bytes: int = 8 << 20,
        in_flight: int = 2,
        receive_hwm: int = 1000,
        max_message_bytes: int = -1,
        linger_secs: float = 1.0,
        context: Optional[zmq.Context] = None,
        finish: Optional[Callable[[list[Received]], list[Received]]] = None,
    ) -> None:
        self.reactor = reactor
        self.specs = list(specs)
        self.decode = decode
        self.deliver = deliver
        #: runs in the thread on each chunk and gives what is delivered in its place (work
        #: done once a chunk, such as one native call for all its messages)
        self.finish = finish
        self.name = name
        self.max_chunk_messages = max_chunk_messages
        self.max_chunk_bytes = max_chunk_bytes
        self.in_flight = in_flight
        self.receive_hwm = receive_hwm
        self.max_message_bytes = max_message_bytes
        self.linger_secs = linger_secs
        self.context = context  # None: one of its own, made and terminated by the thread
        #: the endpoints as bound (``tcp://127.0.0.1:43122`` for ``tcp://127.0.0.1:*``)
        self.bound: list[str] = [s.endpoint for s in self.specs]
        self._lock = threading.Lock()
        self._commands: collections.deque[tuple[Any, ...]] = collections.deque()
        self._handed = 0  # chunks delivered and not yet done(); under _lock
        self._outbox: collections.deque[list[Received]] = collections.deque()  # handed, not yet delivered; under _lock
        self._called = False  # a _deliver_handed is on its way to the reactor; under _lock
        self._paused = False
        self._stopping = False
        self._wake_r, self._wake_w = stdsocket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread: Optional[threading.Thread] = None
        self._started: Optional[defer.Deferred] = None
        self._stopped: defer.Deferred = defer.Deferred()

    # -- reactor side ------------------------------------------------------------------------

    def start(self) -> defer.Deferred:
        """Create, bind and connect the sockets in the thread; fires with the bound endpoints,
        or fails with the reason (an address in use, a bad endpoint) once the thread gave up."""
        self._started = defer.Deferred()
        self._thread = threading.Thread(target=self._run, name=f"logrouter-zmq-{self.name}", daemon=True)
        self._thread.start()
        return self._started

    def _deliver_handed(self) -> None:
        """Deliver the chunks handed over, in order (on the reactor)."""
        while True:
            with self._lock:
                if not self._outbox:
                    self._called = False
                    return
                chunk = self._outbox.popleft()
            try:
                self.deliver(chunk)
            except Exception:  # noqa: BLE001 - a bug in deliver costs its chunk, not the ones after it
                self.log.failure("ZeroMQ receiver {name}: delivering a chunk failed", name=self.name)

    def pause(self) -> None:
        self._paused = True
        self._wake()

    def resume(self) -> None:
        self._paused = False
        self._wake()

    @property
    def handed(self) -> int:
        """Chunks delivered (or on their way to the reactor) and not yet ``done()``."""
        with self._lock:
            return self._handed

    def done(self) -> None:
        """The reactor finished with one delivered chunk: the thread may hand over another."""
        with self._lock:
            blocked = self._handed >= self.in_flight
            self._handed -= 1
        if blocked:
            # Only a thread that stopped reading for want of a free chunk needs waking
            # (a wake-up is a send, which hands the GIL to the thread and waits for it back).
            self._wake()

    def send(self, index: int, frames: list[bytes]) -> None:
        self._command(("send", index, frames))

    def reconnect(self, index: int) -> None:
        self._command(("reconnect", index))

    def stop(self) -> defer.Deferred:
        if self._thread is None:
            return defer.succeed(None)
        if not self._stopping:
            self._stopping = True
            self._wake()
        return self._stopped

    def _command(self, command: tuple[Any, ...]) -> None:
        self._commands.append(command)
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a byte already waits: the thread wakes anyway

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        context = self.context or zmq.Context()
        try:
            self._run_in(context)
        finally:
            if self.context is None:
                context.term()  # returns once every socket is closed and its ports released
            self.reactor.callFromThread(self._stopped.callback, None)

    def _run_in(self, context: zmq.Context) -> None:
        sockets: list[zmq.Socket] = []
        try:
            for spec in self.specs:
                sockets.append(self._open(context, spec))
            self.bound = [
                s.getsockopt_string(zmq.LAST_ENDPOINT) if spec.kind != SUB else spec.endpoint
                for s, spec in zip(sockets, self.specs)
            ]
        except Exception as e:  # noqa: BLE001 - reported to start()'s caller, whatever it is
            for s in sockets:
                s.close(0)
            self._close_wake()
            failure = RuntimeError(f"cannot open {spec.kind} socket on {spec.endpoint}: {e}")
            self.reactor.callFromThread(self._started.errback, failure)
            return
        self.reactor.callFromThread(self._started.callback, list(self.bound))
        try:
            self._loop(sockets)
        except Exception:  # noqa: BLE001 - a bug here must be seen, and must not hang stop()
            # Taken here: on the reactor thread there is no current exception to log.
            failure = clean_failure(Failure())
            self.reactor.callFromThread(self.log.failure, "ZeroMQ receiver thread of {name} failed", failure,
                                        name=self.name)
        finally:
            self._run_commands(sockets)  # replies queued until the end still leave
            for s, spec in zip(sockets, self.specs):
                s.close(int(self.linger_secs * 1000) if spec.kind == ROUTER else 0)
            self._close_wake()

    def _open(self, context: zmq.Context, spec: SocketSpec) -> zmq.Socket:
        s = context.socket({SUB: zmq.SUB, ROUTER: zmq.ROUTER, PULL: zmq.PULL}[spec.kind])
        try:
            s.setsockopt(zmq.RCVHWM, self.receive_hwm)
            s.setsockopt(zmq.LINGER, 0)
            if self.max_message_bytes > 0:
                # ZeroMQ drops the connection of a peer sending a bigger frame, before
                # allocating it: a sender cannot make us buffer an unbounded message.
                s.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
            if spec.kind == SUB:
                for prefix in spec.subscriptions:
                    s.setsockopt(zmq.SUBSCRIBE, prefix)
                s.connect(spec.endpoint)
            else:
                if spec.kind == ROUTER:
                    s.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a reply to a gone peer is dropped, not an error
                s.bind(spec.endpoint)
        except Exception:
            s.close(0)
            raise
        return s

    def _close_wake(self) -> None:
        self._wake_r.close()
        self._wake_w.close()

    def _loop(self, sockets: list[zmq.Socket]) -> None:
        readers = zmq.Poller()
        for s in sockets:
            readers.register(s, zmq.POLLIN)
        readers.register(self._wake_r, zmq.POLLIN)
        waker = zmq.Poller()
        waker.register(self._wake_r, zmq.POLLIN)
        turn = 0  # where the next chunk starts reading, so no socket starves the others
        while True:
            self._run_commands(sockets)
            if self._stopping:
                return
            with self._lock:
                may_read = not self._paused and self._handed < self.in_flight
            events = dict((readers if may_read else waker).poll(_POLL_MS))
            if self._wake_r in events or self._wake_r.fileno() in events:
                self._drain_wake()
            if not may_read or self._stopping or self._paused:
                continue  # (paused again: a pause that came while polling holds from now on)
            ready = [i for i, s in enumerate(sockets) if events.get(s)]
            if not ready:
                continue
            chunk = self._read_chunk(sockets, ready, turn)
            turn += 1
            if chunk:
                with self._lock:
                    self._handed += 1
                    self._outbox.append(chunk)
                    call = not self._called
                    self._called = True
                if call:
                    # One call for the chunks handed over before the reactor got to them:
                    # each callFromThread writes to the reactor's waker.
                    self.reactor.callFromThread(self._deliver_handed)

    def _read_chunk(self, sockets: list[zmq.Socket], ready: list[int], turn: int) -> list[Received]:
        """Up to the chunk limits, round robin over the ready sockets, each message decoded
        (then the chunk given to ``finish``)."""
        chunk: list[Received] = []
        size = 0
        order = ready[turn % len(ready) :] + ready[: turn % len(ready)]
        active = list(order)
        decode = self.decode
        kinds = [spec.kind for spec in self.specs]
        max_messages, max_bytes = self.max_chunk_messages, self.max_chunk_bytes
        while active and len(chunk) < max_messages and size < max_bytes:
            for index in list(active):
                frames = receive_message(sockets[index])
                if frames is None:
                    active.remove(index)
                    continue
                kind = kinds[index]
                identity = None
                if kind == ROUTER:
                    identity = frames.pop(0)
                n = 0
                for frame in frames:
                    n += len(frame)
                try:
                    decoded = decode(kind, frames)
                except Exception as e:  # noqa: BLE001 - the source judges it (counted, replied)
                    decoded = detached(e)
                chunk.append(Received(index, identity, decoded, n))
                size += n
                if len(chunk) >= max_messages or size >= max_bytes:
                    break
        if chunk and self.finish is not None:
            try:
                chunk = self.finish(chunk)
            except Exception as e:  # noqa: BLE001 - a bug there costs the chunk's messages, not the thread
                chunk = [Received(item.socket, item.identity, detached(e), item.size) for item in chunk]
        return chunk

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _run_commands(self, sockets: list[zmq.Socket]) -> None:
        commands = self._commands
        while commands:
            command = commands.popleft()
            try:
                if command[0] == "send":
                    sockets[command[1]].send_multipart(command[2], zmq.NOBLOCK)
                elif command[0] == "reconnect":
                    spec = self.specs[command[1]]
                    s = sockets[command[1]]
                    s.disconnect(spec.endpoint)
                    s.connect(spec.endpoint)
            except zmq.Again:
                pass  # the peer's queue is full or it is gone: a reply it cannot take is dropped
            except zmq.ZMQError as e:
                self.reactor.callFromThread(
                    self.log.warn, "ZeroMQ {command} on {name} failed: {error}", command=command[0], name=self.name, error=str(e)
                )

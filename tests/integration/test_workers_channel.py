"""``logrouter.workers.channel`` (and the supervisor's reload check): a real
``SOCK_SEQPACKET`` pair carrying JSON messages and file descriptors, read by calling
``doRead`` by hand on a ``MemoryReactor``; ``PassedConnections`` with a stub reactor.
No worker processes."""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.testing import MemoryReactor

from logrouter.config.load import load_string
from logrouter.workers import channel as channel_module
from logrouter.workers.channel import Channel, PassedConnections, PassedPort, channel_pair

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SOCK_SEQPACKET and SCM_RIGHTS as on Linux")


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


class Recorder:
    def __init__(self) -> None:
        self.messages: list[tuple[dict, list[int]]] = []
        self.closed = 0

    def on_message(self, message: dict, fds: list[int]) -> None:
        self.messages.append((message, fds))

    def on_closed(self) -> None:
        self.closed += 1


@pytest.fixture
def pair():
    """(reactor, supervisor channel, its recorder, worker channel, its recorder)."""
    reactor = MemoryReactor()
    ours, theirs = channel_pair()
    a, b = Recorder(), Recorder()
    left = Channel(reactor, ours, a.on_message, a.on_closed)
    right = Channel(reactor, theirs, b.on_message, b.on_closed)
    yield reactor, left, a, right, b
    for ch in (left, right):
        ch.sock.close()
    for recorder in (a, b):
        for _, fds in recorder.messages:
            for fd in fds:
                if is_open(fd):
                    os.close(fd)


@pytest.fixture
def tcp_pair():
    """A connected TCP pair (client, server side)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    yield client, server
    client.close()
    server.close()


def test_channel_pair_ends() -> None:
    ours, theirs = channel_pair()
    try:
        assert ours.type == socket.SOCK_SEQPACKET and theirs.type == socket.SOCK_SEQPACKET
        assert ours.family == socket.AF_UNIX
        assert ours.getblocking() is False
        assert theirs.getblocking() is True  # the worker makes its end non-blocking
    finally:
        ours.close()
        theirs.close()


def test_channels_register_with_the_reactor(pair) -> None:
    reactor, left, _, right, _ = pair
    assert reactor.readers == {left, right}
    assert left.fileno() == left.sock.fileno() >= 0
    assert left.sock.getblocking() is False and right.sock.getblocking() is False


def test_a_message_arrives_whole(pair) -> None:
    _, left, _, right, b = pair
    assert left.send({"op": "metrics", "id": 7, "text": "x" * 1000})
    right.doRead()
    assert b.messages == [({"op": "metrics", "id": 7, "text": "x" * 1000}, [])]


def test_messages_both_ways_and_in_order(pair) -> None:
    _, left, a, right, b = pair
    for i in range(5):
        assert left.send({"op": "n", "i": i})
    assert right.send({"op": "ready"})
    right.doRead()
    left.doRead()
    assert [m["i"] for m, _ in b.messages] == [0, 1, 2, 3, 4]
    assert a.messages == [({"op": "ready"}, [])]


def test_doread_with_nothing_waiting_returns(pair) -> None:
    _, _, _, right, b = pair
    right.doRead()
    assert b.messages == [] and b.closed == 0 and not right.closed


def test_doread_takes_a_bounded_number_per_turn(pair) -> None:
    _, left, _, right, b = pair
    extra = 5
    for i in range(channel_module.MESSAGES_PER_TURN + extra):
        assert left.send({"i": i})
    right.doRead()
    assert len(b.messages) == channel_module.MESSAGES_PER_TURN
    right.doRead()
    assert [m["i"] for m, _ in b.messages] == list(range(channel_module.MESSAGES_PER_TURN + extra))


def test_a_passed_pipe_works(pair) -> None:
    _, left, _, right, b = pair
    read_end, write_end = os.pipe()
    try:
        assert left.send({"op": "connection", "source": "forward"}, [write_end])
        right.doRead()
        [(message, fds)] = b.messages
        assert message == {"op": "connection", "source": "forward"}
        assert len(fds) == 1 and fds[0] != write_end
        os.write(fds[0], b"through the passed fd")
        assert os.read(read_end, 100) == b"through the passed fd"
        os.close(fds[0])
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_passed_tcp_connection_works(pair, tcp_pair) -> None:
    _, left, _, right, b = pair
    client, server = tcp_pair
    assert left.send({"op": "connection", "source": "forward"}, [server.fileno()])
    server.close()  # the sender's copy: the receiver has its own
    right.doRead()
    [(message, [fd])] = b.messages
    assert message["source"] == "forward"
    passed = socket.socket(fileno=fd)
    try:
        assert passed.family == socket.AF_INET
        assert passed.getpeername() == client.getsockname()
        client.sendall(b"hello")
        assert passed.recv(10) == b"hello"
        passed.sendall(b"back")
        assert client.recv(10) == b"back"
    finally:
        passed.close()


def test_a_message_not_json_is_dropped(pair) -> None:
    _, left, _, right, b = pair
    left.sock.send(b"\xff not json {")
    assert left.send({"op": "after"})
    right.doRead()
    assert b.messages == [({"op": "after"}, [])]
    assert not right.closed and b.closed == 0


def test_a_message_not_json_with_fds_closes_them(pair) -> None:
    _, left, _, right, b = pair
    read_end, write_end = os.pipe()
    try:
        before = open_fds()
        socket.send_fds(left.sock, [b"not json"], [write_end])
        right.doRead()
        assert b.messages == []
        assert open_fds() == before  # the received copy was closed again
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_peer_closing_closes_the_channel(pair) -> None:
    reactor, left, a, right, b = pair
    left.sock.close()
    right.doRead()
    assert b.closed == 1
    assert right.closed
    assert right.fileno() == -1
    assert right not in reactor.readers
    assert right.send({"op": "ready"}) is False
    right.close()  # a second close does nothing
    assert b.closed == 1


def test_messages_sent_before_the_peer_closed_still_arrive(pair) -> None:
    _, left, _, right, b = pair
    assert left.send({"op": "last"})
    left.sock.close()
    right.doRead()
    assert b.messages == [({"op": "last"}, [])]
    assert b.closed == 1 and right.closed


def test_close_removes_the_reader_and_calls_on_closed(pair) -> None:
    reactor, left, a, right, _ = pair
    left.close()
    assert left.closed and a.closed == 1
    assert left not in reactor.readers and right in reactor.readers
    assert left.send({"op": "x"}) is False
    assert left.fileno() == -1


def test_connection_lost_closes(pair) -> None:
    reactor, left, a, _, _ = pair
    left.connectionLost(None)
    assert left.closed and a.closed == 1 and left not in reactor.readers


def test_send_to_a_closed_peer_is_false(pair) -> None:
    _, left, _, right, _ = pair
    right.sock.close()
    assert left.send({"op": "ready"}) is False


def test_send_is_false_when_the_buffer_is_full(pair) -> None:
    _, left, _, right, b = pair
    message = {"pad": "x" * 65000}
    sent = 0
    for _ in range(10_000):  # the kernel caps the buffer far below 10000 * 64 KiB
        if not left.send(message):
            break
        sent += 1
    else:
        pytest.fail("the channel's buffer never filled")
    assert sent > 0
    assert left.send({"op": "small"}) in (True, False)  # may still fit; must not raise
    # Nothing was lost or cut: the reader gets every message that was accepted.
    while True:
        count = len(b.messages)
        right.doRead()
        if len(b.messages) == count:
            break
    assert len(b.messages) >= sent
    assert all(m == message for m, _ in b.messages[:sent])
    assert left.send(message)  # room again


def test_an_on_message_failure_is_logged_and_the_channel_goes_on(pair) -> None:
    """The fds are the callee's once handed over: the channel does not close them again
    (a second close could hit an unrelated fd that reused the number)."""
    reactor = MemoryReactor()
    ours, theirs = channel_pair()
    seen = []

    def on_message(message: dict, fds: list[int]) -> None:
        seen.append(message)
        for fd in fds:
            os.close(fd)  # like WorkerProcess._message, which closes them first
        if message.get("op") == "boom":
            raise RuntimeError("handler failed")

    sender = Channel(reactor, ours, lambda m, f: None, lambda: None)
    receiver = Channel(reactor, theirs, on_message, lambda: None)
    read_end, write_end = os.pipe()
    try:
        before = open_fds()
        assert sender.send({"op": "boom"}, [write_end])
        assert sender.send({"op": "next"})
        receiver.doRead()
        assert seen == [{"op": "boom"}, {"op": "next"}]
        assert open_fds() == before
        assert not receiver.closed
    finally:
        os.close(read_end)
        os.close(write_end)
        ours.close()
        theirs.close()


def test_json_that_is_not_an_object_does_not_break_doread(pair) -> None:
    reactor = MemoryReactor()
    ours, theirs = channel_pair()
    seen = []

    def on_message(message: dict, fds: list[int]) -> None:  # like WorkerProcess._message
        seen.append(message.get("op"))

    sender = Channel(reactor, ours, lambda m, f: None, lambda: None)
    receiver = Channel(reactor, theirs, on_message, lambda: None)
    try:
        ours.send(json.dumps([1, 2]).encode())
        assert sender.send({"op": "next"})
        receiver.doRead()  # the list is dropped; the next message is still read
        assert seen == ["next"]
    finally:
        ours.close()
        theirs.close()


# -- PassedConnections --------------------------------------------------------------------


class StubReactor:
    """Records adoptStreamConnection calls, checking the fd is open while it is called."""

    def __init__(self, fail: bool = False) -> None:
        self.adopted: list[tuple[int, int, object, bool, int]] = []
        self.fail = fail

    def adoptStreamConnection(self, fd: int, family: int, factory: object) -> None:
        if self.fail:
            raise OSError(9, "refused by the stub")
        # What Twisted does: it makes its own socket from a dup of the fd.
        self.adopted.append((fd, family, factory, is_open(fd), os.dup(fd)))


def test_take_of_an_unknown_source_is_none() -> None:
    passed = PassedConnections(StubReactor(), {"forward": ("127.0.0.1", 24224)})
    made = []
    assert passed.take("other", lambda: made.append(1)) is None
    assert made == []  # no factory was built for it
    assert passed.factories == {}


def test_take_of_a_shared_source() -> None:
    passed = PassedConnections(StubReactor(), {"forward": ("127.0.0.1", 24224), "v6": ("::1", 5000)})
    factory = object()
    port = passed.take("forward", lambda: factory)
    assert isinstance(port, PassedPort)
    address = port.getHost()
    assert isinstance(address, IPv4Address)
    assert (address.type, address.host, address.port) == ("TCP", "127.0.0.1", 24224)
    assert passed.factories == {"forward": factory}
    v6 = passed.take("v6", object).getHost()
    assert isinstance(v6, IPv6Address) and (v6.host, v6.port) == ("::1", 5000)


def test_stop_listening_releases_the_source() -> None:
    passed = PassedConnections(StubReactor(), {"forward": ("127.0.0.1", 24224)})
    port = passed.take("forward", object)
    d = port.stopListening()
    assert d.called
    assert passed.factories == {}


def test_adopt_hands_the_connection_to_the_reactor_and_closes_the_fd(tcp_pair) -> None:
    client, server = tcp_pair
    reactor = StubReactor()
    passed = PassedConnections(reactor, {"forward": ("127.0.0.1", 24224)})
    factory = object()
    passed.take("forward", lambda: factory)
    fd = server.detach()  # the fd is the registry's now
    passed.adopt("forward", [fd])
    assert passed.adopted == 1 and passed.refused == 0
    [(got_fd, family, got_factory, was_open, copy)] = reactor.adopted
    assert (got_fd, family, got_factory, was_open) == (fd, socket.AF_INET, factory, True)
    with pytest.raises(OSError):
        os.fstat(fd)  # closed once adopted
    # The reactor's copy is the connection.
    adopted = socket.socket(fileno=copy)
    try:
        client.sendall(b"ping")
        assert adopted.recv(10) == b"ping"
    finally:
        adopted.close()


def test_adopt_without_a_factory_closes_and_counts_refused(tcp_pair) -> None:
    client, server = tcp_pair
    reactor = StubReactor()
    passed = PassedConnections(reactor, {"forward": ("127.0.0.1", 24224)})
    port = passed.take("forward", object)
    port.stopListening()  # released: no factory any more
    fd = server.detach()
    read_end, write_end = os.pipe()
    passed.adopt("forward", [fd, write_end])
    assert passed.refused == 2 and passed.adopted == 0
    assert reactor.adopted == []
    for closed in (fd, write_end):
        with pytest.raises(OSError):
            os.fstat(closed)
    client.settimeout(5)
    assert client.recv(10) == b""  # the client sees the connection closed
    os.close(read_end)


def test_adopt_for_a_source_never_taken_is_refused() -> None:
    passed = PassedConnections(StubReactor(), {})
    read_end, write_end = os.pipe()
    passed.adopt("nobody", [write_end])
    assert passed.refused == 1
    assert not is_open(write_end)
    os.close(read_end)


def test_adopt_of_something_not_a_socket_is_refused_and_closed() -> None:
    reactor = StubReactor()
    passed = PassedConnections(reactor, {"forward": ("127.0.0.1", 24224)})
    passed.take("forward", object)
    read_end, write_end = os.pipe()
    passed.adopt("forward", [write_end])
    assert passed.refused == 1 and passed.adopted == 0
    assert reactor.adopted == []
    assert not is_open(write_end)
    os.close(read_end)


def test_adopt_failing_in_the_reactor_is_refused_and_closed(tcp_pair) -> None:
    _, server = tcp_pair
    passed = PassedConnections(StubReactor(fail=True), {"forward": ("127.0.0.1", 24224)})
    passed.take("forward", object)
    fd = server.detach()
    passed.adopt("forward", [fd])
    assert passed.refused == 1 and passed.adopted == 0
    assert not is_open(fd)


# -- the supervisor's reload check ---------------------------------------------------------

BASE = """
[router]
workers = {workers}
metrics_listen = "{metrics}"

[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "{listen}"
{extra}
[sinks.files]
type = "file"
inputs = ["forward"]
path = "files"
prefix = "{prefix}"
"""


def config(workers=2, metrics="tcp:0:interface=127.0.0.1", listen="tcp:24224:interface=127.0.0.1", extra="", prefix="a"):
    return load_string(BASE.format(workers=workers, metrics=metrics, listen=listen, extra=extra, prefix=prefix))


def test_kept_until_restart() -> None:
    """What the supervisor keeps as running on a reload (TCP/TLS sources are applied)."""
    from logrouter.workers.reloads import kept_until_restart as _kept_until_restart

    old = config()
    assert _kept_until_restart(old, config()) == []
    assert _kept_until_restart(old, config(prefix="b")) == []  # a sink's option: a reload does it
    second = '[sources.more]\ntype = "fluent_forward"\nlisten = "tcp:24226:interface=127.0.0.1"\n'
    assert _kept_until_restart(old, config(extra=second)) == []  # a new listener: applied
    assert _kept_until_restart(old, config(listen="tcp:24225:interface=127.0.0.1")) == []
    assert _kept_until_restart(old, config(workers=3)) == ["router.workers"]
    assert _kept_until_restart(old, config(metrics="tcp:9999:interface=127.0.0.1")) == ["router.metrics_listen"]

"""``stream.write_now``: a reply goes out in one ``send`` when nothing waits before it, else
through ``transport.write``, and the peer gets every byte in order either way.

Real connected sockets (a ``socketpair``) under ``tcp.Server``, the class of every plain
TCP connection a stream source accepts or adopts, with a ``MemoryReactor`` standing in
for the reactor: what ``write`` registers shows in its ``writers``."""

from __future__ import annotations

import socket

from twisted.internet import protocol, tcp
from twisted.internet.testing import MemoryReactor, StringTransport

from logrouter.sources.stream import write_now


def connection(send_buffer: int | None = None) -> tuple[tcp.Server, socket.socket, MemoryReactor]:
    ours, peer = socket.socketpair()
    if send_buffer is not None:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    ours.setblocking(False)
    peer.settimeout(5)
    reactor = MemoryReactor()
    server = tcp.Server(ours, protocol.Protocol(), ("127.0.0.1", 1), None, 1, reactor)
    return server, peer, reactor


def received(peer: socket.socket, size: int) -> bytes:
    got = b""
    for _ in range(10_000):  # bounded: each recv returns at least one byte or raises
        if len(got) >= size:
            break
        got += peer.recv(size - len(got))
    return got


def drain(server: tcp.Server, peer: socket.socket, size: int) -> bytes:
    """Let the reactor's writes run (``doWrite``) while the peer reads, until ``size`` bytes came."""
    got = b""
    for _ in range(10_000):
        if len(got) >= size:
            break
        if server.dataBuffer or server._tempDataLen:
            server.doWrite()
        peer.setblocking(False)
        try:
            got += peer.recv(1 << 20)
        except BlockingIOError:
            pass
    return got


def test_an_idle_connection_sends_at_once_without_the_reactor() -> None:
    server, peer, reactor = connection()
    write_now(server, b"ack-1")
    assert received(peer, 5) == b"ack-1"
    assert server not in reactor.writers and not server.dataBuffer and not server._tempDataLen


def test_with_data_buffered_the_reply_waits_its_turn() -> None:
    server, peer, reactor = connection()
    server.write(b"first ")
    assert server in reactor.writers
    write_now(server, b"second")
    assert drain(server, peer, 12) == b"first second"


def test_what_the_socket_does_not_take_is_left_to_write() -> None:
    server, peer, reactor = connection(send_buffer=4096)
    data = bytes(range(256)) * 4096  # 1 MiB: far past the socket's buffer
    write_now(server, data)
    assert server in reactor.writers  # the rest is buffered
    assert drain(server, peer, len(data)) == data


def test_a_closed_peer_leaves_it_to_write() -> None:
    server, peer, reactor = connection()
    peer.close()
    write_now(server, b"x" * 100)  # the error comes back from writeSomeData, not raised
    assert server._tempDataLen == 100 and server in reactor.writers


def test_other_transports_use_write() -> None:
    transport = StringTransport()
    write_now(transport, b"reply")
    assert transport.value() == b"reply"


def test_a_disconnecting_connection_uses_write() -> None:
    server, peer, reactor = connection()
    server.disconnecting = True
    write_now(server, b"late")
    assert server._tempDataLen == 4

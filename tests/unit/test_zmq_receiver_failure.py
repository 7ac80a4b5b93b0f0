"""A bug in the ZeroMQ receiver's thread is logged with its traceback, and stop() still ends."""

from __future__ import annotations

from helpers import spin
from twisted.logger import globalLogPublisher

from logrouter.sources.zmq_receiver import PULL, SocketSpec, ZmqReceiver


def test_a_failing_receive_loop_is_logged_with_what_failed(threaded_reactor) -> None:
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    receiver = ZmqReceiver(threaded_reactor, [SocketSpec(PULL, "tcp://127.0.0.1:*")], lambda kind, frames: frames,
                           lambda chunk: None, name="test-pull")

    def broken_loop(sockets):
        raise ZeroDivisionError("a bug in the loop")

    receiver._loop = broken_loop  # type: ignore[method-assign]
    try:
        spin(threaded_reactor, receiver.start())
        spin(threaded_reactor, receiver.stop())
    finally:
        globalLogPublisher.removeObserver(events.append)
    failures = [e for e in events if "ZeroMQ receiver thread" in (e.get("log_format") or "")]
    assert len(failures) == 1
    assert failures[0]["log_failure"].check(ZeroDivisionError)
    assert "a bug in the loop" in failures[0]["log_failure"].getTraceback()

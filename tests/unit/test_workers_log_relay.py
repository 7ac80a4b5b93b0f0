"""A worker's log lines reach the supervisor's log under their own namespace and level,
marked with the worker's index; other output under the worker's name."""

from __future__ import annotations

from twisted.logger import LogLevel, formatEvent, globalLogPublisher

from logrouter.workers.supervisor import WorkerProcess


def relayed(data: bytes, index: int = 1) -> list[dict]:
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        worker = WorkerProcess(supervisor=None, index=index)
        worker.childDataReceived(1, data)
    finally:
        globalLogPublisher.removeObserver(events.append)
    return events


def test_a_worker_line_keeps_its_namespace_and_level() -> None:
    (event,) = relayed(b"[logrouter.router.Router#warn] spool backlog 5 bytes: sources paused\n")
    assert event["log_namespace"] == "logrouter.router.Router"
    assert event["log_level"] == LogLevel.warn
    assert formatEvent(event) == "worker 1: spool backlog 5 bytes: sources paused"


def test_lines_come_whole_however_the_output_is_split() -> None:
    line = b"[logrouter.sources.fluent_forward.FluentForwardSource#error] closed 127.0.0.9: bad frame\n"
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        worker = WorkerProcess(supervisor=None, index=0)
        for i in range(len(line)):
            worker.childDataReceived(2, line[i : i + 1])
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert [formatEvent(e) for e in events] == ["worker 0: closed 127.0.0.9: bad frame"]
    assert events[0]["log_level"] == LogLevel.error


def test_other_output_goes_under_the_worker_name() -> None:
    for data in (b"Traceback (most recent call last):\n", b"[no level] text\n", b"[a#shout] text\n", b"[#info] x\n"):
        (event,) = relayed(data, index=3)
        assert event["log_namespace"] == "logrouter.worker-3"
        assert event["log_level"] == LogLevel.info
        assert formatEvent(event) == data.decode().rstrip("\n")

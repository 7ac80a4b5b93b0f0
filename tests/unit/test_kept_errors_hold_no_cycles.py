"""Errors kept for later hold no reference cycle through the frames they passed.

The daemon runs the cycle collector only every few seconds (``logrouter.gc_tuning``).
An exception's traceback (a Twisted Failure's too) holds every frame it passed through,
and their locals: the whole inflated payload of a decoder, the items of a sink's failed
run, a message being decoded off the reactor. Kept in a local of such a frame or in a
structure those frames reach, that is a cycle, and it keeps all of it until the
collector runs. Invalid events, undecodable messages, a failed inflater, a failed
thread job: each must leave nothing for the collector.
"""

from __future__ import annotations

import gc
import struct
import weakref
from functools import partial
from types import SimpleNamespace

import pytest
from twisted.internet import task

from logrouter.sources.logjam import LogjamSource
from logrouter.sources.logjam_native import LogjamBatches
from logrouter.sources.zmq_receiver import PULL
from logrouter.wire import lumberjack as lj
from logrouter.wire.errors import detached
from logrouter.wire.inflate import InflateError, StreamInflater
from logrouter.wire.log_courier_records import decode_records


@pytest.fixture
def collector_off():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def unreachable_after(decode) -> int:
    decode()
    return gc.collect()


@pytest.mark.parametrize("last", [b'{"a": 1', b"\xff\xfe", b"[1, 2]", b"{" * 100_000])
def test_lumberjack(collector_off, last: bytes) -> None:
    frames = lj.encode_json(1, {"a": 1}) + b"2J" + struct.pack(">II", 2, len(last)) + last
    window = lj.encode_window(2) + lj.encode_compressed(frames)

    def decode() -> None:
        out = lj.LumberjackDecoder().feed(window)
        assert [m.invalid for m in out if isinstance(m, lj.Events)] == [1]

    assert unreachable_after(decode) == 0


@pytest.mark.parametrize("last", [b'{"a": 1', b"\xff\xfe", b"[1, 2]", b"{" * 100_000])
def test_log_courier(collector_off, last: bytes) -> None:
    content = struct.pack(">I", 8) + b'{"a": 1}' + struct.pack(">I", len(last)) + last

    def decode() -> None:
        payload = decode_records(content, "JDAT", b"n" * 16, 1 << 20, 100)
        assert payload.invalid == 1

    assert unreachable_after(decode) == 0


def test_a_failed_inflater_keeps_no_traceback(collector_off) -> None:
    def decode() -> None:
        inflater = StreamInflater(1 << 20)
        for data in (b"\x78\x9c" + b"\xff" * 1000, b"more"):
            with pytest.raises(InflateError):
                inflater.feed(data)
        assert inflater._failed is not None and inflater._failed.__traceback__ is None

    assert unreachable_after(decode) == 0


@pytest.mark.parametrize("native", [True, False])
def test_a_logjam_message_that_does_not_decode_keeps_no_traceback(collector_off, native: bool) -> None:
    # the receiver thread's decode of a source (its batches' native reader, its limits, the clock)
    batches = LogjamBatches("logjam_", ["started_ms"])
    if not native:
        batches.native = False
    source = SimpleNamespace(batches=batches, reactor=task.Clock(), limits=(1 << 20, 1 << 20), max_body_bytes=1 << 20)
    source.decode_frames = partial(LogjamSource.decode_frames, source)

    def decode() -> None:
        request = LogjamSource.decode(source, PULL, [b"app-env", b"topic", b"{not json", b"\x00" * 24])
        error = request.decoded
        assert isinstance(error, Exception) and error.__traceback__ is None and error.__context__ is None
        chunk = [request]  # as the receiver keeps it until the reactor takes the chunk
        del chunk, request, error

    assert unreachable_after(decode) == 0


def test_detached_drops_the_traceback_and_the_chain() -> None:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise ValueError("outer") from inner
    except ValueError as e:
        error = detached(e)
    assert (error.__traceback__, error.__context__, error.__cause__) == (None, None, None)
    assert str(error) == "outer"


class _Payload:
    """Stands for the big buffers a failed call's frames hold."""


def _failing_call(refs: list):
    def call(*_):
        payload = _Payload()
        refs.append(weakref.ref(payload))
        raise ValueError("the disk is full")

    return call


def test_a_failed_run_of_a_serial_worker_holds_nothing_after(threaded_reactor, collector_off) -> None:
    from helpers import spin

    from logrouter.serial import SerialWorker

    refs: list = []
    failures: list = []
    worker = SerialWorker(threaded_reactor, _failing_call(refs), "test-serial", on_failure=failures.append)
    spin(threaded_reactor, worker.submit("item"))
    spin(threaded_reactor, worker.stop())
    assert len(failures) == 1 and "the disk is full" in failures[0].getTraceback()  # still says what and where
    assert refs[0]() is None  # freed without the collector


def test_a_failed_offloaded_call_holds_nothing_after(threaded_reactor, collector_off) -> None:
    from helpers import spin

    from logrouter.sources.offload import OffloadPool

    refs: list = []
    pool = OffloadPool(threaded_reactor, 1, "test-offload")
    with pytest.raises(ValueError):
        spin(threaded_reactor, pool.run(_failing_call(refs)))
    spin(threaded_reactor, pool.stop())
    assert refs[0]() is None


def test_a_failed_call_in_a_thread_holds_nothing_after(threaded_reactor, collector_off) -> None:
    from helpers import spin

    from logrouter.serial import defer_to_thread

    refs: list = []
    with pytest.raises(ValueError):
        spin(threaded_reactor, defer_to_thread(_failing_call(refs)))
    assert refs[0]() is None


def test_a_stored_document_that_fails_in_its_own_thread_leaves_no_cycle(collector_off) -> None:
    from logrouter.sources.events import _loads_shallow

    def decode() -> None:
        with pytest.raises(ValueError):
            _loads_shallow(b'{"a": ' + b"x" * 1000)

    assert unreachable_after(decode) == 0


def test_a_failed_spool_write_keeps_its_error_detached(threaded_reactor, tmp_path, monkeypatch) -> None:
    """The spool thread's failed group commit hands each append its error: without a
    traceback, which would hold the writing frame (every item of the run, their joined
    bytes) until the collector ran."""
    from helpers import spin

    from logrouter.spool.log import SpoolLog, SpoolWriteError

    log = SpoolLog(threaded_reactor, str(tmp_path / "spool"))
    log.open()

    def refuse(data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(log, "_write_all", refuse)
    failures: list = []
    spin(threaded_reactor, log.append(b"x" * 1000).addErrback(failures.append))
    spin(threaded_reactor, log.close())
    error = failures[0].value
    assert isinstance(error, SpoolWriteError) and "No space left on device" in str(error)
    assert isinstance(error.__cause__, OSError) and error.__cause__.__traceback__ is None

"""Fixtures shared by many test modules."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

import pytest

from fixtures.pki import make_pki


@pytest.fixture
def threaded_reactor():
    """The global reactor, iterated by hand (``helpers.spin``), with its thread pool
    running for the test (``deferToThread`` needs it; ``reactor.run`` would start it)."""
    from twisted.internet import reactor

    pool = reactor.getThreadPool()
    if not pool.started:
        pool.start()
    yield reactor
    reactor._stopThreadPool()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A throwaway CA with server and client certificates, made at test time."""
    return make_pki(tmp_path_factory.mktemp("pki"))


EXIT_WATCHDOG_SECS = 120.0


def _exit_watchdog(seconds: float) -> None:
    time.sleep(seconds)
    # Still here: something keeps the interpreter from exiting (a non-daemon thread a
    # test left running, which threading._shutdown waits for). Name it instead of hanging.
    frames = sys._current_frames()
    lines = [f"\npytest finished {seconds:.0f}s ago but the process has not exited; threads still running:\n"]
    for thread in threading.enumerate():
        if thread is threading.current_thread():
            continue
        lines.append(f"--- {thread.name} (daemon={thread.daemon})\n")
        frame = frames.get(thread.ident)
        if frame is not None:
            lines.extend(traceback.format_stack(frame))
    sys.stderr.write("".join(lines))
    sys.stderr.flush()
    os._exit(3)


def pytest_unconfigure(config):
    """After the last test and the report: a test that leaves a non-daemon thread behind
    would otherwise keep pytest from ever exiting (a CI time-out, not a failure)."""
    threading.Thread(target=_exit_watchdog, args=(EXIT_WATCHDOG_SECS,), name="exit-watchdog", daemon=True).start()

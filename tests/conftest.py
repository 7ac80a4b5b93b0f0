"""Fixtures every kind of test shares (unit, integration, interop, lake); a fixture of one
kind goes in that folder's conftest.py."""

from __future__ import annotations

import faulthandler

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


def pytest_unconfigure(config):
    """After the last test and the report: a test that leaves a non-daemon thread behind
    would keep pytest from ever exiting (a CI time-out, not a failure). If the process is
    still alive EXIT_WATCHDOG_SECS later, faulthandler's own thread (it needs no GIL, so it
    also sees a hang in the interpreter's finalization) prints every thread's stack and
    exits with status 1."""
    faulthandler.dump_traceback_later(EXIT_WATCHDOG_SECS, exit=True)

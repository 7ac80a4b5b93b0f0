"""Fixtures shared by many test modules."""

from __future__ import annotations

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

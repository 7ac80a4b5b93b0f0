"""What the router refuses to store: a refusal costs only that batch and never hangs its id."""

from __future__ import annotations

import pytest
from twisted.internet import defer

from helpers import spin
from logrouter.batch import Batch
from logrouter.config.load import load_string
from logrouter.failures import UnstorableBatch
from logrouter.router import Router


@pytest.fixture
def router(tmp_path):
    from twisted.internet import reactor

    config = load_string(f'[spool]\npath = "{tmp_path}/spool"\n')
    router = Router(config, reactor)
    router.spool.open()
    yield router
    spin(reactor, router.spool.close())


def nested(depth: int) -> dict:
    value: object = "bottom"
    for _ in range(depth):
        value = [value]
    return {"deep": value}


def refused(d: defer.Deferred) -> str:
    failures: list = []
    d.addErrback(failures.append)
    assert failures, "the batch was accepted"
    assert failures[0].check(UnstorableBatch)
    return failures[0].getErrorMessage()


def test_a_batch_msgpack_cannot_pack_is_refused_and_its_id_can_be_sent_again(router):
    from twisted.internet import reactor

    batch = Batch("t", [(1, nested(2000))], source="in")
    assert "batch cannot be stored" in refused(router.ingest(batch, b"chunk-1"))
    # The resend of the same id is refused again at once; it does not wait for a first copy.
    assert "batch cannot be stored" in refused(router.ingest(batch, b"chunk-1"))
    assert router.intake.unstorable_batches == 2 and not router.spool_failing
    # Other batches, the same id with a storable body included, go on.
    good = Batch("t", [(1, {"ok": True})], source="in")
    assert spin(reactor, router.ingest(good, b"chunk-1")) is None
    assert router.intake.events_in == 1


def test_a_batch_over_the_spool_record_limit_is_refused(router, monkeypatch):
    monkeypatch.setattr("logrouter.ingest.MAX_PAYLOAD", 1000)
    big = Batch("t", [(1, {"blob": "x" * 2000})], source="in")
    assert "exceeds the spool's record limit" in refused(router.ingest(big, None))
    assert router.spool.end == 0

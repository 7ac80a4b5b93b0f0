"""Log Carver and logrouter acknowledging the same Log Courier shipper (optional: about a
minute; run with ``LOGROUTER_LOG_CARVER=1``). ``tests/log_carver.py`` runs both, a plain
run and a full pipeline; what differs is recorded in ``docs/protocols/log_courier.md``.

- Log Carver acknowledges as its own pipeline passes events on, so a payload's ACKN comes
  in steps (its spooler regroups events, its ``test`` output splits half of its acks);
  logrouter acknowledges each payload whole, once every event of it is durable.
- Held back, Log Carver closes the connection once a client sends more than its receiver
  ``max pending payloads`` (after acknowledging what it holds): the shipper reconnects and
  resends. logrouter stops reading and keeps the payloads in flight alive with ACKN 0
  (every ``keepalive_secs``) on the one connection.
"""

from __future__ import annotations

import os

import pytest

from log_carver import FULL_LINES, HOLD_SECS, LINES, compare
from log_courier_shipper import LOG_CARVER, SHIPPER

pytestmark = [
    pytest.mark.skipif(not os.environ.get("LOGROUTER_LOG_CARVER"), reason="optional: set LOGROUTER_LOG_CARVER=1"),
    pytest.mark.timeout(900),
]


def test_log_carver_and_logrouter_acknowledge_the_same_shipper(tmp_path):
    binaries = []
    for program in (SHIPPER, LOG_CARVER):
        path, why = program.ensure_built_with_reason()
        if path is None:
            pytest.skip(why)
        binaries.append(path)
    runs = {(run.receiver.split()[0], run.scenario): run for run in compare(binaries[0], binaries[1], tmp_path)}
    for run in runs.values():
        print(run)
        assert run.acknowledged >= (LINES if run.scenario == "plain" else FULL_LINES)
    carver, carver_full = runs["Log", "plain"], runs["Log", "full"]
    ours, ours_full = runs["logrouter", "plain"], runs["logrouter", "full"]
    assert carver.partial_steps > 0 and ours.partial_steps == 0 and ours_full.partial_steps == 0
    assert carver.connections == 1 and ours.connections == 1
    assert carver_full.connections > 1, "Log Carver closes a connection past its max pending payloads"
    assert ours_full.connections == 1 and ours_full.failures == []
    assert ours_full.zeros >= int(HOLD_SECS // 5), "ACKN 0 every keepalive_secs while held"

"""The spool log: framing, group commit, segment rolls, torn-tail recovery."""

from __future__ import annotations

import os

import pytest
from twisted.internet import defer

from logrouter.spool.log import FRAME_HEADER, SpoolLog, frame, list_segments, scan_segment


@pytest.fixture
def reactor():
    from twisted.internet import reactor

    return reactor


def run(reactor, d: defer.Deferred, timeout: float = 30):
    """Spin the global reactor until ``d`` fires (the spool runs real threads)."""
    from twisted.internet.defer import ensureDeferred  # noqa: F401

    result: list = []
    d.addBoth(result.append)
    deadline = reactor.seconds() + timeout
    while not result and reactor.seconds() < deadline:
        reactor.iterate(0.01)
    assert result, "Deferred did not fire in time"
    if hasattr(result[0], "raiseException"):
        result[0].raiseException()
    return result[0]


def read_payloads(path: str) -> list[bytes]:
    out = []
    for base in list_segments(path):
        name = os.path.join(path, f"{base:020d}.seg")
        with open(name, "rb") as f:
            data = f.read()
        with open(name, "rb") as f:
            scan = scan_segment(f)
        out += [data[o + FRAME_HEADER.size : o + FRAME_HEADER.size + n] for o, n in scan.records]
    return out


@pytest.mark.parametrize("durability", ["fsync", "os", "none"])
def test_appends_are_stored_in_order_with_positions(reactor, tmp_path, durability):
    spool = SpoolLog(reactor, str(tmp_path), durability)
    spool.open()
    payloads = [f"record {i}".encode() * (i + 1) for i in range(50)]
    ds = [spool.append(p) for p in payloads]
    positions = run(reactor, defer.gatherResults(ds))
    expected, pos = [], 0
    for p in payloads:
        expected.append(pos)
        pos += FRAME_HEADER.size + len(p)
    assert positions == expected
    run(reactor, spool.close())
    assert read_payloads(str(tmp_path)) == payloads


def test_group_commit_covers_many_appends_with_few_fsyncs(reactor, tmp_path):
    spool = SpoolLog(reactor, str(tmp_path), "fsync")
    spool.open()
    run(reactor, defer.gatherResults([spool.append(b"x" * 100) for _ in range(1000)]))
    # All 1000 appends were queued before the worker ran: far fewer fsyncs than records.
    assert 1 <= spool.fsyncs <= 2
    assert spool.durable_end == spool.end == 1000 * (FRAME_HEADER.size + 100)
    run(reactor, spool.close())


def test_segments_roll_at_segment_bytes_and_reopen_at_the_end(reactor, tmp_path):
    spool = SpoolLog(reactor, str(tmp_path), "fsync", segment_bytes=1000)
    spool.open()
    run(reactor, defer.gatherResults([spool.append(bytes([i]) * 92) for i in range(30)]))
    run(reactor, spool.close())
    bases = list_segments(str(tmp_path))
    assert len(bases) == 3 and bases[0] == 0
    assert all(b % 100 == 0 for b in bases)  # each segment starts at a record boundary
    again = SpoolLog(reactor, str(tmp_path), "fsync", segment_bytes=1000)
    again.open()
    assert again.end == 30 * 100
    run(reactor, again.append(b"more"))
    run(reactor, again.close())
    assert read_payloads(str(tmp_path))[-1] == b"more"
    assert len(read_payloads(str(tmp_path))) == 31


@pytest.mark.parametrize("cut", [1, 4, 7, 8, 12, 20])
def test_torn_tail_is_truncated_at_open(reactor, tmp_path, cut):
    spool = SpoolLog(reactor, str(tmp_path))
    spool.open()
    run(reactor, defer.gatherResults([spool.append(b"a" * 12), spool.append(b"b" * 12)]))
    run(reactor, spool.close())
    name = tmp_path / f"{0:020d}.seg"
    size = name.stat().st_size
    with open(name, "r+b") as f:
        f.truncate(size - cut)
    again = SpoolLog(reactor, str(tmp_path))
    again.open()
    assert again.end == 20  # only the first whole record is left
    assert name.stat().st_size == 20
    run(reactor, again.append(b"c" * 3))
    run(reactor, again.close())
    assert read_payloads(str(tmp_path)) == [b"a" * 12, b"c" * 3]


def test_frame_layout():
    assert frame(b"abc") == bytes.fromhex("00000003352441c2") + b"abc"

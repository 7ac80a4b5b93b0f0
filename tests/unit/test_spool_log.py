"""The spool log: framing, group commit, segment rolls, reads, and recovery from damage."""

from __future__ import annotations

import os

import pytest
from twisted.internet import defer

from helpers import spin
from logrouter.spool.log import SpoolLog, list_segments
from logrouter.spool.segment import HEADER_SIZE, Damage, Record, frame, walk


@pytest.fixture
def reactor():
    from twisted.internet import reactor

    return reactor


def run(reactor, d: defer.Deferred, timeout: float = 30):
    return spin(reactor, d, timeout)


def fill(reactor, path, payloads, **options) -> SpoolLog:
    spool = SpoolLog(reactor, str(path), **options)
    spool.open()
    run(reactor, defer.gatherResults([spool.append(p) for p in payloads]))
    run(reactor, spool.close())
    return spool


def read_all(reactor, path) -> tuple[list[bytes], SpoolLog]:
    spool = SpoolLog(reactor, str(path))
    spool.open()
    records, position = spool.read(spool.start, spool.end, 1 << 30)
    assert position == spool.end
    run(reactor, spool.close())
    return [r.payload for r in records], spool


@pytest.mark.parametrize("durability", ["fsync", "os", "none"])
def test_appends_are_stored_in_order_with_positions(reactor, tmp_path, durability):
    spool = SpoolLog(reactor, str(tmp_path), durability)
    spool.open()
    payloads = [f"record {i}".encode() * (i + 1) for i in range(50)]
    written = run(reactor, defer.gatherResults([spool.append(p) for p in payloads]))
    expected, pos = [], 0
    for p in payloads:
        expected.append((pos, pos + HEADER_SIZE + len(p)))
        pos += HEADER_SIZE + len(p)
    assert written == expected
    run(reactor, spool.close())
    assert read_all(reactor, tmp_path)[0] == payloads


def test_group_commit_covers_many_appends_with_few_fsyncs(reactor, tmp_path):
    spool = SpoolLog(reactor, str(tmp_path), "fsync")
    spool.open()
    run(reactor, defer.gatherResults([spool.append(b"x" * 100) for _ in range(1000)]))
    # All 1000 appends were queued before the worker ran: far fewer fsyncs than records.
    assert 1 <= spool.fsyncs <= 2
    assert spool.written_end == spool.end == 1000 * (HEADER_SIZE + 100)
    run(reactor, spool.close())


def test_segments_roll_reads_cross_them_and_reopen_at_the_end(reactor, tmp_path):
    payloads = [bytes([i]) * 84 for i in range(30)]  # 100-byte frames
    fill(reactor, tmp_path, payloads, segment_bytes=1000)
    bases = list_segments(str(tmp_path))
    assert bases == [0, 1000, 2000]
    again = SpoolLog(reactor, str(tmp_path), segment_bytes=1000)
    again.open()
    assert again.end == 3000
    records, position = again.read(950 - 50, 2100, max_bytes=1 << 20)  # from record 9 to 21
    assert [r.offset for r in records] == list(range(900, 2100, 100)) and position == 2100
    records, position = again.read(0, 3000, max_bytes=250)  # stops after about 250 bytes
    assert len(records) == 3 and position == 300
    run(reactor, again.append(b"more"))
    run(reactor, again.close())
    assert read_all(reactor, tmp_path)[0] == payloads + [b"more"]


def test_delete_before_keeps_the_segment_being_written(reactor, tmp_path):
    fill(reactor, tmp_path, [b"a" * 84] * 30, segment_bytes=1000)
    spool = SpoolLog(reactor, str(tmp_path), segment_bytes=1000)
    spool.open()
    assert spool.delete_before(1500) == [str(tmp_path / f"{0:020d}.seg")]
    assert spool.start == 1000 and spool.first_segment_end == 2000
    spool.delete_before(10**9)
    assert list_segments(str(tmp_path)) == [2000]
    records, _ = spool.read(0, spool.end)  # positions before the oldest segment: skipped
    assert records[0].offset == 2000
    run(reactor, spool.close())


@pytest.mark.parametrize("cut", [1, 4, 7, 15, 16, 20])
def test_torn_tail_is_cut_and_set_aside(reactor, tmp_path, cut):
    fill(reactor, tmp_path, [b"a" * 12, b"b" * 12])
    name = tmp_path / f"{0:020d}.seg"
    with open(name, "r+b") as f:
        f.truncate(name.stat().st_size - cut)
    again = SpoolLog(reactor, str(tmp_path))
    again.open()
    assert again.end == 28 and again.torn_tails == 1  # only the first whole record is left
    assert name.stat().st_size == 28
    assert (tmp_path / "quarantine" / f"{28:020d}.bad").read_bytes() == frame(b"b" * 12)[: 28 - cut]
    run(reactor, again.append(b"c" * 3))
    run(reactor, again.close())
    assert read_all(reactor, tmp_path)[0] == [b"a" * 12, b"c" * 3]


@pytest.mark.parametrize("offset", [0, 3, 4, 9, 13, 16, 30])
def test_flipped_byte_in_the_middle_is_quarantined_and_the_rest_read(reactor, tmp_path, offset):
    payloads = [b"first" * 4, b"second" * 4, b"third" * 4]
    fill(reactor, tmp_path, payloads)
    name = tmp_path / f"{0:020d}.seg"
    data = bytearray(name.read_bytes())
    second = HEADER_SIZE + 20
    data[second + offset] ^= 0x40
    name.write_bytes(bytes(data))
    payloads_read, spool = read_all(reactor, tmp_path)
    assert payloads_read == [payloads[0], payloads[2]]
    assert spool.quarantined == 1 and spool.torn_tails == 0
    bad = tmp_path / "quarantine" / f"{second:020d}.bad"
    assert bad.read_bytes() == bytes(data[second : second + HEADER_SIZE + 24])


def test_flipped_byte_in_the_last_record_is_set_aside_not_lost(reactor, tmp_path):
    fill(reactor, tmp_path, [b"one" * 5, b"two" * 5])
    name = tmp_path / f"{0:020d}.seg"
    data = bytearray(name.read_bytes())
    data[-1] ^= 1
    name.write_bytes(bytes(data))
    payloads, spool = read_all(reactor, tmp_path)
    assert payloads == [b"one" * 5]
    assert (tmp_path / "quarantine" / f"{HEADER_SIZE + 15:020d}.bad").read_bytes() == bytes(data[HEADER_SIZE + 15 :])


def test_garbage_segment_never_stops_startup(reactor, tmp_path):
    (tmp_path / f"{0:020d}.seg").write_bytes(os.urandom(5000))
    spool = SpoolLog(reactor, str(tmp_path))
    spool.open()
    assert spool.end == 0
    run(reactor, spool.append(b"fresh"))
    run(reactor, spool.close())
    assert read_all(reactor, tmp_path)[0] == [b"fresh"]


def test_walk_finds_frames_around_damage():
    good = [frame(b"x" * n) for n in (1, 2, 3)]
    data = good[0] + b"\x00garbage\xff" + good[1] + good[2][:-1]
    items = list(walk(data, 100))
    assert isinstance(items[0], Record) and items[0].payload == b"x"
    assert isinstance(items[1], Damage) and items[1].offset == 100 + len(good[0])
    assert isinstance(items[2], Record) and items[2].payload == b"xx"
    assert isinstance(items[3], Damage) and items[3].end == 100 + len(data)


def test_frame_layout():
    f = frame(b"abc")
    assert f[:4] == b"LRS1" and f[4:8] == b"\x00\x00\x00\x03" and f[8:12] == bytes.fromhex("352441c2")
    assert len(f) == HEADER_SIZE + 3


def test_a_record_that_asks_for_fsync_gets_one_in_an_os_spool(reactor, tmp_path):
    spool = SpoolLog(reactor, str(tmp_path), "os")
    spool.open()
    run(reactor, spool.append(b"page cache is enough"))
    assert spool.fsyncs == 0
    run(reactor, spool.append(b"this one must be on disk", "fsync"))
    assert spool.fsyncs == 1
    run(reactor, spool.close())


def test_an_os_record_in_an_fsync_spool_is_not_fsynced_alone(reactor, tmp_path):
    spool = SpoolLog(reactor, str(tmp_path), "fsync")
    spool.open()
    run(reactor, spool.append(b"relaxed", "os"))
    assert spool.fsyncs == 0
    run(reactor, spool.append(b"default"))
    assert spool.fsyncs == 1
    run(reactor, spool.close())


# -- damage to older segments and failed writes (issue 9) ------------------------------


def read_with_deadline(spool, position, limit, seconds=10.0):
    """``spool.read`` in a thread: a read that never returns fails the test instead of hanging it."""
    import threading

    result: list = []
    thread = threading.Thread(target=lambda: result.append(spool.read(position, limit, 1 << 30)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, "SpoolLog.read did not return"
    return result[0]


@pytest.mark.parametrize("cut", [1, HEADER_SIZE // 2, HEADER_SIZE + 40, 200])
def test_an_older_segment_cut_inside_a_frame_is_read_up_to_the_cut(reactor, tmp_path, cut):
    payloads = [bytes([i]) * 84 for i in range(30)]  # 100-byte frames, 10 per segment
    fill(reactor, tmp_path, payloads, segment_bytes=1000)
    first = tmp_path / f"{0:020d}.seg"
    with open(first, "r+b") as f:
        f.truncate(1000 - cut)
    spool = SpoolLog(reactor, str(tmp_path), segment_bytes=1000)
    spool.open()
    records, position = read_with_deadline(spool, 0, spool.end)
    assert position == spool.end == 3000
    whole = (1000 - cut) // 100  # records of the first segment still whole
    assert [r.payload for r in records] == payloads[:whole] + payloads[10:]
    assert spool.missing_ranges == 1
    run(reactor, spool.close())


def test_a_partial_frame_followed_by_empty_segments_never_stops_a_reader(reactor, tmp_path):
    # What a kill -9 on a full disk could leave: a frame cut short, then empty segments.
    good = frame(b"a" * 84)
    (tmp_path / f"{0:020d}.seg").write_bytes(good * 3 + frame(b"b" * 84)[:37])
    for base in (400, 500, 600):
        (tmp_path / f"{base:020d}.seg").write_bytes(b"")
    spool = SpoolLog(reactor, str(tmp_path), segment_bytes=100)
    spool.open()
    assert spool.end == 600
    records, position = read_with_deadline(spool, 0, spool.end)
    assert [r.payload for r in records] == [b"a" * 84] * 3 and position == 600
    assert run(reactor, spool.append(b"after")) == (600, 600 + HEADER_SIZE + 5)
    records, _ = read_with_deadline(spool, 0, spool.written_end)
    assert [r.payload for r in records][-1] == b"after"
    run(reactor, spool.close())


class FailingWrites:
    """Makes the spool's writes fail like a full disk: part of the data lands, then ENOSPC."""

    def __init__(self, spool, failures: int, keep: int = 7) -> None:
        self.failures = failures
        self.keep = keep
        self.real = spool._write_all
        spool._write_all = self

    def __call__(self, data) -> None:
        if self.failures > 0:
            self.failures -= 1
            self.real(bytes(data)[: self.keep])
            import errno

            raise OSError(errno.ENOSPC, "No space left on device")
        self.real(data)


def test_a_failed_write_fails_its_appends_and_leaves_no_trace(reactor, tmp_path):
    from logrouter.spool.log import SpoolWriteError

    spool = SpoolLog(reactor, str(tmp_path))
    spool.open()
    assert run(reactor, spool.append(b"first")) == (0, HEADER_SIZE + 5)
    failing = FailingWrites(spool, failures=10)
    d = defer.DeferredList([spool.append(b"lost %d" % i) for i in range(5)], consumeErrors=True)
    outcomes = run(reactor, d)
    assert all(not ok and f.check(SpoolWriteError) for ok, f in outcomes)
    assert spool.write_errors == 5 and spool.pending_bytes == 0 and spool.end == spool.written_end
    assert (tmp_path / f"{0:020d}.seg").stat().st_size == HEADER_SIZE + 5  # cut back
    # The disk has room again: the next record goes exactly where a reader expects it.
    failing.failures = 0
    assert run(reactor, spool.append(b"second")) == (HEADER_SIZE + 5, 2 * HEADER_SIZE + 11)
    run(reactor, spool.close())
    assert read_all(reactor, tmp_path)[0] == [b"first", b"second"]


def test_a_write_failing_after_a_segment_roll_keeps_the_records_before_it(reactor, tmp_path):
    import errno

    from logrouter.spool.log import _Append

    spool = SpoolLog(reactor, str(tmp_path), segment_bytes=200)
    spool.open()
    real = spool._write_all
    calls = []

    def fail_second_write(data):
        calls.append(len(data))
        if len(calls) == 2:
            real(bytes(data)[:5])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(data)

    # One run (called as the worker thread would): records 0-1 fill the first segment,
    # which is written and fsync'd before the roll; the write after the roll fails.
    spool._write_all = fail_second_write
    items = [_Append(bytes([i]) * 84, True) for i in range(4)]
    assert spool._write(items) == [200]
    assert [(item.position, item.error is None) for item in items] == [(0, True), (100, True), (-1, False), (-1, False)]
    assert (tmp_path / f"{200:020d}.seg").stat().st_size == 0  # the partial write was cut back
    spool._write_all = real
    spool._bases.append(200)
    spool.written_end = 200
    assert run(reactor, spool.append(b"z" * 84)) == (200, 300)
    run(reactor, spool.close())
    payloads, again = read_all(reactor, tmp_path)
    assert payloads == [bytes([0]) * 84, bytes([1]) * 84, b"z" * 84]

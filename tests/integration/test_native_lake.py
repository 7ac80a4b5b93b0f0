"""A lake written from packed forward events holds what one written from decoded events holds.

Two ``LakeWriter``s take the same batches, one as ``PackedEvents`` (the native path),
one as the decoded events (the Python path), with small row groups so batches are
cut across row groups, batches that straddle hours, rows of both kinds in one row
group, fields that change type and fields that first appear in a later file. The
files' schemas, the rows and the learned column types must be the same. Also: the
forward source hands its batches on packed, the spool's replay gives packed events
back, and a batch of them is stored as plain records where it has to be.
"""

from __future__ import annotations

import json
import struct

import msgpack
import pyarrow.parquet as pq
import pytest

from logrouter.batch import Batch
from logrouter.lake.writer import LakeWriter
from logrouter.native import NATIVE, describe
from logrouter.spool.record import decode_batch, encode_batch
from logrouter.wire.fluent_forward import decode_entries
from logrouter.wire.forward_lazy import PackedEvents, lazy_events

pytestmark = pytest.mark.skipif(NATIVE is None, reason=f"native decoding off: {describe()}")

T0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z
HOUR = 3_600_000_000_000


def entries_of(events) -> bytes:
    packer = msgpack.Packer()
    return b"".join(
        packer.pack([msgpack.ExtType(0, struct.pack(">II", *divmod(t, 10**9))), record]) for t, record in events
    )


def batches():
    """(events, entries) of batches whose fields come and go and change type."""
    out = []
    for b in range(12):
        events = []
        for i in range(25):
            record = {"host": f"h{i % 3}", "seq": b * 100 + i, "msg": "m" * (i % 5)}
            if b >= 3:
                record["late"] = i  # first seen after the first files' schemas are fixed
            if b % 4 == 1:
                record["seq"] = f"text {i}"  # a type conflict: to _extra
            if i % 7 == 0:
                record["http"] = {"status": 200 + i, "path": ["/a", None], "raw": b"\x00\x01"}
            if i % 11 == 0:
                record["f"] = 1.5 if b % 2 else 2  # int then float
            time = T0 + b * 600 * 10**9 + i * 10**6  # crosses an hour after b = 5
            events.append((time, record))
        out.append((events, entries_of(events)))
    return out


def write(root: str, batches, packed: bool) -> LakeWriter:
    writer = LakeWriter(root, "w", 1 << 30, 3600, row_group_rows=40)
    for n, (events, entries) in enumerate(batches):
        given = lazy_events(entries, None) if packed else decode_entries(entries, None)[0]
        if packed:
            assert isinstance(given, PackedEvents)
        if packed and n == 7:
            given = decode_entries(entries, None)[0]  # rows of both kinds in one row group
        writer.write("app", given, now=float(n), mark=n)
        if n == 8:
            writer.publish(writer.seal_all())  # later rows go to new files with new columns
    writer.publish(writer.seal_all())
    return writer


def files(root: str) -> list:
    import glob

    found = []
    for path in sorted(glob.glob(f"{root}/tag=app/**/*.parquet", recursive=True)):
        table = pq.read_table(path, partitioning=None)
        found.append((path.split("/")[-2], table))
    return found


class Counting:
    """The extension, counting the row groups it built."""

    def __init__(self) -> None:
        self.built = 0

    def __getattr__(self, name):
        return getattr(NATIVE, name)

    def build(self, pieces, schema, build=True, filtered=None, checked=False, texts=None):
        found = NATIVE.build(pieces, schema, build, filtered, checked, texts)
        self.built += found is not None and build
        return found


def test_the_same_lake_both_ways(tmp_path, monkeypatch) -> None:
    from logrouter.lake import native_table

    data = batches()
    counting = Counting()
    monkeypatch.setattr(native_table, "NATIVE", counting)
    native = write(str(tmp_path / "native"), data, True)
    assert counting.built >= 4  # all but the row groups with decoded rows in them
    monkeypatch.undo()
    python = write(str(tmp_path / "python"), data, False)
    assert native.column_types.items() == python.column_types.items()
    left, right = files(str(tmp_path / "native")), files(str(tmp_path / "python"))
    assert len(left) == len(right) >= 3
    by_rows = lambda found: sorted(found, key=lambda item: (item[0], item[1].column("time")[0].as_py()))  # noqa: E731
    for (hour_a, a), (hour_b, b) in zip(by_rows(left), by_rows(right)):
        assert hour_a == hour_b
        assert a.schema.remove_metadata() == b.schema.remove_metadata()
        for name in a.column_names:
            x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
            if name == "_extra":
                x = [None if t is None else json.loads(t) for t in x]
                y = [None if t is None else json.loads(t) for t in y]
            assert x == y, name


def test_the_forward_source_and_the_spool_keep_events_packed() -> None:
    events = [(T0 + i, {"a": i}) for i in range(3)]
    entries = entries_of(events)
    batch = Batch("t", lazy_events(entries, None), "src", packed=("forward", entries, None))
    stored, _ = decode_batch(encode_batch(batch))
    assert isinstance(stored.events, PackedEvents) and stored.events == events
    # Without what arrived (a filter's replace), packed events are stored as records.
    plain, _ = decode_batch(encode_batch(batch.replace(tag="u")))
    assert plain.tag == "u" and [tuple(e) for e in plain.events] == events


def test_the_forward_source_hands_packed_events_on() -> None:
    import source_fakes
    from logrouter.sources.fluent_forward import FluentForwardSource

    def encode_packed_forward(tag, events, options=None):  # a PackedForward message, entries as bin
        return msgpack.packb([tag, entries_of(events), *([options] if options else [])], use_bin_type=True)

    source, router, _ = source_fakes.make_source(FluentForwardSource, "fwd", listen="tcp:0:interface=127.0.0.1")
    protocol = source_fakes.Conn(source).protocol
    usual = [(T0 + i, {"a": i}) for i in range(3)]
    unusual = [(T0, {"a": 1, "b": {"a": 1, 5: 2}})]  # an int key: left to the Python path
    protocol.dataReceived(encode_packed_forward("x", usual, {"chunk": "c1"}) + encode_packed_forward("y", unusual))
    first, second = router.batches
    assert isinstance(first.events, PackedEvents) and first.events == usual
    assert type(second.events) is list and second.events == [(T0, {"a": 1, "b": {"a": 1, 5: 2}})]


def test_the_codec_hook_keeps_what_the_extension_takes() -> None:
    """``kept_or_decoded``: what the forward codec calls in place of its own decode."""
    from logrouter.wire.forward_lazy import kept_or_decoded

    readings = []

    def clock() -> int:
        readings.append(T0 + 5)
        return T0 + 5

    def decode(blob, now_ns):
        return decode_entries(blob, now_ns())

    usual = entries_of([(0, {"a": 1}), (T0, {"a": 2})])
    events, invalid = kept_or_decoded(usual, clock, decode)
    assert isinstance(events, PackedEvents) and invalid == 0 and readings == [T0 + 5]
    assert events == [(T0 + 5, {"a": 1}), (T0, {"a": 2})] and events.now == T0 + 5
    readings.clear()
    assert isinstance(kept_or_decoded(entries_of([(T0, {"a": 1})]), clock, decode)[0], PackedEvents) and readings == []
    unusual = b"\x92\xd7\x00" + struct.pack(">II", 1, 0) + b"\x81\xa1a\xd4\x05\x00"  # an ext value
    events, invalid = kept_or_decoded(unusual, clock, decode)
    assert type(events) is list and events == decode_entries(unusual, T0 + 5)[0]


def test_the_codec_keeps_packed_forward_events_packed(monkeypatch) -> None:
    """``ForwardDecoder`` hands a PackedForward message's events on packed from arrival,
    fed whole or byte by byte, plain or gzip; without the extension, the same events."""
    import gzip

    from logrouter.wire import forward_lazy
    from logrouter.wire.fluent_forward import ForwardDecoder

    readings = []

    def clock() -> int:
        readings.append(T0 + 5)
        return T0 + 5

    entries = entries_of([(0, {"a": 1}), (T0, {"a": 2})])  # a time-0 entry: "now", read once
    expected = [(T0 + 5, {"a": 1}), (T0, {"a": 2})]
    plain = msgpack.packb(["t", entries, {"chunk": "c1"}], use_bin_type=True)
    zipped = msgpack.packb(["t", gzip.compress(entries), {"compressed": "gzip"}], use_bin_type=True)
    found = []
    for data in (plain, zipped):
        for pieces in ([data], [data[i : i + 1] for i in range(len(data))]):
            readings.clear()
            decoder = ForwardDecoder(now_ns=clock)
            (message,) = [m for piece in pieces for m in decoder.feed(piece)]
            assert isinstance(message.events, PackedEvents), message.events
            assert message.events == expected and message.invalid == 0 and readings == [T0 + 5]
            assert message.packed == (entries, T0 + 5)
            found.append(message)
    monkeypatch.setattr(forward_lazy, "NATIVE", None)
    for data, kept in ((plain, found[0]), (zipped, found[2])):
        (message,) = ForwardDecoder(now_ns=clock).feed(data)
        assert type(message.events) is list and message == kept and message.packed == kept.packed


def test_which_path_runs_is_said_and_can_be_turned_off() -> None:
    import subprocess
    import sys

    from daemon import REPO

    def describe(**env) -> str:
        import os

        code = "from logrouter.native import describe; print(describe())"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
                              env={**os.environ, **env})
        return done.stdout.strip()

    assert describe().startswith("native (logrouter_native ")
    assert describe(LOGROUTER_NATIVE="0") == "pure Python: turned off by LOGROUTER_NATIVE"

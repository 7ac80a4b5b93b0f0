"""The shared bounded inflate: one-shot blocks (zlib, gzip members, raw) and the
streaming inflater, with bombs, truncation, garbage, limits and every split."""

from __future__ import annotations

import gzip
import os
import zlib

import pytest

from logrouter.wire.inflate import GZIP, RAW, ZLIB, InflateError, StreamInflater, inflate, inflate_pieces

TEXT = b"".join(b"line %d of the log\n" % i for i in range(2000))


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


# -- one-shot -------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [0, 1, 3, 9])
def test_zlib_round_trip(level):
    assert inflate(zlib.compress(TEXT, level), len(TEXT)) == TEXT


def test_raw_and_gzip_round_trip():
    assert inflate(raw_deflate(TEXT), len(TEXT), RAW) == TEXT
    assert inflate(gzip.compress(TEXT), len(TEXT), GZIP) == TEXT


def test_concatenated_gzip_members_as_fluentd_sends_them():
    blob = gzip.compress(b"first ") + gzip.compress(b"") + gzip.compress(b"second")
    assert inflate(blob, 100, GZIP) == b"first second"
    assert inflate(b"", 100, GZIP) == b""  # zero members
    with pytest.raises(InflateError, match="after the end"):
        inflate(blob, 100, GZIP, members=False)


def test_many_tiny_gzip_members_are_linear():
    member = gzip.compress(b"x")
    assert inflate(member * 20000, 20000, GZIP) == b"x" * 20000


def test_limit_is_exact_and_never_overshot():
    blob = zlib.compress(TEXT)
    assert inflate(blob, len(TEXT)) == TEXT
    with pytest.raises(InflateError) as info:
        inflate(blob, len(TEXT) - 1)
    assert info.value.too_big


def test_bomb_stops_one_byte_past_the_limit():
    bomb = zlib.compress(b"\0" * (200 << 20), 9)  # 200 MiB from ~200 KiB
    produced = 0
    with pytest.raises(InflateError) as info:
        for piece in inflate_pieces(bomb, 1 << 20, step=64 << 10):
            produced += len(piece)
    assert info.value.too_big and produced <= 1 << 20
    gz_bomb = gzip.compress(b"\0" * (50 << 20))
    with pytest.raises(InflateError, match="more than 1000 bytes") as info:
        inflate(gz_bomb * 3, 1000, GZIP)
    assert info.value.too_big


def test_limit_counts_across_gzip_members():
    with pytest.raises(InflateError) as info:
        inflate(gzip.compress(b"a" * 600) * 2, 1000, GZIP)
    assert info.value.too_big


@pytest.mark.parametrize("wbits,compress", [(ZLIB, zlib.compress), (GZIP, gzip.compress), (RAW, raw_deflate)])
def test_truncated_at_every_offset(wbits, compress):
    blob = compress(b"hello, hello, hello world")
    for cut in range(1 if wbits == GZIP else 0, len(blob)):
        with pytest.raises(InflateError) as info:
            inflate(blob[:cut], 1000, wbits)
        assert not info.value.too_big


def test_garbage_and_trailing_bytes():
    with pytest.raises(InflateError, match="bad compressed data"):
        inflate(b"not zlib at all", 1000)
    with pytest.raises(InflateError, match="bad compressed data"):
        inflate(gzip.compress(b"a") + b"junk", 1000, GZIP)
    with pytest.raises(InflateError, match="3 bytes after the end"):
        inflate(zlib.compress(b"a") + b"xyz", 1000)
    for _ in range(50):
        junk = os.urandom(64)
        try:
            inflate(junk, 1000)
        except InflateError:
            pass


def test_large_input_is_fed_in_slices():
    data = os.urandom(3 << 20)  # incompressible: the blob is bigger than one input slice
    assert inflate(zlib.compress(data, 1), len(data), step=256 << 10) == data


# -- streaming --------------------------------------------------------------------------------


def stream_all(pieces, limit=10_000, **kw):
    s = StreamInflater(limit, **kw)
    out = b"".join(s.feed(p) for p in pieces)
    return out, s


def test_stream_ends_exactly_at_the_zlib_end_at_every_split():
    blob = zlib.compress(b"payload " * 20, 3)
    data = blob + b"NEXT MESSAGE"
    expected = (b"payload " * 20, True, b"NEXT MESSAGE", len(blob))
    for cut in range(len(data) + 1):
        out, s = stream_all([data[:cut], data[cut:]])
        assert (out, s.eof, s.unused_data, s.consumed) == expected, cut
    out, s = stream_all([data[i : i + 1] for i in range(len(data))])
    assert (out, s.eof, s.unused_data, s.consumed) == expected
    assert s.produced == 160


def test_stream_not_at_eof_until_the_trailer_arrived():
    blob = zlib.compress(b"abc")
    s = StreamInflater(100)
    s.feed(blob[:-1])
    assert not s.eof and s.unused_data == b""
    with pytest.raises(InflateError, match="truncated"):
        s.check_complete()
    s.feed(blob[-1:])
    assert s.eof
    s.check_complete()
    s.feed(b"more")
    assert s.unused_data == b"more"


def test_stream_last_used_without_copying_the_rest():
    blob = zlib.compress(b"abc")
    s = StreamInflater(100)
    assert s.feed(blob + b"rest", keep_unused=False) == b"abc"
    assert s.eof and s.last_used == len(blob) and s.unused_data == b""


def test_stream_bomb_same_error_every_split():
    bomb = zlib.compress(b"\0" * 100_000, 9)
    for pieces in ([bomb], [bomb[i : i + 7] for i in range(0, len(bomb), 7)]):
        s = StreamInflater(5000, step=1000)
        with pytest.raises(InflateError) as info:
            for p in pieces:
                s.feed(p)
        assert info.value.too_big and s.produced <= 5001
        with pytest.raises(InflateError, match="already failed"):
            s.feed(b"x")


def test_stream_max_input():
    blob = zlib.compress(os.urandom(300), 0)
    out, s = stream_all([blob + b"tail"], max_input=len(blob))
    assert s.eof and s.unused_data == b"tail"
    for pieces in ([blob], [blob[i : i + 1] for i in range(len(blob))]):
        with pytest.raises(InflateError, match="longer than") as info:
            stream_all(pieces, max_input=len(blob) - 1)
        assert info.value.too_big


def test_stream_garbage_same_error_every_split():
    for data in (b"\x78\x9c\x07 invalid block type", b"not zlib at all", zlib.compress(b"hello")[:-1] + b"\0"):
        errors = set()
        for cut in range(len(data) + 1):
            with pytest.raises(InflateError) as info:
                stream_all([data[:cut], data[cut:]])
            errors.add(info.value.reason)
        assert len(errors) == 1 and not info.value.too_big


def test_input_slice_changes_the_pieces_not_the_result():
    data = os.urandom(1 << 20)  # stored blocks: each piece ends where its input slice did
    blob = gzip.compress(data, 0) + gzip.compress(TEXT)
    default = list(inflate_pieces(blob, 1 << 21, GZIP))
    wide = list(inflate_pieces(blob, 1 << 21, GZIP, input_slice=256 << 10))
    assert b"".join(default) == b"".join(wide) == data + TEXT
    assert max(map(len, default)) <= 64 << 10 < max(map(len, wide)) <= 256 << 10
    for cut in (len(blob) // 3, len(blob) - 5):
        for input_slice in (1, 4096, 256 << 10):
            with pytest.raises(InflateError, match="truncated"):
                inflate(blob[:cut], 1 << 21, GZIP, input_slice=input_slice)

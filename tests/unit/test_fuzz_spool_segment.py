"""Fuzz target for the spool's segment format: damage never stops a reader.

Segments made of good frames are damaged the way disks and crashes do (bytes flipped,
inserted, deleted, cut off) and walked, and whole spools of several segments are cut
short anywhere and read back with ``SpoolLog.read``. Checked: nothing but records and
damage reports come out, the reports cover the input exactly once in order, every good
frame that survived untouched is found, and the reader always ends at the limit.
"""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from fuzz_helpers import fuzz_settings, mutated
from logrouter.spool.log import SpoolLog
from logrouter.spool.segment import Damage, Record, frame, segment_name, walk

payloads = st.lists(st.binary(max_size=64), min_size=1, max_size=12)


@st.composite
def framed(draw):
    return b"".join(frame(p) for p in draw(payloads))


@given(mutated(framed()))
@fuzz_settings()
def test_walk_covers_damaged_data_exactly_once(data):
    position = 100
    for item in walk(data, 100):
        assert isinstance(item, (Record, Damage))
        assert item.offset == position and item.end > item.offset
        if isinstance(item, Record):
            assert frame(item.payload) == data[item.offset - 100 : item.end - 100]
        position = item.end
    assert position == 100 + len(data)


@given(payloads, st.data())
@fuzz_settings(max_examples=min(100, fuzz_settings().max_examples))
def test_a_reader_of_segments_cut_short_always_reaches_the_limit(tmp_path_factory, items, data):
    directory = tmp_path_factory.mktemp("spool")
    frames = [frame(p) for p in items]
    # Segments of a few frames each, as the writer lays them out: named by their first byte.
    bounds = sorted(set(data.draw(st.lists(st.integers(1, len(frames) - 1), max_size=3)))) if len(frames) > 1 else []
    starts = [0, *bounds]
    position = 0
    positions = []
    for i, start in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else len(frames)
        content = b"".join(frames[start:stop])
        positions.append((position, content))
        position += len(content)
    end = position
    cut_segments = data.draw(st.sets(st.integers(0, len(positions) - 1), max_size=len(positions)))
    for i, (base, content) in enumerate(positions):
        if i in cut_segments:
            content = content[: data.draw(st.integers(0, len(content)))]
        (directory / segment_name(base)).write_bytes(content)
    spool = SpoolLog(None, str(directory))
    spool._bases = [base for base, _ in positions]
    result: list = []
    reader = threading.Thread(target=lambda: result.append(spool.read(0, end, 1 << 30)), daemon=True)
    reader.start()
    reader.join(10)
    assert result, "the reader did not return"
    records, reached = result[0]
    assert reached == end
    whole = {(base + r.offset, r.payload) for base, content in positions for r in walk(content) if isinstance(r, Record)}
    for record in records:
        assert (record.offset, record.payload) in whole
    assert [r.offset for r in records] == sorted(r.offset for r in records)

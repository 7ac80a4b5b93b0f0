"""Partition layout: Hive escaping, hour buckets, splitting batches by hour."""

from __future__ import annotations

import pyarrow.dataset as ds
import pytest

from logrouter.lake.partition import (
    DEFAULT_PARTITION,
    HOUR_NS,
    PartitionError,
    escape_value,
    hour_dirs,
    partition_path,
    split_by_hour,
    tag_segment,
    unescape_value,
)
from logrouter.lake.writer import LakeWriter

T0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z

TAGS = [
    "app.web", "a/b", "x=y", "100%", "ünï", "a b", "c:d", "#?", "'\"", "tab\there",
    "[x]^{y}*", "a\\b", "%2F", "a+b", "日本語", "~.-_",
]


@pytest.mark.parametrize("tag", TAGS)
def test_escape_round_trip(tag):
    segment = escape_value(tag)
    assert "/" not in segment and "=" not in segment
    assert unescape_value(segment) == tag


def test_escape_matches_hive():
    assert escape_value("a/b=c%d:e") == "a%2Fb%3Dc%25d%3Ae"
    assert escape_value("\x01\x7f{[]^*?#'\"\\") == "%01%7F%7B%5B%5D%5E%2A%3F%23%27%22%5C"
    # Hive/Spark leave non-ASCII and spaces alone (Spark decodes %XX per character)
    assert escape_value("ünï x") == "ünï x"
    assert escape_value("") == DEFAULT_PARTITION
    assert unescape_value(DEFAULT_PARTITION) is None


def test_surrogates_in_tags_become_backslash_escapes():
    tag = b"a\xff".decode("utf-8", "surrogateescape")
    assert escape_value(tag) == "a%5Cxff"
    assert unescape_value(escape_value(tag)) == "a\\xff"


def test_too_long_tag_is_refused():
    tag_segment("x" * 250)
    with pytest.raises(PartitionError):
        tag_segment("x" * 252)
    with pytest.raises(PartitionError):
        tag_segment("/" * 100)  # 300 bytes once escaped


def test_hour_dirs_are_utc():
    assert partition_path("app", T0 // HOUR_NS) == "tag=app/dt=2024-05-01/hour=07"
    assert hour_dirs(0) == ("1970-01-01", "00")
    assert hour_dirs(-1) == ("1969-12-31", "23")
    # absurd times are clamped for the directory only
    assert hour_dirs(10**12)[0] == "9999-12-30"
    assert hour_dirs(-(10**12))[0] == "0001-01-02"


def test_split_fast_path_hands_back_the_batch():
    events = [(T0 + i, {}) for i in range(100)]
    groups = split_by_hour(events)
    assert len(groups) == 1 and groups[0][0] == T0 // HOUR_NS and groups[0][1] is events
    assert split_by_hour([]) == []


def test_split_groups_by_hour_in_order():
    events = [(T0 + HOUR_NS, {"i": 0}), (T0, {"i": 1}), (T0 + HOUR_NS + 5, {"i": 2}), (T0 - 1, {"i": 3})]
    groups = split_by_hour(events)
    bucket = T0 // HOUR_NS
    assert [(b, [e[1]["i"] for e in group]) for b, group in groups] == [
        (bucket + 1, [0, 2]), (bucket, [1]), (bucket - 1, [3])
    ]


def test_tags_round_trip_through_pyarrow_hive_partitioning(tmp_path):
    root = str(tmp_path)
    writer = LakeWriter(root, "w1", 1 << 30, 60)
    for index, tag in enumerate(TAGS):
        writer.write(tag, [(T0, {"i": index})], now=0)
    writer.publish(writer.seal_all())

    table = ds.dataset(root, partitioning="hive").to_table()
    assert sorted(zip(table.column("i").to_pylist(), table.column("tag").to_pylist())) == list(enumerate(TAGS))
    assert set(table.column("dt").to_pylist()) == {"2024-05-01"}
    assert set(table.column("hour").to_pylist()) == {7}

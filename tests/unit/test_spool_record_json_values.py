"""Batches of JSON values (``Batch.json_values``) are written by a faster encoder: the
spool record must be the very bytes the general encoder writes, for any JSON values."""

from __future__ import annotations

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from fuzz_helpers import fuzz_settings
from logrouter.batch import Batch
from logrouter.sources.events import TagTemplate, batch_builder
from logrouter.spool.record import decode_batch, encode_batch

# What JSON decodes to, with the awkward ones: lone surrogates (a "\ud800" escape) and
# integers beyond 64 bits (json keeps them exact); and bytes (Pravega's raw payloads).
text = st.text(max_size=40) | st.sampled_from(["\ud800", "a\udc80b", "é" * 300])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | text | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=16,
)
events = st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.dictionaries(text, json_values, max_size=6)), max_size=8)
keys = st.none() | st.tuples(st.text(max_size=5), st.binary(max_size=16)) | st.tuples(st.text(max_size=5), st.binary(max_size=8), st.integers(0, 2**64 - 1))


def _encoded(batch: Batch, key):
    try:
        return encode_batch(batch, key)
    except Exception as e:  # noqa: BLE001 - e.g. "\ud800", which no encoder writes as UTF-8
        return type(e)


@fuzz_settings()
@given(events, keys, text)
def test_json_values_are_written_as_the_general_encoder_writes_them(listed, key, tag) -> None:
    general = _encoded(Batch(tag, listed, "src"), key)
    assert _encoded(Batch(tag, listed, "src", json_values=True), key) == general


def test_the_json_sources_batches_say_so_and_read_back() -> None:
    (batch,) = batch_builder(TagTemplate("t"))([{"@timestamp": "2026-11-23T22:00:00.5Z", "n": [1, {"x": None}]}], 0)
    assert batch.json_values
    assert not batch.replace(tag="u").json_values  # a filter's values may be anything
    back, key = decode_batch(encode_batch(batch, ("src", b"id")))
    assert [tuple(e) for e in back.events] == batch.events
    assert key == ("src", b"id")


def test_an_ext_type_is_never_written_as_an_array() -> None:
    # Not JSON values: a batch that does not say json_values keeps msgpack's encoding.
    batch = Batch("t", [(1, {"e": msgpack.ExtType(1, b"x")})], "src")
    back, _ = decode_batch(encode_batch(batch))
    assert back.events[0][1]["e"] == msgpack.ExtType(1, b"x")

"""The forward codec's bomb rule: a message of mostly invalid entries is refused after a
bounded number of entries looked at, on every path (decoded in ``feed``, in deferred parts,
gzip, zstd, plain, Forward arrays, JSON), while a message with a few invalid entries among
valid ones is kept minus those. Work is counted in entries looked at (the error says how
many; an iterator counts its pulls), never in time. A hypothesis property checks the rule
against a model of it, on both paths, with the thresholds made small.
"""

from __future__ import annotations

import gzip
import json
from contextlib import contextmanager
from unittest import mock

import msgpack
import pytest
import zstandard
from fuzz_helpers import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from logrouter.wire import fluent_forward as ff
from logrouter.wire import forward_entries, forward_offload
from logrouter.wire.forward_entries import BOMB_MIN_INVALID, BOMB_RATIO, EntryBombError, EntryTally, collect_events

NOW_NS = 1_700_000_000_000_000_000
T0 = 1_700_000_000
VALID = msgpack.packb([T0, {"m": "x"}])
ZERO = b"\x00"  # the msgpack int 0: an invalid entry of one byte
NIL_PAIR = msgpack.packb([None, None])  # a pair, so only the build pass can tell it is invalid


def compress(blob: bytes, how: str) -> bytes:
    if how == "gzip":
        return gzip.compress(blob, 9)
    if how == "zstd":
        return zstandard.ZstdCompressor().compress(blob)
    return blob


def packed(blob: bytes, how: str, chunk: str = "c1") -> bytes:
    options = {"chunk": chunk} if how == "text" else {"chunk": chunk, "compressed": how}
    return msgpack.packb(["app.bomb", compress(blob, how), options], use_bin_type=True)


def offloading_decoder() -> ff.ForwardDecoder:
    return ff.ForwardDecoder(now_ns=lambda: NOW_NS, offload_bytes=1000)


def deferred(data: bytes) -> ff.DeferredMessage:
    (message,) = offloading_decoder().feed(data)
    assert type(message) is ff.DeferredMessage
    return message


def refusal(steps) -> tuple[EntryBombError, list]:
    """The bomb error a deferred message's steps end in, and what they yielded first."""
    taken: list = []
    with pytest.raises(EntryBombError) as caught:
        for step in steps:
            taken.append(step)
    return caught.value, taken


def joined(parts) -> ff.EventMessage:
    """A message's parts as one message (``DeferredMessage.decode`` with any part size)."""
    events: list = []
    invalid = 0
    for part in parts:
        events += part.events
        invalid += part.invalid
    return ff.EventMessage("", events, None, {}, invalid, 0)


# -- the rule itself ---------------------------------------------------------------------


def counting(entries):
    """``entries`` as an iterator, with ``pulled[0]`` the number of entries taken from it."""
    pulled = [0]

    def items():
        for entry in entries:
            pulled[0] += 1
            yield entry

    return items(), pulled


def test_an_all_invalid_stream_is_refused_at_the_first_entry_over_the_rule():
    items, pulled = counting([0] * (100 * BOMB_MIN_INVALID))
    with pytest.raises(EntryBombError) as caught:
        collect_events(items, lambda: NOW_NS)
    assert pulled[0] == BOMB_MIN_INVALID and (caught.value.valid, caught.value.invalid) == (0, BOMB_MIN_INVALID)
    assert "refused as a bomb" in caught.value.reason and caught.value.fatal


def test_invalid_entries_may_reach_the_ratio_of_the_valid_ones_but_not_pass_it():
    valid = 300
    good = [[T0, {"n": i}] for i in range(valid)]
    events, invalid = collect_events(good + [0] * (BOMB_RATIO * valid), lambda: NOW_NS)
    assert len(events) == valid and invalid == BOMB_RATIO * valid  # 4800: kept, minus those
    items, pulled = counting(good + [0] * (BOMB_RATIO * valid + 1000))
    with pytest.raises(EntryBombError):
        collect_events(items, lambda: NOW_NS)
    assert pulled[0] == valid + BOMB_RATIO * valid + 1


def test_the_rule_is_judged_in_order_so_a_flood_before_the_events_is_refused():
    entries = [0] * BOMB_MIN_INVALID + [[T0, {"n": i}] for i in range(10_000)]
    with pytest.raises(EntryBombError) as caught:
        collect_events(entries, lambda: NOW_NS)
    assert caught.value.invalid == BOMB_MIN_INVALID and caught.value.valid == 0


def test_a_few_invalid_entries_among_valid_ones_are_skipped_as_before():
    entries = []
    for i in range(20_000):
        entries.append([T0, {"n": i}])
        if i % 100 == 0:
            entries += [0, [2**64 - 1, {}], [T0, "not a map"]]
    events, invalid = collect_events(entries, lambda: NOW_NS)
    assert len(events) == 20_000 and invalid == 600


def test_a_tally_carries_the_counts_across_calls():
    tally = EntryTally()
    collect_events([[T0, {}]] * 10, lambda: NOW_NS, tally)
    collect_events([0] * (BOMB_RATIO * 10 - 1), lambda: NOW_NS, tally)
    assert (tally.valid, tally.invalid) == (10, BOMB_RATIO * 10 - 1)
    items, pulled = counting([0] * BOMB_MIN_INVALID)
    with pytest.raises(EntryBombError) as caught:
        collect_events(items, lambda: NOW_NS, tally)
    assert caught.value.valid == 10 and caught.value.invalid == BOMB_MIN_INVALID
    assert pulled[0] == BOMB_MIN_INVALID - (BOMB_RATIO * 10 - 1)


def test_the_spool_replays_a_stored_blob_whatever_its_invalid_entries():
    blob = ZERO * 10_000 + VALID
    events, invalid = ff.decode_entries(blob, NOW_NS)
    assert len(events) == 1 and invalid == 10_000


# -- every path of the codec -------------------------------------------------------------


@pytest.mark.parametrize("how", ["gzip", "zstd", "text"])
def test_a_blob_of_zeros_is_refused_by_the_first_pass_after_bounded_work(how):
    # 8 MiB inflated, 8 million one-byte entries; the reported bomb was 250 MiB of them.
    data = packed(ZERO * (8 << 20), how)
    error, steps = refusal(deferred(data).steps(3000))
    assert (error.valid, error.invalid) == (0, BOMB_MIN_INVALID)  # entries looked at
    assert steps == []  # within the first piece


@pytest.mark.parametrize("how", ["gzip", "zstd"])
def test_a_blob_of_invalid_pairs_is_refused_by_the_build_pass_after_bounded_work(how):
    data = packed(NIL_PAIR * (1 << 20), how)  # 3 MiB, a million [nil, nil]
    error, steps = refusal(deferred(data).steps(1 << 20))
    assert (error.valid, error.invalid) == (0, BOMB_MIN_INVALID)
    assert steps == [None] * len(steps) and len(steps) <= 4  # the first pass's pieces; no part


@pytest.mark.parametrize("how", ["gzip", "zstd", "text"])
def test_a_small_bomb_decoded_on_the_reactor_is_refused_too(how):
    # Below offload_bytes (1 MiB by default) a message is decoded in feed, on the reactor.
    for decoder in (ff.ForwardDecoder(offload_bytes=1 << 20), ff.ForwardDecoder()):
        with pytest.raises(EntryBombError) as caught:
            decoder.feed(packed(ZERO * 900, how) + packed(ZERO * 100_000, how))
        assert (caught.value.valid, caught.value.invalid) == (0, BOMB_MIN_INVALID)
        # the message before it (900 invalid entries) was decoded as before
        assert [m.invalid for m in caught.value.messages] == [900]


def test_forward_arrays_and_json_follow_the_rule():
    forward = msgpack.packb(["app.bomb", [0] * 50_000, {"chunk": "f"}])
    with pytest.raises(EntryBombError):
        ff.ForwardDecoder().feed(forward)
    error, _ = refusal(deferred(forward).steps(3000))
    assert error.invalid == BOMB_MIN_INVALID
    text = json.dumps(["app.bomb", [0] * 50_000]).encode()
    with pytest.raises(EntryBombError):
        ff.ForwardDecoder().feed(text)
    error, _ = refusal(deferred(text).steps(3000))
    assert error.invalid == BOMB_MIN_INVALID


@pytest.mark.parametrize("how", ["gzip", "zstd", "text"])
def test_a_big_message_with_a_few_invalid_entries_is_kept_minus_those(how):
    blob = b"".join(VALID + (ZERO if i % 50 == 0 else b"") for i in range(50_000))
    message = deferred(packed(blob, how)).decode()
    assert len(message.events) == 50_000 and message.invalid == 1000
    inline = ff.ForwardDecoder(now_ns=lambda: NOW_NS).feed(packed(blob, how))[0]
    assert inline.events == message.events and inline.invalid == 1000


@pytest.mark.parametrize("how", ["gzip", "zstd", "text"])
def test_each_step_of_a_deferred_message_looks_at_a_bounded_amount(how, monkeypatch):
    # 40k entries of ~130 bytes: ~5 MiB inflated, read twice (the first pass, then the
    # build); no step takes more than a MiB of it, so a scheduler gets a turn that often.
    inflated = [0]
    pieces = forward_offload.inflated_pieces

    def counted(*args, **kwargs):
        for piece in pieces(*args, **kwargs):
            inflated[0] += len(piece)
            yield piece

    monkeypatch.setattr(forward_offload, "inflated_pieces", counted)
    entry = msgpack.packb([T0, {"message": "m" * 120}])
    message = deferred(packed(entry * 40_000, how))
    inflated[0] = 0  # feed may have inflated offload_bytes of it, to find it big
    seen = [0]
    taken = []
    for step in message.steps(8 << 20):
        taken.append(inflated[0] - seen[0])
        seen[0] = inflated[0]
    assert inflated[0] == 2 * len(entry) * 40_000
    assert max(taken) <= 1 << 20 and len(taken) >= 10


# -- a model of the rule, checked on both paths ------------------------------------------

SMALL_MIN, SMALL_RATIO = 6, 2

INVALID_ENTRIES = [0, None, "ab", [1], [None, None], [T0, 5], [2**64 - 1, {}], {"a": 1, "b": 2}, b"xy"]
entry_kinds = st.one_of(
    st.integers(0, 50).map(lambda n: ("valid", [T0 + n, {"n": n}])),
    st.sampled_from(INVALID_ENTRIES).map(lambda entry: ("invalid", entry)),
)


@contextmanager
def small_rule():
    with mock.patch.object(forward_entries, "BOMB_MIN_INVALID", SMALL_MIN), mock.patch.object(
        forward_entries, "BOMB_RATIO", SMALL_RATIO
    ):
        yield


def model_refuses(kinds: list[str]) -> bool:
    valid = invalid = 0
    for kind in kinds:
        if kind == "valid":
            valid += 1
        else:
            invalid += 1
            if invalid >= SMALL_MIN and invalid > SMALL_RATIO * valid:
                return True
    return False


def outcome(decode):
    try:
        message = decode()
    except EntryBombError:
        return "refused"
    return [record["n"] for _, record in message.events], message.invalid


@fuzz_settings()
@given(
    runs=st.lists(st.tuples(entry_kinds, st.integers(1, 12)), max_size=12),
    how=st.sampled_from(["gzip", "zstd", "text"]),
    part_bytes=st.integers(1, 200),
)
def test_both_paths_refuse_exactly_what_the_rule_refuses(runs, how, part_bytes):
    entries = [entry for (_, entry), count in runs for _ in range(count)]
    kinds = [kind for (kind, _), count in runs for _ in range(count)]
    blob = b"".join(msgpack.packb(entry) for entry in entries)
    data = packed(blob, how)
    forward = msgpack.packb(["app.f", entries, {"chunk": "f"}])
    with small_rule():
        expected = "refused" if model_refuses(kinds) else (
            [entry[1]["n"] for kind, entry in zip(kinds, entries) if kind == "valid"],
            kinds.count("invalid"),
        )
        for message in (data, forward):
            inline = outcome(lambda: ff.ForwardDecoder(now_ns=lambda: NOW_NS).feed(message)[0])
            parts = ff.ForwardDecoder(now_ns=lambda: NOW_NS, offload_bytes=1).feed(message)[0]
            if type(parts) is ff.DeferredMessage:
                in_parts = outcome(lambda: joined(parts.parts(part_bytes)))
            else:  # too small to defer
                in_parts = outcome(lambda: parts)
            assert inline == in_parts == expected

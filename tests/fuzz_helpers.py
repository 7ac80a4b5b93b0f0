"""Shared pieces of the codec fuzz tests: feeding a decoder every way, and example counts.

A decoder is anything made by a zero-argument factory whose ``feed(bytes)`` returns a
list of frames and raises ``DecodeError`` (with ``messages``, the frames that call
decoded before the bad input). ``decode_all_ways`` feeds the same bytes whole, byte by
byte, split at the given offsets (and, for short inputs, at every offset) and checks
that every way gives the same frames and the same error reason.

``mutated(strategy)`` damages valid inputs the way fuzzers do (bytes set, inserted,
deleted, repeated, cut off, a 32-bit length field made huge or tiny); ``cuts`` draws
split offsets for ``decode_all_ways``.

``fuzz_settings()`` keeps the normal suite quick (200 examples, a fixed seed so a run is
repeatable); ``LOGROUTER_FUZZ_EXAMPLES=20000`` raises the count and draws fresh random
examples (see bench/FUZZ.md). A count below the default keeps the fixed seed: ``make
test-unit``, the fast loop, runs 25 examples each.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from logrouter.wire.errors import DecodeError

DEFAULT_EXAMPLES = 200
EVERY_OFFSET_UP_TO = 256  # splitting at every offset decodes the input len(data) times
MAX_INPUT = 4096  # fuzz inputs stay this small: a slow example is a finding, not noise
DEADLINE_MS = 2000  # per example; real ones take milliseconds, so this is no machine's noise


def fuzz_examples() -> int:
    return int(os.environ.get("LOGROUTER_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))


def fuzz_settings(**overrides: Any) -> settings:
    """Settings for one fuzz test: bounded in the normal suite, raisable from the environment."""
    examples = fuzz_examples()
    long_run = examples > DEFAULT_EXAMPLES
    options: dict[str, Any] = dict(
        max_examples=examples,
        deadline=DEADLINE_MS,
        derandomize=not long_run,
        database=None,  # no .hypothesis/ directory in the working tree
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    options.update(overrides)
    return settings(**options)


def feed_pieces(factory: Callable[[], Any], pieces: Iterable[bytes]) -> tuple[list[Any], str | None]:
    """Feed ``pieces`` in order to a new decoder: (all frames, error reason or None).

    Only ``DecodeError`` (and subclasses) is caught: anything else fails the test.
    """
    decoder = factory()
    frames: list[Any] = []
    for piece in pieces:
        try:
            frames += decoder.feed(piece)
        except DecodeError as error:
            assert isinstance(error.reason, str) and error.reason
            return frames + list(error.messages), error.reason
    return frames, None


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``data`` cut at the given offsets (taken modulo its length; duplicates are fine)."""
    if not data:
        return [data]
    points = sorted({c % len(data) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


def decode_all_ways(
    factory: Callable[[], Any],
    data: bytes,
    cuts: Sequence[int] = (),
    *,
    normalize: Callable[[list[Any]], Any] = list,
    every_offset: bool | None = None,
) -> tuple[Any, str | None]:
    """Decode ``data`` whole, byte by byte, split at ``cuts`` and (short inputs, or when
    asked) at every single offset; assert all ways agree; return (normalized frames,
    error reason or None).

    ``normalize`` turns the frames into a form that does not depend on how the input was
    split (a codec may, say, group frames per ``feed`` call).
    """
    frames, reason = feed_pieces(factory, [data])
    whole = (normalize(frames), reason)
    ways: list[tuple[str, list[bytes]]] = [("byte by byte", [data[i : i + 1] for i in range(len(data))])]
    if cuts:
        ways.append((f"split at {sorted(set(c % max(len(data), 1) for c in cuts))}", split_at(data, cuts)))
    if every_offset is None:
        every_offset = len(data) <= EVERY_OFFSET_UP_TO
    if every_offset:
        ways += [(f"split at {i}", [data[:i], data[i:]]) for i in range(1, len(data))]
    for name, pieces in ways:
        frames, reason = feed_pieces(factory, pieces)
        got = (normalize(frames), reason)
        assert got == whole, f"fed {name}: {got!r:.300} != whole: {whole!r:.300}"
    return whole


cuts = st.lists(st.integers(0, MAX_INPUT), max_size=8)


@st.composite
def mutated(draw: Any, base: st.SearchStrategy[bytes]) -> bytes:
    """``base`` with a few bytes set, inserted, deleted, repeated or cut off (at most ``MAX_INPUT``)."""
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["set", "insert", "delete", "truncate", "repeat", "length"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[at:]
        elif op == "repeat":
            data[at:at] = data[at : at + draw(st.integers(1, 40))]
        elif op == "length" and len(data) >= at + 4:
            # Length and count fields are where decoders go wrong: make one huge or tiny.
            value = draw(st.sampled_from([0, 1, 7, 2**31, 2**32 - 1]) | st.integers(0, 2**32 - 1))
            data[at : at + 4] = struct.pack(">I", value)
    return bytes(data[:MAX_INPUT])


_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8
)
_objects = st.dictionaries(st.text(max_size=8), _values, max_size=4)
# JSON that msgspec refuses and ``json`` reads, or that only looks like an object.
_SPECIAL_DOCUMENTS = [b'{"a": NaN}', b'{"\\ud800": 1}', b'{"n": 1e400}', b"[Infinity]", b'{"a":1} x', b"\xff{}", b"",
                      b' {"a": 2} ', b'{"big": 123456789012345678901234567890}']


@st.composite
def mixed_documents(draw: Any) -> list[bytes]:
    """JSON event documents of every kind, mostly objects: other JSON values, JSON only
    ``json`` reads (NaN, a lone surrogate escape, a number beyond floats), garbage and
    invalid UTF-8. For decoders that decode a run of documents at once and must give each
    the verdict it gets alone."""
    kinds = st.sampled_from(["object", "object", "object", "value", "special", "garbage"])
    out = []
    for kind in draw(st.lists(kinds, max_size=8)):
        if kind == "object":
            out.append(json.dumps(draw(_objects)).encode())
        elif kind == "value":
            out.append(json.dumps(draw(_values)).encode())
        elif kind == "special":
            out.append(draw(st.sampled_from(_SPECIAL_DOCUMENTS)))
        else:
            out.append(draw(st.binary(max_size=16)))
    return out


def same(a: Any, b: Any) -> bool:
    """JSON values equal, NaN equal to NaN, types and key order included (the codecs'
    and the lake's values compared across the native and Python paths)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b

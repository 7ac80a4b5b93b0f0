"""Fuzzing the logjam message codec with hypothesis.

For arbitrary frame lists, messages with a valid meta-info frame and a garbage body in
every compression, and mutations of valid messages built with the module's encoders:
only ``LogjamDecodeError`` escapes ``decode_message``, with a known ``kind``, and what
decodes respects the limits. Valid messages decode back to what they were built from.
ZeroMQ delivers whole frames, so there is no splitting to check. Inputs stay within a
few KB and every example has a deadline. More examples: ``LOGROUTER_FUZZ_EXAMPLES=20000``
(bench/FUZZ.md).
"""

from __future__ import annotations

from typing import Any

from fuzz_helpers import MAX_INPUT, fuzz_settings, mutated
from hypothesis import given
from hypothesis import strategies as st

from logrouter.wire import logjam as lj

# Small limits so that examples reach every limit check; and the defaults.
LIMITS = [
    {},
    dict(max_body_bytes=200, max_decompressed_bytes=300),
    dict(max_decompressed_bytes=40),
]
limits = st.sampled_from(LIMITS)

scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8
)
json_bodies = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
names = st.text(st.characters(min_codepoint=32, max_codepoint=127), max_size=12)
metas = st.builds(
    lj.Meta,
    compression=st.sampled_from(sorted(lj.COMPRESSION_NAMES)),
    device=st.integers(0, 2**32 - 1),
    created_ms=st.integers(0, 2**64 - 1),
    sequence=st.integers(0, 2**64 - 1),
    version=st.just(lj.META_VERSION),
    tag=st.sampled_from([lj.META_TAG, lj.META_TAG_SWAPPED]),
)


@st.composite
def valid(draw: Any) -> tuple[list[bytes], lj.LogjamMessage]:
    app = draw(names)
    env = draw(names.filter(lambda s: "-" not in s))
    topic = draw(st.sampled_from(lj.TOPIC_PREFIXES)) + draw(names)
    body = draw(json_bodies)
    meta = draw(metas)
    frames = lj.encode_message(app, env, topic, body, meta)
    return frames, lj.LogjamMessage(app, env, topic, body, meta)


@st.composite
def any_valid_frames(draw: Any) -> list[bytes]:
    if draw(st.integers(0, 4)) == 0:
        return lj.encode_heartbeat(draw(names), draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**64 - 1)), 0)
    return draw(valid())[0]


def decode(frames: list[bytes], limits: dict) -> lj.LogjamMessage | lj.Heartbeat | None:
    """``decode_message``; None for a ``LogjamDecodeError`` (anything else fails the test)."""
    try:
        got = lj.decode_message(frames, **limits)
    except lj.LogjamDecodeError as error:
        assert error.kind in lj.ERROR_KINDS, error.kind
        assert isinstance(error.reason, str) and error.reason and not error.fatal
        return None
    assert isinstance(got, (lj.LogjamMessage, lj.Heartbeat))
    assert len(frames[2]) <= limits.get("max_body_bytes", lj.DEFAULT_MAX_BODY_BYTES)
    if isinstance(got, lj.LogjamMessage):
        assert isinstance(got.body, dict) and got.meta.version == lj.META_VERSION
        assert f"{got.app}-{got.env}".encode() == bytes(frames[0]) and "-" not in got.env
    return got


@fuzz_settings()
@given(st.lists(st.binary(max_size=64), max_size=6), limits)
def test_arbitrary_frames(frames: list[bytes], limits: dict) -> None:
    decode(frames, limits)


@fuzz_settings()
@given(metas, st.integers(0, 255), st.binary(max_size=MAX_INPUT), limits)
def test_valid_meta_with_garbage_body(meta: lj.Meta, compression: int, body: bytes, limits: dict) -> None:
    meta = lj.Meta(compression, meta.device, meta.created_ms, meta.sequence, meta.version, meta.tag)
    decode([b"app-env", b"logs", body, lj.encode_meta(meta)], limits)


@fuzz_settings()
@given(valid(), limits)
def test_valid_messages_round_trip(built: tuple[list[bytes], lj.LogjamMessage], limits: dict) -> None:
    frames, expected = built
    got = decode(frames, limits)
    if not limits:
        assert got == expected
    elif got is not None:
        assert got == expected


@fuzz_settings()
@given(any_valid_frames(), st.data(), limits)
def test_mutated_messages(frames: list[bytes], data: Any, limits: dict) -> None:
    frames = list(frames)
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(st.sampled_from(["frame", "frame", "frame", "drop", "add", "swap"]))
        if op == "frame" and frames:
            at = data.draw(st.integers(0, len(frames) - 1))
            frames[at] = data.draw(mutated(st.just(frames[at])))
        elif op == "drop" and frames:
            del frames[data.draw(st.integers(0, len(frames) - 1))]
        elif op == "add":
            frames.insert(data.draw(st.integers(0, len(frames))), data.draw(st.binary(max_size=32)))
        elif op == "swap" and len(frames) >= 2:
            a, b = data.draw(st.integers(0, len(frames) - 1)), data.draw(st.integers(0, len(frames) - 1))
            frames[a], frames[b] = frames[b], frames[a]
    decode(frames, limits)


@fuzz_settings()
@given(st.sampled_from([lj.ZLIB_COMPRESSION, lj.SNAPPY, lj.LZ4]), json_bodies, st.data(), limits)
def test_mutated_compressed_bodies(compression: int, body: dict, data: Any, limits: dict) -> None:
    frames = lj.encode_message("app", "env", "logs", body, lj.Meta(compression))
    frames[2] = data.draw(mutated(st.just(frames[2])))
    decode(frames, limits)


# -- the source's framing of ROUTER / PULL / SUB messages (empty frame, ping, legacy) -----

def _source():
    from twisted.internet import task

    from logrouter.sources.logjam import LogjamSource
    from source_fakes import FakeRouter, fake_context

    options = {key: option.default for key, option in LogjamSource.OPTIONS.items()}
    options.update(listen_pull="tcp://127.0.0.1:*", max_body_bytes=200, max_decompressed_bytes=300)
    return LogjamSource("fuzz", options, fake_context(FakeRouter(), task.Clock()))


SOURCE = _source()
frame_lists = st.lists(
    st.one_of(st.binary(max_size=64), st.sampled_from([b"", b"ping", b"heartbeat", b"a-b", b"logs"]),
              st.builds(lj.encode_meta, metas)),
    max_size=7,
)


@fuzz_settings()
@given(st.sampled_from(["sub", "router", "pull"]), frame_lists)
def test_source_decode_never_raises(kind: str, frames: list[bytes]) -> None:
    from logrouter.sources.logjam import Ping, Request

    request = SOURCE.decode(kind, frames)
    assert isinstance(request, Request)
    decoded = request.decoded
    assert isinstance(decoded, (lj.LogjamMessage, lj.Heartbeat, Ping, lj.LogjamDecodeError))
    if isinstance(decoded, lj.LogjamDecodeError):
        assert decoded.kind in lj.ERROR_KINDS
    # a reply is owed exactly when a ROUTER message starts with the empty frame
    assert (request.reply_first is not None) == (kind == "router" and bool(frames) and frames[0] == b"")

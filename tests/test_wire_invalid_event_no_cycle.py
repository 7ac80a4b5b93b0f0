"""A payload whose last event is not JSON leaves no garbage cycle behind.

The decoders keep an invalid event's exception in a local only long enough to name the
reason: a traceback refers to the decoding frame, which holds the whole inflated
payload, and the daemon runs the cycle collector only every few seconds
(``logrouter.gc_tuning``), so such a cycle would keep up to a frame's limit of memory
alive per connection until then.
"""

from __future__ import annotations

import gc
import struct

import pytest

from logrouter.wire import log_courier as lc
from logrouter.wire import lumberjack as lj


@pytest.fixture
def collector_off():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def unreachable_after(decode) -> int:
    decode()
    return gc.collect()


@pytest.mark.parametrize("last", [b'{"a": 1', b"\xff\xfe", b"[1, 2]", b"{" * 100_000])
def test_lumberjack(collector_off, last: bytes) -> None:
    frames = lj.encode_json(1, {"a": 1}) + b"2J" + struct.pack(">II", 2, len(last)) + last
    window = lj.encode_window(2) + lj.encode_compressed(frames)

    def decode() -> None:
        out = lj.LumberjackDecoder().feed(window)
        assert [m.invalid for m in out if isinstance(m, lj.Events)] == [1]

    assert unreachable_after(decode) == 0


@pytest.mark.parametrize("last", [b'{"a": 1', b"\xff\xfe", b"[1, 2]", b"{" * 100_000])
def test_log_courier(collector_off, last: bytes) -> None:
    content = struct.pack(">I", 8) + b'{"a": 1}' + struct.pack(">I", len(last)) + last

    def decode() -> None:
        payload = lc._decode_records(content, "JDAT", b"n" * 16, 1 << 20, 100)
        assert payload.invalid == 1

    assert unreachable_after(decode) == 0

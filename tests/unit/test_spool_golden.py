"""Golden spool records: the bytes of one record of every stored format and version, as
the spool wrote them, checked in under ``tests/fixtures/spool_records/``, and the batch
each must decode to.

A spool written before an upgrade is replayed after it, so what a stored record decodes
to may never change, whichever module holds the decoder, and the writer must keep
writing the same bytes for the same batch. Each ``<name>.record`` is one record's payload;
``<name>.events`` is the batch it decodes to, written out with the type of every value
(a list and a tuple, an ``int`` and an ``EventNanos``, are told apart).

The files were made by the code of their day, never by the code under test. To add one
for a new stored format, add its maker to ``MAKERS`` and run

    LOGROUTER_WRITE_GOLDEN=1 python -m pytest tests/unit/test_spool_golden.py

which writes the files that are missing and never overwrites one.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Callable

import msgpack
import pytest

from logrouter import registry
from logrouter.batch import Batch
from logrouter.spool import formats
from logrouter.spool.record import decode_batch, decode_deferred, decode_key, encode_batch
from repo_paths import FIXTURES

GOLDEN = FIXTURES / "spool_records"
WRITE = os.environ.get("LOGROUTER_WRITE_GOLDEN") == "1"
NS = 1_000_000_000
T0 = 1_700_000_000
NOW_NS = 1_800_000_000_123_456_789
SURROGATE = b"caf\xc3\xa9 \xff".decode("utf-8", "surrogateescape")  # invalid UTF-8 received inside a msgpack str


def typed(value: Any) -> str:
    """``value`` as text that names every type ``repr`` would leave out."""
    kind = type(value)
    if kind is dict:
        return "{" + ", ".join(f"{typed(k)}: {typed(v)}" for k, v in value.items()) + "}"
    if kind is list:
        return "[" + ", ".join(map(typed, value)) + "]"
    if kind is tuple:
        return "(" + ", ".join(map(typed, value)) + ("," if len(value) == 1 else "") + ")"
    if kind in (int, float, str, bytes, bool) or value is None:
        return repr(value)
    text = repr(value)
    return text if text.startswith(kind.__name__ + "(") else f"{kind.__name__}({text})"


def describe(batch: Batch, key: tuple | None, json_values: bool = False) -> str:
    lines = [f"source: {typed(batch.source)}", f"tag: {typed(batch.tag)}", f"key: {typed(key)}"]
    if json_values:
        lines.append("json_values: True")  # how the writer was handed it (see test_the_writer_writes_the_same_bytes)
    lines.append("events:")
    lines += [typed(event) for event in batch.events]
    return "\n".join(lines) + "\n"


# -- makers: how each golden record was made (run only to write a missing file) ------------


def _event_time(seconds: int, nanos: int = 0) -> msgpack.ExtType:
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanos))


def _forward(entries: list, key: tuple | None) -> tuple[bytes, Batch, tuple | None]:
    """A PackedForward message through the forward codec, stored as the forward source
    stores it (``Batch.packed``: the format name, then the codec's ``packed``)."""
    from logrouter.wire import fluent_forward as wire

    blob = b"".join(msgpack.packb(e, use_bin_type=True, unicode_errors="surrogateescape") for e in entries)
    data = b"".join([b"\x93", msgpack.packb("app.log"), b"\xdb", len(blob).to_bytes(4, "big"), blob, msgpack.packb({})])
    (message,) = wire.ForwardDecoder(now_ns=lambda: NOW_NS).feed(data)
    batch = Batch(message.tag, message.events, "fwd", packed=("forward", *message.packed))
    return encode_batch(batch, key), batch, key


def _beats(keep_metadata: bool) -> tuple[bytes, Batch, tuple | None]:
    """A Beats window through the lumberjack source, stored as its JSON documents."""
    import source_fakes
    from logrouter.sources.lumberjack import LumberjackSource
    from logrouter.wire import lumberjack as lj

    source, router, _ = source_fakes.make_source(
        LumberjackSource, "beats", tag="beats.${@metadata.beat}", keep_metadata=keep_metadata
    )
    records = [
        {"@timestamp": "2026-11-24T06:00:00.123Z", "@metadata": {"beat": "filebeat"}, "message": "a", "host": {"name": "h"}},
        {"@metadata": {"beat": "filebeat"}, "message": "no stamp: the arrival time", "u": "\u00e9\u2603"},
        {"@timestamp": "2026-11-24T07:00:00+02:00", "@metadata": {"beat": "filebeat"}, "n": 2**70, "f": 1.5, "l": [1, None, True]},
    ]
    # Plain J frames: a window of C frames is stored compressed (_beats_compressed).
    source_fakes.Conn(source).send(lj.encode_window_frames(records, compress_level=None))
    (live,) = router.batches
    assert live.packed is not None and live.packed[0] == "json-documents"
    batch = Batch(live.tag, live.events, "beats", packed=live.packed, json_values=live.json_values)
    return encode_batch(batch), batch, None


class _Receiver:
    def send(self, index: int, frames: list[bytes]) -> None:
        pass

    def done(self) -> None:
        pass


LOGJAM_BODIES = [
    {"started_ms": 1_700_000_000_123, "action": "a#b", "request": {"path": "/x", "params": [1, 2.5, None]}},
    {"started_at": "2026-11-24T06:00:00.5Z", "u": "\u00e9\u2603", "started_ms": None},
    {"started_ms": 1_700_000_001_234.567, "l": [True, {"k": "v"}]},
    {"message": "no time field: the meta's created_ms"},
]


def _logjam() -> tuple[bytes, Batch, tuple | None]:
    """logjam messages through the logjam source's decode and reactor side, stored as it
    stores them: with the native extension the bodies (``logjam-bodies``), without it
    (and before issue 33) the records."""
    from twisted.internet import task

    import source_fakes
    from logrouter.sources.logjam import LogjamSource
    from logrouter.sources.zmq_receiver import PULL, Received
    from logrouter.wire import logjam as wire

    router = source_fakes.FakeRouter()
    clock = task.Clock()
    clock.advance(source_fakes.T0)
    options = {key: option.default for key, option in LogjamSource.OPTIONS.items()}
    options["listen_pull"] = "tcp://127.0.0.1:*"
    source = LogjamSource("jam", options, source_fakes.fake_context(router, clock))
    source.receiver = _Receiver()
    chunk = []
    for n, body in enumerate(LOGJAM_BODIES):
        meta = wire.Meta(wire.ZLIB_COMPRESSION, 3, 0 if n else T0 * 1000 + 7, 40 + n)
        if n == 3:
            meta = meta._replace(created_ms=T0 * 1000 + 9)
        frames = wire.encode_message("shop-app", "prod", "logs", body, meta)
        chunk.append(Received(0, None, source.decode(PULL, frames), sum(map(len, frames))))
    source.received(chunk)
    (live,) = router.batches
    batch = Batch(live.tag, live.events, "jam", packed=live.packed, json_values=live.json_values)
    return encode_batch(batch), batch, None


def _beats_compressed(keep_metadata: bool) -> tuple[bytes, Batch, tuple | None]:
    """A Beats window of two C frames through the lumberjack source, stored as their
    payloads (``lumberjack-zlib``)."""
    import source_fakes
    from logrouter.sources.lumberjack import LumberjackSource
    from logrouter.wire import lumberjack as lj

    source, router, _ = source_fakes.make_source(
        LumberjackSource, "beats", tag="beats.${@metadata.beat}", keep_metadata=keep_metadata
    )
    records = [
        {"@timestamp": "2026-11-24T06:00:00.123Z", "@metadata": {"beat": "filebeat"}, "message": "a", "host": {"name": "h"}},
        {"@metadata": {"beat": "filebeat"}, "message": "no stamp: the arrival time", "u": "\u00e9\u2603"},
        {"@timestamp": "2026-11-24T07:00:00+02:00", "@metadata": {"beat": "filebeat"}, "n": 2**70, "f": 1.5, "l": [1, None, True]},
    ]
    frames = [lj.encode_json(i + 1, r) for i, r in enumerate(records)]
    source_fakes.Conn(source).send(
        lj.encode_window(3) + lj.encode_compressed(frames[0] + frames[1]) + lj.encode_compressed(frames[2])
    )
    (live,) = router.batches
    assert live.packed is not None and live.packed[0] == "lumberjack-zlib" and len(live.packed[1]) == 2
    batch = Batch(live.tag, live.events, "beats", packed=live.packed, json_values=live.json_values)
    return encode_batch(batch), batch, None


def _courier_compressed(streamed: bool) -> tuple[bytes, Batch, tuple | None]:
    """A Log Courier payload (JDAT, or EVNT) through its source, stored as its zlib stream."""
    import source_fakes
    from logrouter.sources.log_courier import LogCourierSource
    from logrouter.wire import log_courier as lc

    source, router, _ = source_fakes.make_source(LogCourierSource, "courier", tag="lc.${type:-none}")
    records = [
        {"@timestamp": "2024-01-02T03:04:05.5Z", "type": "x", "message": "a"},
        {"type": "x", "message": "b", "n": [1, {"x": None}], "big": 2**64},
    ]
    encode = lc.encode_evnt if streamed else lc.encode_jdat
    source_fakes.Conn(source).send(encode(b"n" * 16, records))
    (live,) = router.batches
    assert live.packed is not None and live.packed[0] == "log-courier-zlib"
    batch = Batch(live.tag, live.events, "courier", packed=live.packed, json_values=live.json_values)
    return encode_batch(batch, ("courier", b"n" * 16)), batch, ("courier", b"n" * 16)


ODD_ENTRIES = [
    [_event_time(T0, 5), {"msg": "hello", "n": 1}],
    [0, {"msg": "time zero gets now"}],
    [_event_time(0, 0), {"msg": "EventTime zero is now too"}],
    [T0, {b"bin key": "int seconds", 7: "int key"}],
    ["bad time", {"msg": "invalid"}],
    [T0, "not a map"],
    "not an entry",
    [T0 + 1.5, {"float": True}],
    [_event_time(T0, 9), {"nested": {"seen": _event_time(T0, 1), "ext": msgpack.ExtType(5, b"xy")}}],
    [_event_time(T0), {"bytes": b"\xff\x00", "text": SURROGATE}],
]

RECORD_EVENTS = [
    (T0 * NS + 1, {"msg": "hello", "n": 1, "nested": {"list": [1, 2.5, None, True]}}),
    (T0 * NS + 2, {"bytes": b"\xff\x00", "text": SURROGATE, "big": 2**63 - 1}),
]


def _v1() -> tuple[bytes, Batch, tuple | None]:
    # Version 1 knew batch ids only; today's writer no longer writes it: these are the
    # bytes it wrote (msgpack of the tuple, its key a list).
    payload = msgpack.packb((1, "fwd", "app.log", [[T0 * NS, {"msg": "v1"}]], ["fwd", b"chunk-1"]), use_bin_type=True)
    return payload, Batch("app.log", [[T0 * NS, {"msg": "v1"}]], "fwd"), ("fwd", b"chunk-1")


def _v2(json_values: bool, key: tuple | None, events: list) -> Callable[[], tuple[bytes, Batch, tuple | None]]:
    def make() -> tuple[bytes, Batch, tuple | None]:
        batch = Batch("app.log", events, "src", json_values=json_values)
        return encode_batch(batch, key), batch, key

    return make


MAKERS: dict[str, Callable[[], tuple[bytes, Batch, tuple | None]]] = {
    "v1-events": _v1,
    "v2-events": _v2(False, ("fwd", b"c1"), RECORD_EVENTS),
    "v2-events-writer-key": _v2(False, ("pravega", b"writer-1", 41), RECORD_EVENTS[:1]),
    "v2-json-values": _v2(True, None, [(T0 * NS, {"msg": "json", "n": -(2**63), "u": 2**64 - 1, "f": -0.5, "l": [{"a": None}], "b": b"raw"})]),
    "v2-json-values-refused": _v2(True, ("fwd", b"c2"), [(T0 * NS, {"text": SURROGATE})]),  # msgspec refuses: msgpack writes it
    "v3-forward": lambda: _forward(ODD_ENTRIES, ("fwd", b"c3")),
    "v3-forward-no-clock": lambda: _forward([[_event_time(T0), {"a": 1}], [T0, {"b": 2}]], None),
    "v3-json-documents": lambda: _beats(keep_metadata=True),
    "v3-json-documents-drop-metadata": lambda: _beats(keep_metadata=False),
    # made by the logjam source before issue 33 (records), and with the native read
    "v2-logjam-records": _logjam,
    "v3-logjam-bodies": _logjam,
    "v3-lumberjack-zlib": lambda: _beats_compressed(keep_metadata=True),
    "v3-lumberjack-zlib-drop-metadata": lambda: _beats_compressed(keep_metadata=False),
    "v3-log-courier-zlib-jdat": lambda: _courier_compressed(streamed=False),
    "v3-log-courier-zlib-evnt": lambda: _courier_compressed(streamed=True),
}


def _write_missing(name: str) -> None:
    record, expected = GOLDEN / f"{name}.record", GOLDEN / f"{name}.events"
    if record.exists() or expected.exists():
        return
    registry.load_builtin()
    payload, live, key = MAKERS[name]()
    replayed, replayed_key = decode_batch(payload)
    assert replayed_key == key
    assert [tuple(e) for e in replayed.events] == [tuple(e) for e in live.events], "the record does not replay what went live"
    GOLDEN.mkdir(parents=True, exist_ok=True)
    record.write_bytes(payload)
    expected.write_text(describe(replayed, key, json_values=live.json_values and live.packed is None), encoding="utf-8")


# -- the checks --------------------------------------------------------------------------


def golden_names() -> list[str]:
    return sorted({*MAKERS, *(p.stem for p in GOLDEN.glob("*.record"))})


@pytest.fixture(params=golden_names())
def golden(request) -> tuple[str, bytes, str]:
    name = request.param
    if WRITE:
        _write_missing(name)
    registry.load_builtin()  # every stored format registered
    return name, (GOLDEN / f"{name}.record").read_bytes(), (GOLDEN / f"{name}.events").read_text(encoding="utf-8")


def test_a_golden_record_decodes_to_its_batch(golden):
    _, payload, expected = golden
    batch, key = decode_batch(payload)
    assert describe(batch, key, json_values="json_values: True" in expected) == expected
    assert decode_key(payload) == key


def test_a_golden_record_read_deferred_decodes_to_its_batch(golden):
    _, payload, expected = golden
    deferred = decode_deferred(payload)
    assert deferred.is_deferred
    assert describe(deferred, decode_key(payload), json_values="json_values: True" in expected) == expected


def test_the_writer_writes_the_same_bytes(golden):
    name, payload, expected = golden
    version, source, tag, stored, key = msgpack.unpackb(
        payload, raw=False, unicode_errors="surrogateescape", strict_map_key=False
    )
    if version == 1:
        pytest.skip("version 1 is read, no longer written")
    key = None if key is None else tuple(key)
    if version == 3:
        batch = Batch(tag, decode_batch(payload)[0].events, source, packed=tuple(stored))
    else:
        batch = Batch(tag, stored, source, json_values="json_values: True" in expected)
    assert encode_batch(batch, key) == payload


def test_every_golden_record_has_its_files():
    for name in golden_names():
        assert (GOLDEN / f"{name}.record").exists() and (GOLDEN / f"{name}.events").exists(), name


def _stored_format(payload: bytes) -> str | None:
    version, _, _, stored, _ = msgpack.unpackb(payload, raw=False, unicode_errors="surrogateescape", strict_map_key=False)
    return stored[0] if version == 3 else None


def test_every_registered_stored_format_has_a_golden_record():
    registry.load_builtin()
    pinned = {_stored_format((GOLDEN / f"{name}.record").read_bytes()) for name in golden_names()} - {None}
    assert set(formats.registered()) == pinned


def test_a_format_nobody_registered_is_refused_when_written_and_when_read():
    with pytest.raises(ValueError, match="unknown packed events format 'nope'"):
        encode_batch(Batch("t", [(1, {})], "s", packed=("nope", b"", 0)))
    payload = msgpack.packb([3, "s", "t", ["nope", b"", 0], None], use_bin_type=True)
    with pytest.raises(ValueError, match="unknown packed events format 'nope'"):
        decode_batch(payload)


def test_a_stored_format_with_other_fields_is_refused_when_written_and_when_read():
    registry.load_builtin()
    with pytest.raises(ValueError, match="stores entries, now"):
        encode_batch(Batch("t", [(1, {})], "s", packed=("forward", b"")))
    with pytest.raises(ValueError, match="holds 1 fields, not 2"):
        decode_batch(msgpack.packb([3, "s", "t", ["forward", b""], None], use_bin_type=True))


def test_a_name_is_registered_once():
    registry.load_builtin()
    name = next(iter(formats.registered()))
    with pytest.raises(ValueError, match="registered twice"):
        formats.register(name, ("other",), lambda other: [])

"""``wire.json_text.loads`` answers exactly as ``json.loads(data.decode())`` does: the same
value (type for type: a long integer stays an int) or the same kind of error."""

from __future__ import annotations

import json
import math

from fuzz_helpers import fuzz_settings, mutated
from hypothesis import given
import msgspec
from hypothesis import strategies as st

from logrouter.wire.json_text import fast_loads, fast_object_loads, loads, objects_or_none, objects_or_reasons

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


def reference(data: bytes):
    try:
        return "ok", json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        return "error", UnicodeDecodeError
    except (ValueError, RecursionError) as e:
        return "error", type(e) if not isinstance(e, json.JSONDecodeError) else ValueError


def ours(data: bytes):
    try:
        return "ok", loads(data)
    except UnicodeDecodeError:
        return "error", UnicodeDecodeError
    except (ValueError, RecursionError) as e:
        return "error", type(e) if not isinstance(e, json.JSONDecodeError) else ValueError


def same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


def check(data: bytes) -> None:
    want, got = reference(data), ours(data)
    assert want[0] == got[0], (data, want, got)
    if want[0] == "ok":
        assert same(want[1], got[1]), (data, want, got)


@fuzz_settings()
@given(values, st.booleans())
def test_documents_decode_to_the_same_values(value, ascii_only: bool) -> None:
    check(json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


@fuzz_settings()
@given(st.data())
def test_mutated_and_arbitrary_bytes_get_the_same_verdict(data) -> None:
    base = st.builds(lambda v: json.dumps(v).encode(), values)
    check(data.draw(st.one_of(st.binary(max_size=64), st.builds(lambda b: b, base))))
    check(data.draw(mutated(base)))


def test_the_edges_where_orjson_differs() -> None:
    for text in [b'{"a": -9223372036854775809}', b"[18446744073709551616]", b'{"a": NaN}', b"[Infinity]",
                 b'["\\ud800"]', b"[1e400]", b"\xff", b'{"a":1}x', b'  {"a": 1} ', b'{"a":1,"a":2}',
                 b"[" * 5000 + b"]" * 5000]:
        check(text)


def object_verdict(decode, data: bytes):
    try:
        value = decode(data)
    except (ValueError, RecursionError, msgspec.DecodeError):
        return "refused", None
    return ("object", value) if type(value) is dict else ("other", None)


@fuzz_settings()
@given(st.data())
def test_the_lumberjack_object_decoder_gives_what_fast_loads_gives_for_objects(data) -> None:
    """``objects_or_none`` decodes a run of events with msgspec's decoder typed ``dict``
    and no type check per event: where ``fast_loads`` gives a dict it must give the same
    dict, and refuse every other document (the run then takes the per-event path)."""
    base = st.builds(lambda v: json.dumps(v).encode(), values | st.dictionaries(st.text(max_size=5), values, max_size=5))
    for text in (data.draw(base), data.draw(mutated(base)), data.draw(st.binary(max_size=32))):
        want, got = object_verdict(fast_loads, text), object_verdict(fast_object_loads, text)
        if want[0] == "object":
            assert got[0] == "object" and same(want[1], got[1]), (text, want, got)
        else:
            assert got[0] == "refused", (text, want, got)


def test_the_lumberjack_object_decoder_at_the_edges() -> None:
    for text in [b'{"a": -9223372036854775809}', b'{"a": 18446744073709551616}', b'{"a":1,"a":2}', b'{"a": NaN}',
                 b'{"\\ud800": 1}', b"[]", b"1", b'"x"', b"null", b'  {"a": {"b": [1, {"c": null}]}} ',
                 b'{"a":' * 3000 + b"1" + b"}" * 3000]:
        want, got = object_verdict(fast_loads, text), object_verdict(fast_object_loads, text)
        if want[0] == "object":
            assert got[0] == "object" and same(want[1], got[1]), text
        else:
            assert got[0] == "refused", text


def test_objects_or_none_is_none_when_any_document_is_not_an_object() -> None:
    assert objects_or_none([b'{"a": 1}', b' {"b": [2]} ']) == [{"a": 1}, {"b": [2]}]
    assert objects_or_none([]) == []
    for odd in (b"[1]", b'{"a": NaN}', b"\xff", b"", b'{"a":1} x', b"[" * 5000 + b"]" * 5000):
        assert objects_or_none([b'{"a": 1}', odd]) is None, odd


def test_objects_or_reasons_gives_each_document_the_verdict_loads_gives_it() -> None:
    """The slow path of a run: an object for a document ``loads`` decodes to one, else why
    not (the codecs put the reason in ``invalid_reason``), in order."""
    documents = [b'{"a": 1}', b"[1]", b'"x"', b"\xff", b"{", b'{"a": NaN}', b'{"\\ud800": 2}', b"null",
                 b"[" * 5000 + b"]" * 5000]
    verdicts = objects_or_reasons(documents)
    assert verdicts[0] == {"a": 1} and verdicts[6] == {"\ud800": 2}
    assert math.isnan(verdicts[5]["a"])
    assert verdicts[1] == "a JSON list, not an object"
    assert verdicts[2] == "a JSON str, not an object"
    assert verdicts[3] == "not valid UTF-8"
    assert verdicts[4].startswith("not JSON: Expecting property name")
    assert verdicts[7] == "a JSON NoneType, not an object"
    assert verdicts[8].startswith("not JSON: maximum recursion depth exceeded")
    assert objects_or_reasons([]) == []

"""``wire.json_text.loads`` answers exactly as ``json.loads(data.decode())`` does: the same
value (type for type: a long integer stays an int) or the same kind of error."""

from __future__ import annotations

import json
import math

from fuzz_helpers import fuzz_settings, mutated
from hypothesis import given
from hypothesis import strategies as st

from logrouter.wire.json_text import loads

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

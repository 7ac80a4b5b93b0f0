"""The ``_extra`` encoding's orjson fast path gives the same JSON values as the exact path."""

from __future__ import annotations

import json

from fuzz_helpers import fuzz_settings, same
from hypothesis import given
from hypothesis import strategies as st

from logrouter.lake import extra

scalars = (
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8) | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)
)
keys = st.text(max_size=5) | st.integers(-3, 3) | st.binary(max_size=3)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3), max_leaves=10)


def exact(fields) -> str:
    try:
        text = extra._dumps(fields)
        text.encode("utf-8")
        return text
    except (TypeError, ValueError, RecursionError):
        return extra._dumps(extra.jsonable(fields))


@fuzz_settings()
@given(st.dictionaries(st.text(max_size=6), values, max_size=5))
def test_fast_and_exact_encodings_hold_the_same_values(fields) -> None:
    fast = extra.encode_extra(fields)
    fast.encode("utf-8")  # valid UTF-8 always
    assert same(json.loads(fast), json.loads(exact(fields)))


def test_the_edges_take_the_exact_path() -> None:
    assert json.loads(extra.encode_extra({"f": float("nan"), "i": 2**70, "b": bytes(1)})) == {"f": "NaN", "i": 2**70, "b": "AA=="}
    assert extra.encode_extra({"a": None, "n": {"x": [1, 2.5]}}) == '{"a":null,"n":{"x":[1,2.5]}}'

"""The project's one field path syntax (``logrouter.paths``)."""

from __future__ import annotations

import pytest

from logrouter import paths


@pytest.mark.parametrize("text,path", [
    ("level", ("level",)),
    ("a.b", ("a.b",)),  # a plain name is one top-level key, dots included
    ("@metadata", ("@metadata",)),
    ("$.a.b", ("a", "b")),
    ("$['a']['b.c']", ("a", "b.c")),
    ('$["a b"][0].c', ("a b", 0, "c")),
    ("$.tags[-1]", ("tags", -1)),
])
def test_parse(text, path):
    assert paths.parse(text) == path


@pytest.mark.parametrize("text,offset", [("$", 1), ("$.", 1), ("$a", 1), ("$.a..b", 3), ("$['a'", 1), ("$.a[x]", 3)])
def test_parse_errors_say_where(text, offset):
    with pytest.raises(paths.PathError) as info:
        paths.parse(text)
    assert info.value.offset == offset


def test_index_first_and_empty_are_refused():
    for text in ("", "$[0]"):
        with pytest.raises(ValueError):
            paths.parse(text)


def test_scan_stops_at_white_space_and_operators():
    text = "$.a.b>=5 and $['x y'] == 1"
    assert paths.scan(text, 0) == (("a", "b"), 5)
    assert paths.scan(text, 13) == (("x y",), 21)


def test_text_round_trips():
    for path in [("a",), ("a", "b"), ("a b", 0, "c.d"), ("tags", -1)]:
        assert paths.parse(paths.text(path)) == path if len(path) > 1 else paths.text(path) == "a"


def test_getter_reads_nested_and_treats_wrong_shapes_as_absent():
    record = {"a": {"b": [1, {"c": 2}]}, "s": "text", "n": None}
    assert paths.getter(("a", "b", 1, "c"))(record) == 2
    assert paths.getter(("a", "b", -2))(record) == 1
    assert paths.getter(("a", "b", 5))(record) is None
    assert paths.getter(("s", "x"))(record) is None
    assert paths.getter(("missing", "x"))(record) is None
    missing = paths.MISSING
    assert paths.getter(("n",), missing)(record) is None  # present, null
    assert paths.getter(("gone",), missing)(record) is missing
    assert paths.getter(("a", "gone"), missing)(record) is missing


def test_writers_copy_on_write():
    inner = {"b": 1, "keep": True}
    record = {"a": inner, "x": 0}
    new = paths.with_value(record, ("a", "c"), 2)
    assert new == {"a": {"b": 1, "keep": True, "c": 2}, "x": 0}
    assert record == {"a": {"b": 1, "keep": True}, "x": 0} and record["a"] is inner
    gone = paths.without(record, ("a", "b"))
    assert gone == {"a": {"keep": True}, "x": 0} and record["a"] == {"b": 1, "keep": True}
    assert paths.without(record, ("a", "zz")) is record
    assert paths.with_value({}, ("p", "q", "r"), 1) == {"p": {"q": {"r": 1}}}
    with pytest.raises(TypeError):
        paths.with_value({"x": "scalar"}, ("x", "y"), 1)


def test_key_path_refuses_indexes_and_check_list_names_the_item():
    with pytest.raises(ValueError, match="array indexes"):
        paths.key_path("$.a[0]")
    with pytest.raises(ValueError, match="item 1"):
        paths.check_list(["ok", "$.a..b"])
    with pytest.raises(ValueError, match="at least one"):
        paths.check_list([])


def test_fields_module_uses_the_shared_syntax():
    from logrouter.filters import fields

    assert fields.parse_field_path is paths.parse and fields.field_getter is paths.getter

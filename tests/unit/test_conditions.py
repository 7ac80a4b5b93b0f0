"""The condition language (``logrouter.conditions``): semantics, errors with columns, config paths."""

from __future__ import annotations

import pytest

from logrouter.conditions import Condition, ConditionError

RECORD = {
    "level": "debug",
    "status": 503,
    "ratio": 0.5,
    "ok": False,
    "nothing": None,
    "http": {"path": "/health", "status": 200, "headers": {"user-agent": "kube-probe/1.27"}},
    "tags": ["a", "b"],
    "user-agent": "curl",
    "blob": b"bytes here",
}


@pytest.mark.parametrize("text,expected", [
    ('level == "debug"', True),
    ("level == 'debug'", True),
    ('level != "debug"', False),
    ('"debug" == level', True),
    ("status == 503", True),
    ("status == 503.0", True),
    ('status == "503"', False),  # type-strict
    ("ok == false", True),
    ("ok == 0", False),  # a boolean is not a number
    ("nothing == null", True),
    ("missing == null", True),
    ("missing != null", False),
    ("status >= 500", True),
    ("status < 500", False),
    ("500 <= status", True),
    ("ratio > 0.25", True),
    ('level < "e"', True),
    ("level < 5", False),  # a string is not ordered against a number
    ("missing < 5", False),
    ("not missing < 5", True),
    ("ok < 1", False),
    ("$.http.status == 200", True),
    ("$.http['status'] >= 200 and $.http.status < 300", True),
    ("$['user-agent'] == \"curl\"", True),
    ("user-agent == \"curl\"", True),
    ("$.http.headers['user-agent'] =~ \"^kube-probe/\"", True),
    ('$.tags[0] == "a"', True),
    ('$.tags[-1] == "b"', True),
    ('$.tags[5] == null', True),
    ('$.level.deeper == null', True),  # wrong shape reads as missing
    ('level =~ "^deb"', True),
    ('level !~ "^deb"', False),
    ('status =~ "^5\\d\\d$"', True),  # numbers match as text; regexes need no doubled backslashes
    ('ok =~ "false"', True),
    ('blob =~ "bytes"', True),
    ('http =~ "health"', False),  # tables never match
    ('missing =~ ""', False),
    ('missing !~ "x"', True),
    ("exists(level)", True),
    ("exists(nothing)", True),  # present, even if null
    ("exists(missing)", False),
    ("exists($.http.path)", True),
    ("exists($.http.nope)", False),
    ('level in ["info", "debug"]', True),
    ("status in [500, 503]", True),
    ('status in ["503"]', False),
    ("ok in [0]", False),
    ("http in [1]", False),  # unhashable values are simply not in the list
    ('level == "x" or status == 503', True),
    ('level == "x" or status == 1 or ok == false', True),
    ('level == "debug" and status == 1', False),
    ('level == "debug" and status == 503 and exists(http)', True),
    ('not level == "debug"', False),
    ('not (level == "x" or status == 1)', True),
    ('(level == "debug" or status == 1) and not exists(missing)', True),
    ('level == "debug" and (status == 1 or ok == false)', True),
    ("not not ok == false", True),
])
def test_semantics(text, expected):
    assert Condition(text)(RECORD) is expected


def test_precedence_not_binds_tighter_than_and_than_or():
    c = Condition("a == 1 or a == 2 and b == 3")
    assert c({"a": 1, "b": 0}) and not c({"a": 2, "b": 0}) and c({"a": 2, "b": 3})


def test_an_empty_record_never_raises():
    for text in ["a == 1", "$.a.b[0] >= 1", 'a =~ "x"', "exists($.a[1])", "a in [1]", "not a != null"]:
        Condition(text)({})


def test_select_and_reject_whole_batches():
    events = [(i, {"n": i}) for i in range(10)]
    c = Condition("n >= 7")
    assert [e[0] for e in c.select(events)] == [7, 8, 9]
    assert [e[0] for e in c.reject(events)] == list(range(7))


@pytest.mark.parametrize("text,column,words", [
    ("", 1, "empty condition"),
    ("   ", 4, "empty condition"),
    ("level ==", 9, "expected a value after =="),
    ("level = 1", 7, "equality is =="),
    ("a.b == 1", 1, "$.a.b"),
    ("x == 1 && y == 2", 8, "use and, or, not"),
    ("x =~ 5", 6, "regular expression in a string"),
    ('x =~ "("', 6, "not a valid regular expression"),
    ('5 =~ "x"', 1, "left side of =~"),
    ("(a == 1", 8, "expected ')'"),
    ("a == 1 b", 8, "expected and, or or the end"),
    ('"x" == "y"', 1, "one field and one value"),
    ("a == b", 1, "one field and one value"),
    ("a < true", 5, "orders numbers or strings, not true"),
    ("a >= null", 6, "not null"),
    ("exists(1)", 8, "exists takes a field"),
    ("exists a", 8, "'(' after exists"),
    ("$. == 1", 2, "names a field"),
    ("$.a[x] == 1", 4, "expected a comparison"),
    ('a == "unterminated', 6, "unterminated string"),
    ("a", 2, "expected a comparison"),
    ("a == 1 and", 11, "expected a field"),
    ("and a == 1", 1, "expected a field"),
    ("a in 1", 6, "'[' after in"),
    ("a in [true]", 7, "strings or numbers"),
    ("a in [1 2]", 9, "expected ',' or ']'"),
    ("a == 1 ; b", 8, "unexpected character ';'"),
])
def test_errors_carry_the_column(text, column, words):
    with pytest.raises(ConditionError) as info:
        Condition(text)
    message = str(info.value)
    assert info.value.column == column, message
    assert message.startswith(f"column {column}: ") and words in message, message
    assert repr(text) in message


def test_config_errors_name_the_option_path_and_the_column():
    from logrouter.config.load import ConfigError, load_string

    config = """
[sources.in]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[filters.health]
type = "drop"
inputs = ["in"]
condition = 'path =~ "^/health" and'

[filters.keep]
type = "grep"
inputs = ["health"]
condition = 'level = "error"'

[filters.few]
type = "sample"
inputs = ["keep"]
rate = 10
condition = 'level == "debug" or'

[sinks.out]
type = "parquet"
inputs = ["few"]
path = "lake"
"""
    with pytest.raises(ConfigError) as info:
        load_string(config)
    assert info.value.errors == [
        "filters.health.condition: column 23: expected a field, a value, not, exists or '(', found the end of the "
        "expression (in 'path =~ \"^/health\" and')",
        "filters.keep.condition: column 7: unknown operator '='; equality is == (in 'level = \"error\"')",
        "filters.few.condition: column 20: expected a field, a value, not, exists or '(', found the end of the "
        "expression (in 'level == \"debug\" or')",
    ]

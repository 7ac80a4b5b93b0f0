"""Conditions: the one small expression language of filters that select records.

Parsed once, at config load, into a Python closure ``record -> bool`` (nothing is ever
``eval``'d); a filter then calls it once per event. The syntax::

    condition  := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | "(" condition ")" | test
    test       := "exists" "(" field ")"
                | field op value | value op field
                | field "=~" string | field "!~" string
                | field "in" "[" value ("," value)* "]"
    op         := "==" | "!=" | "<" | "<=" | ">" | ">="
    field      := name | $-path        (``logrouter.paths``: ``$.a.b``, ``$['a b']``, ``$.a[0]``)
    value      := "string" | 'string' | number | true | false | null

A bare ``name`` (letters, digits, ``_``, ``@``, ``-``) is a top-level key; a nested field
is a ``$`` path. Strings take ``\\"``, ``\\'`` and ``\\\\`` escapes; any other backslash
stays as written, so a regex needs no doubling.

Semantics are total: evaluating never raises, whatever the record holds.

* ``==`` / ``!=`` compare type-strictly: a string equals only a string, a number only a
  number (``1 == 1.0``; never a boolean), ``true``/``false`` only a boolean. A missing
  field equals ``null``.
* ``<`` ``<=`` ``>`` ``>=`` hold only between two numbers or two strings; anything else
  (missing, null, another type) is false — so ``not (a < 5)`` is true for a missing ``a``.
* ``=~`` is a regex search (``logrouter.regex``: RE2, linear time; a pattern RE2 cannot
  compile, such as one with a backreference or lookaround, is a ``ConditionError``);
  numbers and booleans are matched as their text (booleans as ``true``/``false``), bytes
  as UTF-8; missing, null, tables and arrays never match.
  ``!~`` is its negation (true for a missing field), like ``grep``'s ``exclude``.
* ``exists(f)`` is true when the field is present, even if null.
* ``in [..]`` is ``==`` against any of the listed strings or numbers.

Each parsed test also carries its ``plan``, the expression as data (``("eq", path,
value)``, ``("and", [plans])``, …), so a batch kept as columns can be tested without
records (``logrouter.filters.columnar``); the closures are the reference.

A malformed expression raises ``ConditionError`` (a ``ValueError``) whose message starts
with the column (1-based) where it went wrong; the config loader puts the option's path
in front (``filters.web.condition: column 9: …``).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from logrouter import paths, regex
from logrouter.batch import Event

Test = Callable[[dict[str, Any]], bool]

SYNTAX = (
    "a condition: `field == \"x\"`, `$.http.status >= 500`, `path =~ \"^/health\"`, `exists($.a.b)`, "
    "`level in [\"debug\", \"trace\"]`, combined with `and`, `or`, `not` and parentheses"
)


class ConditionError(ValueError):
    """A malformed condition; ``column`` (1-based) is where it went wrong."""

    def __init__(self, text: str, offset: int, message: str) -> None:
        self.column = offset + 1
        self.text = text
        super().__init__(f"column {self.column}: {message} (in {text!r})")


_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<op>==|!=|<=|>=|=~|!~|<|>)
  | (?P<punct>[(),\[\]])
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<number>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?(?![\w@.]))
  | (?P<name>[A-Za-z_@][\w@-]*)
  | (?P<path>\$)
    """,
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "exists", "in", "true", "false", "null"}
_LITERALS = {"true": True, "false": False, "null": None}
_ESCAPE = re.compile(r"\\([\\\"'])")
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_NUMBER = (int, float)


class _Token:
    __slots__ = ("kind", "value", "start", "end")

    def __init__(self, kind: str, value: Any, start: int, end: int) -> None:
        self.kind, self.value, self.start, self.end = kind, value, start, end

    def describe(self) -> str:
        if self.kind == "end":
            return "the end of the expression"
        if self.kind == "field":
            return f"field {paths.text(self.value)}"
        if self.kind == "literal" and (self.value is None or isinstance(self.value, bool)):
            return {None: "null", True: "true", False: "false"}[self.value]
        return repr(self.value)


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text.startswith(("&&", "||"), pos) or text[pos] == "!":
                raise ConditionError(text, pos, f"unknown operator {text[pos:pos + 2]!r}; use and, or, not")
            if text[pos] == "=":
                raise ConditionError(text, pos, "unknown operator '='; equality is ==")
            if text[pos] in "\"'":
                raise ConditionError(text, pos, "unterminated string")
            raise ConditionError(text, pos, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup
        start, end = m.start(), m.end()
        value: Any = m.group()
        if kind == "space":
            pos = end
            continue
        if kind == "string":
            value = _ESCAPE.sub(r"\1", value[1:-1])
        elif kind == "number":
            value = float(value) if any(c in value for c in ".eE") else int(value)
        elif kind == "name":
            if text.startswith(".", end) and value not in _KEYWORDS:
                dotted = re.match(r"[\w@.-]+", text[start:]).group()
                raise ConditionError(
                    text, start, f"{dotted!r}: a nested field is written $.{dotted} (a top-level key with a dot: $['{dotted}'])"
                )
            if value in _LITERALS:
                kind, value = "literal", _LITERALS[value]
            elif value in _KEYWORDS:
                kind = "word"
            else:
                kind, value = "field", (value,)
        elif kind == "path":
            try:
                value, end = paths.scan(text, start)
            except paths.PathError as e:
                raise ConditionError(text, e.offset, str(e)) from None
            kind = "field"
        if kind in ("string", "number"):
            kind, value = "literal", value
        out.append(_Token(kind, value, start, end))
        pos = end
    out.append(_Token("end", None, len(text), len(text)))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def error(self, token: _Token, message: str) -> ConditionError:
        return ConditionError(self.text, token.start, message)

    def expect(self, kind: str, value: Any, what: str) -> _Token:
        token = self.take()
        if token.kind != kind or token.value != value:
            raise self.error(token, f"expected {what}, found {token.describe()}")
        return token

    def is_word(self, word: str) -> bool:
        token = self.peek()
        return token.kind == "word" and token.value == word

    def parse(self) -> Test:
        if self.peek().kind == "end":
            raise self.error(self.peek(), "empty condition")
        test = self.or_()
        token = self.peek()
        if token.kind != "end":
            raise self.error(token, f"expected and, or or the end of the expression, found {token.describe()}")
        return test

    def or_(self) -> Test:
        tests = [self.and_()]
        while self.is_word("or"):
            self.take()
            tests.append(self.and_())
        return _planned(_any(tests), "or", tests) if len(tests) > 1 else tests[0]

    def and_(self) -> Test:
        tests = [self.not_()]
        while self.is_word("and"):
            self.take()
            tests.append(self.not_())
        return _planned(_all(tests), "and", tests) if len(tests) > 1 else tests[0]

    def not_(self) -> Test:
        token = self.peek()
        if self.is_word("not"):
            self.take()
            inner = self.not_()
            return _negated(inner)
        if token.kind == "punct" and token.value == "(":
            self.take()
            inner = self.or_()
            self.expect("punct", ")", "')'")
            return inner
        if self.is_word("exists"):
            self.take()
            self.expect("punct", "(", "'(' after exists")
            field = self.take()
            if field.kind != "field":
                raise self.error(field, f"exists takes a field, found {field.describe()}")
            self.expect("punct", ")", "')'")
            return _plan(_exists(field.value), ("exists", field.value))
        return self.test()

    def test(self) -> Test:
        left = self.take()
        if left.kind not in ("field", "literal"):
            raise self.error(left, f"expected a field, a value, not, exists or '(', found {left.describe()}")
        op = self.take()
        if op.kind == "word" and op.value == "in":
            if left.kind != "field":
                raise self.error(left, "the left side of in is a field")
            return self.membership(left)
        if op.kind != "op":
            what = "after the field" if left.kind == "field" else "after the value"
            raise self.error(op, f"expected a comparison (==, !=, <, <=, >, >=, =~, !~, in) {what}, found {op.describe()}")
        right = self.take()
        if right.kind not in ("field", "literal"):
            raise self.error(right, f"expected a value after {op.value}, found {right.describe()}")
        if op.value in ("=~", "!~"):
            if left.kind != "field":
                raise self.error(left, f"the left side of {op.value} is a field")
            if right.kind != "literal" or not isinstance(right.value, str):
                raise self.error(right, f"{op.value} takes a regular expression in a string, found {right.describe()}")
            try:
                search = regex.compile(right.value).searcher()
            except regex.RegexError as e:
                raise self.error(right, str(e)) from None
            test = _plan(_regex(left.value, search), ("regex", left.value, right.value))
            if op.value == "!~":
                return _negated(test)
            return test
        if left.kind == right.kind:
            raise self.error(left, "a comparison needs one field and one value")
        name = op.value
        if left.kind == "literal":
            left, right, name = right, left, _FLIP[name]
        value = right.value
        if name in ("==", "!="):
            test = _plan(_equals(left.value, value), ("eq", left.value, value))
            if name == "!=":
                return _negated(test)
            return test
        if value is None or isinstance(value, bool):
            raise self.error(right, f"{op.value} orders numbers or strings, not {right.describe()}")
        return _plan(_order(left.value, name, value), ("order", left.value, name, value))

    def membership(self, field: _Token) -> Test:
        self.expect("punct", "[", "'[' after in")
        values: list[Any] = []
        while True:
            token = self.take()
            if token.kind != "literal" or token.value is None or isinstance(token.value, bool):
                raise self.error(token, f"in lists strings or numbers, found {token.describe()}")
            values.append(token.value)
            sep = self.take()
            if sep.kind == "punct" and sep.value == "]":
                break
            if sep.kind != "punct" or sep.value != ",":
                raise self.error(sep, f"expected ',' or ']', found {sep.describe()}")
        choices = frozenset(values)
        get = paths.getter(field.value)
        scalar = (str, int, float)

        def test(record: dict[str, Any]) -> bool:
            value = get(record)
            return value.__class__ in scalar and value in choices

        return _plan(test, ("in", field.value, tuple(values)))


# --- the closures -------------------------------------------------------------------------


def _plan(test: Test, plan: tuple) -> Test:
    test.plan = plan  # type: ignore[attr-defined]
    return test


def _planned(test: Test, op: str, parts: list[Test]) -> Test:
    plans = [getattr(part, "plan", None) for part in parts]
    return _plan(test, (op, plans)) if all(plan is not None for plan in plans) else test


def _negated(inner: Test) -> Test:
    test = lambda record: not inner(record)  # noqa: E731
    plan = getattr(inner, "plan", None)
    return test if plan is None else _plan(test, ("not", plan))


def _any(tests: list[Test]) -> Test:
    if len(tests) == 2:
        a, b = tests
        return lambda record: a(record) or b(record)

    def test(record: dict[str, Any]) -> bool:
        for t in tests:
            if t(record):
                return True
        return False

    return test


def _all(tests: list[Test]) -> Test:
    if len(tests) == 2:
        a, b = tests
        return lambda record: a(record) and b(record)

    def test(record: dict[str, Any]) -> bool:
        for t in tests:
            if not t(record):
                return False
        return True

    return test


def _exists(path: paths.Path) -> Test:
    if len(path) == 1:
        key = path[0]
        return lambda record: key in record
    get = paths.getter(path, paths.MISSING)
    missing = paths.MISSING
    return lambda record: get(record) is not missing


def _equals(path: paths.Path, value: Any) -> Test:
    key = path[0] if len(path) == 1 else None
    get = paths.getter(path)
    if value is None:
        if key is not None:
            return lambda record: record.get(key) is None
        return lambda record: get(record) is None
    if isinstance(value, bool):
        if key is not None:
            return lambda record: record.get(key) is value
        return lambda record: get(record) is value
    if isinstance(value, str):
        # Only a str equals a str: no type test needed.
        if key is not None:
            return lambda record: record.get(key) == value
        return lambda record: get(record) == value

    def number(record: dict[str, Any]) -> bool:
        v = get(record)
        return v.__class__ in _NUMBER and v == value

    return number


def _order(path: paths.Path, op: str, value: Any) -> Test:
    get = paths.getter(path)
    kinds = _NUMBER if isinstance(value, _NUMBER) else (str,)
    if op == "<":
        return lambda record: (v := get(record)).__class__ in kinds and v < value
    if op == "<=":
        return lambda record: (v := get(record)).__class__ in kinds and v <= value
    if op == ">":
        return lambda record: (v := get(record)).__class__ in kinds and v > value
    return lambda record: (v := get(record)).__class__ in kinds and v >= value


def _regex(path: paths.Path, search: Callable[[str], bool]) -> Test:
    key = path[0] if len(path) == 1 else None
    get = paths.getter(path)

    def test(record: dict[str, Any]) -> bool:
        v = record.get(key) if key is not None else get(record)
        if v.__class__ is not str:
            if v is None or isinstance(v, (dict, list)):
                return False
            v = _as_text(v)
        return search(v)

    return test


def _as_text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- the public face ----------------------------------------------------------------------


class Condition:
    """A parsed condition: ``test(record)`` for one record, ``split(events)`` for a batch."""

    __slots__ = ("text", "test", "plan")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise ValueError(f"a condition is a string, got {text!r}")
        self.text = text
        self.test: Test = _Parser(text).parse()
        #: the expression as data (see the module's docstring), for batches kept as columns
        self.plan: tuple | None = getattr(self.test, "plan", None)

    def __call__(self, record: dict[str, Any]) -> bool:
        return self.test(record)

    def select(self, events: list[Event]) -> list[Event]:
        """The events whose record passes."""
        test = self.test
        return [event for event in events if test(event[1])]

    def reject(self, events: list[Event]) -> list[Event]:
        """The events whose record does not pass."""
        test = self.test
        return [event for event in events if not test(event[1])]

    def __repr__(self) -> str:
        return f"Condition({self.text!r})"


def check(value: str) -> None:
    """``Option.check`` for a condition option: parse it, raising with the column."""
    Condition(value)

"""User-written regular expressions, matched by RE2 in time linear in the text.

Every regex a config holds (``grep``'s ``include`` / ``exclude``, ``parse_regex``'s
``pattern``, a condition's ``=~`` / ``!~``, the regexes tag patterns become) runs on the
reactor thread, once per event. Python's ``re`` backtracks: one value against a pattern
like ``^(a+)+$`` can take exponential time, and the process it runs in stops answering
anyone. RE2 (PyPI ``google-re2``) matches in time linear in the text, at the price of
what only backtracking can do: backreferences, lookahead and lookbehind, atomic groups,
possessive quantifiers. ``compile`` refuses those with a ``RegexError`` (a ``ValueError``)
that says what is unsupported and why, so the config loader can name the key.

The syntax is otherwise Python's (``(?P<name>...)``, ``(?i)``, ``(?s)``, ``\\d``,
classes), with RE2's meanings where they differ: ``\\d`` ``\\w`` ``\\s`` ``\\b`` are ASCII
(``\\pL``, ``\\p{Greek}``, ``[[:alpha:]]`` reach further), ``$`` is the end of the text
only (not also before a final newline) unless ``(?m)``, the end of the text is ``\\z``
(Python's ``\\Z``), no ``(?x)``, and a counted repetition goes up to 1000.

The matchers call the binding's ``RE2.Match`` (``re2._re2``) themselves: the ``re2``
module's ``re``-like ``search``, which builds a match object through a generator, costs
about ten times more per call on a short text, and per-event cost is what matters here.
Text goes to RE2 as UTF-8; a lone surrogate (JSON allows ``"\\ud800"``) passes through
as the three bytes ``surrogatepass`` makes of it, and group values come back the same way.
"""

from __future__ import annotations

import re
from typing import Callable

import re2
from re2 import _re2

_UNANCHORED = _re2.RE2.Anchor.UNANCHORED
_ANCHOR_BOTH = _re2.RE2.Anchor.ANCHOR_BOTH

#: the operators RE2's "invalid perl operator: ..." names that only backtracking has
_OPERATORS = {
    "(?=": "lookahead (?=...)",
    "(?!": "negative lookahead (?!...)",
    "(?<=": "lookbehind (?<=...)",
    "(?<!": "negative lookbehind (?<!...)",
    "(?>": "atomic groups (?>...)",
}
#: a named group's opening, or an escape (skipped, so ``\\(?P<a>`` is no group)
_GROUP_NAME = re.compile(r"\\.|\(\?P?<(\w+)>", re.S)
_LINEAR = "RE2 matches in linear time: no backreferences, lookaround, atomic groups or possessive repetition"


class RegexError(ValueError):
    """A pattern RE2 cannot compile; the message says why."""


def _explain(pattern: str, error: str) -> str:
    """RE2's reason, with what it means when the pattern needs a backtracking engine."""
    kind, _, detail = error.partition(": ")
    unsupported = None
    if kind == "invalid perl operator":
        if detail == "(?P" and "(?P=" in pattern:
            unsupported = "backreferences (?P=name)"
        elif detail == "(?x":
            return "(?x) verbose mode is not supported"
        else:
            unsupported = _OPERATORS.get(detail)
    elif kind == "invalid escape sequence":
        if detail[1:].isdigit():
            unsupported = f"backreferences ({detail})"
        elif detail == "\\Z":
            return "\\Z is written \\z (the end of the text)"
        elif detail in ("\\u", "\\U"):
            return f"{detail}hhhh is written \\x{{hhhh}} (a code point)"
    elif kind == "bad repetition operator" and detail.endswith("+"):
        unsupported = f"possessive repetition ({detail})"
    if unsupported is not None:
        return f"{unsupported}: not supported ({_LINEAR})"
    return error


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # RE2 would print each refused pattern to stderr
    return options


class Regex:
    """A compiled user pattern; its matchers are made once and called per event."""

    __slots__ = ("pattern", "names", "_re2", "_groups")

    def __init__(self, pattern: str) -> None:
        if not isinstance(pattern, str):
            raise RegexError(f"a regular expression is a string, got {pattern!r}")
        compiled = _re2.RE2(pattern.encode("utf-8", "surrogatepass"), _options())
        if not compiled.ok():
            raise RegexError(f"not a valid regular expression: {_explain(pattern, compiled.error().decode('utf-8', 'replace'))}")
        # RE2 takes a group name twice and answers for the first only; Python refuses it.
        named = [name for name in _GROUP_NAME.findall(pattern) if name]
        twice = sorted({name for name in named if named.count(name) > 1})
        if twice:
            raise RegexError(f"not a valid regular expression: group name {twice[0]!r} is used twice")
        self.pattern = pattern
        self._re2 = compiled
        self._groups = sorted((index, name.decode("utf-8", "surrogatepass")) for name, index in compiled.NamedCapturingGroups())
        #: the named groups, in the order they open in the pattern
        self.names: tuple[str, ...] = tuple(name for _, name in self._groups)

    def searcher(self) -> Callable[[str], bool]:
        """``text -> bool``: the pattern matches somewhere in the text (``re.search``)."""
        return self._matcher(_UNANCHORED)

    def full_matcher(self) -> Callable[[str], bool]:
        """``text -> bool``: the pattern matches the whole text (``re.fullmatch``)."""
        return self._matcher(_ANCHOR_BOTH)

    def _matcher(self, anchor: _re2.RE2.Anchor) -> Callable[[str], bool]:
        match = self._re2.Match

        def matches(text: str) -> bool:
            try:
                data = text.encode()
            except UnicodeEncodeError:
                data = text.encode("utf-8", "surrogatepass")
            return match(anchor, data, 0, len(data))[0][0] != -1

        return matches

    def group_searcher(self) -> Callable[[str], dict[str, str] | None]:
        """``text -> {name: value}`` of the named groups that took part in the first match
        (``re.search(...).groupdict()`` without the ``None`` ones), or ``None``: no match."""
        match, groups = self._re2.Match, self._groups

        def search(text: str) -> dict[str, str] | None:
            try:
                data = text.encode()
            except UnicodeEncodeError:
                data = text.encode("utf-8", "surrogatepass")
            spans = match(_UNANCHORED, data, 0, len(data))
            if spans[0][0] == -1:
                return None
            fields = {}
            for index, name in groups:
                start, end = spans[index]
                if start != -1:
                    fields[name] = data[start:end].decode("utf-8", "surrogatepass")
            return fields

        return search

    def __repr__(self) -> str:
        return f"Regex({self.pattern!r})"


def compile(pattern: str) -> Regex:  # noqa: A001 - the name every regex module uses
    """The pattern compiled by RE2; ``RegexError`` says why it cannot be."""
    return Regex(pattern)


def check(pattern: str) -> None:
    """``Option.check`` for a regex option."""
    Regex(pattern)

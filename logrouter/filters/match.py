"""Fluentd tag patterns and the ``match`` filter that passes whole batches by tag.

Tags are dot-separated parts. In a pattern ``*`` matches within one part (``a.*`` matches
``a.b`` but neither ``a`` nor ``a.b.c``), ``**`` matches zero or more parts (``a.**``
matches ``a``, ``a.b`` and ``a.b.c``), ``{x,y}`` matches any of its alternatives (which may
be patterns themselves), ``\\`` escapes the next character and everything else is literal.
Several patterns, in a list or separated by spaces as in Fluentd's ``<match a b>``, match
a tag when any of them does. ``compile_tag_pattern`` is the reusable part (``throttle``).
The regex a pattern becomes runs in RE2 (``logrouter.regex``), like every pattern a user
writes: ``**a**a**a**b`` against a long tag would take Python's ``re`` polynomial time.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable

from logrouter import regex, registry
from logrouter.batch import Batch
from logrouter.config.options import Option
from logrouter.errors import ErrorPath

# Sources send few distinct tags; the bound only matters against a flood of unique ones.
TAG_CACHE_SIZE = 1024


def split_patterns(patterns: str | Iterable[str]) -> list[str]:
    """One pattern string (space-separated patterns allowed) or a list -> single patterns."""
    items = [patterns] if isinstance(patterns, str) else list(patterns)
    return [p for item in items for p in item.split()]


def glob_to_regex(pattern: str) -> str:
    """Translate one tag pattern to a regex for ``fullmatch``; ``ValueError`` if malformed."""
    if not pattern:
        raise ValueError("empty tag pattern")
    out = [""]  # regex text per open brace level; out[0] is the whole pattern
    alternatives: list[list[str]] = []  # finished alternatives per open brace level
    dot = False  # a "." read but not yet written: ".**" must absorb it (zero parts)
    i, n = 0, len(pattern)
    while i < n:
        if pattern.startswith("**", i):
            if dot:
                out[-1] += r"(?:\..*)?"  # "a.**": nothing, or a dot and any parts
                dot = False
                i += 2
            elif pattern.startswith(".", i + 2):
                out[-1] += r"(?:.*\.)?"  # "**.b": nothing, or any parts and a dot
                i += 3
            else:
                out[-1] += ".*"
                i += 2
            continue
        if dot:
            out[-1] += r"\."
            dot = False
        c = pattern[i]
        if c == "\\":
            if i + 1 == n:
                raise ValueError(f"tag pattern {pattern!r} ends with a lone backslash")
            out[-1] += re.escape(pattern[i + 1])  # what re.escape writes, RE2 reads as the same literal
            i += 1
        elif c == ".":
            dot = True
        elif c == "*":
            out[-1] += r"[^.]*"
        elif c == "{":
            alternatives.append([])
            out.append("")
        elif c == "," and alternatives:
            alternatives[-1].append(out.pop())
            out.append("")
        elif c == "}":
            if not alternatives:
                raise ValueError(f"tag pattern {pattern!r} has '}}' without '{{'")
            alternatives[-1].append(out.pop())
            out[-1] += "(?:" + "|".join(alternatives.pop()) + ")"
        else:
            out[-1] += re.escape(c)
        i += 1
    if alternatives:
        raise ValueError(f"tag pattern {pattern!r} has '{{' without '}}'")
    if dot:
        out[-1] += r"\."
    return out[0]


def compile_tag_pattern(patterns: str | Iterable[str]) -> Callable[[str], bool]:
    """A predicate ``tag -> bool`` for one or more patterns, with a bounded per-tag cache."""
    parts = split_patterns(patterns)
    if not parts:
        raise ValueError("no tag pattern given")
    fullmatch = regex.compile("(?s)" + "|".join(f"(?:{glob_to_regex(p)})" for p in parts)).full_matcher()
    cache: dict[str, bool] = {}

    def matches(tag: str) -> bool:
        result = cache.get(tag)
        if result is None:
            result = fullmatch(tag)
            if len(cache) >= TAG_CACHE_SIZE:
                cache.clear()
            cache[tag] = result
        return result

    return matches


def check_tag_patterns(value: Any) -> None:
    """``Option.check`` for a pattern string or list of them."""
    items = [value] if isinstance(value, str) else value
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ValueError(f"item {i} must be a string, got {item!r}")
    if not split_patterns(items):
        raise ValueError("must name at least one tag pattern")
    compile_tag_pattern(items)  # a malformed one raises; so does one too large for RE2


@registry.filter("match")
class MatchFilter:
    """Passes a batch whose tag matches any of the patterns, drops the others whole."""

    OPTIONS = {
        "tag": Option(
            (str, list),
            doc="Fluentd tag patterns, an array or space-separated: `*` is one dot-separated part, `**` zero or more, "
            "`{x,y}` alternatives, `\\` escapes; the whole batch passes or not",
            check=check_tag_patterns,
        ),
    }

    def __init__(self, name: str, options: dict[str, Any], errors: ErrorPath) -> None:
        self.name = name
        self.errors = errors
        self._matches = compile_tag_pattern(options["tag"])

    def process(self, batch: Batch) -> Batch | None:
        return batch if self._matches(batch.tag) else None

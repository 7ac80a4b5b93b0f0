"""The fenced code blocks of the docs pages, for the tests that check or run them.

``blocks(page, "toml")`` are a page's blocks of one language, in order
(``tests/unit/test_docs_snippets.py`` validates every TOML one). A block a test runs is named
on the page by an HTML comment on the line before it, which the site does not show::

    <!-- snippet: beats-router -->
    ```toml
    ...
    ```

``snippet(page, "beats-router")`` is that block's text, exactly as a reader copies it;
the test then changes only what cannot be the same on a test machine (ports, paths,
certificate files) with ``substituted``, which fails when what it replaces is no longer on
the page, so a page edit cannot quietly leave a test running something else.
"""

from __future__ import annotations

import re
from pathlib import Path

from repo_paths import DOCS, REPO  # noqa: F401 - REPO for the tests that import it from here

FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.M | re.S)
NAMED = re.compile(r"^<!-- snippet: ([\w.-]+) -->\n```[^\n]*\n(.*?)^```", re.M | re.S)


def _text(page: Path | str) -> str:
    path = Path(page)
    return (path if path.is_absolute() else REPO / path).read_text(encoding="utf-8")


def blocks(page: Path | str, language: str) -> list[str]:
    """The page's fenced blocks of ``language`` (the fence's first word), in order."""
    return [body for lang, body in FENCE.findall(_text(page)) if lang == language]


def named(page: Path | str) -> dict[str, str]:
    """The page's named blocks; a name used twice is an error."""
    found: dict[str, str] = {}
    for name, body in NAMED.findall(_text(page)):
        if name in found:
            raise AssertionError(f"{page}: two snippets named {name!r}")
        found[name] = body
    return found


def snippet(page: Path | str, name: str) -> str:
    found = named(page)
    if name not in found:
        raise AssertionError(f"{page} has no snippet named {name!r} (it has {sorted(found)})")
    return found[name]


def substituted(text: str, replacements: dict[str, str]) -> str:
    """``text`` with each key replaced by its value; every key must occur in it."""
    for old, new in replacements.items():
        if old not in text:
            raise AssertionError(f"{old!r} is no longer in the snippet:\n{text}")
        text = text.replace(old, new)
    return text


def toml_tables(text: str) -> dict[str, str]:
    """A TOML snippet cut into its tables: ``{"sinks.lake": "[sinks.lake]\\n…"}``, so a test
    can put one snippet's source next to another's sink (no TOML writer is needed)."""
    tables: dict[str, str] = {}
    header = ""
    for line in text.splitlines(keepends=True):
        if m := re.match(r"^\[([^\[\]]+)\]\s*$", line):
            header = m.group(1).strip()
        tables[header] = tables.get(header, "") + line
    return tables

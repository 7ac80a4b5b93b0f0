"""The README's option tables, rendered from the option specs.

Every config key is declared once, as an ``Option`` with its type, default and doc (see
``logrouter.config.options``); ``check-config`` errors and the README both show that doc.
This module renders one markdown table (key | default | meaning) per section and keeps
the README's copies between markers up to date::

    <!-- options:sources.fluent_forward -->
    | key | default | meaning |
    …
    <!-- /options -->

Sections: ``router``, ``spool``, ``compaction``, ``sources.stream`` (the options every
stream source shares), ``sinks.common`` (every sink's), and ``<kind>.<type>`` for each
component the registry knows; a component's table leaves out the shared keys it takes
unchanged. A component registered later (a new source) gets its section added by
``--write``, under a heading of its own at the end of its kind's part of the README.

    python -m logrouter.config.docs --write README.md   # regenerate the tables
    python -m logrouter.config.docs --check README.md   # exit status 1 if they drifted
    python -m logrouter.config.docs sources.lumberjack  # print one table
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from logrouter.config.options import Option

REGENERATE = "python -m logrouter.config.docs --write README.md"
END_MARKER = "<!-- /options -->"
_BLOCK = re.compile(r"<!-- options:(?P<name>[\w.]+) -->\n(?P<body>.*?)" + re.escape(END_MARKER), re.S)
_HEADING = re.compile(r"^(#{1,6}) ", re.M)
KINDS = ("sources", "filters", "sinks")


def _shared() -> dict[str, type]:
    """The bases whose options a whole family of components shares: section -> base class."""
    from logrouter.sinks.base import SinkBase
    from logrouter.sources.stream import StreamSource

    return {"sources.stream": StreamSource, "sinks.common": SinkBase}


def sections() -> dict[str, dict[str, Option]]:
    """Every section's options, in the README's order."""
    from logrouter import registry
    from logrouter.config.load import COMPACTION_OPTIONS, ROUTER_OPTIONS, SPOOL_OPTIONS

    registry.load_builtin()
    out: dict[str, dict[str, Option]] = {
        "router": ROUTER_OPTIONS,
        "spool": SPOOL_OPTIONS,
        "compaction": COMPACTION_OPTIONS,
    }
    shared: dict[type, dict[str, Option]] = {}
    for kind in KINDS:
        classes = registry.KINDS[kind]
        for section, base in _shared().items():
            if section.startswith(kind + "."):
                family = [cls for cls in classes.values() if issubclass(cls, base)]
                # A base's option every member replaces (a listen address with each one's
                # own default) is theirs to show, not the family's.
                shared[base] = out[section] = {
                    key: option
                    for key, option in base.OPTIONS.items()
                    if not family or any(cls.OPTIONS.get(key) is option for cls in family)
                }
        for type_name, cls in classes.items():
            inherited = [options for base, options in shared.items() if issubclass(cls, base)]
            out[f"{kind}.{type_name}"] = {
                key: option
                for key, option in cls.OPTIONS.items()
                if not any(shared_options.get(key) is option for shared_options in inherited)
            }
    return out


def default_text(option: Option) -> str:
    if option.required:
        return "required"
    return f"`{_toml(option.default)}`" if option.default is not None else "not set"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}" if value else "{}"
    return repr(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(options: dict[str, Option]) -> str:
    """The markdown table of ``options``: key | default | meaning."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for key, option in options.items():
        lines.append(f"| `{key}` | {_cell(default_text(option))} | {_cell(option.doc) or '(undocumented)'} |")
    return "\n".join(lines) + "\n"


def _block(name: str, body: str) -> str:
    return f"<!-- options:{name} -->\n{body}{END_MARKER}"


def render(text: str, specs: dict[str, dict[str, Option]] | None = None) -> str:
    """``text`` (the README) with every table regenerated and missing component sections added."""
    specs = sections() if specs is None else specs

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        return _block(name, table(specs[name])) if name in specs else match.group(0)

    text = _BLOCK.sub(replace, text)
    present = {m.group("name") for m in _BLOCK.finditer(text)}
    for name in specs:
        if name not in present:
            text = _insert(text, name, table(specs[name]))
            present.add(name)
    return text


def _insert(text: str, name: str, body: str) -> str:
    """Add a missing component's section after the last section of its kind."""
    kind, _, type_name = name.partition(".")
    last = None
    for match in _BLOCK.finditer(text):
        if match.group("name").startswith(kind + "."):
            last = match
    if kind not in KINDS or last is None:
        raise ValueError(f"no place for <!-- options:{name} -->: add the marker to the README by hand")
    # The heading level of that last section: the new one goes before the next heading of
    # that level or above (the end of that component's prose).
    headings = list(_HEADING.finditer(text, 0, last.start()))
    level = len(headings[-1].group(1)) if headings else 4
    position = len(text)
    for heading in _HEADING.finditer(text, last.end()):
        if len(heading.group(1)) <= level:
            position = heading.start()
            break
    title = f"{'#' * level} `{type_name}`" + (" (sink)" if kind == "sinks" else "")
    section = f"{title}\n\n{_block(name, body)}\n\n"
    if position == len(text) and not text.endswith("\n\n"):
        section = "\n" + section
    return text[:position] + section + text[position:]


def problems(text: str, specs: dict[str, dict[str, Option]] | None = None) -> list[str]:
    """How the README's tables differ from the specs (empty when they agree)."""
    specs = sections() if specs is None else specs
    found: dict[str, str] = {}
    out: list[str] = []
    for match in _BLOCK.finditer(text):
        name = match.group("name")
        if name in found:
            out.append(f"options:{name}: the README has this table twice")
        found[name] = match.group("body")
    for name, options in specs.items():
        if name not in found:
            out.append(f"options:{name}: no table in the README (no <!-- options:{name} --> marker)")
        elif found[name] != table(options):
            out.append(f"options:{name}: the table differs from the option specs")
    for name in found:
        if name not in specs:
            out.append(f"options:{name}: the README has a table for something that has no options spec")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m logrouter.config.docs", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="README", help="regenerate the option tables in this file")
    group.add_argument("--check", metavar="README", help="exit with status 1 if this file's tables drifted")
    parser.add_argument("section", nargs="*", help="print these sections' tables (default: list the sections)")
    args = parser.parse_args(argv)
    specs = sections()
    if args.write:
        with open(args.write, encoding="utf-8") as f:
            old = f.read()
        try:
            new = render(old, specs)
        except ValueError as e:
            print(f"{args.write}: {e}", file=sys.stderr)
            return 2
        if new != old:
            with open(args.write, "w", encoding="utf-8") as f:
                f.write(new)
            print(f"{args.write}: option tables updated")
        return 0
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            found = problems(f.read(), specs)
        for problem in found:
            print(f"{args.check}: {problem}", file=sys.stderr)
        if found:
            print(f"regenerate them with: {REGENERATE}", file=sys.stderr)
        return 1 if found else 0
    if not args.section:
        print("\n".join(specs))
        return 0
    for name in args.section:
        if name not in specs:
            print(f"unknown section {name!r}; known: {', '.join(specs)}", file=sys.stderr)
            return 2
        print(table(specs[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The docs site's option tables, rendered from the option specs.

Every config key is declared once, as an ``Option`` with its type, default and doc (see
``logrouter.config.options``); ``check-config`` errors and the documentation both show
that doc. This module renders one markdown table (key | default | meaning) per section
and keeps the copies in the pages under ``docs/`` up to date, between markers::

    <!-- options:sources.fluent_forward -->
    | key | default | meaning |
    …
    <!-- /options -->

Sections: ``router``, ``spool``, ``compaction``, ``sources.stream`` (the options every
stream source shares), ``sinks.common`` (every sink's), and ``<kind>.<type>`` for each
component the registry knows; a component's table leaves out the shared keys it takes
unchanged. A table may sit in any page, once; ``--write`` puts a missing one in its
default page (``PAGES``, or ``docs/<kind>/<type>.md`` for a component), creating that
page when it does not exist yet (it then needs its prose and a line in ``mkdocs.yml``'s
``nav``).

The tables are generated Markdown checked into the pages, not made at build time: the
pages read the same on a forge, in an editor and on the site, and a changed option shows
up in review as a changed page. ``tests/unit/test_docs_options.py`` fails when they drift.

    python -m logrouter.config.docs --write docs   # regenerate the tables
    python -m logrouter.config.docs --check docs   # exit status 1 if they drifted
    python -m logrouter.config.docs sources.lumberjack  # print one table
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from logrouter.config.options import Option

REGENERATE = "python -m logrouter.config.docs --write docs"
END_MARKER = "<!-- /options -->"
_BLOCK = re.compile(r"<!-- options:(?P<name>[\w.]+) -->\n(?P<body>.*?)" + re.escape(END_MARKER), re.S)
KINDS = ("sources", "filters", "sinks")
#: Where the tables that are not one component's live (paths inside the docs directory).
PAGES = {
    "router": "configuration.md",
    "spool": "configuration.md",
    "compaction": "compaction.md",
    "sources.stream": "sources/index.md",
    "sinks.common": "sinks/index.md",
}
_TITLES = {"sources": "source", "filters": "filter", "sinks": "sink"}


def _shared() -> dict[str, type]:
    """The bases whose options a whole family of components shares: section -> base class.
    A base names its section in ``OPTIONS_FAMILY`` (``StreamSource``: ``sources.stream``)."""
    from logrouter import registry

    found: dict[str, type] = {}
    for kind in KINDS:
        for cls in registry.KINDS[kind].values():
            for base in cls.__mro__:
                section = vars(base).get("OPTIONS_FAMILY")
                if section is not None:
                    found.setdefault(section, base)
    return found


def sections() -> dict[str, dict[str, Option]]:
    """Every section's options."""
    from logrouter import registry
    from logrouter.config import sections as owned
    from logrouter.config.load import ROUTER_OPTIONS, SPOOL_OPTIONS

    registry.load_builtin()
    out: dict[str, dict[str, Option]] = {
        "router": ROUTER_OPTIONS,
        "spool": SPOOL_OPTIONS,
        **{name: section.options for name, section in owned.SECTIONS.items()},
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


def page_for(section: str) -> str:
    """The page (a path inside the docs directory) a section's table goes in by default."""
    if section in PAGES:
        return PAGES[section]
    kind, _, type_name = section.partition(".")
    return f"{kind}/{type_name}.md"


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


def render(text: str, specs: dict[str, dict[str, Option]]) -> str:
    """``text`` (one page) with every table it holds regenerated from ``specs``."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        return _block(name, table(specs[name])) if name in specs else match.group(0)

    return _BLOCK.sub(replace, text)


def new_page(section: str, body: str) -> str:
    """A page for a component that has none yet: its title and its table, to be described."""
    kind, _, type_name = section.partition(".")
    title = f"# `{type_name}` {_TITLES.get(kind, kind)}"
    return f"{title}\n\n(Not described yet.)\n\n## Options\n\n{_block(section, body)}\n"


def read_pages(docs: Path) -> dict[str, str]:
    """Every Markdown page under ``docs``: its path inside ``docs`` -> its text."""
    return {
        path.relative_to(docs).as_posix(): path.read_text(encoding="utf-8") for path in sorted(docs.rglob("*.md"))
    }


def problems(pages: dict[str, str], specs: dict[str, dict[str, Option]] | None = None) -> list[str]:
    """How the pages' tables differ from the specs (empty when they agree)."""
    specs = sections() if specs is None else specs
    found: dict[str, tuple[str, str]] = {}
    out: list[str] = []
    for page, text in pages.items():
        for match in _BLOCK.finditer(text):
            name = match.group("name")
            if name in found:
                out.append(f"options:{name}: the table is in {found[name][0]} and again in {page}")
            found[name] = (page, match.group("body"))
    for name, options in specs.items():
        if name not in found:
            out.append(
                f"options:{name}: no table in the docs (no <!-- options:{name} --> marker; its page is {page_for(name)})"
            )
        elif found[name][1] != table(options):
            out.append(f"options:{name}: the table in {found[name][0]} differs from the option specs")
    for name, (page, _) in found.items():
        if name not in specs:
            out.append(f"options:{name}: {page} has a table for something that has no options spec")
    return out


def write(pages: dict[str, str], specs: dict[str, dict[str, Option]]) -> dict[str, str]:
    """The pages to write (path -> new text): tables regenerated, missing ones added to their
    default page (appended, or in a new page)."""
    out = {page: render(text, specs) for page, text in pages.items()}
    present = {m.group("name") for text in out.values() for m in _BLOCK.finditer(text)}
    for name in specs:
        if name in present:
            continue
        page = page_for(name)
        body = table(specs[name])
        if page in out:
            out[page] = out[page].rstrip("\n") + f"\n\n## Options\n\n{_block(name, body)}\n"
        else:
            out[page] = new_page(name, body)
    return {page: text for page, text in out.items() if pages.get(page) != text}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m logrouter.config.docs", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="DOCS", help="regenerate the option tables of the pages in this directory")
    group.add_argument("--check", metavar="DOCS", help="exit with status 1 if the tables in this directory drifted")
    parser.add_argument("section", nargs="*", help="print these sections' tables (default: list the sections)")
    args = parser.parse_args(argv)
    specs = sections()
    if args.write:
        docs = Path(args.write)
        pages = read_pages(docs)
        for page, text in write(pages, specs).items():
            path = docs / page
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            if page in pages:
                print(f"{path}: option tables updated")
            else:
                print(f"{path}: new page: describe the component and add the page to mkdocs.yml's nav")
        return 0
    if args.check:
        found = problems(read_pages(Path(args.check)), specs)
        for problem in found:
            print(f"{args.check}: {problem}", file=sys.stderr)
        if found:
            print(f"regenerate them with: {REGENERATE}", file=sys.stderr)
        return 1 if found else 0
    if not args.section:
        print("\n".join(f"{name}  ({page_for(name)})" for name in specs))
        return 0
    for name in args.section:
        if name not in specs:
            print(f"unknown section {name!r}; known: {', '.join(specs)}", file=sys.stderr)
            return 2
        print(table(specs[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Config sections and checks that other packages own, declared here so that ``config/``
imports none of them.

``logrouter.config.load`` reads ``[router]``, ``[spool]`` and the component tables
itself. A package that owns another top-level table registers a ``Section``: the table's
options (type-checked like every table, defaults filled in, shown in the docs) and a
check of what needs the rest of the config (``compaction.options``: ``[compaction]``,
whose ``sinks`` must name parquet sinks). A package with rules across tables registers a
``Check`` (``workers.plan``: what only one process can run, refused with an explicit
``workers`` above 1). Both are called in the one validation pass and return their
problems as ``path: message`` lines.

The registering modules are listed in ``registry.CONFIG_MODULES``;
``registry.load_config_modules()``, which validation runs first, imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from logrouter.config.options import Option


@dataclass(frozen=True)
class Tables:
    """What a check sees: the tables validated so far, defaults filled in (a table or
    component with problems of its own may be left out or hold what was written)."""

    router: dict[str, Any]
    spool: dict[str, Any]
    sources: dict[str, Any]  # name -> config.load.Component
    filters: dict[str, Any]
    sinks: dict[str, Any]


Check = Callable[[Tables], list[str]]


@dataclass(frozen=True)
class Section:
    """A top-level table its package owns: ``[name]``."""

    name: str
    options: dict[str, Option]
    check: Callable[[dict[str, Any], Tables], list[str]] | None = None  # (the section's values, the rest)

    def defaults(self) -> dict[str, Any]:
        return {key: option.default for key, option in self.options.items() if not option.required}


SECTIONS: dict[str, Section] = {}
CHECKS: list[Check] = []


def register_section(section: Section) -> Section:
    existing = SECTIONS.get(section.name)
    if existing is not None and existing is not section:
        raise ValueError(f"config section [{section.name}] registered twice")
    SECTIONS[section.name] = section
    return section


def register_check(check: Check) -> Check:
    if check not in CHECKS:
        CHECKS.append(check)
    return check


def defaults(name: str) -> dict[str, Any]:
    """The values of section ``name`` when the file has no such table ({} if unregistered)."""
    section = SECTIONS.get(name)
    return {} if section is None else section.defaults()

"""Component classes by kind and config type name.

Modules register their classes with the decorators below; ``load_builtin()`` imports the
modules that ship with logrouter so the config validator sees every type name, every
config section and check other packages own (``CONFIG_MODULES``, see
``logrouter.config.sections``) and, through the sources, every stored format of the
spool (``logrouter.spool.formats``).
"""

from __future__ import annotations

import importlib
from typing import Callable, TypeVar

T = TypeVar("T", bound=type)

SOURCES: dict[str, type] = {}
FILTERS: dict[str, type] = {}
SINKS: dict[str, type] = {}

KINDS = {"sources": SOURCES, "filters": FILTERS, "sinks": SINKS}

BUILTIN_MODULES = (
    "logrouter.sources.fluent_forward",
    "logrouter.sources.lumberjack",
    "logrouter.sources.log_courier",
    "logrouter.sources.logjam",
    "logrouter.sources.pravega",
    "logrouter.filters.match",
    "logrouter.filters.grep",
    "logrouter.filters.fields",
    "logrouter.filters.drop",
    "logrouter.filters.parse",
    "logrouter.filters.parse_time",
    "logrouter.filters.sample",
    "logrouter.filters.throttle",
    "logrouter.filters.dedupe",
    "logrouter.filters.route",
    "logrouter.sinks.parquet",
    "logrouter.sinks.iceberg",
    "logrouter.sinks.fluent_forward",
    "logrouter.sinks.lumberjack",
    "logrouter.sinks.logjam",
    "logrouter.sinks.file",
    "logrouter.sinks.stdout",
    "logrouter.sinks.blackhole",
)

#: Modules that register config sections and checks (``logrouter.config.sections``), in
#: the order their checks run.
CONFIG_MODULES = (
    "logrouter.compaction.options",
    "logrouter.workers.plan",
)


def _register(table: dict[str, type], type_name: str) -> Callable[[T], T]:
    def decorate(cls: T) -> T:
        if type_name in table and table[type_name] is not cls:
            raise ValueError(f"type name {type_name!r} registered twice")
        cls.TYPE = type_name
        table[type_name] = cls
        return cls

    return decorate


def source(type_name: str) -> Callable[[T], T]:
    return _register(SOURCES, type_name)


def filter(type_name: str) -> Callable[[T], T]:  # noqa: A001 - the component kind's name
    return _register(FILTERS, type_name)


def sink(type_name: str) -> Callable[[T], T]:
    return _register(SINKS, type_name)


def load_builtin() -> None:
    for module in (*BUILTIN_MODULES, *CONFIG_MODULES):
        importlib.import_module(module)

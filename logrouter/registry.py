"""Component classes by kind and config type name.

Modules register their classes with the decorators below. A process imports only the
modules of the types its config names (``get``: ``BUILTIN_TYPES`` says where each
built-in type is), the modules of the config sections and checks other packages own
(``CONFIG_MODULES``, see ``logrouter.config.sections``), and the module of a stored format
of the spool when a record of it is read (``STORED_FORMATS``, ``logrouter.spool.formats``).
``load_builtin()`` imports them all, for the docs and the tools that list every type.
"""

from __future__ import annotations

import importlib
from typing import Callable, TypeVar

T = TypeVar("T", bound=type)

SOURCES: dict[str, type] = {}
FILTERS: dict[str, type] = {}
SINKS: dict[str, type] = {}

KINDS = {"sources": SOURCES, "filters": FILTERS, "sinks": SINKS}

#: The module that registers each built-in type: what a config names is imported, and
#: nothing else (each component module costs memory in every process that checks a
#: config: ``docs/operations/memory.md``). ``tests/unit/test_registry.py`` checks it against
#: what the modules register.
BUILTIN_TYPES: dict[str, dict[str, str]] = {
    "sources": {
        "fluent_forward": "logrouter.sources.fluent_forward",
        "lumberjack": "logrouter.sources.lumberjack",
        "log_courier": "logrouter.sources.log_courier",
        "logjam": "logrouter.sources.logjam",
        "pravega": "logrouter.sources.pravega",
    },
    "filters": {
        "match": "logrouter.filters.match",
        "grep": "logrouter.filters.grep",
        "set": "logrouter.filters.fields",
        "remove": "logrouter.filters.fields",
        "rename": "logrouter.filters.fields",
        "drop": "logrouter.filters.drop",
        "parse_json": "logrouter.filters.parse",
        "parse_regex": "logrouter.filters.parse",
        "parse_time": "logrouter.filters.parse_time",
        "sample": "logrouter.filters.sample",
        "throttle": "logrouter.filters.throttle",
        "dedupe": "logrouter.filters.dedupe",
        "route": "logrouter.filters.route",
    },
    "sinks": {
        "parquet": "logrouter.sinks.parquet",
        "iceberg": "logrouter.sinks.iceberg",
        "fluent_forward": "logrouter.sinks.fluent_forward",
        "lumberjack": "logrouter.sinks.lumberjack",
        "logjam": "logrouter.sinks.logjam",
        "file": "logrouter.sinks.file",
        "stdout": "logrouter.sinks.stdout",
        "blackhole": "logrouter.sinks.blackhole",
    },
}

BUILTIN_MODULES = tuple(dict.fromkeys(module for types in BUILTIN_TYPES.values() for module in types.values()))

#: The module that registers each stored format of the spool (``logrouter.spool.formats``):
#: a spool may hold records of a source no longer in the config, read back all the same.
STORED_FORMATS: dict[str, str] = {
    "forward": "logrouter.sources.fluent_forward",
    "json-documents": "logrouter.sources.events",
    "logjam-bodies": "logrouter.sources.logjam_native",
    "lumberjack-zlib": "logrouter.sources.compressed_documents",
    "log-courier-zlib": "logrouter.sources.compressed_documents",
}

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
    """Every built-in type (the docs and tools that list them all)."""
    for module in (*BUILTIN_MODULES, *CONFIG_MODULES):
        importlib.import_module(module)


def load_config_modules() -> None:
    """What a config check needs whatever the config names (``CONFIG_MODULES``)."""
    for module in CONFIG_MODULES:
        importlib.import_module(module)


def names(kind: str) -> list[str]:
    """Every type name of ``kind`` (``sources``, ``filters``, ``sinks``), loaded or not."""
    return sorted(set(BUILTIN_TYPES[kind]) | set(KINDS[kind]))


def get(kind: str, type_name: str) -> type | None:
    """The class of ``type_name``, its module imported if it is built in and was not yet;
    None for a name nobody registers."""
    table = KINDS[kind]
    module = BUILTIN_TYPES[kind].get(type_name)
    if type_name not in table and module is not None:
        importlib.import_module(module)
    return table.get(type_name)


def load_stored_format(name: str) -> None:
    """Import the module that registers stored format ``name``, if one does."""
    module = STORED_FORMATS.get(name)
    if module is not None:
        importlib.import_module(module)

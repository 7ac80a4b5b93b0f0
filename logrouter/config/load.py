"""Reading and validating the TOML config into a ``Config``.

Validation covers the whole file in one pass and collects every problem as a message
that starts with the path of the bad key (``sinks.lake.roll_bytes: …``): unknown
sections, kinds and types, unknown keys (listing the allowed ones), wrong value types,
values a component's option check refuses, unknown inputs, inputs that name sinks,
cycles, sinks without inputs, bad listen endpoints and two listeners on one endpoint.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

from logrouter import registry
from logrouter.config import endpoints, sections
from logrouter.config.http_options import HTTP_OPTIONS, check_http, http_warnings
from logrouter.config.options import Option, Problems, non_negative, one_of, positive

#: The config file the commands (``twistd logrouter``, ``logrouter run``, …) read when given none.
DEFAULT_CONFIG = "etc/logrouter.toml"

DURABILITY = ("fsync", "os", "none")

SPOOL_OPTIONS: dict[str, Option] = {
    "path": Option(str, "var/spool", "directory of the segment files, sink state and the dedupe snapshot"),
    "durability": Option(
        str,
        "fsync",
        "when an ack may be sent: `fsync` (written and fsync'd), `os` (written to the kernel) or `none` (at once); "
        "see How delivery works",
        one_of(*DURABILITY),
    ),
    "segment_bytes": Option(int, 64 * 1024 * 1024, "a new segment file starts past this size; segments are deleted once every sink is past them", positive),
    "max_bytes": Option(
        int, 8 << 30, "backlog (from the slowest sink's cursor to the end of the spool) at which every source stops reading; "
        "they resume below 80%", positive
    ),
    "dedupe_window": Option(int, 100_000, "client batch ids (forward `chunk`, …) remembered to recognise retransmissions", positive),
}

def _check_workers(value: Any) -> None:
    if value == "auto" or (type(value) is int and value >= 1):
        return
    raise ValueError(f"must be a whole number of at least 1 or \"auto\", got {value!r}")


ROUTER_OPTIONS: dict[str, Option] = {
    **HTTP_OPTIONS,
    "workers": Option(
        (int, str), "auto", "router processes: above 1, a supervisor hands each TCP/TLS connection to one of this many "
        "workers (each with its own spool); `auto` = the cores this process may use (capped by a cgroup CPU limit), or 1 "
        "when nothing can be shared; "
        "see Workers", _check_workers
    ),
    "pin_workers": Option(
        bool, True, "with more than one worker, bind worker `i` to the `i`-th CPU this process may use (in turn): a "
        "process whose threads hand the GIL between cores spends ~20% more CPU per event; see Workers"
    ),
    "shutdown_timeout_secs": Option(
        (int, float), 30, "how long a graceful stop may take to drain and commit (0 = no limit); past it the process stops "
        "anyway and uncommitted work is replayed from the spool at the next start", non_negative
    ),
}

COMPONENT_KINDS = ("sources", "filters", "sinks")


class ConfigError(Exception):
    """The config file is unusable; ``errors`` lists every problem found."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def invalid_config_header(path: str, errors: list[str]) -> str:
    """The first line of a refused config's report, the same for ``check-config`` and twistd."""
    return f"logrouter: {path}: invalid config ({len(errors)} error{'s' if len(errors) != 1 else ''}):"


@dataclass
class Component:
    kind: str  # "sources", "filters" or "sinks"
    name: str
    type: str
    options: dict[str, Any]
    inputs: list[str] = field(default_factory=list)

    @property
    def cls(self) -> type:
        cls = registry.get(self.kind, self.type)
        assert cls is not None, self.type  # validation accepted only known type names
        return cls

    @property
    def path(self) -> str:
        return f"{self.kind}.{self.name}"


@dataclass
class Config:
    router: dict[str, Any]
    spool: dict[str, Any]
    sources: dict[str, Component]
    filters: dict[str, Component]
    sinks: dict[str, Component]
    compaction: dict[str, Any] = field(default_factory=lambda: sections.defaults("compaction"))

    def downstream(self, name: str) -> list[Component]:
        """Filters and sinks that name ``name`` among their inputs, in config order.

        ``name`` is a component (``forward``) or one of its outputs (``parse.errors``,
        ``by_level.slow``), exactly as written in ``inputs``."""
        return [c for c in (*self.filters.values(), *self.sinks.values()) if name in c.inputs]

    def split_input(self, reference: str) -> tuple[str, str | None]:
        """``(component, output)`` of an ``inputs`` entry: ``("forward", None)`` for a
        component's main output, ``("parse", "errors")`` for ``parse.errors``."""
        return split_input(reference, (*self.sources, *self.filters, *self.sinks))

    def error_outputs(self) -> list[str]:
        """The ``<component>.errors`` outputs some component takes as input."""
        used = []
        for component in (*self.filters.values(), *self.sinks.values()):
            for reference in component.inputs:
                name, output = self.split_input(reference)
                if output == ERRORS_OUTPUT and reference not in used:
                    used.append(reference)
        return used


def warnings(config: "Config") -> list[str]:
    """What is valid but almost certainly not meant: a source or filter whose events
    nothing takes (they are stored in the spool, then go nowhere), an empty graph, an
    HTTP endpoint open on every interface."""
    found = http_warnings(config.router)
    if not config.sources and not config.sinks:
        found.append("the config defines no sources and no sinks: the router would take nothing in and write nothing")
    elif not config.sinks:
        found.append("sinks: none defined: events are stored in the spool and go nowhere")
    taken = {config.split_input(r) for c in (*config.filters.values(), *config.sinks.values()) for r in c.inputs}
    for kind, components in (("sources", config.sources), ("filters", config.filters)):
        for name in components:
            if (name, None) not in taken and not any(n == name and o not in (None, ERRORS_OUTPUT) for n, o in taken):
                found.append(f"{kind}.{name}: nothing takes its events (no filter or sink lists it in inputs)")
    return found


#: Every component's dead-letter output: ``<name>.errors`` carries what it could not handle.
ERRORS_OUTPUT = "errors"


def split_input(reference: str, names: Any) -> tuple[str, str | None]:
    """``(component, output)`` of ``reference`` given the component ``names``: a name as
    it is wins (a quoted TOML name may hold dots), else the part before the last dot."""
    if reference in names:
        return reference, None
    component, dot, output = reference.rpartition(".")
    if dot and component in names:
        return component, output
    return reference, None


def outputs_of(component: Component) -> list[str] | None:
    """The named outputs a component declares (a ``route`` filter's), besides ``errors``;
    None when they cannot be known (the option naming them was refused)."""
    declared = getattr(component.cls, "outputs", None)
    if declared is None:
        return []
    outputs = declared(component.options)
    return None if outputs is None else list(outputs)


def load_file(path: str) -> Config:
    """Read and validate ``path``; raise ``ConfigError`` with every problem found."""
    return load_string(read_text(path), path)


def read_text(path: str) -> str:
    """The text of the config file ``path`` (``ConfigError`` if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError([f"{path}: cannot read: {e.strerror or e}"]) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError([f"{path}: not valid TOML: {e}"]) from None


def load_string(text: str, origin: str = "") -> Config:
    """Validate a config's text; ``origin`` (its file) starts the message of a TOML error."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{origin + ': ' if origin else ''}not valid TOML: {e}"]) from None
    return validate(raw)


def validate(raw: dict[str, Any]) -> Config:
    registry.load_config_modules()  # component modules: only those of the types named
    errors: list[str] = []
    top_level = ("router", "spool", *COMPONENT_KINDS, *sections.SECTIONS)
    for key in raw:
        if key not in top_level:
            errors.append(f"{key}: unknown section (allowed: {', '.join(top_level)})")
    router = _check_table("router", raw.get("router", {}), ROUTER_OPTIONS, errors)
    check_http(router, errors)
    spool = _check_table("spool", raw.get("spool", {}), SPOOL_OPTIONS, errors)
    components = {kind: _read_components(kind, raw.get(kind, {}), errors) for kind in COMPONENT_KINDS}
    _check_graph(components, errors)
    _check_listeners(components["sources"], errors)
    tables = sections.Tables(router, spool, components["sources"], components["filters"], components["sinks"])
    owned: dict[str, dict[str, Any]] = {}  # the sections other packages own (compaction)
    for name, section in sections.SECTIONS.items():
        owned[name] = _check_table(name, raw.get(name, {}), section.options, errors)
        if section.check is not None:
            errors.extend(section.check(owned[name], tables))
    for check in sections.CHECKS:
        errors.extend(check(tables))
    if errors:
        raise ConfigError(errors)
    compaction = owned.get("compaction", sections.defaults("compaction"))
    return Config(router, spool, components["sources"], components["filters"], components["sinks"], compaction)


def _check_table(path: str, table: Any, options: dict[str, Option], errors: list[str]) -> dict[str, Any]:
    """Type-check ``table`` against ``options``; return it with defaults filled in."""
    if not isinstance(table, dict):
        errors.append(f"{path}: must be a table, got {_describe(table)}")
        return {k: o.default for k, o in options.items() if not o.required}
    result: dict[str, Any] = {}
    for key, value in table.items():
        option = options.get(key)
        if option is None:
            allowed = ", ".join(sorted(options)) or "none"
            errors.append(f"{path}.{key}: unknown key (allowed: {allowed})")
            continue
        messages = _check_value(value, option)
        if messages:
            errors.extend(_at(f"{path}.{key}", message) for message in messages)
            continue
        result[key] = float(value) if option.types is float and isinstance(value, int) else value
    for key, option in options.items():
        if key in table:
            continue
        if option.required:
            errors.append(f"{path}.{key}: required key is missing")
        else:
            result[key] = option.default
    return result


def _cross_key_errors(
    path: str,
    specs: dict[str, Option],
    options: dict[str, Any],
    raw: dict[str, Any],
    own_errors: list[str],
    check_options: Any,
) -> list[str]:
    """A component's cross-key problems, found in the same pass as the per-key ones.

    Keys whose value was refused are checked with the value as written (a default could
    make up a problem, say a TLS option "needing an ssl: listen" when the ssl: listen
    string itself was refused); a required key that is missing stops the cross-key check,
    there is nothing to check it with. A cross-key message about a key that already has
    its own error is left out, and a check that cannot cope with a refused value says
    nothing: the per-key errors say enough.
    """
    bad = {_key_of(path, e) for e in own_errors} - {None}
    candidate = dict(options)
    for key in bad:
        spec = specs.get(key)
        if spec is None:
            continue
        if key in raw:
            candidate[key] = raw[key]
        elif spec.required:
            return []
    try:
        messages = check_options(candidate)
    except Exception:  # noqa: BLE001 - a check fed a default it did not expect: the per-key errors say enough
        return []
    said = {e.partition(": ")[2] for e in own_errors}  # a refused value's problem, seen again from another key
    return [
        _cross_key(path, specs, message)
        for message in messages
        if message.partition(": ")[0] not in bad and message.partition(": ")[2] not in said
    ]


def _key_of(path: str, error: str) -> str | None:
    """The option key an error of the component at ``path`` is about (None for the whole table)."""
    if not error.startswith(path + "."):
        return None
    rest = error[len(path) + 1 :]
    end = min((i for i in (rest.find(":"), rest.find("["), rest.find(".")) if i >= 0), default=len(rest))
    return rest[:end]


def _cross_key(path: str, options: dict[str, Option], message: str) -> str:
    """A component's cross-key message under the path of the key it starts with, if any."""
    key, sep, rest = message.partition(": ")
    if sep and key in options:
        return f"{path}.{key}: {rest}"
    return f"{path}: {message}"


def _at(path: str, message: str) -> str:
    """``message`` under ``path``: joined directly when it names a part (``[1].port: …``)."""
    return f"{path}{message}" if message.startswith(("[", ".")) else f"{path}: {message}"


def _check_value(value: Any, option: Option) -> list[str]:
    types = option.types if isinstance(option.types, tuple) else (option.types,)
    # TOML booleans are ints to Python; a bool is only accepted where bool is declared.
    if isinstance(value, bool) and bool not in types:
        ok = False
    elif float in types and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    else:
        ok = isinstance(value, types)
    if not ok:
        return [f"must be {_article(option.type_names())}, got {_describe(value)}"]
    if option.check is not None:
        try:
            option.check(value)
        except Problems as e:
            return e.messages
        except ValueError as e:
            return [str(e)]
    return []


def _read_components(kind: str, tables: Any, errors: list[str]) -> dict[str, Component]:
    if not isinstance(tables, dict):
        errors.append(f"{kind}: must be a table of named components, got {_describe(tables)}")
        return {}
    known = registry.names(kind)
    components: dict[str, Component] = {}
    for name, table in tables.items():
        path = f"{kind}.{name}"
        if not isinstance(table, dict):
            errors.append(f"{path}: must be a table, got {_describe(table)}")
            continue
        type_name = table.get("type")
        if type_name is None:
            errors.append(f"{path}.type: required key is missing (one of: {', '.join(sorted(known))})")
            continue
        if type_name not in known:
            errors.append(f"{path}.type: unknown {kind[:-1]} type {type_name!r} (known: {', '.join(sorted(known))})")
            continue
        cls = registry.get(kind, type_name)
        body = {k: v for k, v in table.items() if k not in ("type", "inputs")}
        inputs = _read_inputs(kind, path, table, errors)
        if kind == "sources" and "inputs" in table:
            errors.append(f"{path}.inputs: sources take no inputs")
        before = len(errors)
        options = _check_table(path, body, cls.OPTIONS, errors)
        check_options = getattr(cls, "check_options", None)
        if check_options is not None:
            errors.extend(_cross_key_errors(path, cls.OPTIONS, options, body, errors[before:], check_options))
        components[name] = Component(kind, name, type_name, options, inputs)
    return components


def _read_inputs(kind: str, path: str, table: dict[str, Any], errors: list[str]) -> list[str]:
    if kind == "sources":
        return []
    inputs = table.get("inputs")
    if inputs is None:
        errors.append(f"{path}.inputs: required key is missing (a list of source or filter names)")
        return []
    if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
        errors.append(f"{path}.inputs: must be an array of component names, got {_describe(inputs)}")
        return []
    if not inputs:
        errors.append(f"{path}.inputs: must name at least one source or filter")
    return inputs


def _check_graph(components: dict[str, dict[str, Component]], errors: list[str]) -> None:
    sources, filters, sinks = (components[k] for k in COMPONENT_KINDS)
    seen: dict[str, str] = {}
    for kind in COMPONENT_KINDS:
        for name in components[kind]:
            if name in seen:
                errors.append(f"{kind}.{name}: name already used by {seen[name]}.{name}; component names must be unique")
            else:
                seen[name] = kind
    every = {**sinks, **filters, **sources}  # a name used twice is reported above; take the first kind
    for component in (*filters.values(), *sinks.values()):
        for i, reference in enumerate(component.inputs):
            where = f"{component.path}.inputs[{i}]"
            name, output = split_input(reference, every)
            upstream = every.get(name)
            if upstream is None:
                known = ", ".join(sorted((*sources, *filters))) or "none defined"
                errors.append(f"{where}: unknown input {reference!r} (sources and filters: {known})")
                continue
            declared = outputs_of(upstream)
            if output is None:
                if upstream.kind == "sinks":
                    errors.append(
                        f"{where}: {name!r} is a sink; inputs may name sources or filters (or {name}.{ERRORS_OUTPUT})"
                    )
                elif declared:
                    named = ", ".join(f"{name}.{o}" for o in declared)
                    errors.append(f"{where}: {name!r} has named outputs: take one of {named}")
                continue
            if declared is None:
                continue  # the component's own error says what is wrong
            allowed = [ERRORS_OUTPUT, *declared]
            if output not in allowed:
                errors.append(
                    f"{where}: {name!r} has no output {output!r} (its outputs: {', '.join(f'{name}.{o}' for o in allowed)})"
                )
    consumers = {**sinks, **filters}
    for cycle in _find_cycles(consumers, every):
        errors.append(f"{consumers[cycle[0]].kind}.{cycle[0]}.inputs: cycle {' -> '.join(cycle)}")
    if not sources and (filters or sinks):
        errors.append("sources: no source defined")


def _find_cycles(filters: dict[str, Component], every: Any = ()) -> list[list[str]]:
    """Each cycle among filters once, as the list of names along it (first repeated last).
    An output reference (``parse.errors``) is an edge from its component."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        path.append(name)
        for reference in filters[name].inputs:
            upstream = split_input(reference, every or filters)[0]
            if upstream not in filters:
                continue
            if state.get(upstream) == 1:
                cycles.append(path[path.index(upstream):] + [upstream])
            elif upstream not in state:
                visit(upstream, path)
        path.pop()
        state[name] = 2

    for name in filters:
        if name not in state:
            visit(name, [])
    return cycles


def _check_listeners(sources: dict[str, Component], errors: list[str]) -> None:
    bound: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for component in sources.values():
        for key, option in component.cls.OPTIONS.items():
            if not getattr(option, "endpoint", False) or key not in component.options:
                continue
            path = f"{component.path}.{key}"
            value = component.options[key]
            try:
                address = endpoints.listen_address(value)
            except ValueError as e:
                errors.append(f"{path}: {e}")
                continue
            if address is None:
                continue
            family, port, interface = address
            for other_path, other_interface in bound.get((family, port), []):
                if port != 0 and (interface == other_interface or "" in (interface, other_interface)):
                    errors.append(f"{path}: {value!r} listens on the same {family} port {port} as {other_path}")
            bound.setdefault((family, port), []).append((path, interface))


def _article(type_names: str) -> str:
    return ("an " if type_names[0] in "aeiou" else "a ") + type_names


def _describe(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "table"}
    return f"{names.get(type(value), type(value).__name__)} {value!r}"

"""Removed sources whose stored batches some sink has not passed yet, and their routes.

The router routes a spool record by the name of the source that stored it. A source
taken out of the config (by a reload, or by editing the file between two runs) leaves
acknowledged batches in the spool that a sink catching up (slow, held, failing, or
restarted) has still to read; under the new config their source has no route, so they
would reach no sink. Such a source is *retired* instead: the route it had (its filters
built again from their type and options, the sinks it reached, by name) stays among the
router's routes until every one of those sinks that still exists has committed past
``end``, the spool position where the source's batches end; then it is dropped. A source
added again under the same name takes its old batches over (routing is by name).

The running graph and the retired sources are kept in ``<spool>/routes.json``, replaced
atomically before new sources start and whenever a retired source is dropped, so a
restart routes them the same way: a source of the saved graph that the config no longer
has is retired at start, up to the spool's end.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from logrouter import registry, routes
from logrouter.config.load import ERRORS_OUTPUT, Component, Config, split_input
from logrouter.serial import defer_to_thread
from logrouter.atomic_file import replace_file

FILE = "routes.json"
_DATES = {"datetime": datetime.datetime, "date": datetime.date, "time": datetime.time}


def graph_of(config: Config) -> dict[str, Any]:
    """What routing needs of a config, as JSON-able data (see ``dumps``)."""
    return {
        "sources": list(config.sources),
        "filters": {n: {"type": c.type, "options": c.options, "inputs": list(c.inputs)} for n, c in config.filters.items()},
        "sinks": {n: list(c.inputs) for n, c in config.sinks.items()},
    }


def subgraph(graph: dict[str, Any], source: str) -> dict[str, Any]:
    """The part of ``graph`` a batch of ``source`` goes through (dead letters are new
    batches, routed by the running config: error outputs are left out)."""
    filters, sinks = graph["filters"], graph["sinks"]
    names = (*graph["sources"], *filters, *sinks)
    consumers = [*((n, f["inputs"]) for n, f in filters.items()), *sinks.items()]
    reached = {source}
    for _ in consumers:  # each round adds a component, or nothing more is reached
        more = {n for n, inputs in consumers if n not in reached and _taken(inputs, reached, names)}
        if not more:
            break
        reached |= more
    return {
        "sources": [source],
        "filters": {n: {**f, "inputs": _taken(f["inputs"], reached, names)} for n, f in filters.items() if n in reached},
        "sinks": {n: _taken(inputs, reached, names) for n, inputs in sinks.items() if n in reached},
    }


def _taken(inputs: list[str], reached: set[str], names: tuple[str, ...]) -> list[str]:
    """The ``inputs`` that take the main or a named output of a component in ``reached``."""
    taken = []
    for reference in inputs:
        component, output = split_input(reference, names)
        if component in reached and output != ERRORS_OUTPUT:
            taken.append(reference)
    return taken


def _plain(value: Any) -> Any:
    for tag, kind in _DATES.items():
        if type(value) is kind:
            return {"$toml": tag, "value": value.isoformat()}
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"cannot save a {type(value).__name__} option value")


def _typed(obj: dict[str, Any]) -> Any:
    if obj.keys() == {"$toml", "value"} and obj["$toml"] in _DATES:
        return _DATES[obj["$toml"]].fromisoformat(obj["value"])
    return obj


def dumps(data: Any) -> bytes:
    """JSON; TOML's dates and times (which option values may hold) as tagged objects."""
    return json.dumps(data, default=_plain, separators=(",", ":")).encode()


def loads(data: bytes) -> Any:
    return json.loads(data, object_hook=_typed)


def _check(saved: Any) -> None:
    """Raise unless ``saved`` has the shape ``save`` writes."""

    def graph(g: Any) -> None:
        if not (isinstance(g, dict) and isinstance(g["sources"], list) and isinstance(g["sinks"], dict)):
            raise ValueError("not a graph")
        for f in g["filters"].values():
            if not (isinstance(f["type"], str) and isinstance(f["options"], dict) and isinstance(f["inputs"], list)):
                raise ValueError("not a filter")

    if not isinstance(saved, dict):
        raise ValueError("not an object")
    graph(saved["graph"])
    for entry in saved["retired"]:
        if not (isinstance(entry["source"], str) and type(entry["end"]) is int):
            raise ValueError("not a retired source")
        graph(entry["graph"])


@dataclass
class RetiredSource:
    source: str
    end: int  # every batch the source stored lies before this spool position
    graph: dict[str, Any]  # subgraph(...) of the graph it was removed from
    filters: dict[str, Any] | None = None  # built on first use
    sinks: frozenset[str] | None = None  # the running sinks its route reaches (set by ``routes``)


class RetiredSources:
    """The retired sources of one router, their routes, and their file.

    ``run_blocking(function, *args)`` runs a blocking call off the reactor and returns a
    Deferred (a thread by default; tests pass a synchronous one).
    """

    log = Logger(namespace="logrouter.router")

    def __init__(self, directory: str, errors: Any, run_blocking: Callable[..., defer.Deferred] = defer_to_thread) -> None:
        self.path = os.path.join(directory, FILE)
        self.errors = errors
        self.run_blocking = run_blocking
        self.entries: dict[str, RetiredSource] = {}
        self._saving: defer.Deferred | None = None
        self._next: bytes | None = None
        self._waiting: list[defer.Deferred] = []

    # -- what was saved, and what the config leaves out ------------------------------------

    def load(self) -> dict[str, Any] | None:
        """The saved file (blocking); ``None`` when there is none or it is unreadable."""
        try:
            with open(self.path, "rb") as f:
                saved = loads(f.read())
            _check(saved)
            return saved
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as e:
            # Only disk damage makes one (it is replaced atomically); it must not stop the start.
            try:
                os.replace(self.path, self.path + ".damaged")
            except OSError:
                pass
            self.log.error("{path} is unreadable ({error}); moved aside: batches of sources removed before this "
                           "start reach no sink", path=self.path, error=f"{type(e).__name__}: {e}")
            return None

    def start(self, saved: dict[str, Any] | None, config: Config, end: int) -> None:
        """At start: the retired sources saved, and the sources of the saved graph that
        ``config`` no longer has, retired up to ``end`` (the spool's end)."""
        self.entries = {}
        if saved is None:
            return
        for entry in saved.get("retired", ()):
            self.entries[entry["source"]] = RetiredSource(entry["source"], entry["end"], entry["graph"])
        graph = saved["graph"]
        self._retire(graph, [s for s in graph.get("sources", ()) if s not in config.sources], end)
        for name in list(self.entries):
            if name in config.sources:
                del self.entries[name]  # added again: its batches go its new way

    def retire(self, old: Config, new: Config, end: int) -> None:
        """A reload: the sources of ``old`` that ``new`` has not are retired up to ``end``."""
        self._retire(graph_of(old), [s for s in old.sources if s not in new.sources], end)
        for name in list(self.entries):
            if name in new.sources:
                del self.entries[name]

    def _retire(self, graph: dict[str, Any], sources: list[str], end: int) -> None:
        for source in sources:
            self.entries[source] = RetiredSource(source, end, subgraph(graph, source))

    # -- routes ------------------------------------------------------------------------------

    def routes(self, sinks: dict[str, Any], config: Config) -> dict[str, list[Any]]:
        """The route of every retired source the running ``config`` has no source of,
        into the running ``sinks``; notes on each the sinks it reaches."""
        found = {}
        for entry in self.entries.values():
            if entry.source in config.sources:
                continue
            if entry.filters is None:
                entry.filters = self._build_filters(entry)
            graph = entry.graph
            sub = Config(
                router={}, spool={},
                sources={entry.source: Component("sources", entry.source, "", {})},
                filters={n: Component("filters", n, f["type"], f["options"], f["inputs"]) for n, f in graph["filters"].items()},
                sinks={n: Component("sinks", n, "", {}, inputs) for n, inputs in graph["sinks"].items()},
            )
            built, _ = routes.build(sub, entry.filters, {n: s for n, s in sinks.items() if n in sub.sinks}, self.errors)
            nodes = built.get(entry.source, [])
            entry.sinks = routes.reach(nodes) & frozenset(sinks)
            found[entry.source] = nodes
        return found

    def _build_filters(self, entry: RetiredSource) -> dict[str, Any]:
        filters = {}
        for name, definition in entry.graph["filters"].items():
            try:
                cls = registry.get("filters", definition["type"])
                if cls is None:
                    raise ValueError(f"unknown filter type {definition['type']!r}")
                options = {k: o.default for k, o in cls.OPTIONS.items() if not o.required}
                options.update(definition["options"])
                filters[name] = cls(name, options, self.errors)
            except Exception as e:  # noqa: BLE001 - e.g. a filter type this version no longer has
                self.log.error(
                    "source {source} was removed; its filter {name} cannot be built again ({error}): its stored "
                    "batches do not go through it", source=entry.source, name=name, error=f"{type(e).__name__}: {e}")
        return filters

    def release(self, cursors: dict[str, int]) -> list[str]:
        """Drop the retired sources whose sinks all committed past their end (``cursors``:
        the running sinks' cursors; a sink without one holds); their names."""
        done = [
            name for name, e in self.entries.items()
            if e.sinks is not None and all(cursors.get(sink, -1) >= e.end for sink in e.sinks)
        ]
        for name in done:
            del self.entries[name]
        return done

    def describe(self) -> list[str]:
        """``source → sinks (until spool position N)`` for each retired source."""
        return [
            f"{e.source} → {', '.join(sorted(e.sinks or ())) or 'no sink'} (until spool position {e.end})"
            for e in self.entries.values()
        ]

    # -- the file ------------------------------------------------------------------------------

    def save(self, config: Config) -> defer.Deferred:
        """Write the running graph and the retired sources; fires once they are on disk
        (or the write failed: logged, the running router goes on as it was)."""
        retired = [{"source": e.source, "end": e.end, "graph": e.graph} for e in self.entries.values()]
        try:
            self._next = dumps({"graph": graph_of(config), "retired": retired})
        except (TypeError, ValueError) as e:
            self.log.error("the routes cannot be saved ({error}): sources removed later and not passed by every "
                           "sink before a restart reach no sink after it", error=e)
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        self._waiting.append(d)
        if self._saving is None:
            self._write()
        return d

    def idle(self) -> defer.Deferred:
        """Fires once no write is under way."""
        if self._saving is None:
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        self._waiting.append(d)
        return d

    def _write(self) -> None:
        data, self._next = self._next, None
        waiting, self._waiting = self._waiting, []
        self._saving = self.run_blocking(replace_file, self.path, data)

        def done(result: Any) -> None:
            self._saving = None
            if isinstance(result, Failure):
                self.log.error("saving {path} failed: {error}", path=self.path, error=result.getErrorMessage())
            self._waiting[:0] = waiting  # a newer state waiting to be written holds theirs too
            if self._next is not None:
                self._write()
                return
            done_waiting, self._waiting = self._waiting, []
            for d in done_waiting:
                d.callback(None)

        self._saving.addBoth(done)

"""The routing graph: the filter and sink nodes a batch goes through, per batch source.

``build`` turns a config's graph (every filter and sink lists its ``inputs``) and the
running filter and sink objects into the routes the router pushes batches down: per
batch source (a source's name, or ``<component>.errors`` for dead letters) the nodes
that take it. Each node knows the sinks it reaches, so a batch meant for some sinks
only (a sink catching up) skips the branches that lead elsewhere. The router builds
the routes of the running config here, and ``logrouter.retired`` those of removed
sources whose stored batches some sink has not passed yet.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from logrouter.batch import Batch, Routing
from logrouter.config.load import ERRORS_OUTPUT, Config
from logrouter.errors import LoggedErrors

log = Logger(namespace="logrouter.router")


def records_of(batch: Batch, position: int) -> list:
    """The records of a batch whose filter or sink raised, for the error path; none, and
    a log line, when they cannot be decoded either (a deferred batch: what raised may
    have been that)."""
    try:
        return [record for _, record in batch.events]
    except Exception as e:  # noqa: BLE001 - reported here, the record is skipped
        log.error("spool record at {position} cannot be decoded ({error}); skipped",
                  position=position, error=f"{type(e).__name__}: {e}")
        return []


class FilterNode:
    """A filter, the nodes that take its outputs and the sinks reachable through it.

    ``children`` maps an output to the nodes that take it: ``None`` is the filter's main
    output; a filter with named outputs (``route``) returns ``{output: batch}`` from
    ``process`` and each batch goes to the nodes of its output. A filter whose class sets
    ``TAKES_ROUTING`` is called ``process(batch, routing)``: the ``Routing`` tells it which
    spool record the batch comes from, and which routing of it. ``counts`` is the
    ``[events in, events out]`` pair it adds to (``logrouter.flow``).
    """

    def __init__(self, name: str, component: Any, errors: LoggedErrors, counts: list[int] | None = None) -> None:
        self.name = name
        self.component = component
        self.takes_routing = bool(getattr(component, "TAKES_ROUTING", False))
        self.errors = errors
        self.counts = [0, 0] if counts is None else counts
        self.children: dict[str | None, list[Any]] = {}
        self.reach: frozenset[str] = frozenset()

    def push(self, batch: Batch, routing: Routing) -> None:
        if self.reach.isdisjoint(routing.targets):
            return
        errors = self.errors
        errors.position = routing.position  # what the filter reports comes from this spool record
        counts = self.counts
        try:
            counts[0] += len(batch.events)
            out = self.component.process(batch, routing) if self.takes_routing else self.component.process(batch)
        except Exception as e:
            # A filter bug must not take the router down; its whole batch goes to the error path.
            for record in records_of(batch, routing.position):
                errors(self.name, batch.tag, record, f"filter raised {type(e).__name__}: {e}")
            return
        finally:
            errors.position = None
        if out is None:
            return
        if out.__class__ is dict:
            for output, part in out.items():
                if part is not None and part.events:
                    counts[1] += len(part.events)
                    for child in self.children.get(output, ()):
                        child.push(part, routing)
            return
        if not out.events:
            return
        counts[1] += len(out.events)
        for child in self.children.get(None, ()):
            child.push(out, routing)


class SinkNode:
    def __init__(self, name: str, component: Any, errors: LoggedErrors) -> None:
        self.name = name
        self.component = component
        self.errors = errors
        self.reach = frozenset((name,))

    def push(self, batch: Batch, routing: Routing) -> None:
        if self.name in routing.targets and not routing.dry:
            errors = self.errors
            errors.position = position = routing.position
            try:
                self.component.write(batch, position, routing.size)
            except Exception as e:
                # A batch the sink cannot take (a bug, a value it cannot encode) would fail
                # the same way on every retry: it goes to the error path, the sink goes on.
                for record in records_of(batch, position):
                    errors(self.name, batch.tag, record, f"sink raised {type(e).__name__}: {e}")
            finally:
                errors.position = None


def build(
    config: Config, filters: dict[str, Any], sinks: dict[str, Any], errors: LoggedErrors, flow: Any = None
) -> tuple[dict[str, list[Any]], set[str]]:
    """Per batch source of ``config``, the nodes its batches are pushed to; and the
    components whose dead letters some component takes (for ``RoutedErrors.routed``).

    ``filters`` and ``sinks`` are the objects by name; a component of the config that
    has none is left out of the routes. ``flow`` (a ``logrouter.flow.Flow``) keeps the
    filter nodes' counts; without it they count for themselves only.
    """
    nodes: dict[str, Any] = {
        name: FilterNode(name, f, errors, flow.filter_counts(name) if flow is not None else None)
        for name, f in filters.items()
        if name in config.filters
    }
    nodes.update({name: SinkNode(name, s, errors) for name, s in sinks.items() if name in config.sinks})
    for component in (*config.filters.values(), *config.sinks.values()):
        consumer = nodes.get(component.name)
        if consumer is None:
            continue
        for reference in component.inputs:
            upstream, output = config.split_input(reference)
            if isinstance(nodes.get(upstream), FilterNode) and output != ERRORS_OUTPUT:
                nodes[upstream].children.setdefault(output, []).append(consumer)
    routed = {config.split_input(o)[0] for o in config.error_outputs()}
    every_sink = frozenset(name for name, node in nodes.items() if isinstance(node, SinkNode))
    for name in routed:
        if isinstance(nodes.get(name), FilterNode):
            # Its dead letters are consumed: it runs whatever sink a batch is for.
            nodes[name].reach = every_sink

    def reach(node: Any) -> frozenset[str]:
        if isinstance(node, FilterNode) and not node.reach:
            node.reach = frozenset().union(*(reach(c) for group in node.children.values() for c in group))
        return node.reach

    for node in nodes.values():
        reach(node)
    entries = [*config.sources, *config.error_outputs()]
    return {entry: [nodes[c.name] for c in config.downstream(entry) if c.name in nodes] for entry in entries}, routed


def reach(nodes: list[Any]) -> frozenset[str]:
    """The sinks a batch pushed down ``nodes`` can reach."""
    return frozenset().union(*(node.reach for node in nodes))


def filter_reach(routes: dict[str, list[Any]]) -> dict[str, frozenset[str]]:
    """Per filter on some route, the sinks a batch it is handed can reach."""
    found: dict[str, frozenset[str]] = {}
    seen: set[int] = set()
    stack = [node for nodes in routes.values() for node in nodes]
    while stack:
        node = stack.pop()
        if not isinstance(node, FilterNode) or id(node) in seen:
            continue
        seen.add(id(node))
        found[node.name] = found.get(node.name, frozenset()) | node.reach
        stack.extend(child for group in node.children.values() for child in group)
    return found


def filtered_sources(routes: dict[str, list[Any]], sink: str) -> frozenset[str]:
    """The batch sources with a route through a filter to ``sink``."""
    return frozenset(
        source
        for source, nodes in routes.items()
        if any(isinstance(node, FilterNode) and sink in node.reach for node in nodes)
    )

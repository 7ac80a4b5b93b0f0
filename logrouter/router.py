"""The router: builds the configured graph and moves batches from sources to sinks.

A source hands a batch to ``ingest``; the batch is appended to the spool, and once it is
durable the returned Deferred fires (the source then acks) and the batch is pushed down
the precomputed routes: each filter transforms it, each sink receives what reaches it.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from logrouter.batch import Batch
from logrouter.config.load import Config
from logrouter.errors import LoggedErrors
from logrouter.spool.log import SpoolLog
from logrouter.spool.record import encode_batch


class FilterNode:
    """A filter with the nodes that take its output."""

    def __init__(self, name: str, component: Any, errors: LoggedErrors) -> None:
        self.name = name
        self.component = component
        self.errors = errors
        self.children: list[Any] = []

    def push(self, batch: Batch) -> None:
        try:
            out = self.component.process(batch)
        except Exception as e:
            # A filter bug must not take the router down; its whole batch goes to the error path.
            for _, record in batch.events:
                self.errors(self.name, batch.tag, record, f"filter raised {type(e).__name__}: {e}")
            return
        if out is None or not out.events:
            return
        for child in self.children:
            child.push(out)


class SinkNode:
    def __init__(self, name: str, component: Any) -> None:
        self.name = name
        self.component = component

    def push(self, batch: Batch) -> None:
        self.component.write(batch)


class Router:
    log = Logger(namespace="logrouter.router")

    def __init__(self, config: Config, reactor: Any) -> None:
        self.config = config
        self.reactor = reactor
        self.errors = LoggedErrors()
        spool = config.spool
        self.spool = SpoolLog(reactor, spool["path"], spool["durability"], spool["segment_bytes"])
        self.sinks = {
            name: c.cls(name, c.options, self.errors, reactor) for name, c in config.sinks.items()
        }
        self.filters = {name: c.cls(name, c.options, self.errors) for name, c in config.filters.items()}
        self.sources = {name: c.cls(name, c.options, self, reactor) for name, c in config.sources.items()}
        self.routes = self._build_routes()
        self.batches_in = 0
        self.events_in = 0
        self.metrics_port: Any = None

    def _build_routes(self) -> dict[str, list[Any]]:
        nodes: dict[str, Any] = {name: FilterNode(name, f, self.errors) for name, f in self.filters.items()}
        nodes.update({name: SinkNode(name, s) for name, s in self.sinks.items()})
        for component in (*self.config.filters.values(), *self.config.sinks.values()):
            for upstream in component.inputs:
                if upstream in self.filters:
                    nodes[upstream].children.append(nodes[component.name])
        return {
            source: [nodes[c.name] for c in self.config.downstream(source)] for source in self.sources
        }

    def ingest(self, batch: Batch) -> defer.Deferred:
        """Store ``batch``; the Deferred fires once it is durable, after it was routed."""
        self.batches_in += 1
        self.events_in += len(batch.events)
        d = self.spool.append(encode_batch(batch))
        d.addCallback(self._route, batch)
        return d

    def _route(self, position: int, batch: Batch) -> None:
        for node in self.routes[batch.source]:
            node.push(batch)

    @defer.inlineCallbacks
    def start(self) -> Any:
        self.spool.open()
        for sink in self.sinks.values():
            yield sink.start()
        for source in self.sources.values():
            yield source.start()
        if self.config.router["metrics_listen"]:
            from twisted.internet import endpoints

            from logrouter import metrics

            endpoint = endpoints.serverFromString(self.reactor, self.config.router["metrics_listen"])
            self.metrics_port = yield endpoint.listen(metrics.site(self))
            address = self.metrics_port.getHost()
            self.log.info("metrics listening on {host} port {port}", host=address.host, port=address.port)

    @defer.inlineCallbacks
    def stop(self) -> Any:
        """Drain sources, let the spool finish what it holds, then commit every sink."""
        if self.metrics_port is not None:
            yield self.metrics_port.stopListening()
        yield defer.DeferredList([defer.maybeDeferred(s.stop) for s in self.sources.values()], consumeErrors=True)
        yield self.spool.close()
        results = yield defer.DeferredList([defer.maybeDeferred(s.stop) for s in self.sinks.values()], consumeErrors=True)
        for (ok, result), name in zip(results, self.sinks):
            if not ok:
                self.log.failure("sink {name} failed to stop cleanly", result, name=name)

"""What a config reload changes: the difference between the running config and a new one.

``plan(old, new)`` compares two validated configs and says, per component, what a live
reload does (``Router.reconfigure`` carries it out):

* a source whose type and options are unchanged **keeps** its listening socket and its
  connections; a changed or removed one is stopped gracefully (its stored batches get
  their acks), a changed or new one is started; a removed one's stored batches keep its
  route until every sink it named has passed them (``logrouter.retired``; ``retired``);
* a sink whose type and options are unchanged keeps running (its inputs may change: that
  only changes the routes); a changed one is stopped (it commits what it was handed) and
  started again from the cursor it saved; a removed one is stopped; a new one starts
  from its saved cursor, if any (as at start-up);
* a filter whose type and options are unchanged is kept with its state (``dedupe``'s
  memory, ``throttle``'s buckets); changed and new ones are built from the new config;
* what cannot change while running (``[spool]``, ``[compaction]``, the metrics endpoint)
  is listed in ``needs_restart`` and keeps its running value; ``shutdown_timeout_secs``
  and the reload token apply at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from logrouter.config.load import Component, Config

LIVE_ROUTER_KEYS = ("shutdown_timeout_secs", "reload_token", "reload_token_file")


def same_component(a: Component, b: Component) -> bool:
    """Same type and options (inputs are the routes' business, not the component's)."""
    return a.type == b.type and a.options == b.options


@dataclass
class ReloadPlan:
    """What a reload does; ``effective`` is the config the router runs afterwards."""

    effective: Config
    keep_sources: list[str] = field(default_factory=list)
    stop_sources: list[str] = field(default_factory=list)
    start_sources: list[str] = field(default_factory=list)
    keep_sinks: list[str] = field(default_factory=list)
    stop_sinks: list[str] = field(default_factory=list)
    start_sinks: list[str] = field(default_factory=list)
    needs_restart: list[str] = field(default_factory=list)
    #: components that could not start (``kind.name: reason``); left out, retried by the next reload
    failed: list[str] = field(default_factory=list)
    #: removed sources whose stored batches keep their route until the sinks it names pass
    #: them (``source → sinks (until spool position N)``; ``logrouter.retired``)
    retired: list[str] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return bool(self.stop_sources or self.start_sources or self.stop_sinks or self.start_sinks) or self.routes_changed

    routes_changed: bool = False

    def summary(self) -> str:
        parts = []
        for label, names in (
            ("sources kept", self.keep_sources),
            ("sources stopped", self.stop_sources),
            ("sources started", self.start_sources),
            ("sinks kept", self.keep_sinks),
            ("sinks stopped", self.stop_sinks),
            ("sinks started", self.start_sinks),
        ):
            if names:
                parts.append(f"{label}: {', '.join(names)}")
        if self.routes_changed:
            parts.append("filters and routes rebuilt")
        if self.retired:
            parts.append(f"stored events of removed sources still routed until their sinks pass them: {'; '.join(self.retired)}")
        if self.failed:
            parts.append(f"could not start (left out, retried by the next reload): {', '.join(self.failed)}")
        if self.needs_restart:
            parts.append(f"needs a restart to change (kept as running): {', '.join(self.needs_restart)}")
        return "; ".join(parts) or "nothing changed"


def plan(old: Config, new: Config) -> ReloadPlan:
    needs_restart = []
    if old.spool != new.spool:
        needs_restart.append("[spool]")
    if old.compaction != new.compaction:
        needs_restart.append("[compaction]")
    router: dict[str, Any] = dict(old.router)
    for key, value in new.router.items():
        if key in LIVE_ROUTER_KEYS:
            router[key] = value
        elif old.router.get(key) != value:
            needs_restart.append(f"router.{key}")
    effective = dataclasses.replace(
        new,
        router=router,
        spool=old.spool,
        compaction=old.compaction,
        # its own dicts: components that fail to start are taken out of the running config
        sources=dict(new.sources),
        filters=dict(new.filters),
        sinks=dict(new.sinks),
    )
    result = ReloadPlan(effective=effective, needs_restart=needs_restart)
    for name, component in old.sources.items():
        if name in new.sources and same_component(component, new.sources[name]):
            result.keep_sources.append(name)
        else:
            result.stop_sources.append(name)
    result.start_sources = [n for n in new.sources if n not in result.keep_sources]
    for name, component in old.sinks.items():
        if name in new.sinks and same_component(component, new.sinks[name]):
            result.keep_sinks.append(name)
        else:
            result.stop_sinks.append(name)
    result.start_sinks = [n for n in new.sinks if n not in result.keep_sinks]
    result.routes_changed = _graph(old) != _graph(new)
    return result


def _graph(config: Config) -> tuple:
    return (
        tuple((n, c.type, repr(sorted(c.options.items())), tuple(c.inputs)) for n, c in config.filters.items()),
        tuple((n, tuple(c.inputs)) for n, c in config.sinks.items()),
    )

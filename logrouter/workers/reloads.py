"""The supervisor's reloads (SIGHUP, ``POST /reload``): one at a time, applied by every
worker, and the config every worker starts from.

A reload reads the config file once, in the supervisor, and checks it. A config with
errors, or a new or moved TCP/TLS source whose address cannot be bound, is refused:
nothing changes anywhere. Otherwise the supervisor *accepts* it: from then on its text
(with the running ``[spool]``, which a reload cannot change) is what every worker runs.
Each running worker is sent it and applies it; a worker that is not running starts with
it, and one that was starting with an older text is sent the accepted one once it runs
(``worker_ready``). Workers never read the file, so a bad file on disk after a refused
reload cannot keep a crashed worker from starting again.

Once every worker answered, the listeners of removed or moved sources are closed and the
new ones accept. The answer has one line per worker; it is ``applied`` (200) only when
every running worker applied all of it.

Reloads run through a ``ReloadQueue``: one asked while another runs waits, then reads
the file again, so the last one asked for is the one every process ends up running.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from twisted.internet import defer
from twisted.logger import Logger

from logrouter.config.endpoints import listen_address
from logrouter.config.load import Config, ConfigError, load_string, read_text
from logrouter.reload_queue import APPLIED, FAILED, PARTLY, REFUSED, ReloadQueue, ReloadResult
from logrouter.workers import plan

ROUTER_KEPT = ("workers", "metrics_listen", "pin_workers")  # supervisor settings, until a restart


def kept_until_restart(old: Config, new: Config) -> list[str]:
    """What a reload cannot change in the supervisor (it keeps the running values)."""
    kept = [f"router.{key}" for key in ROUTER_KEPT if new.router[key] != old.router[key]]
    if new.spool != old.spool:
        kept.append("[spool]")
    if new.compaction != old.compaction:
        kept.append("[compaction]")
    return kept


def as_running(old: Config, new: Config) -> Config:
    """``new`` with what only a restart changes kept as ``old`` has it."""
    return dataclasses.replace(
        new, router={**new.router, **{key: old.router[key] for key in ROUTER_KEPT}},
        spool=old.spool, compaction=old.compaction,
    )


class SupervisorReloads:
    """The reloads of one supervisor.

    ``supervisor`` has ``config``, ``config_path``, ``config_text``, ``listeners``,
    ``addresses``, ``workers``, ``stopping``, ``announce(listener)`` and
    ``reply_limit()``; ``make_listener(name, type, listen)`` makes an unbound listener."""

    log = Logger(namespace="logrouter")

    def __init__(self, supervisor: Any, make_listener: Callable[[str, str, str], Any]) -> None:
        self.supervisor = supervisor
        self.make_listener = make_listener
        self.queue = ReloadQueue(self._run)

    def request(self) -> defer.Deferred:
        """Fires with the ``ReloadResult``."""
        if self.queue.running:
            self.log.info("reload asked while another runs: it waits for the reload under way, then reads the file again")
        return self.queue.request()

    def start_message(self) -> dict:
        """What a worker being started is sent first: the accepted config."""
        return {"op": "start", **self._config_message()}

    def _config_message(self) -> dict:
        supervisor = self.supervisor
        return {"config": supervisor.config_text, "spool": supervisor.config.spool, "shared": supervisor.addresses}

    def worker_ready(self, worker: Any) -> None:
        """A worker started with a config accepted since: it is sent the accepted one."""
        if worker.config_text == self.supervisor.config_text or self.supervisor.stopping:
            return
        self.log.info("worker {index} started with an older config: sending it the one accepted since", index=worker.index)
        worker.config_text = self.supervisor.config_text
        worker.request({"op": "reload", **self._config_message()}).addCallback(self._caught_up, worker)

    def _caught_up(self, reply: dict | None, worker: Any) -> None:
        if reply is None:
            self.log.error("worker {index}: no answer to the accepted config (it is applied when it starts again)",
                           index=worker.index)
            return
        result = ReloadResult.from_message(reply)
        if result.ok:
            self.log.info("worker {index} runs the accepted config: {text}", index=worker.index, text=result.text)
        else:
            self.log.error("worker {index} did not apply all of the accepted config ({outcome}): {text}",
                           index=worker.index, outcome=result.outcome, text=result.text)

    @defer.inlineCallbacks
    def _run(self) -> Any:
        supervisor = self.supervisor
        if supervisor.stopping:
            return ReloadResult(FAILED, "the router is stopping")
        try:
            text = read_text(supervisor.config_path)
            self.log.info("reloading the config from {path}", path=supervisor.config_path)  # (read: a later edit is not)
            new = load_string(text, supervisor.config_path)
        except ConfigError as e:
            for error in e.errors:
                self.log.error("reload refused: {error}", error=error)
            return ReloadResult(REFUSED, "refused, the running config is unchanged:\n" + "\n".join(e.errors))
        kept = kept_until_restart(supervisor.config, new)
        new = as_running(supervisor.config, new)
        try:
            opened, closing = self.listeners_for(new)
        except OSError as e:
            self.log.error("reload refused: {error}", error=e)
            return ReloadResult(REFUSED, f"refused, the running config is unchanged: {e}")
        addresses = {name: address for name, address in supervisor.addresses.items() if name not in closing}
        addresses.update({name: listener.address for name, listener in opened.items()})
        # Accepted: from here on every worker started runs it.
        supervisor.config, supervisor.config_text, supervisor.addresses = new, text, addresses
        message = {"op": "reload", **self._config_message()}
        asked = [worker.ready for worker in supervisor.workers]
        for worker, ready in zip(supervisor.workers, asked):
            if ready:  # one starting now with an older text is sent this one once it runs (worker_ready)
                worker.config_text = text
        replies = yield defer.gatherResults(
            [worker.request(message) if ready else defer.succeed(None) for worker, ready in zip(supervisor.workers, asked)]
        )
        if supervisor.stopping:  # its listeners are closed already: the new ones must not accept
            for listener in opened.values():
                listener.close()
            return ReloadResult(FAILED, "the router is stopping")
        for name in closing:
            supervisor.listeners.pop(name).close()
        for name, listener in opened.items():
            supervisor.listeners[name] = listener
            listener.start()
            supervisor.announce(listener)
        return self._answer(replies, asked, kept)

    def _answer(self, replies: list, asked: list[bool], kept: list[str]) -> ReloadResult:
        lines, outcomes = [], []
        for worker, ready, reply in zip(self.supervisor.workers, asked, replies):
            if not ready:
                lines.append(f"worker {worker.index}: not running now; it runs this config once it is")
                continue
            if reply is None:
                outcomes.append(FAILED)
                lines.append(f"worker {worker.index}: no answer within {self.supervisor.reply_limit():g}s "
                             "(it exited, or is still reloading)")
                continue
            result = ReloadResult.from_message(reply)
            outcomes.append(result.outcome)
            shown = result.text if result.outcome == APPLIED else f"{result.outcome}: {result.text}"
            lines.append(f"worker {worker.index}: {shown}")
        if kept:
            lines.append(f"needs a restart to change (kept as running): {', '.join(kept)}")
        if all(outcome == APPLIED for outcome in outcomes):
            self.log.info("config reloaded by every running worker")
            return ReloadResult(APPLIED, "\n".join(lines))
        outcome = PARTLY if set(outcomes) <= {APPLIED, PARTLY} else FAILED
        self.log.error("the reload did not apply everywhere ({outcome}); the supervisor runs the new config, and the next "
                       "reload tries again what was left out", outcome=outcome)
        return ReloadResult(outcome, f"not applied everywhere ({outcome}):\n" + "\n".join(lines))

    def listeners_for(self, new: Config) -> tuple[dict[str, Any], set[str]]:
        """Bind the shared sources ``new`` adds or moves to another address (all or none:
        an address that cannot be bound raises ``OSError`` with the source named), and
        the names of the listeners to close once the workers applied ``new``."""
        listeners = self.supervisor.listeners
        wanted = {name: new.sources[name] for name in plan.shared_sources(new)}
        closing = {name for name in listeners if name not in wanted}
        opened: dict[str, Any] = {}
        same: list[tuple[Any, str, str]] = []
        try:
            for name, component in wanted.items():
                listen = component.options["listen"]
                current = listeners.get(name)
                if current is not None and listen_address(current.listen) == listen_address(listen):
                    same.append((current, listen, component.cls.TYPE))  # same socket, maybe new TLS options
                    continue
                listener = self.make_listener(name, component.cls.TYPE, listen)
                try:
                    listener.bind()
                except OSError as e:
                    raise OSError(e.errno, f"sources.{name}.listen: cannot listen on {listen!r}: {e.strerror or e}") from None
                opened[name] = listener
                if current is not None:
                    closing.add(name)
        except OSError:
            for listener in opened.values():
                listener.close()
            raise
        for current, listen, source_type in same:
            current.listen, current.type = listen, source_type
        return opened, closing

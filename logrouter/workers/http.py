"""The supervisor's pages of the HTTP endpoint: built from the workers' answers, within a deadline.

``logrouter.http_endpoint`` serves them (and decides who may ask). Every worker is asked
at once over its channel and the page is answered with what came within
``WORKER_ANSWER_SECS``, so a worker that is stopped (SIGSTOP) or whose reactor is
blocked costs a scrape half a second, not Prometheus's whole scrape timeout:

* ``/metrics``: the workers' pages summed (``logrouter.workers.metrics``) and the
  supervisor's own samples. Per worker, ``logrouter_worker_running`` (its process runs
  and its router started) and ``logrouter_worker_up`` (it also answered this scrape in
  time). A worker that did not answer adds the counters of the last page it gave and no
  gauges: a late scrape does not make the summed counters go backwards (which
  Prometheus would read as a reset).
* ``/health``: the supervisor's listeners and, per worker, its state and the health
  document of its router (``logrouter.health``); a worker that is not running, not
  answering or crash-looping is a problem (503), as is any problem a worker reports.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from logrouter.health import status_of
from logrouter.workers.metrics import merge

WORKER_ANSWER_SECS = 0.5


class SupervisorPages:
    """The ``Pages`` (``logrouter.http_endpoint``) of a ``SupervisorService``."""

    def __init__(self, supervisor: Any, answer_secs: float = WORKER_ANSWER_SECS) -> None:
        self.supervisor = supervisor
        self.answer_secs = answer_secs
        self.last_pages: dict[int, str] = {}  # each worker's last page: its counters stand in when it is late

    def _ask(self, op: str) -> defer.Deferred:
        """Every worker's reply to ``op`` (None for one that did not answer in time), in worker order."""
        asks = [w.request({"op": op}, timeout=self.answer_secs) for w in self.supervisor.workers]
        return defer.gatherResults(asks)

    # -- /metrics -----------------------------------------------------------------------

    def metrics(self) -> defer.Deferred:
        workers = list(self.supervisor.workers)

        def render(replies: list) -> str:
            fresh = {}
            for worker, reply in zip(workers, replies):
                text = reply.get("text") if isinstance(reply, dict) else None
                if isinstance(text, str):
                    fresh[worker.index] = text
            self.last_pages.update(fresh)
            stale = {index: text for index, text in self.last_pages.items() if index not in fresh}
            return merge(fresh, list(self.samples(set(fresh))), stale)

        return self._ask("metrics").addCallback(render)

    def samples(self, answered: set[int]) -> Any:
        """The supervisor's own samples; ``answered``: the workers whose page came in time."""
        supervisor = self.supervisor
        yield "logrouter_workers", "gauge", {}, supervisor.accepting
        for worker in supervisor.workers:
            labels = {"worker": str(worker.index)}
            yield "logrouter_worker_running", "gauge", labels, 1 if worker.ready else 0
            yield "logrouter_worker_up", "gauge", labels, 1 if worker.ready and worker.index in answered else 0
            yield "logrouter_worker_restarts_total", "counter", labels, worker.restarts
            yield from worker.connections.samples()
        for listener in supervisor.listeners.values():
            labels = {"source": listener.name}
            yield "logrouter_supervisor_connections_passed_total", "counter", labels, listener.passed
            yield "logrouter_supervisor_connections_dropped_total", "counter", labels, listener.dropped
        if supervisor.compaction is not None:
            yield from supervisor.compaction.samples()

    def worker_metrics(self, index: int) -> defer.Deferred:
        """One worker's own page; None if there is no such worker, or it did not answer in time."""
        workers = self.supervisor.workers
        if not 0 <= index < len(workers):
            return defer.succeed(None)
        reply = workers[index].request({"op": "metrics"}, timeout=self.answer_secs)
        return reply.addCallback(lambda answer: answer.get("text") if isinstance(answer, dict) else None)

    # -- /health ------------------------------------------------------------------------

    def health(self) -> defer.Deferred:
        workers = list(self.supervisor.workers)
        return self._ask("health").addCallback(lambda replies: self.health_document(workers, replies))

    def health_document(self, workers: list, replies: list) -> dict[str, Any]:
        supervisor = self.supervisor
        now = supervisor.reactor.seconds()
        problems: list[str] = []
        if supervisor.stopping:
            problems.append("stopping")
        listeners = {}
        for name, listener in supervisor.listeners.items():
            listening = listener.sock is not None
            listeners[name] = {"state": "listening" if listening else "closed"}
            if not listening:
                problems.append(f"source {name}: the supervisor's socket is closed")
        entries = []
        for worker, reply in zip(workers, replies):
            document = reply.get("health") if isinstance(reply, dict) else None
            entry: dict[str, Any] = {"worker": worker.index, "restarts": worker.restarts}
            if worker.ended is None:
                entry["state"] = "exited"
                if not supervisor.stopping:
                    problems.append(f"worker {worker.index}: not running (it exited; it is started again after a pause)")
            elif not worker.ready:
                entry["state"] = "starting"
                problems.append(f"worker {worker.index}: starting (its router does not run yet)")
            elif not isinstance(document, dict):
                entry["state"] = "not answering"
                problems.append(
                    f"worker {worker.index}: did not answer within {self.answer_secs:g} s (stopped, or its reactor is blocked)"
                )
            else:
                entry["state"] = "running"
                problems.extend(f"worker {worker.index}: {p}" for p in document.get("problems", ()))
                entry.update({key: document[key] for key in ("spool", "sources", "sinks") if key in document})
            if worker.crash_looping(now):
                entry["crash_looping"] = True
                problems.append(
                    f"worker {worker.index}: crash-looping ({worker.restarts} restarts, the last ones soon after it started)"
                )
            entries.append(entry)
        return {"status": status_of(problems), "problems": problems, "listeners": listeners, "workers": entries}

    # -- /reload ------------------------------------------------------------------------

    def reload(self) -> defer.Deferred:
        return self.supervisor.reload()

    def router_options(self) -> dict[str, Any]:
        return self.supervisor.config.router

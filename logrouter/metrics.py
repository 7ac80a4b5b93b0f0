"""Prometheus metrics, a health check and the reload trigger over HTTP (``[router] metrics_listen``).

``POST /reload`` re-reads the config file and applies it (as SIGHUP does; ``logrouter
reload`` sends it), answering what changed: 200 when all of it runs, 409 with the errors
of a refused config, 500 when something could not start or the reload failed.

Each component owns its numbers and says what they are: ``samples()`` yields
``(name, type, labels, value)`` for the router (and its spool), every source (the
contract of ``logrouter.sources.base``), the error path, every sink and compaction.
The numbers are plain attributes bumped on the hot path and read only when scraped, so
counting costs nothing extra. This module only collects the samples and renders them.
"""

from __future__ import annotations

from typing import Any, Iterator

from twisted.web import resource, server

Sample = tuple[str, str, dict[str, str], float]


def collect(router: Any) -> Iterator[Sample]:
    """Every component's samples, in the order their metrics appear on the page."""
    yield from router.samples()
    for source in router.sources.values():
        yield from source.samples()
    yield from router.errors.samples()
    for component in getattr(router, "filters", {}).values():
        samples = getattr(component, "samples", None)  # filters that count (throttle, dedupe, …)
        if samples is not None:
            yield from samples()
    for sink in router.sinks.values():
        yield from sink.samples()
    yield from router.feed_samples()
    compaction = getattr(router, "compaction", None)  # set by RouterService when [compaction] is enabled
    if compaction is not None:
        yield from compaction.samples()


def render_samples(samples: Iterator[Sample]) -> str:
    """Prometheus text: one ``# TYPE`` line per metric, all its samples right below it."""
    families: dict[str, tuple[str, list[str]]] = {}
    for metric, kind, labels, value in samples:
        family = families.get(metric)
        if family is None:
            family = families[metric] = (kind, [])
        label_text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
        family[1].append(f"{metric}{{{label_text}}} {value}" if label_text else f"{metric} {value}")
    lines: list[str] = []
    for metric, (kind, lines_of_metric) in families.items():
        lines.append(f"# TYPE {metric} {kind}")
        lines.extend(lines_of_metric)
    return "\n".join(lines) + "\n"


def render(router: Any) -> str:
    return render_samples(collect(router))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class MetricsResource(resource.Resource):
    isLeaf = True

    def __init__(self, router: Any) -> None:
        super().__init__()
        self.router = router

    def render_GET(self, request: server.Request) -> bytes:
        if request.path == b"/metrics":
            request.setHeader(b"content-type", b"text/plain; version=0.0.4")
            return render(self.router).encode()
        if request.path == b"/health":
            request.setHeader(b"content-type", b"text/plain")
            return b"ok\n"
        request.setResponseCode(404)
        return b"not found: try /metrics or /health\n"


    def render_POST(self, request: server.Request) -> Any:
        if request.path != b"/reload" or getattr(self.router, "reload_hook", None) is None:
            request.setResponseCode(404)
            return b"not found: POST /reload\n"
        return answer_reload(request, self.router.reload_hook())


def answer_reload(request: server.Request, reloading: Any) -> Any:
    """Answer ``POST /reload`` once ``reloading`` fires with its ``ReloadResult``: 200 only
    when everything the config names runs; 409 when it was refused (nothing changed);
    500 when it was applied in part or failed (``logrouter.reload_queue``). The text says
    what changed, or why not."""
    request.setHeader(b"content-type", b"text/plain; charset=utf-8")

    def answer(result: Any) -> None:
        if request.finished or getattr(request, "_disconnected", False):
            return  # the client went away meanwhile
        request.setResponseCode(result.status)
        request.write((result.text + "\n").encode("utf-8"))
        request.finish()

    reloading.addCallback(answer)
    return server.NOT_DONE_YET


def site(router: Any) -> server.Site:
    factory = server.Site(MetricsResource(router))
    factory.noisy = False
    factory.log = lambda request: None  # scrapes are not worth a log line each
    return factory

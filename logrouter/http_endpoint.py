"""The HTTP endpoint of ``[router] metrics_listen``: its pages, and who may ask for what.

* ``GET /metrics``: Prometheus text. ``GET /health``: the health document (JSON, see
  ``logrouter.health``), status 200 when the router serves as configured, else 503.
  ``GET /workers/<index>/metrics``: one worker's own page (with ``workers`` above 1).
* ``POST /reload``: re-read the config file and apply it, as SIGHUP does; 200 with what
  changed, 409 with the errors of a refused config (nothing changed), 500 when a part
  could not start or the reload failed (``logrouter.reload_queue``). It needs ``Authorization: Bearer
  <token>`` (``[router] reload_token`` or ``reload_token_file``, see
  ``logrouter.config.http_options``) and takes no body; refused with 403 otherwise, the
  answer saying why (and, with no token configured, how to enable it).
* Nothing a browser sends on behalf of a web page is answered: a request with an
  ``Origin`` header, or with ``Sec-Fetch-Site`` other than ``none`` (the user typed the
  address), is refused with 403, and no CORS header is ever sent, so a page cannot read
  the answers nor send the token.

The answers come from a ``Pages`` object: ``RouterPages`` here for one process, the
supervisor's (``logrouter.workers.http``) with workers.
"""

from __future__ import annotations

import hmac
import json
from typing import Any, Callable, Protocol

from twisted.internet import defer
from twisted.logger import Logger
from twisted.web import resource, server

from logrouter.config.http_options import HOW_TO_ENABLE, reload_token
from logrouter.health import OK, router_health
from logrouter.metrics import render

PROMETHEUS_TEXT = b"text/plain; version=0.0.4"
log = Logger(namespace="logrouter.metrics")


class Pages(Protocol):
    """What the endpoint serves; each page is a Deferred so a supervisor can ask its workers."""

    def metrics(self) -> defer.Deferred: ...  # str

    def health(self) -> defer.Deferred: ...  # the health document (dict)

    def worker_metrics(self, index: int) -> defer.Deferred: ...  # str, or None: no such page

    def reload(self) -> defer.Deferred | None: ...  # a ReloadResult; None: this process cannot reload

    def router_options(self) -> dict[str, Any]: ...  # the running [router] table (the reload token)


def browser_refusal(request: server.Request) -> str | None:
    """Why a request a browser made for a web page is refused, or None for any other."""
    if request.getHeader(b"origin") is not None:
        return "requests from web pages (with an Origin header) are refused\n"
    site = request.getHeader(b"sec-fetch-site")
    if site is not None and site.lower() != b"none":
        return f"requests from web pages (Sec-Fetch-Site: {site.decode('latin-1')}) are refused\n"
    return None


def reload_refusal(request: server.Request, router: dict[str, Any]) -> str | None:
    """Why ``POST /reload`` is refused (no token configured, none or a wrong one sent, a body), or None."""
    token, why_not = reload_token(router)
    if token is None:
        return why_not + "\n"
    content = request.content
    if content is not None and content.seek(0, 2) > 0:
        return "POST /reload takes no body\n"
    scheme, _, sent = (request.getHeader(b"authorization") or b"").strip().partition(b" ")
    if scheme.lower() != b"bearer" or not hmac.compare_digest(sent.strip(), token.encode("ascii")):
        return f"POST /reload needs Authorization: Bearer <the reload token> ({HOW_TO_ENABLE})\n"
    return None


class EndpointResource(resource.Resource):
    """Routes the endpoint's requests to its ``Pages``; methods other than GET, HEAD and POST get 405."""

    isLeaf = True

    def __init__(self, pages: Pages) -> None:
        super().__init__()
        self.pages = pages

    def render(self, request: server.Request) -> Any:
        refused = browser_refusal(request)
        if refused is not None:
            return _plain(request, 403, refused)
        return super().render(request)

    def render_GET(self, request: server.Request) -> Any:
        parts = request.path.split(b"/")
        if request.path == b"/metrics":
            return _later(request, self.pages.metrics(), lambda text: (200, PROMETHEUS_TEXT, text))
        if request.path == b"/health":
            return _later(request, self.pages.health(), _health_answer)
        if len(parts) == 4 and parts[1] == b"workers" and parts[2].isdigit() and parts[3] == b"metrics":
            return _later(request, self.pages.worker_metrics(int(parts[2])), _worker_answer)
        return _plain(request, 404, "not found: try /metrics, /health or /workers/<index>/metrics\n")

    def render_POST(self, request: server.Request) -> Any:
        if request.path != b"/reload":
            return _plain(request, 404, "not found: POST /reload\n")
        refused = reload_refusal(request, self.pages.router_options())
        if refused is not None:
            return _plain(request, 403, refused)
        reloading = self.pages.reload()
        if reloading is None:
            return _plain(request, 404, "this process cannot reload (it has no config file)\n")
        return _later(request, reloading, _reload_answer)


def _health_answer(document: dict[str, Any]) -> tuple[int, bytes, str]:
    return 200 if document.get("status") == OK else 503, b"application/json", json.dumps(document, indent=2) + "\n"


def _worker_answer(text: str | None) -> tuple[int, bytes, str]:
    if text is None:
        return 404, b"text/plain; charset=utf-8", "no such worker, or it is not running or not answering\n"
    return 200, PROMETHEUS_TEXT, text


def _reload_answer(result: Any) -> tuple[int, bytes, str]:
    """A ``ReloadResult``: 200 applied, 409 refused, 500 applied in part or failed."""
    return result.status, b"text/plain; charset=utf-8", result.text + "\n"


def _plain(request: server.Request, code: int, text: str) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"text/plain; charset=utf-8")
    return text.encode("utf-8")


def _later(request: server.Request, page: defer.Deferred, answer: Callable[[Any], tuple[int, bytes, str]]) -> Any:
    """Answer once ``page`` fires, unless the client went away meanwhile; 500 if it failed."""

    def write(result: Any) -> None:
        code, content_type, text = answer(result)
        _finish(request, code, content_type, text)

    def failed(failure: Any) -> None:
        log.failure("the metrics endpoint could not answer {path}", failure, path=request.path.decode("latin-1"))
        _finish(request, 500, b"text/plain; charset=utf-8", f"internal error: {failure.getErrorMessage()}\n")

    page.addCallback(write).addErrback(failed)
    return server.NOT_DONE_YET


def _finish(request: server.Request, code: int, content_type: bytes, text: str) -> None:
    if request.finished or getattr(request, "_disconnected", False):
        return
    request.setResponseCode(code)
    request.setHeader(b"content-type", content_type)
    request.setHeader(b"cache-control", b"no-store")
    data = text.encode("utf-8")
    request.setHeader(b"content-length", str(len(data)).encode())
    request.write(data)
    request.finish()


class RouterPages:
    """The pages of a single-process router (``workers = 1``)."""

    def __init__(self, router: Any) -> None:
        self.router = router

    def metrics(self) -> defer.Deferred:
        return defer.maybeDeferred(render, self.router)

    def health(self) -> defer.Deferred:
        return defer.maybeDeferred(router_health, self.router)

    def worker_metrics(self, index: int) -> defer.Deferred:
        return defer.succeed(None)

    def reload(self) -> defer.Deferred | None:
        hook = getattr(self.router, "reload_hook", None)
        return hook() if hook is not None else None

    def router_options(self) -> dict[str, Any]:
        return self.router.config.router


def site(pages: Pages) -> server.Site:
    factory = server.Site(EndpointResource(pages))
    factory.noisy = False
    factory.log = lambda request: None  # scrapes are not worth a log line each
    return factory

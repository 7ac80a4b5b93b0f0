"""The options of the HTTP endpoint (``[router] metrics_listen``, ``reload_token``,
``reload_token_file``): where it listens and who may make the router reload.

* ``metrics_listen`` without an interface (``tcp:9880``, ``ssl:…``) listens on loopback
  only (``127.0.0.1``, ``::1`` for ``tcp6:``): validation writes the interface into the
  endpoint, so every part of the router binds, logs and reaches the same address. An
  explicit ``interface=0.0.0.0`` (or ``::``) is kept, with a warning (``check-config``
  and the log at start say it).
* ``POST /reload`` needs ``Authorization: Bearer <token>``; the token is
  ``reload_token``, or the first line of ``reload_token_file``, read again at each request
  so a new token in the file applies at once. Without either, reload over HTTP is off
  (SIGHUP still reloads).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import endpoints

from logrouter.config.endpoints import check_optional
from logrouter.config.options import Option

MIN_TOKEN_CHARS = 16
HOW_TO_ENABLE = (
    "set [router] reload_token_file (a file holding the token, e.g. from `openssl rand -hex 32`) or reload_token, "
    "and send it as `Authorization: Bearer <token>` (`logrouter reload --config FILE` does); or send SIGHUP "
    "(`systemctl reload logrouter`)"
)


def check_token(value: str) -> None:
    if len(value) < MIN_TOKEN_CHARS:
        raise ValueError(f"a token must have at least {MIN_TOKEN_CHARS} characters (e.g. `openssl rand -hex 32`)")
    if not (value.isascii() and value.isprintable()) or any(c.isspace() for c in value):
        raise ValueError("a token must be printable ASCII without spaces (it is sent in an HTTP header)")


def _check_optional_token(value: str) -> None:
    if value:
        check_token(value)


HTTP_OPTIONS: dict[str, Option] = {
    "metrics_listen": Option(
        str, "", "endpoint serving Prometheus `/metrics`, `/health` and `POST /reload` (empty = off); without an "
        "`interface=` it listens on loopback only (`tcp:9880` is `tcp:9880:interface=127.0.0.1`); see Metrics and health",
        check_optional,
    ),
    "reload_token": Option(
        str, "", "the bearer token `POST /reload` must carry (at least 16 characters; empty = reload over HTTP is off "
        "unless `reload_token_file` is set); prefer `reload_token_file` when the config file is readable by others",
        _check_optional_token,
    ),
    "reload_token_file": Option(
        str, "", "a file whose first line is the token `POST /reload` must carry, read at each request (a new token "
        "applies at once); `logrouter reload` reads it too", None,
    ),
}


def loopback_by_default(listen: str) -> str:
    """``listen`` with ``interface=127.0.0.1`` (``::1`` for ``tcp6:``) added when it is a
    TCP-like endpoint without an interface; any other endpoint as it is."""
    kind, interface = _kind_and_interface(listen)
    if kind is None or interface:
        return listen
    loopback = r"\:\:1" if kind == "TCP6" else "127.0.0.1"  # colons escaped, as in any endpoint string
    return f"{listen}:interface={loopback}"


def _kind_and_interface(listen: str) -> tuple[str | None, str]:
    """("TCP" | "TCP6" | "SSL", the interface given or "") of a TCP-like endpoint, (None, "") otherwise."""
    try:
        kind, args, kwargs = endpoints._parseServer(listen, None)
    except Exception:  # noqa: BLE001 - the option's own check reports a bad endpoint
        return None, ""
    if getattr(kind, "prefix", None) == "tcp6":  # parsed by the endpoint plugin, not by name
        interface = kwargs.get("interface") or (args[2] if len(args) > 2 else "")
        return "TCP6", str(interface)
    if kind in ("TCP", "SSL"):
        return kind, str(kwargs.get("interface") or "")
    return None, ""


def endpoint_url(listen: str) -> str | None:
    """``http://host:port`` (``https`` for ``ssl:``) where a client on this host reaches
    ``metrics_listen`` (its interface, loopback for none or any); None when it is off,
    not TCP, or on port 0 (any free port: only the router's log says which)."""
    kind, interface = _kind_and_interface(listen) if listen else (None, "")
    if kind is None:
        return None
    _, args, kwargs = endpoints._parseServer(listen, None)
    try:
        port = int(args[0] if args else kwargs.get("port", 0))
    except (TypeError, ValueError):
        return None
    if port == 0:
        return None
    if interface in ("", "0.0.0.0", "::"):
        interface = "::1" if kind == "TCP6" else "127.0.0.1"
    scheme = "https" if kind == "SSL" else "http"
    return f"{scheme}://{f'[{interface}]' if ':' in interface else interface}:{port}"


def read_token_file(path: str) -> str:
    """The token in ``path`` (its first line); ``ValueError`` saying why there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path!r}: {getattr(e, 'strerror', None) or e}") from None
    try:
        check_token(token)
    except ValueError as e:
        raise ValueError(f"{path!r}: {e}") from None
    return token


def check_http(router: dict[str, Any], errors: list[str]) -> None:
    """Complete ``router`` (a checked ``[router]`` table) in place: the loopback interface
    of ``metrics_listen``; and check that at most one token option is set and its file is readable."""
    listen = router.get("metrics_listen")
    if listen:
        router["metrics_listen"] = loopback_by_default(listen)
    path = router.get("reload_token_file")
    if path and router.get("reload_token"):
        errors.append("router.reload_token_file: set reload_token or reload_token_file, not both")
    elif path:
        try:
            read_token_file(path)
        except ValueError as e:
            errors.append(f"router.reload_token_file: {e}")


def reload_token(router: dict[str, Any]) -> tuple[str | None, str]:
    """``(token, "")`` when reload over HTTP is on, else ``(None, why not and how to enable it)``."""
    if router.get("reload_token"):
        return router["reload_token"], ""
    path = router.get("reload_token_file")
    if not path:
        return None, f"reload over HTTP is off: {HOW_TO_ENABLE}"
    try:
        return read_token_file(path), ""
    except ValueError as e:
        return None, f"reload over HTTP is off: router.reload_token_file: {e}"


def http_warnings(router: dict[str, Any]) -> list[str]:
    """An endpoint that listens on every interface: said at ``check-config`` and at start."""
    listen = router.get("metrics_listen")
    if not listen:
        return []
    kind, interface = _kind_and_interface(listen)
    if kind is None or interface not in ("0.0.0.0", "::"):
        return []
    return [
        f"router.metrics_listen: {listen!r} listens on every interface: anyone who reaches this host can read "
        "/metrics and /health (POST /reload still needs the reload token); give interface=127.0.0.1, or the one "
        "address your scraper uses"
    ]

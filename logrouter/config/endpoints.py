"""Listen addresses given as Twisted server endpoint strings.

Parsing happens at validation time through Twisted's own parser, so a bad port, an
unknown endpoint type or a missing TLS key file is reported before anything binds.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import endpoints

from logrouter.config.options import Option


def check_server_endpoint(description: str) -> None:
    """Raise ``ValueError`` with a readable reason when Twisted cannot build the endpoint."""
    from twisted.internet import reactor

    try:
        endpoints.serverFromString(reactor, description)
    except ValueError as e:
        raise ValueError(f"bad endpoint {description!r}: {e}") from None
    except OSError as e:
        raise ValueError(f"bad endpoint {description!r}: {e.strerror or e}: {e.filename or ''}".rstrip(": ")) from None
    except Exception as e:  # Twisted's parsers raise KeyError/TypeError/SSL errors too
        raise ValueError(f"bad endpoint {description!r}: {type(e).__name__}: {e}") from None
    address = listen_address(description)
    if address is not None and not 0 <= address[1] <= 65535:
        # Twisted takes any integer here and only the bind fails, without naming the key.
        raise ValueError(f"bad endpoint {description!r}: port {address[1]} is outside 0..65535")


def check_optional(description: str) -> None:
    if description:
        check_server_endpoint(description)


def listen_address(description: str) -> tuple[str, int, str] | None:
    """``(family, port, interface)`` for TCP-like endpoints, ``None`` for others (unix, systemd)."""
    try:
        kind, args, kwargs = endpoints._parseServer(description, None)
    except Exception as e:
        raise ValueError(f"bad endpoint {description!r}: {e}") from None
    if kind not in ("TCP", "SSL", "TCP6"):
        return None
    port = args[0] if args else kwargs.get("port")
    interface = kwargs.get("interface", "") or ""
    if interface in ("0.0.0.0", "::"):
        interface = ""
    return ("tcp", int(port), interface)


def listen_option(default: Any, doc: str = "Twisted server endpoint string to listen on") -> Option:
    return Option(str, default, doc, check_server_endpoint, endpoint=True)

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


def accept_any_systemd_sockets() -> None:
    """Outside socket activation, check ``systemd:`` endpoints for their form only.

    Twisted resolves ``systemd:domain=…:index=N`` (or ``name=…``) against the sockets
    passed in ``LISTEN_FDS`` while parsing the endpoint, so without them every such
    endpoint is "bad". ``check-config`` runs outside the service manager (systemd does
    not pass the sockets to ``ExecStartPre=`` either), so it takes every index and name
    as passed; the daemon itself still refuses one that is missing. The commands that
    read a config to reach the running router (``reload``, ``top``) call it too.
    """
    from collections import defaultdict

    parser = endpoints._SystemdParser
    if parser._sddaemon.inheritedDescriptors():
        return  # really socket-activated: check against what was passed

    class AnyIndex:
        def __getitem__(self, index: int) -> int:
            return -1  # adopted only by listen(), which check-config never calls

    class AnySocket:
        def inheritedDescriptors(self) -> AnyIndex:
            return AnyIndex()

        def inheritedNamedDescriptors(self) -> dict[str, int]:
            return defaultdict(lambda: -1)

    parser._sddaemon = AnySocket()

"""TLS of every stream source: the client-certificate options, the listener they build, and
what a connection learns from its TLS layer.

It owns ``TLS_OPTIONS`` (one set of client-authentication options for every stream source;
``logrouter.tls`` has the three modes and builds the contexts), the checks of those options
together with ``listen`` (and with the older names a source still accepts), the listening
endpoint and the factory for connections the supervisor accepted (``TlsListener``, mixed
into ``StreamSource``), and per connection the verified client certificate and a readable
line when a TLS handshake or connection fails (``TlsConnection``, mixed into
``StreamProtocol``).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import protocol
from twisted.internet.interfaces import IHandshakeListener
from zope.interface import implementer

from logrouter import tls
from logrouter.config.options import Option

# One set of server TLS client-certificate options for every stream source (``tls`` has
# the three modes). They only act on an ``ssl:`` listener.
TLS_OPTIONS: dict[str, Option] = {
    "ssl_client_authentication": Option(
        str,
        "none",
        "client certificates on an `ssl:` listener: `none`, `optional` (a certificate, if sent, must be signed "
        "by `ca_file`) or `required` (every client must send one signed by `ca_file`)",
        tls.check_client_cert_mode,
    ),
    "ca_file": Option(
        str,
        "",
        "PEM file of the CA(s) client certificates must be signed by; needed with `ssl_client_authentication` "
        "`optional` or `required`",
        tls.check_ca_file,
    ),
}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


class TlsListener:
    """The source's side: its client-authentication mode, the checks of its TLS options
    and the endpoint and factories that apply them. Mixed into ``StreamSource``."""

    # Older names of ssl_client_authentication a source still accepts, as
    # {key: {value: the mode it stands for}}; other values of the key say nothing
    # (fluent_forward: {"verify_client": {True: "required"}}). Such keys need their own Option.
    CLIENT_AUTH_ALIASES: dict[str, dict[Any, str]] = {}
    options: dict[str, Any]
    reactor: Any
    factory: Callable[[], protocol.Factory]

    @classmethod
    def client_authentication(cls, options: dict[str, Any]) -> tuple[str, str, str]:
        """The client-certificate mode in effect, the key that set it, and how it was set
        (for messages: ``ssl_client_authentication is 'required'``, ``verify_client = true``)."""
        mode = options.get("ssl_client_authentication", "none")
        for key, meanings in cls.CLIENT_AUTH_ALIASES.items():
            value = options.get(key)
            if value in meanings:
                return meanings[value], key, f"{key} = {_toml(value)}"
        return mode, "ssl_client_authentication", f"ssl_client_authentication is {mode!r}"

    @classmethod
    def check_tls_options(cls, options: dict[str, Any]) -> list[str]:
        """``ssl_client_authentication`` (or an alias of it), ``ca_file`` and ``listen`` together."""
        own = options.get("ssl_client_authentication", "none")
        for key, meanings in cls.CLIENT_AUTH_ALIASES.items():
            value = options.get(key)
            if value in meanings and own not in ("none", meanings[value]):
                # "none" is the default: it cannot be told apart from not given.
                return [
                    f"{key}: {key} = {_toml(value)} means ssl_client_authentication = {meanings[value]!r}, "
                    f"which contradicts ssl_client_authentication = {own!r}; set only ssl_client_authentication"
                ]
        mode, key, setting = cls.client_authentication(options)
        ca_file, listen = options.get("ca_file", ""), options["listen"]
        if mode == "none":
            if ca_file:
                aliases = "".join(
                    f" (or {k} = {_toml(v)})" for k, meanings in cls.CLIENT_AUTH_ALIASES.items() for v in meanings
                )
                return [
                    f"ca_file: only used with ssl_client_authentication 'optional' or 'required'{aliases}; "
                    "set it or remove ca_file"
                ]
            return []
        if tls.endpoint_kind(listen) != "ssl":
            shown = f"{mode!r} " if key == "ssl_client_authentication" else ""
            return [f"{key}: {shown}needs an ssl: listen endpoint, got {listen!r}"]
        if not ca_file:
            return [f"ca_file: required when {setting}"]
        try:
            tls.check_server_endpoint(listen, mode, ca_file)
        except ValueError as e:
            return [f"listen: {e}"]
        return []

    def endpoint(self) -> Any:
        """The endpoint to listen on: the ``listen`` string, asking TLS clients for a
        certificate as ``ssl_client_authentication`` says."""
        mode = self.client_authentication(self.options)[0]
        return tls.server_endpoint(self.reactor, self.options["listen"], mode, self.options.get("ca_file") or None)

    def passed_factory(self) -> protocol.Factory:
        """The factory for connections accepted by the supervisor: TLS is done here, in
        the worker, as the ``ssl:`` listener would have."""
        mode = self.client_authentication(self.options)[0]
        context = tls.server_context(self.options["listen"], mode, self.options.get("ca_file") or None)
        factory = self.factory()
        return factory if context is None else tls.wrap_factory(factory, context)


@implementer(IHandshakeListener)
class TlsConnection:
    """The connection's side: the client certificate once the TLS handshake completed,
    and why a TLS handshake or connection failed. Mixed into ``StreamProtocol``."""

    tls_established: bool
    tls_peer: str | None
    transport: Any
    source: Any
    peer: str
    log: Any

    def handshakeCompleted(self) -> None:
        """The TLS handshake is done (``IHandshakeListener``): note the client certificate."""
        # Not logged: out_forward's TCP heartbeat opens a connection every second.
        self.tls_established = True
        self.tls_peer = tls.peer_subject(self.transport)

    def tls_failed(self, reason: Any) -> bool:
        """Whether the connection was lost to TLS (``reason``: ``connectionLost``'s);
        if so, log the failure readably and count it."""
        tls_failure = tls.failure_reason(self.transport, reason)
        if tls_failure is None:
            return False
        self.source.tls_errors += 1
        self.log.warn(
            "{protocol} {peer}: TLS {phase} failed: {reason}; connection closed",
            protocol=self.source.TYPE,
            peer=self.peer,
            phase="connection" if self.tls_established else "handshake",
            reason=tls_failure,
        )
        return True

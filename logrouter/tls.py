"""TLS for stream sources: server contexts with client-certificate checks, and TLS errors told plainly.

Twisted's ``ssl:`` endpoint strings load a key and certificate but cannot ask clients for
a certificate. This module builds the server context itself when a source wants client
certificates, in one of three modes shared by every source:

- ``none``: no client certificate is asked for (what a plain ``ssl:`` endpoint does);
- ``optional``: a client may present one; if it does, it must be signed by the CA;
- ``required``: every client must present a certificate signed by the CA.

It also records why OpenSSL rejected a client certificate (the X.509 verify error, not
just "certificate verify failed") and turns a TLS failure into one readable reason for
the source's log line.

pyOpenSSL and cryptography (~13 MiB of RSS) are imported on first use, not with this
module: the config check imports it for every config, and a process whose config has no
TLS never loads them (``logrouter.twisted_without_openssl``, ``docs/operations/memory.md``).
For the same reason TLS connections and listeners are built here over plain TCP
(``connect``, ``ClientEndpoint``, ``listening_endpoint``), never with the reactor's
``connectSSL``/``listenSSL``, which work only if pyOpenSSL was loaded before the reactor.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from twisted.internet import defer, endpoints
from twisted.internet.interfaces import IOpenSSLContextFactory, IStreamClientEndpoint, IStreamServerEndpoint
from twisted.python.failure import Failure
from twisted.python.filepath import FilePath
from zope.interface import implementer

from logrouter.lazy_import import lazy

OpenSSL = lazy("OpenSSL")  # its SSL module: OpenSSL.SSL
ssl = lazy("twisted.internet.ssl")
protocols_tls = lazy("twisted.protocols.tls")

CLIENT_CERT_MODES = ("none", "optional", "required")

# What a rejected certificate's X.509 verify error is recorded as, on the TLS transport.
VERIFY_ERROR_ATTRIBUTE = "logrouter_verify_error"

_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.DOTALL)

# X509_V_ERR_* codes (openssl/x509_vfy.h) for the errors a client certificate usually has.
_VERIFY_ERRORS = {
    2: "unable to get issuer certificate",
    7: "certificate signature failure",
    9: "certificate is not yet valid",
    10: "certificate has expired",
    18: "self-signed certificate",
    19: "self-signed certificate in certificate chain",
    20: "unable to get local issuer certificate",
    21: "unable to verify the first certificate",
    23: "certificate revoked",
    24: "invalid CA certificate",
    26: "unsupported certificate purpose",
    28: "certificate rejected",
}


# -- loading -----------------------------------------------------------------------------


def load_ca_certificates(path: str) -> list[ssl.Certificate]:
    """The certificates of a PEM bundle; ``ValueError`` with a readable reason if unusable."""
    try:
        data = FilePath(path).getContent()
    except OSError as e:
        raise ValueError(f"cannot read {path!r}: {e.strerror or e}") from None
    blocks = _PEM_CERTIFICATE.findall(data)
    if not blocks:
        raise ValueError(f"{path!r} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    certificates = []
    for i, block in enumerate(blocks):
        try:
            certificates.append(ssl.Certificate.loadPEM(block))
        except Exception as e:  # OpenSSL.crypto.Error and friends
            raise ValueError(f"{path!r}: certificate {i + 1} cannot be loaded: {e}") from None
    return certificates


def check_ca_file(path: str) -> None:
    """An ``Option`` check: the CA file is readable and holds certificates (empty = unset)."""
    if path:
        load_ca_certificates(path)


def check_client_cert_mode(value: str) -> None:
    if value not in CLIENT_CERT_MODES:
        raise ValueError(f"must be one of {', '.join(map(repr, CLIENT_CERT_MODES))}, got {value!r}")


def server_options(
    private_key: str,
    certificate: str | None = None,
    *,
    extra_chain: str | None = None,
    dh_parameters: str | None = None,
    method: str | None = None,
    client_certs: str = "none",
    ca_file: str | None = None,
) -> "ClientCertificateOptions | ssl.CertificateOptions":
    """A server TLS context factory from PEM files (the same files an ``ssl:`` endpoint takes).

    ``certificate`` defaults to ``private_key`` (one PEM holding both), ``extra_chain``
    is a PEM of intermediate certificates, ``client_certs`` one of ``CLIENT_CERT_MODES``
    with ``ca_file`` the PEM of the CA(s) client certificates must be signed by.
    """
    check_client_cert_mode(client_certs)
    key_pem = FilePath(private_key).getContent()
    cert_pem = FilePath(certificate or private_key).getContent()
    own = ssl.PrivateCertificate.loadPEM(cert_pem + b"\n" + key_pem)
    kwargs: dict[str, Any] = {
        "privateKey": own.privateKey.original,
        "certificate": own.original,
    }
    if extra_chain:
        chain = load_ca_certificates(extra_chain)
        kwargs["extraCertChain"] = [c.original for c in chain]
    if dh_parameters:
        kwargs["dhParameters"] = ssl.DiffieHellmanParameters.fromFile(FilePath(dh_parameters))
    if method:
        kwargs["method"] = getattr(OpenSSL.SSL, method)
    if client_certs == "none":
        return ssl.CertificateOptions(**kwargs)
    if not ca_file:
        raise ValueError(f"client_certs {client_certs!r} needs a CA file")
    authorities = load_ca_certificates(ca_file)
    options = ssl.CertificateOptions(
        verify=True,
        caCerts=[c.original for c in authorities],
        requireCertificate=client_certs == "required",
        **kwargs,
    )
    return ClientCertificateOptions(options)


@implementer(IOpenSSLContextFactory)
class ClientCertificateOptions:
    """A context factory around ``CertificateOptions`` that remembers why a client certificate failed.

    OpenSSL reports every rejected chain as "certificate verify failed"; the verify
    callback here keeps the X.509 error (e.g. "unable to get local issuer certificate")
    and the certificate's subject on the TLS transport, where ``failure_reason`` finds it.
    """

    def __init__(self, options: ssl.CertificateOptions) -> None:
        self.options = options
        self._context: OpenSSL.SSL.Context | None = None

    def getContext(self) -> OpenSSL.SSL.Context:
        if self._context is None:
            context = self.options.getContext()
            context.set_verify(context.get_verify_mode(), _remember_verify_error)
            self._context = context
        return self._context


def _remember_verify_error(connection: OpenSSL.SSL.Connection, certificate: Any, errno: int, depth: int, ok: int) -> bool:
    if not ok:
        transport = connection.get_app_data()
        if transport is not None and getattr(transport, VERIFY_ERROR_ATTRIBUTE, None) is None:
            reason = _VERIFY_ERRORS.get(errno, f"X.509 verify error {errno}")
            subject = _subject(certificate)
            where = f"certificate {subject}" if depth == 0 else f"depth {depth} {subject}"
            try:
                setattr(transport, VERIFY_ERROR_ATTRIBUTE, f"{reason} ({where})")
            except AttributeError:
                pass
    return bool(ok)


def _subject(certificate: Any) -> str:
    """``O=…/CN=…`` of a pyOpenSSL or ``cryptography`` certificate ("?" if unreadable)."""
    try:
        if hasattr(certificate, "to_cryptography"):
            certificate = certificate.to_cryptography()
        attributes = list(certificate.subject)
    except Exception:
        return "?"
    return "/".join(f"{a.rfc4514_attribute_name}={a.value}" for a in attributes) or "(empty subject)"


# -- endpoints ---------------------------------------------------------------------------


def endpoint_kind(description: str) -> str:
    """The endpoint type of a server endpoint string, lower-case (``tcp``, ``ssl``, ``unix`` …)."""
    args, _ = endpoints._parse(description)
    return str(args[0]).lower() if args else ""


def server_endpoint(reactor: Any, description: str, client_certs: str = "none", ca_file: str | None = None) -> Any:
    """The listening endpoint for ``description``, asking for client certificates if told to.

    With ``client_certs`` ``"none"`` this is ``serverFromString``. Otherwise
    ``description`` must be an ``ssl:`` endpoint; its options (``privateKey``,
    ``certKey``, ``extraCertChain``, ``dhParameters``, ``sslmethod``, ``interface``,
    ``backlog``) are honoured and the context verifies clients against ``ca_file``.
    """
    if client_certs == "none":
        return listening_endpoint(reactor, description)
    port, context, interface, backlog = _ssl_server_parts(description, client_certs, ca_file)
    return ServerEndpoint(reactor, port, context, backlog, interface)


def listening_endpoint(reactor: Any, description: str) -> Any:
    """``serverFromString(reactor, description)``, but an ``ssl:`` endpoint listens with
    ``ServerEndpoint`` (TLS over ``listenTCP``, the same as ``listenSSL`` does)."""
    if endpoint_kind(description) != "ssl":
        return endpoints.serverFromString(reactor, description)
    _, args, kwargs = endpoints._parseServer(description, None)
    return ServerEndpoint(reactor, args[0], args[2], kwargs.get("backlog", 50), kwargs.get("interface", ""))


@implementer(IStreamServerEndpoint)
class ServerEndpoint:
    """A TLS listener over TCP: what ``SSL4ServerEndpoint`` and the reactor's ``listenSSL``
    do, without depending on the reactor having found pyOpenSSL when it was imported."""

    def __init__(self, reactor: Any, port: int, context: Any, backlog: int = 50, interface: str = "") -> None:
        self.reactor, self.port, self.context = reactor, int(port), context
        self.backlog, self.interface = int(backlog), interface

    def listen(self, factory: Any) -> defer.Deferred:
        return defer.execute(self.reactor.listenTCP, self.port, wrap_factory(factory, self.context),
                             self.backlog, self.interface)


@implementer(IStreamClientEndpoint)
class ClientEndpoint:
    """TLS over the client endpoint ``inner`` (``endpoints.wrapClientTLS``, which needs
    pyOpenSSL loaded before ``twisted.internet.endpoints``); fires with the protocol of
    ``factory``, not the TLS one around it."""

    def __init__(self, creator: Any, inner: Any) -> None:
        self.creator, self.inner = creator, inner

    def connect(self, factory: Any) -> defer.Deferred:
        wrapped = protocols_tls.TLSMemoryBIOFactory(self.creator, True, factory)
        return self.inner.connect(wrapped).addCallback(lambda protocol: protocol.wrappedProtocol)


def connect(reactor: Any, host: str, port: int, factory: Any, creator: Any, timeout: float) -> Any:
    """``reactor.connectSSL``: TLS over ``connectTCP``, as the reactor itself does it."""
    return reactor.connectTCP(host, port, protocols_tls.TLSMemoryBIOFactory(creator, True, factory), timeout)


def server_context(description: str, client_certs: str = "none", ca_file: str | None = None) -> Any:
    """The TLS context an ``ssl:`` listener of ``description`` would use (None for other
    kinds): for a connection accepted elsewhere and handed over (``[router] workers``)."""
    if endpoint_kind(description) != "ssl":
        return None
    if client_certs == "none":
        _, args, _ = endpoints._parseServer(description, None)
        return args[2]  # (port, protocol factory, context factory) as serverFromString builds them
    return _ssl_server_parts(description, client_certs, ca_file)[1]


def _ssl_server_parts(description: str, client_certs: str, ca_file: str | None) -> tuple[int, Any, str, int]:
    """``(port, context, interface, backlog)`` of an ``ssl:`` endpoint that asks for client certificates."""
    args, kwargs = endpoints._parse(description)
    if not args or str(args[0]).lower() != "ssl":
        raise ValueError(f"client certificates need an ssl: endpoint, got {description!r}")
    positional = args[1:]
    port = kwargs.pop("port", positional[0] if positional else None)
    if port is None:
        raise ValueError(f"no port in {description!r}")
    private_key = kwargs.pop("privateKey", positional[1] if len(positional) > 1 else "server.pem")
    context = server_options(
        private_key,
        kwargs.pop("certKey", None),
        extra_chain=kwargs.pop("extraCertChain", None),
        dh_parameters=kwargs.pop("dhParameters", None),
        method=kwargs.pop("sslmethod", None),
        client_certs=client_certs,
        ca_file=ca_file,
    )
    interface = kwargs.pop("interface", "")
    backlog = int(kwargs.pop("backlog", 50))
    if kwargs:
        raise ValueError(f"unknown ssl endpoint option(s) {', '.join(sorted(kwargs))} in {description!r}")
    return int(port), context, interface, backlog


def check_server_endpoint(description: str, client_certs: str, ca_file: str | None) -> None:
    """Build (not bind) the endpoint: ``ValueError`` with a readable reason if it cannot work."""
    from twisted.internet import reactor

    try:
        server_endpoint(reactor, description, client_certs, ca_file)
    except ValueError:
        raise
    except OSError as e:
        raise ValueError(f"bad endpoint {description!r}: {e.strerror or e}: {e.filename or ''}".rstrip(": ")) from None
    except Exception as e:  # OpenSSL errors for keys that do not match and the like
        raise ValueError(f"bad endpoint {description!r}: {type(e).__name__}: {e}") from None


def wrap_factory(factory: Any, context_factory: Any) -> Any:
    """TLS over any stream endpoint: wrap a server ``factory`` (e.g. for a ``tcp:`` listener
    whose certificates come from a source's own options)."""
    return protocols_tls.TLSMemoryBIOFactory(context_factory, False, factory)


# -- what happened -----------------------------------------------------------------------


def _openssl_reasons(error: OpenSSL.SSL.Error) -> str:
    details = error.args[0] if error.args else None
    if isinstance(details, list):
        reasons = [str(item[-1]) for item in details if isinstance(item, tuple) and item and item[-1]]
        if reasons:
            return "; ".join(dict.fromkeys(reasons))
    return str(error) or type(error).__name__


def failure_reason(transport: Any, reason: Failure | None) -> str | None:
    """Why a TLS connection failed, or None when ``reason`` is no TLS error (a plain close)."""
    if reason is None or not isinstance(reason, Failure) or "OpenSSL" not in sys.modules:
        return None  # without pyOpenSSL loaded no connection of this process spoke TLS
    if not reason.check(OpenSSL.SSL.Error):
        return None
    text = _openssl_reasons(reason.value)
    verify_error = getattr(transport, VERIFY_ERROR_ATTRIBUTE, None)
    if verify_error:
        return f"client certificate rejected: {verify_error}"
    if "peer did not return a certificate" in text:
        return "client certificate required but none was sent"
    return text


def peer_subject(transport: Any) -> str | None:
    """The verified client certificate's subject (``CN=…/O=…``), or None without one."""
    get = getattr(transport, "getPeerCertificate", None)
    if get is None:
        return None
    try:
        certificate = get()
    except Exception:
        return None
    return None if certificate is None else _subject(certificate)


# -- the client side, shared by the forwarding sinks ------------------------------------


def check_readable(path: str) -> None:
    if path:
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise ValueError(f"cannot read {path!r}: {e.strerror or e}") from None


def _client_option_specs() -> dict[str, Any]:
    from logrouter.config.options import Option

    return {
        "tls": Option(bool, False, "connect with TLS"),
        "ca_file": Option(
            str, "", "PEM of the CA(s) the server certificate must chain to (empty = system roots)", check_ca_file
        ),
        "verify_hostname": Option(bool, True, "check the certificate names the host (the chain is always checked)"),
        "client_cert": Option(str, "", "PEM client certificate, for servers that ask for one (mutual TLS; set `client_key` too)", check_readable),
        "client_key": Option(str, "", "PEM private key of `client_cert`", check_readable),
    }


#: The TLS options of every sink that connects out (``fluent_forward``, ``lumberjack``).
CLIENT_OPTIONS = _client_option_specs()


def client_certificate(options: dict[str, Any]) -> ssl.PrivateCertificate | None:
    if not options["client_cert"]:
        return None
    with open(options["client_cert"], "rb") as f:
        cert_pem = f.read()
    with open(options["client_key"], "rb") as f:
        key_pem = f.read()
    return ssl.PrivateCertificate.loadPEM(cert_pem + b"\n" + key_pem)


def check_client_options(options: dict[str, Any]) -> list[str]:
    """Cross-key problems of ``CLIENT_OPTIONS``, as config messages."""
    problems: list[str] = []
    if not options["tls"]:
        for key in ("ca_file", "client_cert", "client_key"):
            if options[key]:
                problems.append(f"{key}: only used with tls = true; set tls = true or remove {key}")
    if bool(options["client_cert"]) != bool(options["client_key"]):
        problems.append("client_cert, client_key: give both (client certificate) or neither")
    elif options["tls"] and options["client_cert"]:
        try:
            client_certificate(options)
        except Exception as e:  # bad PEM, a key that does not match the certificate …
            problems.append(f"client_cert: cannot be loaded with client_key: {e}")
    return problems


def client_tls_options(host: str, options: dict[str, Any]) -> Any:
    """The TLS connection creator for one host: the server's chain is checked against
    ``ca_file`` (or the system's roots), its name unless ``verify_hostname`` is false."""
    if options["ca_file"]:
        trust: Any = ssl.trustRootFromCertificates(load_ca_certificates(options["ca_file"]))
    else:
        trust = ssl.platformTrust()
    own = client_certificate(options)
    if options["verify_hostname"]:
        return ssl.optionsForClientTLS(host, trustRoot=trust, clientCertificate=own)
    # The chain is still verified; only the name check is off.
    kwargs: dict[str, Any] = {"trustRoot": trust}
    if own is not None:
        kwargs.update(privateKey=own.privateKey.original, certificate=own.original)
    return ssl.CertificateOptions(**kwargs)

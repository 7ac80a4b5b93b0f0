"""The Pravega controller's listen addresses: parsed and checked without gRPC.

Twisted server endpoint strings mapped onto gRPC ports: ``tcp:PORT[:interface=HOST]``
(``tcp6:`` too), and
``ssl:PORT:privateKey=KEY.pem[:certKey=CERT.pem][:extraCertChain=CHAIN.pem][:interface=HOST]``
(gRPC's TLS; no client certificates). The config check runs in every process (the
supervisor of ``[router] workers`` too), so this module does not import grpcio: only the
controller (``controller.py``), started by a ``pravega`` source, does.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from twisted.internet import endpoints


# -- listen addresses ---------------------------------------------------------------


@dataclass(frozen=True)
class Listen:
    """A parsed controller listen address."""

    kind: str  # "tcp" or "ssl"
    port: int
    host: str  # "" = every IPv4 address (as Twisted's tcp:)
    private_key: str | None = None
    cert: str | None = None
    extra_chain: str | None = None

    def grpc_address(self) -> str:
        host = self.host or "0.0.0.0"
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.port}"


_TCP_OPTIONS = {"port", "interface"}
_SSL_OPTIONS = {"port", "interface", "privateKey", "certKey", "extraCertChain"}


def parse_controller_listen(text: str) -> Listen:
    """Parse a controller listen address; ``ValueError`` with the reason if unusable.

    Does not read key files (``check_controller_listen`` does).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("controller listen address is empty; expected e.g. tcp:9090 or ssl:9090:privateKey=…:certKey=…")
    try:
        args, kwargs = endpoints._parse(text)
    except Exception as e:
        raise ValueError(f"bad controller listen address {text!r}: {e}") from None
    kind = str(args[0]).lower() if args else ""
    positional = [str(a) for a in args[1:]]
    if kind not in ("tcp", "tcp6", "ssl"):
        raise ValueError(
            f"bad controller listen address {text!r}: the gRPC controller listens on tcp:PORT[:interface=HOST] "
            f"or ssl:PORT:privateKey=…:certKey=…[:interface=HOST] only, not {kind or 'nothing'}:"
        )
    allowed = _SSL_OPTIONS if kind == "ssl" else _TCP_OPTIONS
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise ValueError(f"bad controller listen address {text!r}: unsupported option(s) {', '.join(unknown)}")
    order = ["port", "privateKey"] if kind == "ssl" else ["port"]
    if len(positional) > len(order):
        raise ValueError(f"bad controller listen address {text!r}: too many positional values")
    for name, value in zip(order, positional):
        if name in kwargs:
            raise ValueError(f"bad controller listen address {text!r}: {name} given twice")
        kwargs[name] = value
    port_text = kwargs.get("port")
    if port_text is None:
        raise ValueError(f"bad controller listen address {text!r}: no port")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bad controller listen address {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"bad controller listen address {text!r}: port {port} out of range")
    host = kwargs.get("interface", "") or ("::" if kind == "tcp6" else "")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host:
        try:
            socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        except OSError:
            raise ValueError(f"bad controller listen address {text!r}: interface {host!r} is not an IPv4/IPv6 address") from None
    if kind == "ssl":
        key = kwargs.get("privateKey")
        if not key:
            raise ValueError(f"bad controller listen address {text!r}: ssl needs privateKey=")
        return Listen("ssl", port, host, key, kwargs.get("certKey") or key, kwargs.get("extraCertChain"))
    return Listen("tcp", port, host)


def _read_pem(path: str, what: str, text: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"bad controller listen address {text!r}: {what} {path}: {e.strerror or e}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"bad controller listen address {text!r}: {what} {path} holds no PEM data")
    return data


def key_and_certificate(listen: Listen, text: str) -> tuple[bytes, bytes]:
    """The PEM private key and certificate (chain) of an ``ssl:`` address, read and
    checked to be a pair: ``ValueError`` saying why not."""
    key = _read_pem(listen.private_key or "", "privateKey", text)
    cert = _read_pem(listen.cert or "", "certKey", text)
    if listen.extra_chain:
        cert = cert.rstrip(b"\n") + b"\n" + _read_pem(listen.extra_chain, "extraCertChain", text)
    try:  # gRPC reports a bad or mismatched pair only when the port is bound
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from OpenSSL import SSL

        context = SSL.Context(SSL.TLS_METHOD)
        context.use_privatekey(serialization.load_pem_private_key(key, password=None))
        context.use_certificate(x509.load_pem_x509_certificate(cert))
        context.check_privatekey()
    except ImportError:  # pragma: no cover - pyOpenSSL and cryptography come with twisted[tls]
        pass
    except Exception as e:
        raise ValueError(f"bad controller listen address {text!r}: unusable key/certificate: {type(e).__name__}: {e}") from None
    return key, cert


def check_controller_listen(text: str) -> None:
    """Validate a controller listen address without binding: ``ValueError`` if unusable
    (bad form, unreadable or mismatched TLS key/certificate)."""
    listen = parse_controller_listen(text)
    if listen.kind == "ssl":
        key_and_certificate(listen, text)

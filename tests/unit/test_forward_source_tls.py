"""logrouter.tls: server contexts in the three client-certificate modes, endpoint parsing,
and the reasons a refused TLS connection is logged with.

The TLS handshakes run in memory (``twisted.test.iosim`` pumps bytes between a client and
a server protocol), so no reactor or port is needed.
"""

from __future__ import annotations

import pytest
from twisted.internet import endpoints, protocol, ssl
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IHandshakeListener
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactor
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.test.iosim import connectedServerAndClient
from zope.interface import implementer

from logrouter import tls
from source_fakes import fake_context

ADDRESS = IPv4Address("TCP", "127.0.0.1", 40000)


@implementer(IHandshakeListener)
class Recorder(protocol.Protocol):
    def __init__(self) -> None:
        self.handshake_done = False
        self.lost = None
        self.received = b""

    def handshakeCompleted(self) -> None:
        self.handshake_done = True

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason=None) -> None:
        self.lost = reason


def client_options(pki, cert=None, key=None):
    authority = ssl.Certificate.loadPEM(pki.ca.read_bytes())
    own = None
    if cert is not None:
        own = ssl.PrivateCertificate.loadPEM(cert.read_bytes() + key.read_bytes())
    return ssl.optionsForClientTLS("localhost", trustRoot=authority, clientCertificate=own)


def handshake(pki, mode: str, cert=None, key=None):
    """Connect a client to a server in ``mode``; the server's TLS transport and its protocol."""
    server_context = tls.server_options(str(pki.server_key), str(pki.server_cert), client_certs=mode, ca_file=str(pki.ca))
    clock = Clock()  # TLS transports aggregate small writes until the next reactor turn
    built: list[Recorder] = []

    class ServerSide(protocol.Factory):
        def buildProtocol(self, addr):
            built.append(Recorder())
            return built[-1]

    server_factory = TLSMemoryBIOFactory(server_context, False, ServerSide(), clock=clock)
    client_factory = TLSMemoryBIOFactory(
        client_options(pki, cert, key), True, protocol.Factory.forProtocol(Recorder), clock=clock
    )
    client, server, pump = connectedServerAndClient(
        lambda: server_factory.buildProtocol(ADDRESS), lambda: client_factory.buildProtocol(ADDRESS)
    )
    (recorder,) = built  # not server.wrappedProtocol: the wrapper drops it once the connection is lost
    client.write(b"hello")  # TLS 1.3: the server judges the client certificate as it reads on
    for _ in range(5):  # bounded: a handshake takes a few round trips
        clock.advance(0)
        pump.flush()
    return server, recorder


def accepted(server, recorder) -> bool:
    return recorder.handshake_done and recorder.received == b"hello" and tls.failure_reason(server, recorder.lost) is None


@pytest.mark.parametrize("mode", ["required", "optional", "none"])
def test_good_client_certificate_accepted(pki, mode):
    server, recorder = handshake(pki, mode, pki.client_cert, pki.client_key)
    assert accepted(server, recorder)
    subject = tls.peer_subject(server)
    assert subject == ("O=logrouter tests/CN=test-client" if mode != "none" else None)


def test_no_client_certificate(pki):
    server, recorder = handshake(pki, "required")
    assert not recorder.received
    assert tls.failure_reason(server, recorder.lost) == "client certificate required but none was sent"
    for mode in ("optional", "none"):
        server, recorder = handshake(pki, mode)
        assert accepted(server, recorder) and tls.peer_subject(server) is None


@pytest.mark.parametrize("mode", ["required", "optional"])
def test_rogue_and_expired_certificates_rejected_with_the_verify_error(pki, mode):
    server, recorder = handshake(pki, mode, pki.rogue_client_cert, pki.rogue_client_key)
    assert not recorder.received
    assert tls.failure_reason(server, recorder.lost) == (
        "client certificate rejected: unable to get local issuer certificate (certificate O=logrouter tests/CN=rogue-client)"
    )
    server, recorder = handshake(pki, mode, pki.expired_client_cert, pki.expired_client_key)
    assert tls.failure_reason(server, recorder.lost) == (
        "client certificate rejected: certificate has expired (certificate O=logrouter tests/CN=expired-client)"
    )


def test_none_mode_does_not_ask_for_certificates(pki):
    server, recorder = handshake(pki, "none", pki.rogue_client_cert, pki.rogue_client_key)
    assert accepted(server, recorder)


def test_modes_and_ca_checked(pki):
    with pytest.raises(ValueError, match="must be one of 'none', 'optional', 'required'"):
        tls.server_options(str(pki.server_key), str(pki.server_cert), client_certs="maybe")
    with pytest.raises(ValueError, match="needs a CA file"):
        tls.server_options(str(pki.server_key), str(pki.server_cert), client_certs="required")


def test_load_ca_certificates(pki, tmp_path):
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(pki.ca.read_bytes() + b"\n" + pki.rogue_ca.read_bytes())
    assert len(tls.load_ca_certificates(str(bundle))) == 2
    with pytest.raises(ValueError, match="cannot read"):
        tls.load_ca_certificates(str(tmp_path / "missing.pem"))
    broken = tmp_path / "broken.pem"
    broken.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    with pytest.raises(ValueError, match="certificate 1 cannot be loaded"):
        tls.load_ca_certificates(str(broken))
    tls.check_ca_file("")  # unset is fine


def test_server_endpoint_parses_the_ssl_string(pki):
    reactor = MemoryReactor()
    chain = str(pki.ca)  # any PEM of certificates will do as a chain file here
    description = pki.ssl_endpoint(4433, "127.0.0.1") + f":backlog=7:extraCertChain={chain}"
    endpoint = tls.server_endpoint(reactor, description, "required", str(pki.ca))
    assert isinstance(endpoint, tls.ServerEndpoint)
    endpoint.listen(protocol.Factory.forProtocol(Recorder))
    # TLS over listenTCP, as the reactor's listenSSL does it (which needs pyOpenSSL loaded
    # before the reactor: logrouter.twisted_without_openssl)
    port, factory, backlog, interface = reactor.tcpServers[0]
    assert (port, backlog, interface) == (4433, 7, "127.0.0.1")
    assert isinstance(factory, TLSMemoryBIOFactory) and factory.wrappedFactory.protocol is Recorder
    assert isinstance(endpoint.context, tls.ClientCertificateOptions)
    # "none": the key, certificate, backlog and interface of the ssl: string, as serverFromString reads them
    plain = tls.server_endpoint(reactor, description, "none")
    assert isinstance(plain, tls.ServerEndpoint) and (plain.port, plain.backlog, plain.interface) == (4433, 7, "127.0.0.1")
    assert not isinstance(plain.context, tls.ClientCertificateOptions)
    with pytest.raises(ValueError, match="need an ssl: endpoint"):
        tls.server_endpoint(reactor, "tcp:0", "required", str(pki.ca))
    with pytest.raises(ValueError, match="unknown ssl endpoint option"):
        tls.server_endpoint(reactor, pki.ssl_endpoint() + ":bogus=1", "required", str(pki.ca))
    assert tls.endpoint_kind("SSL:0") == "ssl" and tls.endpoint_kind("tcp:0") == "tcp"


def test_wrap_factory_serves_tls_over_a_plain_listener(pki):
    context = tls.server_options(str(pki.server_key), str(pki.server_cert))
    wrapped = tls.wrap_factory(protocol.Factory.forProtocol(Recorder), context)
    assert isinstance(wrapped, TLSMemoryBIOFactory)


@pytest.mark.parametrize(
    "source_type, settings, required",
    [
        ("fluent_forward", {"verify_client": True}, True),
        ("fluent_forward", {"ssl_client_authentication": "required"}, True),
        ("fluent_forward", {"ssl_client_authentication": "optional"}, False),
        ("lumberjack", {"ssl_client_authentication": "required"}, True),
        ("lumberjack", {"ssl_client_authentication": "optional"}, False),
    ],
)
def test_every_stream_source_listens_with_the_shared_client_certificate_options(pki, source_type, settings, required):
    from logrouter import registry

    registry.load_builtin()
    cls = registry.KINDS["sources"][source_type]
    options = {key: option.default for key, option in cls.OPTIONS.items()}
    options.update(listen=pki.ssl_endpoint(4433, "127.0.0.1"), ca_file=str(pki.ca), **settings)
    assert cls.check_options(options) == []
    reactor = MemoryReactor()
    endpoint = cls("s", options, fake_context(None, reactor)).endpoint()
    endpoint.listen(protocol.Factory.forProtocol(Recorder))
    assert isinstance(reactor.tcpServers[0][1], TLSMemoryBIOFactory)
    context_factory = endpoint.context
    assert isinstance(context_factory, tls.ClientCertificateOptions)
    assert context_factory.options.requireCertificate is required

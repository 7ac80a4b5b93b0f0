"""Fluentd forward protocol v1 handshake (HELO / PING / PONG), pure Python with no Twisted.

It owns the messages of the security phase (``docs/protocols/fluent_forward.md`` section 4):

- ``ServerHandshake``: one connection's server side. ``helo()`` is the greeting the
  server sends first; ``feed(data)`` reads the client's PING incrementally, checks the
  shared key digest (and the user digest when users are configured) and returns a
  ``HandshakeResult`` holding the PONG to send, the verdict, and any bytes the client
  sent after its PING (the start of the transport phase).
- The digests, and encoders/decoders for all three messages, including the client side
  (``decode_helo``, ``client_ping``, ``check_pong``, and ``ClientHandshake`` tying them
  together for one connection) for tests and forwarding clients (the forward sink).

Handshake fields are raw bytes: Fluent Bit sends 16 random salt bytes inside a msgpack
``str`` (not valid UTF-8) and out_forward 32 hex characters. Strings are decoded with
``surrogateescape`` and turned back into the exact bytes received before hashing, so a
salt is hashed as sent whatever its encoding.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from logrouter.wire.errors import DecodeError

__all__ = [
    "ClientHandshake",
    "HandshakeError",
    "HandshakeResult",
    "Helo",
    "Ping",
    "Security",
    "ServerHandshake",
    "check_pong",
    "client_ping",
    "decode_helo",
    "encode_helo",
    "encode_ping",
    "encode_pong",
    "parse_ping",
    "password_digest",
    "shared_key_digest",
]

SALT_BYTES = 16
MAX_PING_BYTES = 64 * 1024  # a real PING is a few hundred bytes

# The reasons in_forward puts in a failure PONG (section 4).
INVALID_PING = "invalid ping message"
SHARED_KEY_MISMATCH = "shared_key mismatch"
USER_MISMATCH = "username/password mismatch"

_MSGPACK_ERRORS = (ValueError, TypeError, msgpack.UnpackException)


class HandshakeError(DecodeError):
    """A handshake message that is malformed or fails its check.

    ``reason`` is what goes on the wire (in_forward's wording); ``detail`` says more, for
    log lines only.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason, fatal=True)
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason} ({self.detail})" if self.detail else self.reason


# -- bytes and digests -------------------------------------------------------------------


def raw_bytes(value: Any) -> bytes | None:
    """The bytes a msgpack str/bin carried, exactly as received; None for other types."""
    if type(value) is bytes:
        return value
    if type(value) is str:
        return value.encode("utf-8", "surrogateescape")
    return None


def _utf8(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


def _text(value: bytes) -> str:
    """Bytes from the wire made printable for a log line (never used for comparisons)."""
    return value.decode("utf-8", "backslashreplace")


# repr() of a peer's message recurses into it (msgpack nests up to 1024 deep, deeper than
# the interpreter lets repr go) and builds all of it before it could be cut short.
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 3
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 40


def shown(message: Any) -> str:
    """A decoded message from a peer as at most 80 characters for a log line."""
    return _SHORT_REPR.repr(message)[:80]


def shared_key_digest(salt: bytes, hostname: str | bytes, nonce: bytes, shared_key: str | bytes) -> str:
    """``sha512_hex(shared_key_salt ‖ hostname ‖ nonce ‖ shared_key)`` (PING and PONG)."""
    return hashlib.sha512(salt + _utf8(hostname) + nonce + _utf8(shared_key)).hexdigest()


def password_digest(auth_salt: bytes, username: str | bytes, password: str | bytes) -> str:
    """``sha512_hex(auth_salt ‖ username ‖ password)`` (PING's user digest)."""
    return hashlib.sha512(auth_salt + _utf8(username) + _utf8(password)).hexdigest()


def _digest_matches(received: bytes, expected: str) -> bool:
    return hmac.compare_digest(received, expected.encode("ascii"))


# -- encoders ----------------------------------------------------------------------------


def encode_helo(nonce: bytes, auth: bytes, keepalive: bool = True) -> bytes:
    """``["HELO", {"nonce": bin, "auth": bin, "keepalive": bool}]`` (vector F4)."""
    return msgpack.packb(["HELO", {"nonce": nonce, "auth": auth, "keepalive": keepalive}], use_bin_type=True)


def encode_ping(
    client_hostname: str | bytes,
    salt: bytes,
    digest: str,
    username: str | bytes = "",
    password_hexdigest: str = "",
) -> bytes:
    """The 6-element PING; hostname, salt and username go out as msgpack str (as peers send)."""
    parts = [_utf8(client_hostname), salt, digest.encode("ascii"), _utf8(username), password_hexdigest.encode("ascii")]
    packer = msgpack.Packer(use_bin_type=False)  # bytes -> str family: the str a Ruby/C peer sends
    return packer.pack(["PING", *parts])


def encode_pong(ok: bool, reason: str, server_hostname: str, digest: str) -> bytes:
    """The 5-element PONG; a failure is ``["PONG", false, reason, "", ""]``."""
    return msgpack.packb(["PONG", ok, reason, server_hostname, digest])


# -- server side -------------------------------------------------------------------------


@dataclass(frozen=True)
class Security:
    """A source's handshake settings: the shared key, the name it answers with, its users.

    With ``users`` empty, user authentication is off (the auth salt is still sent, as
    in_forward does, and whatever username/digest the client sends is ignored).
    """

    shared_key: str
    self_hostname: str
    users: Mapping[str, str] = field(default_factory=dict)

    @property
    def user_auth(self) -> bool:
        return bool(self.users)


@dataclass(frozen=True)
class Ping:
    """A PING's fields as the raw bytes received (username/digest ``b""`` when sent as nil)."""

    hostname: bytes
    salt: bytes
    digest: bytes
    username: bytes
    password_digest: bytes


def parse_ping(message: Any) -> Ping:
    """Check a decoded PING's shape; raise ``HandshakeError("invalid ping message")`` if wrong."""
    if type(message) is not list:
        raise HandshakeError(INVALID_PING, f"expected a PING array, got {type(message).__name__}")
    if len(message) != 6 or raw_bytes(message[0]) != b"PING":
        head = message[0] if message else None
        shown = repr(head) if type(head) in (str, bytes) else type(head).__name__
        raise HandshakeError(INVALID_PING, f"expected ['PING', …] with 6 elements, got {len(message)} starting with {shown}")
    fields = []
    for index, name in ((1, "hostname"), (2, "shared_key_salt"), (3, "shared_key_hexdigest")):
        value = raw_bytes(message[index])
        if value is None:
            raise HandshakeError(INVALID_PING, f"{name} is {type(message[index]).__name__}, not a string")
        fields.append(value)
    for index, name in ((4, "username"), (5, "password_hexdigest")):
        # Older clients send nil here when they have no user (npm fluent-logger).
        value = b"" if message[index] is None else raw_bytes(message[index])
        if value is None:
            raise HandshakeError(INVALID_PING, f"{name} is {type(message[index]).__name__}, not a string")
        fields.append(value)
    return Ping(*fields)


@dataclass(slots=True)
class HandshakeResult:
    """The verdict on one PING.

    ``pong`` is to be written in every case; on failure the connection is then closed.
    ``rest`` holds the bytes that followed the PING in the stream (transport phase).
    """

    ok: bool
    pong: bytes
    reason: str = ""
    detail: str = ""
    client_hostname: str = ""
    username: str = ""
    rest: bytes = b""

    def describe(self) -> str:
        """The failure for a log line: reason, then what the client sent."""
        parts = [self.detail] if self.detail else []
        if self.client_hostname:
            parts.append(f"client hostname {self.client_hostname!r}")
        if self.username:
            parts.append(f"username {self.username!r}")
        return f"{self.reason} ({', '.join(parts)})" if parts else self.reason


class ServerHandshake:
    """One connection's server side of the handshake: HELO out, PING in, PONG out.

    ``nonce`` and ``auth_salt`` are 16 random bytes each unless given (tests pass fixed
    ones). ``feed`` returns None until a whole PING (or more than ``max_ping_bytes`` of
    input) has arrived, then a ``HandshakeResult``; it must not be fed after that.
    """

    def __init__(
        self,
        security: Security,
        *,
        nonce: bytes | None = None,
        auth_salt: bytes | None = None,
        keepalive: bool = True,
        max_ping_bytes: int = MAX_PING_BYTES,
    ) -> None:
        self.security = security
        self.nonce = os.urandom(SALT_BYTES) if nonce is None else nonce
        # in_forward sends an auth salt whenever security is on, used or not (section 4).
        self.auth_salt = os.urandom(SALT_BYTES) if auth_salt is None else auth_salt
        self.keepalive = keepalive
        self._max = max_ping_bytes
        self._buffer = bytearray()
        self._unpacker = msgpack.Unpacker(
            raw=False,
            unicode_errors="surrogateescape",
            max_buffer_size=max_ping_bytes,
            strict_map_key=False,
        )
        self.result: HandshakeResult | None = None

    @property
    def pending_bytes(self) -> int:
        """Bytes held of a PING not complete yet (0 before any and once the verdict is in)."""
        return len(self._buffer)

    def helo(self) -> bytes:
        return encode_helo(self.nonce, self.auth_salt, self.keepalive)

    def feed(self, data: bytes) -> HandshakeResult | None:
        if self.result is not None:
            raise RuntimeError("handshake already finished")
        room = self._max - len(self._buffer)
        piece, overflow = bytes(data[:room]), bytes(data[room:])
        self._buffer += piece
        try:
            self._unpacker.feed(piece)
            message = self._unpacker.unpack()
        except msgpack.OutOfData:
            if overflow or len(self._buffer) >= self._max:
                return self._finish(self._failure(HandshakeError(INVALID_PING, f"no complete PING within {self._max} bytes")))
            return None
        except _MSGPACK_ERRORS as exc:
            return self._finish(self._failure(HandshakeError(INVALID_PING, f"not msgpack: {exc}")))
        result = self.check(message)
        if result.ok:
            result.rest = bytes(self._buffer[self._unpacker.tell():]) + overflow
        return self._finish(result)

    def _finish(self, result: HandshakeResult) -> HandshakeResult:
        self.result = result
        self._buffer = bytearray()
        return result

    def check(self, message: Any) -> HandshakeResult:
        """The verdict on one decoded PING message (in_forward's ``check_ping``)."""
        try:
            ping = parse_ping(message)
        except HandshakeError as error:
            return self._failure(error)
        security = self.security
        hostname = _text(ping.hostname)
        expected = shared_key_digest(ping.salt, ping.hostname, self.nonce, security.shared_key)
        if not _digest_matches(ping.digest, expected):
            return self._failure(HandshakeError(SHARED_KEY_MISMATCH), hostname)
        username = ""
        if security.user_auth:
            username = _text(ping.username)
            password = security.users.get(ping.username.decode("utf-8", "surrogateescape"))
            # An unknown user is checked against a password nobody has, so it costs the same.
            expected_user = password_digest(self.auth_salt, ping.username, os.urandom(SALT_BYTES) if password is None else password)
            if password is None or not _digest_matches(ping.password_digest, expected_user):
                detail = "" if password is not None else "unknown user"
                return self._failure(HandshakeError(USER_MISMATCH, detail), hostname, username)
        server_digest = shared_key_digest(ping.salt, security.self_hostname, self.nonce, security.shared_key)
        pong = encode_pong(True, "", security.self_hostname, server_digest)
        return HandshakeResult(True, pong, client_hostname=hostname, username=username)

    @staticmethod
    def _failure(error: HandshakeError, hostname: str = "", username: str = "") -> HandshakeResult:
        pong = encode_pong(False, error.reason, "", "")
        return HandshakeResult(False, pong, error.reason, error.detail, hostname, username)


# -- client side (tests, forwarding clients) ----------------------------------------------


@dataclass(frozen=True)
class Helo:
    nonce: bytes
    auth: bytes  # b"" when the server asks for no user authentication
    keepalive: bool


def decode_helo(message: Any) -> Helo:
    """Read a decoded HELO (nonce/auth as bin or str; keepalive defaults to true)."""
    if type(message) is not list or len(message) != 2 or raw_bytes(message[0]) != b"HELO" or type(message[1]) is not dict:
        raise HandshakeError("invalid HELO message", f"got {shown(message)}")
    options = {raw_bytes(k) or k: v for k, v in message[1].items()}
    nonce = raw_bytes(options.get(b"nonce"))
    auth = raw_bytes(options.get(b"auth", b""))
    keepalive = options.get(b"keepalive", True)
    if nonce is None or auth is None or type(keepalive) is not bool:
        raise HandshakeError("invalid HELO message", "nonce/auth must be strings, keepalive a boolean")
    return Helo(nonce, auth, keepalive)


def client_ping(
    helo: Helo,
    client_hostname: str,
    shared_key: str,
    *,
    salt: bytes | None = None,
    username: str = "",
    password: str = "",
) -> tuple[bytes, bytes]:
    """``(ping_bytes, salt)`` answering ``helo``; the user digest only when the HELO has a salt."""
    salt = os.urandom(SALT_BYTES).hex().encode("ascii") if salt is None else salt  # out_forward's form
    digest = shared_key_digest(salt, client_hostname, helo.nonce, shared_key)
    user_digest = password_digest(helo.auth, username, password) if helo.auth else ""
    return encode_ping(client_hostname, salt, digest, username if helo.auth else "", user_digest), salt


def check_pong(message: Any, helo: Helo, salt: bytes, client_hostname: str, shared_key: str) -> str:
    """The server's hostname from a successful PONG; ``HandshakeError`` otherwise (out_forward's checks)."""
    if type(message) is not list or len(message) != 5 or raw_bytes(message[0]) != b"PONG" or type(message[1]) is not bool:
        raise HandshakeError("invalid PONG message", f"got {shown(message)}")
    _, ok, reason, hostname, digest = message
    if not ok:
        raise HandshakeError("authentication failed", _text(raw_bytes(reason) or b""))
    hostname_bytes, digest_bytes = raw_bytes(hostname), raw_bytes(digest)
    if hostname_bytes is None or digest_bytes is None:
        raise HandshakeError("invalid PONG message", "hostname and digest must be strings")
    if hostname_bytes == _utf8(client_hostname):
        raise HandshakeError("same hostname between input and output", _text(hostname_bytes))
    if not _digest_matches(digest_bytes, shared_key_digest(salt, hostname_bytes, helo.nonce, shared_key)):
        raise HandshakeError(SHARED_KEY_MISMATCH, "server digest does not match")
    return _text(hostname_bytes)


class ClientHandshake:
    """One connection's client side of the handshake (out_forward's): HELO in, PING out, PONG in.

    ``receive(message)`` takes each decoded server message in order: for the HELO it
    returns the PING to send, for the PONG it checks the server (auth result, its digest,
    and that it does not answer with our own hostname) and returns None with
    ``established`` set. Anything wrong raises ``HandshakeError``. ``salt`` is 32 random
    hex characters unless given (out_forward's form).
    """

    def __init__(
        self,
        client_hostname: str,
        shared_key: str,
        *,
        username: str = "",
        password: str = "",
        salt: bytes | None = None,
    ) -> None:
        self.client_hostname = client_hostname
        self.shared_key = shared_key
        self.username = username
        self.password = password
        self._salt = salt
        self.helo: Helo | None = None
        self.established = False
        self.server_hostname = ""

    def receive(self, message: Any) -> bytes | None:
        if self.established:
            raise RuntimeError("handshake already finished")
        if self.helo is None:
            head = raw_bytes(message[0]) if type(message) is list and message else None
            if head == b"PONG":
                raise HandshakeError("invalid HELO message", "got a PONG before any HELO")
            self.helo = decode_helo(message)
            ping, self._salt = client_ping(
                self.helo,
                self.client_hostname,
                self.shared_key,
                salt=self._salt,
                username=self.username,
                password=self.password,
            )
            return ping
        assert self._salt is not None
        self.server_hostname = check_pong(message, self.helo, self._salt, self.client_hostname, self.shared_key)
        self.established = True
        return None

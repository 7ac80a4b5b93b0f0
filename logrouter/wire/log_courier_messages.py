"""The messages of the Log Courier protocol ("courier"), pure Python with no Twisted imports.

It owns what each message is (``docs/protocols/log_courier.md``, sections 2-6): the
type codes and the 8-byte header (4 ASCII type bytes, u32 BE body length), the frame
types the decoders return (``Helo``, ``Vers``, ``Ping``, ``Pong``, ``Unknown``,
``UnrecognizedMessage``, ``Ackn``; ``Payload`` is ``log_courier_records``'), the
handshake body both sides share (flags with the EVNT bit, version, client id, 0-32
bytes), and the encoders of every message in both directions. Decoding the stream of
messages is ``logrouter.wire.log_courier``'s.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from logrouter.wire.log_courier_records import Payload, encode_records

HELO = b"HELO"
VERS = b"VERS"
PING = b"PING"
PONG = b"PONG"
JDAT = b"JDAT"
EVNT = b"EVNT"
ACKN = b"ACKN"
UNKN = b"????"

STREAMED = 0xFFFFFFFF  # the EVNT length field
HANDSHAKE_BYTES = 32
NONCE_BYTES = 16
EVNT_FLAG = 0x01000000  # bit 0x01 of the first flags byte (section 4)

HEADER = struct.Struct(">4sI")  # type code, body length (section 2)
_HANDSHAKE = struct.Struct(">IIII4s")  # flags, major, minor, patch, client id
ACKN_BODY = struct.Struct(">16sI")


# -- frames ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Handshake:
    """The body both sides' handshakes share. ``client_id`` is the 4-byte id without NULs
    (``"LCOR"``, ``"RYLC"``, ``""`` for unknown); ``size`` the body length it came with (0-32)."""

    flags: int
    version: tuple[int, int, int]
    client_id: str
    size: int = HANDSHAKE_BYTES

    @property
    def supports_evnt(self) -> bool:
        return bool(self.flags & EVNT_FLAG)


@dataclass(frozen=True, slots=True)
class Helo(_Handshake):
    """A client's handshake."""


@dataclass(frozen=True, slots=True)
class Vers(_Handshake):
    """A server's handshake answer."""


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Pong:
    pass


@dataclass(frozen=True, slots=True)
class Unknown:
    """The ``????`` message: the peer did not understand our last message."""


@dataclass(frozen=True, slots=True)
class UnrecognizedMessage:
    """A message of a type this codec does not know, skipped (``length`` body bytes).
    The Ruby server answers these with ``????``."""

    code: bytes
    length: int


@dataclass(frozen=True, slots=True)
class Ackn:
    nonce: bytes
    sequence: int


Frame = Helo | Ping | Unknown | UnrecognizedMessage | Payload
ServerFrame = Vers | Pong | Ackn | Unknown


def handshake_fields(body: bytes) -> tuple[int, tuple[int, int, int], str, int]:
    """A ``HELO``/``VERS`` body (0-32 bytes, short ones padded with NULs) as the fields of ``Helo``/``Vers``."""
    flags, major, minor, patch, ident = _HANDSHAKE.unpack_from(body.ljust(HANDSHAKE_BYTES, b"\0"))
    return flags, (major, minor, patch), ident.rstrip(b"\0").decode("latin-1"), len(body)


def printable(code: bytes) -> bool:
    """Whether a type code is four printable ASCII characters (then an unknown type may be skipped)."""
    return all(0x20 <= c < 0x7F for c in code)


def show_code(code: bytes) -> str:
    """A type code for an error message: as text if printable, else in hex."""
    return code.decode("latin-1") if printable(code) else "0x" + code.hex()


# -- encoders ----------------------------------------------------------------------------


def _message(code: bytes, body: bytes = b"") -> bytes:
    return HEADER.pack(code, len(body)) + body


def _handshake_body(
    supports_evnt: bool, version: tuple[int, int, int], client_id: bytes | str, flags: int | None, size: int
) -> bytes:
    if isinstance(client_id, str):
        client_id = client_id.encode("ascii")
    if len(client_id) > 4:
        raise ValueError(f"client id must be at most 4 bytes, got {client_id!r}")
    if not 0 <= size <= HANDSHAKE_BYTES:
        raise ValueError(f"handshake body size must be 0..32, got {size}")
    if flags is None:
        flags = EVNT_FLAG if supports_evnt else 0
    body = _HANDSHAKE.pack(flags, *version, client_id.ljust(4, b"\0")).ljust(HANDSHAKE_BYTES, b"\0")
    return body[:size]


def encode_helo(
    supports_evnt: bool = False,
    version: tuple[int, int, int] = (2, 12, 0),
    client_id: bytes | str = b"LCOR",
    *,
    flags: int | None = None,
    size: int = HANDSHAKE_BYTES,
) -> bytes:
    """A client's ``HELO``: 32-byte body (the Ruby client sends ``size=20``). ``flags``
    overrides ``supports_evnt`` (the EVNT bit is 0x01000000, the first body byte)."""
    return _message(HELO, _handshake_body(supports_evnt, version, client_id, flags, size))


def encode_vers(
    supports_evnt: bool = True,
    version: tuple[int, int, int] = (2, 12, 0),
    client_id: bytes | str = b"LCVR",
    *,
    flags: int | None = None,
    size: int = HANDSHAKE_BYTES,
) -> bytes:
    """A server's ``VERS`` (Log Carver sets the EVNT bit; the Ruby server sends 20 bytes
    with flags 0 and ``RYLC``)."""
    return _message(VERS, _handshake_body(supports_evnt, version, client_id, flags, size))


def encode_ping() -> bytes:
    return _message(PING)


def encode_pong() -> bytes:
    return _message(PONG)


def encode_unknown() -> bytes:
    """``????``: the answer to a message the receiver does not understand."""
    return _message(UNKN)


def _nonce(nonce: bytes) -> bytes:
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be 16 bytes, got {len(nonce)}")
    return bytes(nonce)


def encode_ackn(nonce: bytes, sequence: int) -> bytes:
    """``ACKN``: the first ``sequence`` events of the payload are done (0 = keepalive)."""
    return _message(ACKN, ACKN_BODY.pack(_nonce(nonce), sequence))


def encode_jdat(nonce: bytes, events: Iterable[Mapping[str, Any] | str | bytes], level: int = 3) -> bytes:
    """``JDAT``: nonce + one zlib stream of the records (Log Courier compresses at level 3)."""
    blob = zlib.compress(encode_records(events), level)
    return _message(JDAT, _nonce(nonce) + blob)


def encode_evnt(nonce: bytes, events: Iterable[Mapping[str, Any] | str | bytes], level: int = 3) -> bytes:
    """``EVNT``: length 0xFFFFFFFF, nonce, then the zlib stream; the message ends with it."""
    blob = zlib.compress(encode_records(events), level)
    return HEADER.pack(EVNT, STREAMED) + _nonce(nonce) + blob

"""The acks of the Lumberjack (Beats) protocol, pure Python with no Twisted imports.

The server->client half of a connection is ``A`` frames only: version byte, ``'A'``,
u32 BE sequence number (``docs/protocols/lumberjack.md``, section 5). This module owns
``Ack``, the server's encoder ``encode_ack``, and the client side's reader
``AckDecoder`` (used by the lumberjack sink and by tests).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from logrouter.wire.errors import DecodeError
from logrouter.wire.lumberjack_frames import ACK, VERSIONS, version_byte

__all__ = ["Ack", "AckDecoder", "encode_ack"]

_U32 = struct.Struct(">I")
_HEADER_U32 = struct.Struct(">BBI")


@dataclass(frozen=True, slots=True)
class Ack:
    """An ``A`` frame: the events of the window up to ``seq`` are stored (0: a keepalive)."""

    version: int
    seq: int


def encode_ack(seq: int, version: int = 2) -> bytes:
    """The server's ``A`` frame; ``seq`` 0 is the keepalive (section 5)."""
    return _HEADER_U32.pack(version_byte(version), ACK, seq)


class AckDecoder:
    """Reads the server->client half: ``A`` frames only (used by tests and clients).

    A bad version or frame type is refused as soon as its byte arrives; the acks decoded
    before it by the same ``feed`` call are in the error's ``messages``.
    """

    def __init__(self) -> None:
        self._buffer = b""

    @property
    def pending_bytes(self) -> int:
        """Bytes held of an ``A`` frame not complete yet (0 at a frame boundary)."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Ack]:
        buf = self._buffer + data if self._buffer else data
        acks: list[Ack] = []
        pos = 0
        end = len(buf)
        while pos < end:
            vbyte = buf[pos]
            if vbyte not in VERSIONS:
                raise self._error(f"invalid protocol version byte 0x{vbyte:02x} in an ack", acks)
            if end - pos < 2:
                break
            kind = buf[pos + 1]
            if kind != ACK:
                raise self._error(f"expected an ACK frame, got frame type 0x{kind:02x}", acks)
            if end - pos < 6:
                break
            acks.append(Ack(VERSIONS[vbyte], _U32.unpack_from(buf, pos + 2)[0]))
            pos += 6
        self._buffer = bytes(buf[pos:])
        return acks

    def _error(self, reason: str, acks: list[Ack]) -> DecodeError:
        self._buffer = b""
        error = DecodeError(reason)
        error.messages = acks
        return error

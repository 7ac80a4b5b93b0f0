"""The protocol handshake hook of stream connections (a protocol's own handshake, not TLS's).

A protocol whose connections start with a handshake (fluent forward's HELO/PING/PONG, Log
Courier's HELO/VERS) calls ``expect_handshake`` when the connection is ready; until its
``handshake_received`` says the handshake is done (``HandshakeDone``) or failed
(``HandshakeFailed``), every byte received goes there instead of to the codec. This module
owns those two answers and the hooks (``HandshakeHooks``, mixed into ``StreamProtocol``);
the connection's reading loop acts on the answers.
"""

from __future__ import annotations


class HandshakeDone:
    """What ``handshake_received`` returns once the handshake is over.

    ``reply`` is written first (e.g. a PONG, a VERS); ``rest`` (the bytes that followed the
    handshake in the stream) then goes to the codec, as does everything after it. A
    connection whose client turns out to skip the handshake (a legacy client whose first
    message is already data) returns every byte received so far as ``rest``.
    """

    __slots__ = ("rest", "reply")

    def __init__(self, rest: bytes = b"", reply: bytes = b"") -> None:
        self.rest = rest
        self.reply = reply


class HandshakeFailed:
    """What ``handshake_received`` returns when the handshake failed: ``reply`` is written,
    then the connection is closed as bad input (``decode_error``) with ``reason`` logged."""

    __slots__ = ("reason", "reply")

    def __init__(self, reason: str, reply: bytes = b"") -> None:
        self.reason = reason
        self.reply = reply


class HandshakeHooks:
    """The hooks a protocol with a handshake overrides; mixed into ``StreamProtocol``."""

    handshaking: bool

    def expect_handshake(self) -> None:
        """This connection starts with a handshake: until ``handshake_received`` says it is
        done, every byte received goes there instead of to the codec.

        Idle timeout, frame deadline (``frame_timeout_secs``, with
        ``handshake_pending_bytes`` as the frame's unprocessed bytes) and the stop's drain
        apply to the handshake as they do to frames.
        """
        self.handshaking = True

    def handshake_received(self, data: bytes) -> HandshakeDone | HandshakeFailed | None:
        """Take the bytes of one read during the handshake.

        Return None while it is not complete (keep what you need of ``data``),
        ``HandshakeDone(rest, reply)`` once it is (``rest`` goes to the codec; return the
        same bytes when no handshake took place), or ``HandshakeFailed(reason, reply)``.
        """
        raise NotImplementedError

    def handshake_pending_bytes(self) -> int:
        """Bytes of an incomplete handshake message held (the frame deadline's measure)."""
        return 0

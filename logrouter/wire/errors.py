"""The error every codec raises for input it cannot decode."""

from __future__ import annotations

from typing import Any


class DecodeError(Exception):
    """Input a codec cannot decode. ``fatal`` means the connection cannot continue.

    ``messages`` holds what the same ``feed`` call decoded before the bad input, in
    order, so that a caller sees the same frames however the bytes were split into
    reads (frames completed by earlier calls were returned by them). The caller may
    act on them before closing, or drop them (unacknowledged data is resent).
    """

    def __init__(self, reason: str, fatal: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fatal = fatal
        self.messages: list[Any] = []


def detached(error: BaseException) -> BaseException:
    """``error`` without its traceback and the exceptions chained to it, to be kept.

    A traceback holds every frame the error passed through, and through them their
    locals (whole payloads, the decoder, the list the error is about to be put in): kept
    in a long-lived structure, that is a reference cycle, freed only when the cycle
    collector runs, which the daemon does every few seconds (``logrouter.gc_tuning``).
    """
    error.__traceback__ = None
    error.__context__ = None
    error.__cause__ = None
    return error

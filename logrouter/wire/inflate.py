"""Bounded inflate (zlib, gzip, raw deflate) shared by the codecs; pure Python, no Twisted.

A peer decides how much a few compressed bytes become, so every inflate here is bounded:

- ``inflate(blob, limit, wbits)`` / ``inflate_pieces(...)``: one complete compressed block
  (a Lumberjack ``C`` frame, a Log Courier ``JDAT`` body, a forward ``PackedForward``
  blob). zlib and raw deflate: exactly one stream, bytes after its end are an error.
  gzip: one or more concatenated members (fluentd's compressable.rb concatenates them);
  an empty blob is zero members and inflates to nothing.
- ``StreamInflater``: one zlib stream arriving in pieces off a socket (a Log Courier
  ``EVNT`` message ends exactly where its zlib stream ends): ``feed`` what arrived, read
  ``eof`` and, once it is true, ``unused_data`` (the bytes after the stream, i.e. the
  start of the next message).

Both never produce more than ``limit`` + 1 bytes in total: zlib is asked for at most the
remaining budget plus one byte (and at most ``step`` bytes) per call, so a bomb is caught
one step after it passes the limit instead of after it has filled memory. Compressed
input is handed to zlib in slices of ``INPUT_SLICE_BYTES``: zlib copies the input it has
not consumed yet (``unconsumed_tail``) after every call, which for a whole 64 MiB payload
inflating in 1 MiB steps was a copy of the payload per step. (``inflate_pieces`` takes
another ``input_slice``: where a codec's pieces mark boundaries that must stay as they
were, e.g. the forward codec's deferred parts, whose dedupe keys a resend relies on.)

Problems raise ``InflateError(reason, too_big=...)``; ``too_big`` is set when a limit was
hit (as opposed to bad or truncated data). Codecs turn it into their own ``DecodeError``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

__all__ = [
    "DEFAULT_STEP_BYTES",
    "GZIP",
    "INPUT_SLICE_BYTES",
    "InflateError",
    "RAW",
    "StreamInflater",
    "ZLIB",
    "inflate",
    "inflate_pieces",
]

ZLIB = 15  # RFC 1950: header, deflate, Adler-32
GZIP = 31  # RFC 1952 members
RAW = -15  # bare deflate

DEFAULT_STEP_BYTES = 1 << 20  # at most this much output per zlib call
INPUT_SLICE_BYTES = 64 << 10  # compressed input handed to zlib per call
FIRST_SLICE_BYTES = 4 << 10  # a StreamInflater's first slice; they double up to the above


class InflateError(Exception):
    """Compressed data that cannot be inflated within its limits.

    ``too_big`` is True when a limit was exceeded (decompressed size, or a stream's
    compressed length), False for corrupt or truncated data.
    """

    def __init__(self, reason: str, too_big: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.too_big = too_big


def _is_gzip(wbits: int) -> bool:
    return 16 + 8 <= wbits <= 16 + 15


def _too_big(limit: int) -> InflateError:
    return InflateError(f"compressed data inflates to more than {limit} bytes", too_big=True)


def inflate_pieces(
    blob: bytes | bytearray | memoryview,
    limit: int,
    wbits: int = ZLIB,
    *,
    members: bool | None = None,
    step: int = DEFAULT_STEP_BYTES,
    input_slice: int = INPUT_SLICE_BYTES,
) -> Iterator[bytes]:
    """Inflate one complete block, yielding pieces of at most ``step`` bytes, never more
    than ``limit`` bytes in all (the error is raised once ``limit`` + 1 bytes came out).

    ``members`` (default: True for gzip ``wbits``, False otherwise) allows several
    concatenated streams; an empty blob is then zero streams. Without it the blob must be
    exactly one stream. Errors are raised as the pieces are read. Compressed input is
    handed to zlib ``input_slice`` bytes at a time; the pieces depend on it (a piece ends
    where its slice was used up), the joined result and the errors do not.
    """
    if members is None:
        members = _is_gzip(wbits)
    view = memoryview(blob)
    size = len(view)
    position = 0  # of the next byte not yet handed to zlib
    pending: bytes | memoryview = b""  # handed to the current stream, not consumed yet
    inflater = zlib.decompressobj(wbits)
    started = False  # the current stream has been handed input
    total = 0
    try:
        while True:
            if not pending and position < size:
                pending = view[position : position + input_slice]
                position += len(pending)
                started = True
            ask = min(limit - total + 1, step)
            piece = inflater.decompress(pending, ask)
            total += len(piece)
            if total > limit:
                raise _too_big(limit)
            if piece:
                yield piece
            if inflater.eof:
                rest = len(inflater.unused_data) + size - position
                if not rest:
                    return
                if not members:
                    raise InflateError(f"{rest} bytes after the end of the compressed stream")
                pending = inflater.unused_data  # the next member starts there
                inflater = zlib.decompressobj(wbits)
                continue
            pending = inflater.unconsumed_tail
            if not piece and not pending and position >= size:
                if started or not members:
                    raise InflateError("compressed data is truncated")
                return  # members allowed and the blob was empty
    except zlib.error as e:
        raise InflateError(f"bad compressed data: {e}") from None


def inflate(
    blob: bytes | bytearray | memoryview,
    limit: int,
    wbits: int = ZLIB,
    *,
    members: bool | None = None,
    step: int = DEFAULT_STEP_BYTES,
    input_slice: int = INPUT_SLICE_BYTES,
) -> bytes:
    """``inflate_pieces`` joined: the whole inflated block (at most ``limit`` bytes)."""
    return b"".join(inflate_pieces(blob, limit, wbits, members=members, step=step, input_slice=input_slice))


class StreamInflater:
    """One compressed stream (zlib by default) fed in pieces as it arrives.

    ``feed(data)`` returns what ``data`` inflated to (possibly ``b""``). Once the stream
    has ended, ``eof`` is True and ``unused_data`` holds the bytes fed after its end (later
    ``feed`` calls append to it). ``produced`` counts inflated bytes, ``consumed`` the
    compressed bytes that belong to the stream.

    Limits: the inflated total may not exceed ``limit``; with ``max_input`` the stream
    itself (compressed) may not be longer than that. Both raise ``InflateError`` with
    ``too_big`` set; bad data raises it without. The result, and which error is raised,
    do not depend on how the input is split into ``feed`` calls. After an error the
    inflater is unusable. ``check_complete()`` raises unless the stream has ended.
    """

    def __init__(
        self,
        limit: int,
        wbits: int = ZLIB,
        *,
        max_input: int | None = None,
        step: int = DEFAULT_STEP_BYTES,
    ) -> None:
        self.limit = limit
        self.max_input = max_input
        self.step = step
        self.produced = 0
        self._taken = 0  # compressed bytes handed to zlib
        self._left = max_input  # compressed bytes zlib may still be handed
        self._inflater = zlib.decompressobj(wbits)
        self._full = False  # the last call filled its output: zlib may hold more
        self._unused = b""
        self._slice = FIRST_SLICE_BYTES
        self.last_used = 0
        self._failed: InflateError | None = None

    @property
    def eof(self) -> bool:
        return self._inflater.eof

    @property
    def unused_data(self) -> bytes:
        return self._unused

    @property
    def consumed(self) -> int:
        """Compressed bytes of the stream handed in so far (all of it once ``eof``)."""
        if self._inflater.eof:
            return self._taken - len(self._inflater.unused_data)
        return self._taken - len(self._inflater.unconsumed_tail)

    def check_complete(self) -> None:
        if not self._inflater.eof:
            raise InflateError("compressed data is truncated")

    def feed(self, data: bytes | bytearray | memoryview, *, keep_unused: bool = True) -> bytes:
        """Inflate ``data``; return its output. ``last_used`` tells how many bytes of
        ``data`` belonged to the stream (all, unless it ended in them). A caller that
        reads the rest from its own buffer passes ``keep_unused=False``: ``unused_data``
        then stays empty and nothing after the stream is copied."""
        if self._failed is not None:
            raise InflateError(f"inflater already failed: {self._failed.reason}", self._failed.too_big)
        inflater = self._inflater
        if inflater.eof:
            self.last_used = 0
            if keep_unused:
                self._unused += bytes(data)
            return b""
        view = memoryview(data)
        size = len(view)
        position = 0
        pending: bytes | memoryview = b""
        parts: list[bytes] = []
        limit = self.limit
        try:
            while not inflater.eof:
                # New input only once zlib has handed out all it held: a limit is then hit
                # at the same place in the output however the input was split.
                if not pending and not self._full and position < size:
                    # Slices start small and grow: zlib copies what follows the stream's end
                    # in the last slice, so a small stream costs a small copy.
                    take = self._slice
                    self._slice = min(take * 2, INPUT_SLICE_BYTES)
                    if self._left is not None:
                        if self._left <= 0:
                            raise InflateError(
                                f"compressed stream is longer than {self.max_input} bytes", too_big=True
                            )
                        take = min(take, self._left)
                    pending = view[position : position + take]
                    position += len(pending)
                    if self._left is not None:
                        self._left -= len(pending)
                    self._taken += len(pending)
                ask = min(limit - self.produced + 1, self.step)
                piece = inflater.decompress(pending, ask)
                self.produced += len(piece)
                if self.produced > limit:
                    raise _too_big(limit)
                self._full = len(piece) == ask
                if piece:
                    parts.append(piece)
                pending = inflater.unconsumed_tail
                if not piece and not pending and position >= size:
                    break  # everything handed in is inflated: wait for more
        except zlib.error as e:
            # What is kept is a copy that is never raised: a raised one carries a
            # traceback back to this frame and this inflater (a reference cycle).
            self._failed = InflateError(f"bad compressed data: {e}")
            raise InflateError(self._failed.reason) from None
        except InflateError as e:
            self._failed = InflateError(e.reason, e.too_big)
            raise
        if inflater.eof:
            self.last_used = position - len(inflater.unused_data)
            if keep_unused:
                self._unused = inflater.unused_data + bytes(view[position:])
        else:
            self.last_used = size
        return b"".join(parts)

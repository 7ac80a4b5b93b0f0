"""Framing a forward connection's byte stream into messages (pure, no Twisted).

- ``MsgpackFramer``: top-level msgpack objects, each at most ``max_message_bytes``,
  refused as oversize at the same byte however the stream is split. With the native
  extension, PackedForward messages of the usual shape are framed by it
  (``logrouter_native.forward_frames``): each blob is sliced out of the received bytes
  once. From any other message on (Message and Forward modes, heartbeats, garbage,
  anything too big) the Python framer takes the stream, until it stands between
  messages at the end of a read. In Python, a scanner running ahead turns the str
  header of each PackedForward blob into bin, so the unpacker copies the entries' bytes
  instead of decoding them as text. Both give the same messages and errors.
- ``JsonFramer``: the text of each top-level JSON array or object (in_forward's JSON
  mode), found by bracket depth outside strings; ``parse_json`` parses one, keeping
  integers msgpack cannot hold as their digits and replacing lone surrogates.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Generator, Iterator
from typing import Any

import msgpack

from logrouter.native import NATIVE
from logrouter.wire.forward_entries import MSGPACK_ERRORS, ForwardDecodeError, byte_in, msgpack_problem, new_unpacker


def _oversize(limit: int, detail: str = "") -> ForwardDecodeError:
    return ForwardDecodeError(f"message exceeds max_message_bytes ({limit}){detail}")


# A PackedForward blob sent as str (out_forward's str32) is fed to the unpacker as bin of
# the same length instead: the unpacker then copies the entries' bytes rather than decoding
# them as UTF-8 (surrogateescape) only for _packed to encode them back, which cost a sixth
# of the decode. The bytes that come out are the same either way.
_STR_AS_BIN = {0xD9: 0xC4, 0xDA: 0xC5, 0xDB: 0xC6}
_SHORT_TAG = range(0xA0, 0xC0)  # fixstr
_SCAN_BYTES = 1 << 20  # the longest message in progress the scanner keeps a copy of
# An older build of the extension may not have it: the Python framer then runs alone.
NATIVE_FRAMES = getattr(NATIVE, "forward_frames", None)


def _blob_header_at(data: Any, index: int) -> int | None:
    """Where the str header of a PackedForward blob is, for a message starting at ``index``.

    Only ``[tag, str blob, options?]`` with a fixstr, str8 or bin8 tag, and only when the
    header is inside ``data``; None otherwise (the message is then fed as it came).
    """
    end = len(data)
    if index + 1 >= end or data[index] not in (0x92, 0x93):
        return None
    at = index + 1
    kind = data[at]
    if kind in _SHORT_TAG:
        at += 1 + (kind & 0x1F)
    elif kind == 0xD9 or kind == 0xC4:  # str8, bin8
        if at + 1 >= end:
            return None
        at += 2 + data[at + 1]
    else:
        return None
    return at if at < end and data[at] in _STR_AS_BIN else None


def _options(data: Any) -> Any:
    # Scalars under str keys (forward_frames checked): unpackb cannot fail on them, and
    # builds what the unpacker would.
    if data[0] == 0xC0:
        return None
    return msgpack.unpackb(data, raw=False, unicode_errors="surrogateescape", strict_map_key=False)


class MsgpackFramer:
    """Splits a msgpack byte stream into top-level objects, each at most ``limit`` bytes."""

    def __init__(self, limit: int, native_frames: Callable[..., Any] | None = NATIVE_FRAMES) -> None:
        self._limit = limit
        self._native_frames = native_frames
        # Native framing: the bytes of the message in progress, the length they must
        # reach before it can be framed, and the stream offset of their first byte.
        self._held = bytearray()
        self._need = 0
        self._stream = 0
        self._python = False  # whether the Python framer holds the stream
        if native_frames is None:
            self._start_python(0)

    def _start_python(self, at: int) -> None:
        """The Python framer takes the stream from offset ``at``, where a message starts."""
        limit = self._limit
        self._python = True
        self._unpacker = new_unpacker(limit)
        self._tell_base = at  # the stream offset of the unpacker's first byte
        self._fed = at  # stream offset of the end of everything fed so far
        self._message_start = at  # stream offset where the current message began
        # Runs ahead over the same bytes without building anything (skip), to find where
        # messages start before they are fed; None once it met input it cannot skip (the
        # unpacker then reports the fault).
        # It holds a copy of a message in progress, so it stands down for a message longer
        # than _SCAN_BYTES (restarted after it: _rescan), and memory stays about one copy.
        self._scanner: msgpack.Unpacker | None = msgpack.Unpacker(max_buffer_size=limit)
        self._scan_base = at  # stream offset of the scanner's first byte
        self._next_start = at  # stream offset where the first message not yet skipped starts
        self._rescan = False

    @property
    def pending_bytes(self) -> int:
        return self._fed - self._message_start if self._python else len(self._held)

    def frames(self, data: bytes) -> Iterator[tuple[Any, int]]:
        """Yield ``(object, wire_size)`` for each message completed by ``data``."""
        if not self._python:
            rest = yield from self._native(data)
            if rest is None:
                return
            data = rest
        yield from self._python_frames(data)
        if self._native_frames is not None and self._fed == self._message_start:
            # Between messages: native framing takes the stream back.
            self._python = False
            self._stream = self._fed
            self._need = 0
            self._unpacker = self._scanner = None  # type: ignore[assignment]

    def _native(self, data: bytes) -> Generator[tuple[Any, int], None, Any]:
        """Frame what native framing takes; the bytes the Python framer takes, or None."""
        held = self._held
        if held:
            held += data
            if len(held) < self._need:
                return None
            buf: Any = held
        else:
            buf = data
        assert self._native_frames is not None
        found, used, need = self._native_frames(buf, self._limit)
        messages = []
        if found:
            with memoryview(buf) as view:
                for start, end, tag_start, tag_end, blob_start, blob_end, options in found:
                    tag = str(view[tag_start:tag_end], "utf-8", "surrogateescape")
                    message = [tag, bytes(view[blob_start:blob_end])]
                    if options is not None:
                        message.append(_options(view[options[0] : options[1]]))
                    messages.append((message, end - start))
        rest = None
        if need < 0:
            rest = bytes(memoryview(buf)[used:]) if buf is held else memoryview(buf)[used:]
            self._held = bytearray()
            self._start_python(self._stream + used)
        else:
            if buf is held:
                if used == len(held):
                    self._held = bytearray()  # an idle connection keeps no big buffer
                else:
                    del held[:used]
            else:
                held += memoryview(buf)[used:]
            self._stream += used
            self._need = need - used
        yield from messages
        return rest

    def _python_frames(self, data: Any) -> Iterator[tuple[Any, int]]:
        unpacker = self._unpacker
        while data:
            # Never hand the unpacker more than the rest of the current message's
            # allowance: it then never sees a byte past the limit, so a message is refused
            # as oversize at its (limit+1)th byte however the stream was split, never for
            # what a later byte would have shown; and its buffer (max_buffer_size) never
            # fills. Messages completed by a piece advance the start, so the next piece
            # gets a fresh allowance.
            room = self._limit - (self._fed - self._message_start)
            if room <= 0:
                raise _oversize(self._limit)
            if len(data) <= room:
                piece, data = data, b""
            else:
                view = memoryview(data)
                piece, data = view[:room], view[room:]
            if self._scanner is not None:
                piece = self._blobs_as_bin(piece)
            unpacker.feed(piece)
            self._fed += len(piece)
            yield from self._drain(piece)

    def _blobs_as_bin(self, piece: Any) -> Any:
        """``piece``, with the str header of each PackedForward blob starting in it made bin."""
        scanner = self._scanner
        assert scanner is not None
        start = self._fed
        end = start + len(piece)
        headers = []
        try:
            scanner.feed(piece)
            while True:
                if start <= self._next_start < end:
                    header = _blob_header_at(piece, self._next_start - start)
                    if header is not None:
                        headers.append(header)
                scanner.skip()
                self._next_start = self._scan_base + scanner.tell()
        except msgpack.OutOfData:
            if end - self._next_start > _SCAN_BYTES:
                self._scanner = None  # a long message: the unpacker's copy is enough
                self._rescan = True
        except Exception:  # noqa: BLE001 - garbage, too deep, ...: the unpacker says what
            self._scanner = None
        if not headers:
            return piece
        changed = bytearray(piece)
        for header in headers:
            changed[header] = _STR_AS_BIN[changed[header]]
        return changed

    def _restart_scanner(self, piece: Any, end: int) -> None:
        """A new scanner from ``end`` (where the long message ended, inside ``piece``): the
        rest of ``piece`` was fed as it came; the messages after it are scanned again."""
        self._rescan = False
        scanner = self._scanner = msgpack.Unpacker(max_buffer_size=self._limit)
        self._scan_base = self._next_start = end
        try:
            scanner.feed(piece[end - (self._fed - len(piece)) :])
            while True:
                scanner.skip()
                self._next_start = end + scanner.tell()
        except msgpack.OutOfData:
            pass
        except Exception:  # noqa: BLE001 - the unpacker reports it
            self._scanner = None

    def _drain(self, piece: Any) -> Iterator[tuple[Any, int]]:
        unpacker = self._unpacker
        while True:
            try:
                obj = unpacker.unpack()
            except msgpack.OutOfData:
                # Big messages are parsed incrementally, so the buffer limit alone would
                # never stop a huge array of small items: count the message's bytes.
                if self._fed - self._message_start > self._limit:
                    raise _oversize(self._limit) from None
                return
            except MSGPACK_ERRORS as exc:
                # A declared str/bin/array length over the unpacker's limits (which follow
                # max_buffer_size) is an over-size message, reported as such.
                if "exceeds max_" in str(exc):
                    raise _oversize(self._limit, f": {exc}") from exc
                # The parser stops at a bad byte as soon as it arrives, so it is in this piece.
                byte_at = byte_in(piece, self._fed - len(piece))
                problem = msgpack_problem(exc, self._tell_base + unpacker.tell(), byte_at)
                raise ForwardDecodeError(f"invalid msgpack: {problem}") from exc
            end = self._tell_base + unpacker.tell()
            size = end - self._message_start
            self._message_start = end
            if self._rescan:
                self._restart_scanner(piece, end)
            if size > self._limit:
                raise _oversize(self._limit)
            yield obj, size


_JSON_WHITESPACE = re.compile(r"[ \t\r\n]*")
_JSON_BRACKET_OR_QUOTE = re.compile(r'[\[\]{}"]')
_JSON_QUOTE_OR_BACKSLASH = re.compile(r'["\\]')


class JsonFramer:
    """Splits a stream of JSON arrays/objects into the text of each value (in_forward's JSON mode).

    json.JSONDecoder cannot tell a truncated value from a broken one, so a small scanner
    finds where each top-level value ends (bracket depth outside strings) and only whole
    values are parsed (by ``parse_json``): a parse error is then always garbage. Limits
    count characters.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._text = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self._pieces: list[str] = []  # text received so far of the value in progress
        self._pending_chars = 0
        self._in_value = False
        self._depth = 0
        self._in_string = False
        self._skip_next_char = False  # the previous piece ended in a backslash in a string

    @property
    def pending_bytes(self) -> int:
        # characters of the value so far, plus the bytes of a character cut in two
        return self._pending_chars + len(self._text.getstate()[0])

    def frames(self, data: bytes) -> Iterator[tuple[Any, int]]:
        text = self._text.decode(data)
        pos = 0
        while pos < len(text):
            if not self._in_value:
                pos = _JSON_WHITESPACE.match(text, pos).end()
                if pos == len(text):
                    return
                if text[pos] not in "[{":
                    found = text[pos]
                    raise ForwardDecodeError(f"invalid JSON stream: expected an array, found {found!r}")
                self._in_value = True
            end = self._value_end(text, pos)
            self._keep(text[pos:end])
            if end == len(text) and self._in_value:
                return
            value_text = "".join(self._pieces)
            self._pieces.clear()
            self._pending_chars = 0
            yield value_text, len(value_text)
            pos = end

    def _keep(self, piece: str) -> None:
        self._pieces.append(piece)
        self._pending_chars += len(piece)
        if self._pending_chars > self._limit:
            raise _oversize(self._limit)

    def _value_end(self, text: str, pos: int) -> int:
        """Index just past the current value's closing bracket, or len(text) if it goes on."""
        depth, in_string = self._depth, self._in_string
        if self._skip_next_char:
            pos += 1
            self._skip_next_char = False
        while True:
            if in_string:
                match = _JSON_QUOTE_OR_BACKSLASH.search(text, pos)
                if match is None:
                    break
                if match.group() == "\\":
                    pos = match.end() + 1  # skip the escaped character
                    if pos > len(text):
                        self._skip_next_char = True
                        break
                    continue
                in_string = False
                pos = match.end()
            else:
                match = _JSON_BRACKET_OR_QUOTE.search(text, pos)
                if match is None:
                    break
                char = match.group()
                pos = match.end()
                if char == '"':
                    in_string = True
                elif char in "[{":
                    depth += 1
                else:
                    depth -= 1
                    if depth == 0:
                        self._depth, self._in_string, self._in_value = 0, False, False
                        return pos
        self._depth, self._in_string = depth, in_string
        return len(text)



_INT64_MIN = -(1 << 63)
_UINT64_MAX = (1 << 64) - 1


def _json_int(text: str) -> int | str:
    # The spool stores records as msgpack, which holds int64..uint64 only; a longer
    # integer is kept as its digits rather than failing the whole batch later.
    if len(text) < 19:
        return int(text)
    if len(text) > 21:
        return text  # also spares int() its 4300-digit refusal
    value = int(text)
    return value if _INT64_MIN <= value <= _UINT64_MAX else text


_JSON_PARSER = json.JSONDecoder(parse_int=_json_int)
# A \uD800-\uDFFF escape: paired ones make one character, a lone one a lone surrogate.
_JSON_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# Lone surrogates no UTF-8 can hold; U+DC80-U+DCFF are left alone: they are bytes that were
# not UTF-8 (surrogateescape), written back unchanged.
_UNSTORABLE_SURROGATE = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def parse_json(value_text: str) -> Any:
    try:
        value = _JSON_PARSER.decode(value_text)
    except ValueError as exc:  # JSONDecodeError and its kin
        raise ForwardDecodeError(f"invalid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ForwardDecodeError("invalid JSON: nested too deep") from exc
    if _JSON_SURROGATE_ESCAPE.search(value_text):
        value = _replace_lone_surrogates(value)
    return value


def _replace_lone_surrogates(value: Any) -> Any:
    """``value`` with U+FFFD for every lone surrogate a JSON escape made, in strings and keys.

    Such a string cannot be stored (the spool and the lake write UTF-8) or echoed in an
    ack. Only text that holds such an escape comes here. Iterative: the parser allows
    nesting as deep as the recursion limit.
    """

    def fixed(item: Any) -> Any:
        return _UNSTORABLE_SURROGATE.sub("\ufffd", item) if type(item) is str else item

    root = [value]
    stack: list[Any] = [root]
    while stack:
        container = stack.pop()
        if type(container) is list:
            for index, item in enumerate(container):
                if type(item) in (list, dict):
                    stack.append(item)
                else:
                    container[index] = fixed(item)
        else:
            items = list(container.items())
            container.clear()
            for key, item in items:
                if type(item) in (list, dict):
                    stack.append(item)
                else:
                    item = fixed(item)
                container[fixed(key)] = item
    return root[0]

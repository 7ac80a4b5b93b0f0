"""Pravega segment-store wire protocol codec, pure Python with no Twisted imports.

It owns the bytes of one connection between a Pravega writer and a segment store
(``docs/protocols/pravega.md``; section numbers in comments refer to it):

- ``PravegaServerDecoder``: an incremental decoder for the client->server half. It yields
  ``Hello``, ``KeepAlive``, ``SetupAppend``, ``Append`` (one per ``AppendBlock`` +
  ``AppendBlockEnd`` pair, or per standalone ``AppendBlockEnd`` as the Rust client sends
  them) and ``ConditionalAppend``; ``Padding`` between commands is skipped.
- ``PravegaClientDecoder``: the client side's reader for the server->client half
  (``Hello``, ``KeepAlive``, ``AppendSetup``, ``DataAppended``, ``ConditionalCheckFailed``
  and the error replies), for tests and a future sink.
- Encoders for every one of those commands, both directions, and Java's ``writeUTF`` /
  ``readUTF`` string form (``encode_modified_utf8`` / ``decode_modified_utf8``).

This module is the codec's public face; the code is split by message family:
``pravega_frames`` (framing, type codes, modified UTF-8, ``Hello`` and ``KeepAlive``),
``pravega_appends`` (what a writer sends, and the segment store's decoder of it),
``pravega_replies`` (what a segment store answers, and the writer side's decoder).

Framing: ``int32 type``, ``int32 length``, ``length`` bytes of fields (section 2). What
this codec decides:

- Any problem raises ``DecodeError`` (always fatal: the segment store closes the
  connection on ``InvalidMessageException``). Its ``messages`` hold the commands the same
  ``feed`` call decoded before the bad frame; later calls raise again. The same bytes give
  the same commands and the same error however they are split into reads: header checks
  (negative length, a frame over ``max_frame_bytes``, an unknown type or one this side
  does not take, anything but ``AppendBlockEnd`` after an ``AppendBlock``) are made as soon
  as the 8-byte header is here, before the body is buffered; field checks once the whole
  frame is.
- Append validation follows the Java ``AppendDecoder`` (section 6.5): ``numEvents`` > 0,
  writer ids of the block and its end match, ``sizeOfWholeEvents`` within the block, the
  block's tail after it exactly one ``PartialEvent`` or ``Padding`` frame, no end data
  after ``Padding``. Stricter than Java, because a log router must not drop data silently:
  end data after a block that has no tail is refused (Java ignores it), and the append
  data must parse as whole ``Event`` frames (type 0, each payload at most
  ``max_event_bytes``) whose count equals ``numEvents``. A standalone ``AppendBlockEnd``
  carries its events in its data; its ``sizeOfWholeEvents`` is not checked (Java ignores
  it too; the Rust client sets it to the data length). Event numbers and whether the
  writer did a ``SetupAppend`` are not tracked here: that is connection state, the source's.
- Trailing-field compatibility as the Java ``readFrom`` methods (section 2): fields read
  only "if available" get Java's defaults (-1 or ""), unknown trailing bytes are skipped.
  A ``SetupAppend`` without its delegation token is also accepted (token ""), which Java
  would refuse; older peers never sent one.
- Strings: modified UTF-8 as Java's ``readUTF`` (``C0 80`` and a raw ``00`` for NUL,
  surrogate pairs as two 3-byte forms). Refused: unpaired surrogates (a Python ``str``
  holding one cannot be encoded later) and overlong forms other than ``C0 80``. Standard
  4-byte UTF-8 forms are accepted (Java refuses them; a non-Java peer may send them).
- Decoding costs time linear in the bytes received: bytes wait in one buffer until the
  frame their header announces is complete (its length is known from the header), then
  the frame is parsed once.
"""

from __future__ import annotations

from logrouter.wire.pravega_frames import (
    APPEND_BLOCK,
    APPEND_BLOCK_END,
    APPEND_SETUP,
    AUTH_TOKEN_CHECK_FAILED,
    CONDITIONAL_APPEND,
    CONDITIONAL_CHECK_FAILED,
    DATA_APPENDED,
    EVENT,
    HEADER_BYTES,
    HELLO,
    INVALID_EVENT_NUMBER,
    KEEP_ALIVE,
    MAX_EVENT_BYTES,
    MAX_FRAME_BYTES,
    NO_EVENT_NUMBER,
    NO_SUCH_SEGMENT,
    OLDEST_COMPATIBLE_VERSION,
    OPERATION_UNSUPPORTED,
    PADDING,
    PARTIAL_EVENT,
    SEGMENT_IS_SEALED,
    SETUP_APPEND,
    WIRE_VERSION,
    WRONG_HOST,
    Hello,
    KeepAlive,
    command_name,
    decode_modified_utf8,
    encode_hello,
    encode_keep_alive,
    encode_modified_utf8,
)
from logrouter.wire.pravega_appends import (
    Append,
    ConditionalAppend,
    PravegaServerDecoder,
    ServerCommand,
    SetupAppend,
    encode_append_block,
    encode_append_block_end,
    encode_conditional_append,
    encode_event,
    encode_padding,
    encode_partial_event,
    encode_setup_append,
)
from logrouter.wire.pravega_replies import (
    AppendSetup,
    AuthTokenCheckFailed,
    ClientCommand,
    ConditionalCheckFailed,
    DataAppended,
    InvalidEventNumber,
    NoSuchSegment,
    OperationUnsupported,
    PravegaClientDecoder,
    SegmentIsSealed,
    WrongHost,
    encode_append_setup,
    encode_auth_token_check_failed,
    encode_conditional_check_failed,
    encode_data_appended,
    encode_invalid_event_number,
    encode_no_such_segment,
    encode_operation_unsupported,
    encode_segment_is_sealed,
    encode_wrong_host,
)

__all__ = [
    "APPEND_BLOCK",
    "APPEND_BLOCK_END",
    "APPEND_SETUP",
    "AUTH_TOKEN_CHECK_FAILED",
    "Append",
    "AppendSetup",
    "AuthTokenCheckFailed",
    "CONDITIONAL_APPEND",
    "CONDITIONAL_CHECK_FAILED",
    "ClientCommand",
    "ConditionalAppend",
    "ConditionalCheckFailed",
    "DATA_APPENDED",
    "DataAppended",
    "EVENT",
    "HEADER_BYTES",
    "HELLO",
    "Hello",
    "INVALID_EVENT_NUMBER",
    "InvalidEventNumber",
    "KEEP_ALIVE",
    "KeepAlive",
    "MAX_EVENT_BYTES",
    "MAX_FRAME_BYTES",
    "NO_EVENT_NUMBER",
    "NO_SUCH_SEGMENT",
    "NoSuchSegment",
    "OLDEST_COMPATIBLE_VERSION",
    "OPERATION_UNSUPPORTED",
    "OperationUnsupported",
    "PADDING",
    "PARTIAL_EVENT",
    "PravegaClientDecoder",
    "PravegaServerDecoder",
    "SEGMENT_IS_SEALED",
    "SETUP_APPEND",
    "SegmentIsSealed",
    "ServerCommand",
    "SetupAppend",
    "WIRE_VERSION",
    "WRONG_HOST",
    "WrongHost",
    "command_name",
    "decode_modified_utf8",
    "encode_append_block",
    "encode_append_block_end",
    "encode_append_setup",
    "encode_auth_token_check_failed",
    "encode_conditional_append",
    "encode_conditional_check_failed",
    "encode_data_appended",
    "encode_event",
    "encode_hello",
    "encode_invalid_event_number",
    "encode_keep_alive",
    "encode_modified_utf8",
    "encode_no_such_segment",
    "encode_operation_unsupported",
    "encode_padding",
    "encode_partial_event",
    "encode_segment_is_sealed",
    "encode_setup_append",
    "encode_wrong_host",
]

"""Pravega replies, what a segment store answers a writer (``pravega`` has the overview):
``AppendSetup``, ``DataAppended``, ``ConditionalCheckFailed`` and the error replies
(``WrongHost``, ``NoSuchSegment``, ``SegmentIsSealed``, ``InvalidEventNumber``,
``AuthTokenCheckFailed``, ``OperationUnsupported``); their encoders (the ``pravega``
source answers with them) and the writer side's decoder (``PravegaClientDecoder``, for
tests and a future sink). Pure, no Twisted.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from logrouter.wire.pravega_frames import (
    APPEND_SETUP,
    AUTH_TOKEN_CHECK_FAILED,
    CONDITIONAL_CHECK_FAILED,
    DATA_APPENDED,
    HELLO,
    INT,
    INVALID_EVENT_NUMBER,
    KEEP_ALIVE,
    LONG,
    MAX_FRAME_BYTES,
    NAMES,
    NO_SUCH_SEGMENT,
    OPERATION_UNSUPPORTED,
    SEGMENT_IS_SEALED,
    WRONG_HOST,
    Fields,
    FrameDecoder,
    Hello,
    KeepAlive,
    encode_modified_utf8,
    frame,
)


@dataclass(frozen=True, slots=True)
class AppendSetup:
    request_id: int
    segment: str
    writer_id: uuid.UUID
    last_event_number: int


@dataclass(frozen=True, slots=True)
class DataAppended:
    writer_id: uuid.UUID
    event_number: int
    previous_event_number: int
    request_id: int
    current_segment_write_offset: int


@dataclass(frozen=True, slots=True)
class ConditionalCheckFailed:
    writer_id: uuid.UUID
    event_number: int
    request_id: int


@dataclass(frozen=True, slots=True)
class WrongHost:
    request_id: int
    segment: str
    correct_host: str
    server_stack_trace: str


@dataclass(frozen=True, slots=True)
class NoSuchSegment:
    request_id: int
    segment: str
    server_stack_trace: str
    offset: int


@dataclass(frozen=True, slots=True)
class SegmentIsSealed:
    request_id: int
    segment: str
    server_stack_trace: str
    offset: int


@dataclass(frozen=True, slots=True)
class InvalidEventNumber:
    writer_id: uuid.UUID
    request_id: int
    server_stack_trace: str
    event_number: int


@dataclass(frozen=True, slots=True)
class AuthTokenCheckFailed:
    """``error_code``: -1 unspecified, 0 token check failed, 1 token expired."""

    request_id: int
    server_stack_trace: str
    error_code: int


@dataclass(frozen=True, slots=True)
class OperationUnsupported:
    request_id: int
    operation_name: str
    server_stack_trace: str


ClientCommand = (
    Hello
    | KeepAlive
    | AppendSetup
    | DataAppended
    | ConditionalCheckFailed
    | WrongHost
    | NoSuchSegment
    | SegmentIsSealed
    | InvalidEventNumber
    | AuthTokenCheckFailed
    | OperationUnsupported
)


# -- the writer-side decoder -----------------------------------------------------------------


def _hello(f: Fields) -> Hello:
    return Hello(f.int(), f.int())


def _append_setup(f: Fields) -> AppendSetup:
    return AppendSetup(f.long(), f.utf(), f.uuid(), f.long())


def _data_appended(f: Fields) -> DataAppended:
    return DataAppended(f.uuid(), f.long(), f.long_or(-1), f.long_or(-1), f.long_or(-1))


def _conditional_check_failed(f: Fields) -> ConditionalCheckFailed:
    return ConditionalCheckFailed(f.uuid(), f.long(), f.long_or(-1))


def _wrong_host(f: Fields) -> WrongHost:
    return WrongHost(f.long(), f.utf(), f.utf(), f.utf_or(""))


def _no_such_segment(f: Fields) -> NoSuchSegment:
    return NoSuchSegment(f.long(), f.utf(), f.utf_or(""), f.long_or(-1))


def _segment_is_sealed(f: Fields) -> SegmentIsSealed:
    return SegmentIsSealed(f.long(), f.utf(), f.utf_or(""), f.long_or(-1))


def _invalid_event_number(f: Fields) -> InvalidEventNumber:
    return InvalidEventNumber(f.uuid(), f.long(), f.utf_or(""), f.long_or(-1))


def _auth_token_check_failed(f: Fields) -> AuthTokenCheckFailed:
    return AuthTokenCheckFailed(f.long(), f.utf_or(""), f.int_or(-1))


def _operation_unsupported(f: Fields) -> OperationUnsupported:
    return OperationUnsupported(f.long(), f.utf(), f.utf_or(""))


_REPLY_READERS = {
    HELLO: _hello,
    APPEND_SETUP: _append_setup,
    DATA_APPENDED: _data_appended,
    CONDITIONAL_CHECK_FAILED: _conditional_check_failed,
    WRONG_HOST: _wrong_host,
    NO_SUCH_SEGMENT: _no_such_segment,
    SEGMENT_IS_SEALED: _segment_is_sealed,
    INVALID_EVENT_NUMBER: _invalid_event_number,
    AUTH_TOKEN_CHECK_FAILED: _auth_token_check_failed,
    OPERATION_UNSUPPORTED: _operation_unsupported,
}


class PravegaClientDecoder(FrameDecoder):
    """Incremental decoder for what a writer reads from a segment store: ``Hello``,
    ``KeepAlive``, ``AppendSetup``, ``DataAppended``, ``ConditionalCheckFailed``,
    ``WrongHost``, ``NoSuchSegment``, ``SegmentIsSealed``, ``InvalidEventNumber``,
    ``AuthTokenCheckFailed`` and ``OperationUnsupported``."""

    _accepts = frozenset((KEEP_ALIVE, *_REPLY_READERS))
    _side = "this writer-side decoder takes"

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        super().__init__(max_frame_bytes)

    def _command(self, kind: int, body: bytes, out: list[Any]) -> None:
        if kind == KEEP_ALIVE:
            out.append(KeepAlive())
        else:
            out.append(_REPLY_READERS[kind](Fields(body, NAMES[kind])))


# -- encoders --------------------------------------------------------------------------------


def encode_append_setup(request_id: int, segment: str, writer_id: uuid.UUID, last_event_number: int) -> bytes:
    body = LONG.pack(request_id) + encode_modified_utf8(segment) + writer_id.bytes + LONG.pack(last_event_number)
    return frame(APPEND_SETUP, body)


def encode_data_appended(
    writer_id: uuid.UUID,
    event_number: int,
    previous_event_number: int,
    request_id: int,
    current_segment_write_offset: int,
) -> bytes:
    body = (
        writer_id.bytes
        + LONG.pack(event_number)
        + LONG.pack(previous_event_number)
        + LONG.pack(request_id)
        + LONG.pack(current_segment_write_offset)
    )
    return frame(DATA_APPENDED, body)


def encode_conditional_check_failed(writer_id: uuid.UUID, event_number: int, request_id: int) -> bytes:
    return frame(CONDITIONAL_CHECK_FAILED, writer_id.bytes + LONG.pack(event_number) + LONG.pack(request_id))


def encode_wrong_host(request_id: int, segment: str, correct_host: str = "", server_stack_trace: str = "") -> bytes:
    body = (
        LONG.pack(request_id)
        + encode_modified_utf8(segment)
        + encode_modified_utf8(correct_host)
        + encode_modified_utf8(server_stack_trace)
    )
    return frame(WRONG_HOST, body)


def encode_no_such_segment(request_id: int, segment: str, server_stack_trace: str = "", offset: int = -1) -> bytes:
    body = LONG.pack(request_id) + encode_modified_utf8(segment) + encode_modified_utf8(server_stack_trace) + LONG.pack(offset)
    return frame(NO_SUCH_SEGMENT, body)


def encode_segment_is_sealed(request_id: int, segment: str, server_stack_trace: str = "", offset: int = -1) -> bytes:
    body = LONG.pack(request_id) + encode_modified_utf8(segment) + encode_modified_utf8(server_stack_trace) + LONG.pack(offset)
    return frame(SEGMENT_IS_SEALED, body)


def encode_invalid_event_number(
    writer_id: uuid.UUID, request_id: int, server_stack_trace: str = "", event_number: int = -1
) -> bytes:
    body = writer_id.bytes + LONG.pack(request_id) + encode_modified_utf8(server_stack_trace) + LONG.pack(event_number)
    return frame(INVALID_EVENT_NUMBER, body)


def encode_auth_token_check_failed(request_id: int, server_stack_trace: str = "", error_code: int = -1) -> bytes:
    body = LONG.pack(request_id) + encode_modified_utf8(server_stack_trace) + INT.pack(error_code)
    return frame(AUTH_TOKEN_CHECK_FAILED, body)


def encode_operation_unsupported(request_id: int, operation_name: str, server_stack_trace: str = "") -> bytes:
    body = LONG.pack(request_id) + encode_modified_utf8(operation_name) + encode_modified_utf8(server_stack_trace)
    return frame(OPERATION_UNSUPPORTED, body)

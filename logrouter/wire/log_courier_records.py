"""The records inside a Log Courier payload, pure Python with no Twisted imports.

A ``JDAT`` or ``EVNT`` payload inflates to records back to back, each ``u32 BE length``
followed by one JSON object (``docs/protocols/log_courier.md``, section 5). This module
owns ``Payload`` (one payload's events in order, with the JSON texts the spool stores),
cutting an inflated payload into its records within ``max_event_bytes`` and
``max_payload_events``, the verdict on a record that is not a JSON object (it becomes
``{"message": <its text>}``, counted, in its place, as the Ruby server does), and the
encoder of records. The framing and the zlib streams around a payload are
``logrouter.wire.log_courier``'s.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from logrouter.native import NATIVE
from logrouter.wire import json_text
from logrouter.wire.errors import DecodeError

_U32 = struct.Struct(">I")


@dataclass(slots=True)
class Payload:
    """One ``JDAT`` or ``EVNT`` message with all its events, in order.

    ``events`` has one dict per record; records that were not a JSON object are
    ``{"message": text}`` and counted in ``invalid`` (first reason in ``invalid_reason``).
    ``documents`` are the JSON texts of the valid ones, in order (the spool stores those
    rather than encoding the records again).
    Acknowledge with ``encode_ackn(nonce, n)`` once the first ``n`` events are stored.
    With ``undecoded``, ``events`` are the documents, not yet decoded.
    ``compressed`` is the payload's zlib stream as received and ``inflated_bytes`` what it
    inflated to (the spool may store the stream instead of the documents:
    ``logrouter.sources.compressed_documents``).
    """

    kind: str  # "JDAT" or "EVNT"
    nonce: bytes
    events: list[dict[str, Any]] = field(default_factory=list)
    documents: list[bytes] = field(default_factory=list, compare=False, repr=False)
    invalid: int = 0
    invalid_reason: str | None = None
    #: ``events`` are the documents themselves, undecoded and unchecked (``invalid`` does
    #: not count them yet): read them natively or decode them (``decode_payload``).
    undecoded: bool = False
    compressed: bytes | None = field(default=None, compare=False, repr=False)
    inflated_bytes: int = field(default=0, compare=False, repr=False)


def decode_records(
    content: bytes, kind: str, nonce: bytes, max_event_bytes: int, max_events: int, keep_documents: bool = False
) -> Payload:
    """The records of an inflated payload: ``u32 BE length`` + JSON, back to back.

    The per-event hot path, in two tight passes: the records cut out (one unpack, one
    slice each), then all of them decoded at once (``json_text.objects_or_none``); a
    record that is not an object msgspec reads sends the payload one by one
    (``json_text.objects_or_reasons``). With ``keep_documents`` (and the native
    extension installed) the records are not decoded at all (``Payload.undecoded``): the
    source reads them natively, or decodes them (``decode_payload``).
    """
    payload = Payload(kind, nonce)
    raws: list[bytes] = []
    keep = raws.append
    unpack = _U32.unpack_from
    end = len(content)
    pos = 0
    while pos < end:
        if end - pos < 4:
            raise DecodeError(f"{kind} payload ends inside a record length ({end - pos} bytes left over)")
        size = unpack(content, pos)[0]
        if size > max_event_bytes:
            raise DecodeError(f"{kind} event {len(raws) + 1} of {size} bytes exceeds max_event_bytes {max_event_bytes}")
        start = pos + 4
        pos = start + size
        if pos > end:
            raise DecodeError(f"{kind} payload ends inside event {len(raws) + 1} ({end - start} of {size} bytes)")
        if len(raws) >= max_events:
            raise DecodeError(f"{kind} payload holds more than max_payload_events {max_events} events")
        keep(content[start:pos])
    if keep_documents and raws and NATIVE is not None:
        payload.events = raws  # type: ignore[assignment]
        payload.documents = raws
        payload.undecoded = True
        return payload
    add_records(payload, raws)
    return payload


def record_documents(content: bytes) -> list[bytes]:
    """The records of an inflated payload as they are (``u32 BE length`` + JSON, back to
    back), not decoded; ``ValueError`` where the content does not cut into whole records."""
    documents: list[bytes] = []
    keep = documents.append
    unpack = _U32.unpack_from
    end = len(content)
    pos = 0
    while pos < end:
        if end - pos < 4:
            raise ValueError(f"a payload ends inside a record length ({end - pos} bytes left over)")
        start = pos + 4
        pos = start + unpack(content, pos)[0]
        if pos > end:
            raise ValueError(f"a payload ends inside record {len(documents) + 1}")
        keep(content[start:pos])
    return documents


def add_records(payload: Payload, raws: list[bytes]) -> None:
    """Decode the records ``raws`` into ``payload``: all at once, or one by one where one
    is not an object msgspec reads (kept as ``{"message": text}`` then, and counted)."""
    records = json_text.objects_or_none(raws)
    if records is not None:
        payload.events = records
        payload.documents = raws
        return
    for raw, verdict in zip(raws, json_text.objects_or_reasons(raws)):
        if verdict.__class__ is dict:
            payload.events.append(verdict)
            payload.documents.append(raw)
        else:
            add_invalid(payload, verdict, raw)


def decode_payload(payload: Payload) -> None:
    """Decode the records of a payload kept ``undecoded``, as ``decode_records`` would have."""
    if payload.undecoded:
        raws = payload.documents
        payload.events, payload.documents, payload.undecoded = [], [], False
        add_records(payload, raws)


def add_invalid(payload: Payload, reason: str, raw: bytes) -> None:
    """Keep a record that is not a JSON object (``reason`` says why) as
    ``{"message": its text}`` and count it."""
    payload.invalid += 1
    if payload.invalid_reason is None:
        payload.invalid_reason = f"event {len(payload.events) + 1}: {reason}"
    payload.events.append({"message": raw.decode("utf-8", "replace")})


def encode_records(events: Iterable[Mapping[str, Any] | str | bytes]) -> bytes:
    """A payload's inflated content: each event as ``u32 BE length`` + JSON. Mappings are
    serialised compactly (as Go's encoding/json does); str/bytes are sent as they are."""
    parts: list[bytes] = []
    for event in events:
        if isinstance(event, Mapping):
            event = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        if isinstance(event, str):
            event = event.encode()
        parts += (_U32.pack(len(event)), event)
    return b"".join(parts)

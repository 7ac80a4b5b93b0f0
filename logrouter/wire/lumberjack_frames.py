"""The client->server frames of the Lumberjack (Beats) protocol, v1 and v2, pure Python
with no Twisted imports.

It owns what a client sends (``docs/protocols/lumberjack.md``, sections 2-6): the
version bytes (``'1'``, ``'2'``) and frame types (``W`` window, ``J`` JSON data, ``D``
key/value data, ``C`` compressed; ``A`` is the server's), what the server's decoder
returns (``Window``, ``Events``), and the encoders of the client's frames, including a
whole window as Beats sends it. Decoding them is ``logrouter.wire.lumberjack``'s; the
``A`` frames are ``logrouter.wire.lumberjack_acks``'.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ACK",
    "CLIENT_FRAMES",
    "COMPRESSED",
    "DATA",
    "Events",
    "JSON",
    "VERSIONS",
    "VERSION_BYTES",
    "WINDOW",
    "Window",
    "encode_compressed",
    "encode_data",
    "encode_json",
    "encode_window",
    "encode_window_frames",
    "json_frame_documents",
    "version_byte",
]

VERSION_BYTES = {1: 0x31, 2: 0x32}
VERSIONS = {0x31: 1, 0x32: 2}  # the version a frame's first byte names

WINDOW = 0x57  # 'W'
DATA = 0x44  # 'D'
JSON = 0x4A  # 'J'
COMPRESSED = 0x43  # 'C'
ACK = 0x41  # 'A'
CLIENT_FRAMES = frozenset((WINDOW, DATA, JSON, COMPRESSED))

_U32 = struct.Struct(">I")
_HEADER_U32 = struct.Struct(">BBI")
_HEADER_U32X2 = struct.Struct(">BBII")
_TAG_U32X2 = struct.Struct(">HII")  # version and frame type as one number, seq, length


# -- what the server's decoder returns -----------------------------------------------------


@dataclass(slots=True)
class Window:
    """A ``W`` frame: the client announces ``size`` events.

    ``window`` is this window's serial number on the connection (1 for the first ``W``).
    ``missing`` is how many announced events the previous window still lacked when this
    one started (0 normally; Logstash logs a warning and treats the partial window as
    complete, section 3).
    """

    version: int
    size: int
    window: int
    missing: int = 0


@dataclass(slots=True)
class Events:
    """Consecutive data frames of one window, decoded by one ``feed`` call.

    ``records`` are the valid events in order (v2: the JSON objects; v1: dicts of str);
    ``documents`` the JSON texts of the ``J`` ones, in the same order (the spool stores
    those rather than encoding the records again), and ``documents_match`` says whether
    they are every record's (no ``D`` frame's record among them).
    ``ack_seq`` is the highest ``seq`` seen in this window up to and including these
    frames: acknowledge with it once these and all earlier events are stored. ``frames``
    counts the data frames (valid and invalid); ``invalid`` those whose payload was not a
    JSON object, with the first reason in ``invalid_reason``. ``complete`` says whether
    the window has now received at least its announced count. ``window`` is 0 for data
    frames that arrived before any ``W``. ``undecoded``: the decoder was asked to keep
    the ``J`` documents undecoded (the native extension is installed), and did: they
    are then in ``runs`` (``records`` and ``documents`` empty), each ``(buffer,
    spans)``, the inflated payload (or a copy of the plain frames) and where its
    documents lie (``logrouter_native.json_frames``), not yet checked (``invalid`` does
    not count them yet), for the caller to read natively (``logrouter.wire.json_lazy``)
    or decode (``lumberjack.decode_group``, which counts the invalid ones).

    ``payloads`` are the payloads of the top-level ``C`` frames (their zlib streams, as
    received) that held nothing but ``J`` frames of this group, ``payload_frames`` those
    frames and ``inflated_bytes`` what the payloads inflated to: when ``payload_frames``
    is ``frames``, the payloads are all of the group as it arrived (the spool may store
    them instead of the documents: ``logrouter.sources.compressed_documents``).
    """

    version: int
    window: int
    records: list[dict[str, Any]] = field(default_factory=list)
    documents: list[bytes] = field(default_factory=list, compare=False, repr=False)
    documents_match: bool = field(default=True, compare=False, repr=False)
    ack_seq: int = 0
    frames: int = 0
    invalid: int = 0
    invalid_reason: str | None = None
    complete: bool = False
    undecoded: bool = field(default=False, compare=False, repr=False)
    runs: list[tuple[bytes, bytes]] = field(default_factory=list, compare=False, repr=False)
    payloads: list[bytes] = field(default_factory=list, compare=False, repr=False)
    payload_frames: int = field(default=0, compare=False, repr=False)
    inflated_bytes: int = field(default=0, compare=False, repr=False)


def json_frame_documents(frames: bytes) -> list[bytes]:
    """The documents of ``frames``, ``J`` frames back to back, all of one version (what a
    ``C`` frame of Beats' inflates to); ``ValueError`` for anything else."""
    documents: list[bytes] = []
    keep = documents.append
    end = len(frames)
    if not end:
        return documents
    first = frames[0]
    if first not in VERSIONS:
        raise ValueError(f"no J frame: version byte 0x{first:02x}")
    tag = first << 8 | JSON
    unpack = _TAG_U32X2.unpack_from
    pos = 0
    while pos < end:
        if end - pos < 10:
            raise ValueError(f"a J frame cut short ({end - pos} bytes left over)")
        got, _, size = unpack(frames, pos)
        if got != tag:
            raise ValueError(f"not a J frame of version {VERSIONS[first]} at offset {pos}")
        start = pos + 10
        pos = start + size
        if pos > end:
            raise ValueError(f"a J frame of {size} bytes cut short at {end - start}")
        keep(frames[start:pos])
    return documents


# -- encoders ------------------------------------------------------------------------------


def version_byte(version: int) -> int:
    """The first byte of every frame of ``version`` (1 or 2)."""
    try:
        return VERSION_BYTES[version]
    except KeyError:
        raise ValueError(f"version must be 1 or 2, got {version!r}") from None


def encode_window(size: int, version: int = 2) -> bytes:
    return _HEADER_U32.pack(version_byte(version), WINDOW, size)


def encode_json(seq: int, document: Mapping[str, Any] | str | bytes, version: int = 2) -> bytes:
    """A ``J`` frame; a mapping is serialised compactly, str/bytes are sent as they are."""
    if isinstance(document, Mapping):
        document = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    if isinstance(document, str):
        document = document.encode()
    return _HEADER_U32X2.pack(version_byte(version), JSON, seq, len(document)) + document


def encode_data(seq: int, fields: Mapping[str, str], version: int = 1) -> bytes:
    """A v1 ``D`` frame of key/value pairs (values are sent as their ``str``)."""
    parts = [_HEADER_U32X2.pack(version_byte(version), DATA, seq, len(fields))]
    for key, value in fields.items():
        k, v = str(key).encode(), str(value).encode()
        parts += (_U32.pack(len(k)), k, _U32.pack(len(v)), v)
    return b"".join(parts)


def encode_compressed(frames: bytes, level: int = 3, version: int = 2) -> bytes:
    """A ``C`` frame wrapping already encoded ``frames`` (Beats' default level is 3)."""
    blob = zlib.compress(frames, level)
    return _HEADER_U32.pack(version_byte(version), COMPRESSED, len(blob)) + blob


def encode_window_frames(
    records: Iterable[Mapping[str, Any]],
    version: int = 2,
    compress_level: int | None = 3,
    first_seq: int = 1,
) -> bytes:
    """One whole window as Beats sends it: ``W`` N, then N data frames numbered from
    ``first_seq``, inside one ``C`` frame unless ``compress_level`` is None (or 0, which is
    what Beats' ``compression_level: 0`` means)."""
    encode = encode_json if version == 2 else encode_data
    frames = [encode(first_seq + i, record, version) for i, record in enumerate(records)]
    body = b"".join(frames)
    if compress_level:
        body = encode_compressed(body, compress_level, version)
    return encode_window(len(frames), version) + body

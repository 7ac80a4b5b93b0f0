"""The payload of one spool record: a batch as it came from its source, and its client id.

msgpack, because the events came in as msgpack-shaped values and the C packer is the
cheapest way back to bytes. Strings may carry lone surrogates (invalid UTF-8 received
inside msgpack str); ``surrogateescape`` writes and reads those bytes back unchanged.
The optional id (``[source, chunk]``) is what lets retransmissions be recognised after
a restart (see ``logrouter.dedupe``).
"""

from __future__ import annotations

import msgpack

from logrouter.batch import Batch

VERSION = 1
_PACK = {"use_bin_type": True, "unicode_errors": "surrogateescape"}
_UNPACK = {"raw": False, "unicode_errors": "surrogateescape", "strict_map_key": False, "use_list": True}


def encode_batch(batch: Batch, key: tuple[str, bytes] | None = None) -> bytes:
    return msgpack.packb((VERSION, batch.source, batch.tag, batch.events, key), **_PACK)


def decode_batch(payload: bytes) -> tuple[Batch, tuple[str, bytes] | None]:
    version, source, tag, events, key = msgpack.unpackb(payload, **_UNPACK)
    if version != VERSION:
        raise ValueError(f"unknown spool record version {version}")
    # Events come back as [time_ns, record] lists; they unpack like the tuples sources build.
    return Batch(tag, events, source), (None if key is None else (key[0], key[1]))


def decode_key(payload: bytes) -> tuple[str, bytes] | None:
    """Only the client id of a record, without building its events."""
    unpacker = msgpack.Unpacker(**_UNPACK)
    unpacker.feed(payload)
    unpacker.read_array_header()
    if unpacker.unpack() != VERSION:
        return None
    for _ in range(3):
        unpacker.skip()
    key = unpacker.unpack()
    return None if key is None else (key[0], key[1])

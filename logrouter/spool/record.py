"""The payload of one spool record: a batch as it came from its source.

msgpack, because the events came in as msgpack-shaped values and the C packer is the
cheapest way back to bytes. Strings may carry lone surrogates (invalid UTF-8 received
inside msgpack str); ``surrogateescape`` writes and reads those bytes back unchanged.
"""

from __future__ import annotations

import msgpack

from logrouter.batch import Batch

_packer_options = {"use_bin_type": True, "unicode_errors": "surrogateescape"}


def encode_batch(batch: Batch) -> bytes:
    return msgpack.packb((1, batch.source, batch.tag, batch.events), **_packer_options)


def decode_batch(payload: bytes) -> Batch:
    version, source, tag, events = msgpack.unpackb(
        payload, raw=False, unicode_errors="surrogateescape", strict_map_key=False, use_list=True
    )
    if version != 1:
        raise ValueError(f"unknown spool record version {version}")
    # Events come back as [time_ns, record] lists; they unpack like the tuples sources build.
    return Batch(tag, events, source)

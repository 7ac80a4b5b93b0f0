"""Decoding one JSON document per event, fast, with the standard library's verdict.

Beats, Log Courier, logjam and Pravega JSON payloads are decoded once per event, which
makes this the per-event cost of those paths. ``orjson`` parses a typical event two to
three times faster than ``json``; but the two differ at the edges, and the standard
library's answers are the ones logrouter documents and tests: ``NaN``/``Infinity``
literals are accepted, a ``\\ud800`` escape gives a lone surrogate (``orjson`` refuses
both), and an integer beyond 64 bits stays an exact int (``orjson`` turns it into a float
without a word). So ``loads`` asks ``json`` whenever the document holds a run of 19
digits or more (where a long integer could be; digits in strings only cost the slower
path) and whenever ``orjson`` refuses it, for the exact result or error. Otherwise both
read whitespace, floats, strings and duplicate keys (the last one wins) alike.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_orjson_loads = orjson.loads
_ORJSON_ERROR = orjson.JSONDecodeError
# Every digit becomes "0", every other byte a space: a long digit run is then one
# substring search (a regex over the document costs several times orjson's parse).
_DIGITS_ONLY = bytes(0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))
_LONG_RUN = b"0" * 19


def _long_number(data: Any) -> bool:
    return _LONG_RUN in data.translate(_DIGITS_ONLY)


def loads(data: bytes | bytearray | memoryview) -> Any:
    """The value of the UTF-8 JSON document ``data``; raises ``ValueError`` (including
    ``UnicodeDecodeError``) or ``RecursionError`` as ``json.loads(data.decode())`` does."""
    if data.__class__ is memoryview:
        data = bytes(data)
    if not _long_number(data):
        try:
            return _orjson_loads(data)
        except _ORJSON_ERROR:
            pass
    return json.loads(bytes(data).decode("utf-8"))

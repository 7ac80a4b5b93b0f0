"""The catch-all column's encoding: record fields that have no typed column, as JSON.

Owns how any value a record can hold becomes valid UTF-8 JSON text:

* bytes (msgpack ``bin``) become standard base64 strings;
* strings with lone surrogates (invalid UTF-8 decoded with ``surrogateescape``) are
  made valid with ``fix_text``: the original bytes come back and each invalid byte is
  spelled ``\\xNN`` (backslashreplace);
* NaN and ±infinity, which JSON has no numbers for, become the strings ``"NaN"``,
  ``"Infinity"`` and ``"-Infinity"``;
* integers of any size stay exact JSON numbers;
* map keys that are not strings become strings (bytes keys decoded as UTF-8);
* anything else a filter may have put into a record becomes ``str(value)``.

No pyarrow here; convert.py decides which fields land in the catch-all column.
"""

from __future__ import annotations

import base64
import json
import math
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, Callable

import orjson

#: Nesting deeper than this (the _extra object itself is level 1) is replaced by
#: TOO_DEEP: it protects the worker thread's stack from absurd input.
MAX_DEPTH = 100
TOO_DEEP = "<nested deeper than %d levels>" % MAX_DEPTH



def _refuse(value: Any) -> Any:
    raise TypeError(f"not a JSON type: {type(value).__name__}")


def _compact_dumps() -> Callable[[Any], str]:
    """``json.dumps(ensure_ascii=False, allow_nan=False, separators=(",", ":"))``
    without its per-call setup: ``JSONEncoder.encode`` builds a new C encoder on
    every call, which costs more than encoding a small object. No circular check:
    records come from decoders and cannot be circular (if one were, the C encoder
    raises RecursionError and ``jsonable`` cuts it at MAX_DEPTH)."""
    fallback = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode
    try:
        encoder = c_make_encoder(None, _refuse, encode_basestring, None, ":", ",", False, False, False)
    except TypeError:  # no C accelerator (None), or another Python's signature
        return fallback

    def dumps(value: Any) -> str:
        return "".join(encoder(value, 0))

    return dumps


_dumps = _compact_dumps()


def fix_text(text: str) -> str:
    """``text`` as valid Unicode: lone surrogates become backslash escapes.

    Surrogates U+DC80..U+DCFF are what ``surrogateescape`` made of invalid bytes, so
    turn them back into those bytes and spell each invalid byte ``\\xNN``. Any other
    lone surrogate (e.g. from a JSON ``\\ud800`` escape) is spelled ``\\ud800``.
    """
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def valid_text(value: str) -> str:
    """``value``, or ``fix_text(value)`` if it is not valid Unicode (the cheap check first)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return fix_text(value)
    return value


def _key(key: Any) -> str:
    if type(key) is str:
        return valid_text(key)
    if isinstance(key, (bytes, bytearray)):
        return fix_text(bytes(key).decode("utf-8", "surrogateescape"))
    return valid_text(str(key))


def jsonable(value: Any, depth: int = 0) -> Any:
    """``value`` rebuilt from types that ``json`` encodes to valid UTF-8 JSON."""
    kind = type(value)
    if kind is str:
        return valid_text(value)
    if value is None or kind is bool or kind is int:
        return value
    if kind is float:
        if math.isfinite(value):
            return value
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(value).decode("ascii")
    if depth >= MAX_DEPTH:
        return TOO_DEEP
    if isinstance(value, dict):
        return {_key(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, int):  # bool/int subclasses such as IntEnum
        return int(value)
    if isinstance(value, float):
        return jsonable(float(value), depth)
    return valid_text(str(value))


def _orjson_refuse(value: Any) -> Any:
    raise TypeError  # anything orjson does not encode natively: the exact path decides


# Datetimes, dataclasses and subclasses go to ``default`` (and so to the exact path):
# orjson would spell them its own way, where the rules above say str(value).
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def encode_extra(fields: dict[str, Any]) -> str:
    """The JSON object text of ``fields`` (valid UTF-8, compact, key order kept).

    ``orjson`` encodes the common case many times faster than ``json``. It refuses
    bytes, lone surrogates, integers beyond 64 bits, non-string keys and deep nesting,
    and it writes NaN and infinities as ``null``: so its output is taken only when it
    succeeded and holds no ``null`` at all; everything else goes through the standard
    library's C encoder, and what that refuses through the rebuilding path. (Floats
    may be spelled differently, ``1e-07`` or ``1e-7``: the same number.)
    """
    try:
        data = orjson.dumps(fields, default=_orjson_refuse, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        pass
    else:
        if b"null" not in data:
            return data.decode("utf-8")
    try:
        text = _dumps(fields)
        text.encode("utf-8")
        return text
    except (TypeError, ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        return _dumps(jsonable(fields))

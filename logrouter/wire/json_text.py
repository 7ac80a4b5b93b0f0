"""Decoding one JSON document per event, fast, with the standard library's verdict.

Beats, Log Courier, logjam and Pravega JSON payloads are decoded once per event, which
makes this the per-event cost of those paths. ``msgspec`` parses a typical event two to
three times faster than ``json`` (and faster than ``orjson``), keeps integers beyond 64
bits exact as ``json`` does, and, where both succeed, gives the same values (duplicate
keys: the last one wins). Where it refuses a document, ``json`` answers, for the exact
result or error: the standard library's answers are the ones logrouter documents and
tests, and it accepts some documents ``msgspec`` refuses (``NaN``/``Infinity`` literals,
numbers beyond the float range as infinities, a ``\\ud800`` escape as a lone surrogate).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

#: The fast decoder alone, for loops that decode one document per event and cannot spare
#: the call of ``loads``: ``loads(d)`` is ``fast_loads(d)``, or, where that raises one of
#: ``FAST_REFUSED``, ``standard_loads(d)``.
fast_loads = msgspec.json.Decoder().decode
FAST_REFUSED = (msgspec.DecodeError, RecursionError)


#: msgspec's decoder typed ``dict``: for a document ``fast_loads`` decodes to a dict it
#: gives the same dict, and raises one of ``OBJECTS_REFUSED`` for any other document
#: (``ValidationError`` for JSON that is no object).
fast_object_loads = msgspec.json.Decoder(dict).decode
OBJECTS_REFUSED = (msgspec.DecodeError, RecursionError, ValueError)

#: What ``loads`` raises for a document it cannot decode.
JSON_ERRORS = (ValueError, RecursionError)


def objects_or_none(documents: list[bytes]) -> list[dict[str, Any]] | None:
    """The object of every document, in one ``map`` (no call or type check per document
    in Python), when each is a JSON object msgspec reads; else None, and the caller
    takes the documents one by one (``loads``) for each one's own verdict."""
    try:
        return list(map(fast_object_loads, documents))
    except OBJECTS_REFUSED:
        return None


def objects_or_reasons(documents: list[bytes]) -> list[dict[str, Any] | str]:
    """Each document's verdict alone, as ``loads`` gives it: its object, or, for a
    document that is not a JSON object, why (``why_not_an_object``), in order. The slow
    path of a run ``objects_or_none`` refused, for codecs that count such documents.

    JSON decoders count nesting against the recursion limit, so the verdict on a document
    nested within a few levels of it depends on how deep the caller's stack is. No error
    is kept: a kept error's traceback would hold this frame and, through it, the
    documents (a cycle only the collector frees)."""
    verdicts: list[dict[str, Any] | str] = []
    keep = verdicts.append
    fast, fast_refused = fast_loads, FAST_REFUSED
    for document in documents:
        try:
            value = fast(document)
        except fast_refused:
            try:
                value = standard_loads(document)
            except JSON_ERRORS as e:
                keep(why_not_an_object(e))
                continue
        except ValueError as e:  # msgspec's own verdict stands (UnicodeDecodeError), as in loads
            keep(why_not_an_object(e))
            continue
        keep(value if value.__class__ is dict else why_not_an_object(value))
    return verdicts


def why_not_an_object(problem: Any) -> str:
    """Why a document is no event: what ``loads`` raised for it, or the value it gave."""
    if isinstance(problem, UnicodeDecodeError):
        return "not valid UTF-8"
    if isinstance(problem, BaseException):
        return f"not JSON: {problem}"
    return f"a JSON {type(problem).__name__}, not an object"


def standard_loads(data: bytes | bytearray | memoryview) -> Any:
    """The standard library's answer for ``data``: value or error."""
    return json.loads(bytes(data).decode("utf-8"))


def loads(data: bytes | bytearray | memoryview) -> Any:
    """The value of the UTF-8 JSON document ``data``; raises ``ValueError`` (including
    ``UnicodeDecodeError``) or ``RecursionError`` as ``json.loads(data.decode())`` does."""
    try:
        return fast_loads(data)
    except FAST_REFUSED:
        pass
    return standard_loads(data)

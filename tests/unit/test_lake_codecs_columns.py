"""The pyarrow-free config checks of the lake sinks give what pyarrow would.

``lake/codecs.py`` reads the codecs of the pyarrow build from the header it ships, and
``lake/column_names.py`` checks declared columns by name: both must agree with pyarrow
(``Codec.is_available``) and with the writer's own rules (``schema.ColumnTypes``).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from logrouter.lake import codecs
from logrouter.lake.column_names import check_declared, usable
from logrouter.lake.schema import TYPE_NAMES, ColumnTypes


def test_the_build_header_names_the_codecs_pyarrow_has() -> None:
    header = codecs._build_header()
    assert header is not None  # the wheel ships it; else the check asks pyarrow
    from_header = {c for c in codecs.PARQUET_CODECS if c == "none" or codecs.BUILD_DEFINES[c] in codecs.defines_of(header)}
    from_pyarrow = {c for c in codecs.PARQUET_CODECS if c == "none" or pa.Codec.is_available(c)}
    assert from_header == from_pyarrow == set(codecs.available())


def test_defines_of_reads_defines_not_undefs() -> None:
    text = "#define ARROW_WITH_ZSTD\n/* #undef ARROW_WITH_BROTLI */\n  #  define ARROW_WITH_LZ4 1\n"
    assert codecs.defines_of(text) == {"ARROW_WITH_ZSTD", "ARROW_WITH_LZ4"}


def test_a_codec_the_build_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codecs, "available", lambda: frozenset({"none", "zstd"}))
    codecs.check_codec("ZSTD")
    with pytest.raises(ValueError, match="'brotli' is not available in this pyarrow build"):
        codecs.check_codec("brotli")
    with pytest.raises(ValueError, match="unknown Parquet codec 'lzo'"):
        codecs.check_codec("lzo")


@pytest.mark.parametrize("declared", [
    {"status": "int", "latency": "double", "ok": "bool", "raw": "binary", "msg": "string"},
    {"Time": "int"}, {"_EXTRA": "string"}, {"tag": "string"}, {"hour": "int"}, {"": "int"},
    {"a": "int", "A": "string"}, {"a": "decimal"}, {"a": 3}, {"\ud800": "string"},
])
def test_declared_columns_are_refused_as_the_writer_refuses_them(declared: dict) -> None:
    def outcome(check):
        try:
            check(declared)
        except (ValueError, TypeError) as e:
            return "type must be one of" in str(e), "cannot be declared" in str(e)
        return None

    assert outcome(check_declared) == outcome(ColumnTypes)


def test_the_declared_type_names_are_the_writers() -> None:
    from logrouter.lake.column_names import DECLARED_TYPES

    assert set(DECLARED_TYPES) == set(TYPE_NAMES)
    assert usable("status", set()) and not usable("Status", {"status"}) and not usable(3, set())


def test_a_list_for_a_type_is_named_as_one() -> None:
    """(``ColumnTypes`` itself fails on it with ``unhashable type``, which the check showed.)"""
    with pytest.raises(ValueError, match=r"column 'a': type must be one of .*, not \['int'\]"):
        check_declared({"a": ["int"]})

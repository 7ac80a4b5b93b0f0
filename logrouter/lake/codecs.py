"""The Parquet codecs a config may name, and which of them this pyarrow build has.

The config check asks (``compression`` of the lake sinks) in every process, the supervisor
of ``[router] workers`` too, which never writes Parquet: importing pyarrow there to ask
would cost it ~30 MiB for good. The build says which codecs it was compiled with in the
header it ships (``pyarrow/include/arrow/util/config.h``, an ``ARROW_WITH_<CODEC>`` define
each), read here without importing pyarrow; a build that ships no header is asked
directly (``pyarrow.Codec.is_available``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re

PARQUET_CODECS = ("zstd", "snappy", "gzip", "brotli", "lz4", "none")

#: codec -> the define of Arrow's build config that says it is compiled in
BUILD_DEFINES = {"zstd": "ARROW_WITH_ZSTD", "snappy": "ARROW_WITH_SNAPPY", "gzip": "ARROW_WITH_ZLIB",
                 "brotli": "ARROW_WITH_BROTLI", "lz4": "ARROW_WITH_LZ4"}


def defines_of(header: str) -> set[str]:
    """The names ``#define``d in a C header's text."""
    return set(re.findall(r"^\s*#\s*define\s+(\w+)", header, re.MULTILINE))


def _build_header() -> str | None:
    spec = importlib.util.find_spec("pyarrow")  # finds, does not run it
    for directory in (spec.submodule_search_locations or []) if spec is not None else []:
        try:
            with open(os.path.join(directory, "include", "arrow", "util", "config.h"), encoding="utf-8") as f:
                return f.read()
        except OSError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def available() -> frozenset[str]:
    """The codecs of ``PARQUET_CODECS`` this pyarrow build can write."""
    header = _build_header()
    if header is not None:
        defines = defines_of(header)
        return frozenset(c for c in PARQUET_CODECS if c == "none" or BUILD_DEFINES[c] in defines)
    import pyarrow

    return frozenset(c for c in PARQUET_CODECS if c == "none" or pyarrow.Codec.is_available(c))


def check_codec(value: str) -> None:
    """Refused at config load: an unknown codec would otherwise fail every file write."""
    name = value.lower()
    if name not in PARQUET_CODECS:
        raise ValueError(f"unknown Parquet codec {value!r} (one of: {', '.join(PARQUET_CODECS)})")
    if name not in available():
        raise ValueError(f"Parquet codec {value!r} is not available in this pyarrow build")
